//! What a JSON schema may be before llguidance compiles it. llguidance recurses along a
//! schema's nesting and its object properties, so these bounds, with the compile thread's
//! stack ([`super::thread`]), keep any one request from exhausting a stack: at most
//! [`MAX_SCHEMA_BYTES`] of JSON, at most [`MAX_SCHEMA_PROPERTIES`] object properties in all, and
//! subschemas nested at most [`MAX_SCHEMA_DEPTH`] deep (a `$ref` counts as a step into its
//! target).
//!
//! Only local references (`#` and `#/json/pointer`) are followed; others are llguidance's to
//! resolve or refuse. The checks walk the schema without recursion.

use std::collections::HashMap;
use std::io;

use serde_json::Value;

/// Most bytes a schema may take as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 4 << 20;

/// Most object properties (`properties` entries) a schema may declare, all its objects
/// together.
pub const MAX_SCHEMA_PROPERTIES: usize = 5000;

/// Deepest nesting of subschemas, a `$ref` counting as a step into its target.
pub const MAX_SCHEMA_DEPTH: usize = 256;

/// Checks `schema` against the bounds; the error says, for a client, what is wrong with it.
pub fn check(schema: &Value) -> Result<(), String> {
    if json_len_over(schema, MAX_SCHEMA_BYTES) {
        return Err(format!(
            "it is more than {MAX_SCHEMA_BYTES} bytes long as JSON"
        ));
    }
    let graph = SchemaGraph::of(schema);
    let properties = graph.properties();
    if properties > MAX_SCHEMA_PROPERTIES {
        return Err(format!(
            "it declares {properties} object properties in all; at most \
             {MAX_SCHEMA_PROPERTIES} are accepted"
        ));
    }
    let depth = graph.depth();
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "it nests subschemas {depth} deep (counting each `$ref` as a step into its \
             target); at most {MAX_SCHEMA_DEPTH} are accepted"
        ));
    }
    Ok(())
}

/// Whether `value` as compact JSON is longer than `limit` bytes (it stops writing there).
fn json_len_over(value: &Value, limit: usize) -> bool {
    struct Counter {
        written: usize,
        limit: usize,
    }
    impl io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.written += buf.len();
            if self.written > self.limit {
                return Err(io::Error::other("over the limit"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { written: 0, limit };
    serde_json::to_writer(&mut counter, value).is_err()
}

/// How a subschema relates to the schema it is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edge {
    /// A part of the value (a property, an item), or a condition on it.
    Part,
    /// The whole value must match it too: the `$ref` target, an `allOf` member.
    Whole,
    /// The whole value may match it instead of the others: an `anyOf` or `oneOf` member.
    Alternative,
}

/// Every schema location of a document (the root, its subschemas, the `$defs`, the targets of
/// local `$ref`s), each once, named by its JSON pointer, with the edges to its subschemas.
struct SchemaGraph<'a> {
    nodes: Vec<Node<'a>>,
}

struct Node<'a> {
    /// `#` and the JSON pointer.
    name: String,
    schema: &'a Value,
    edges: Vec<(usize, Edge)>,
}

/// Keywords whose value is one subschema of a part of the value, or a condition on it.
const ONE_PART: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value maps names to subschemas of parts.
const PART_MAPS: &[&str] = &["properties", "patternProperties", "dependentSchemas"];

/// Keywords whose value maps names to definitions (nodes, but no edge from here).
const DEFINITION_MAPS: &[&str] = &["$defs", "definitions"];

impl<'a> SchemaGraph<'a> {
    /// The graph of `root`, built breadth first.
    fn of(root: &'a Value) -> Self {
        let mut graph = Builder {
            root,
            nodes: Vec::new(),
            by_pointer: HashMap::new(),
        };
        graph.node_at(String::new(), root);
        let mut next = 0;
        while next < graph.nodes.len() {
            let edges = graph.edges_of(next);
            graph.nodes[next].edges = edges;
            next += 1;
        }
        Self { nodes: graph.nodes }
    }

    /// Object properties declared, all locations together.
    fn properties(&self) -> usize {
        self.nodes
            .iter()
            .filter_map(|n| n.schema.get("properties").and_then(Value::as_object))
            .map(|p| p.len())
            .sum()
    }

    /// The longest chain of nested subschemas from the root, following every edge; an edge
    /// back into the chain (recursion) adds nothing. Depth first, without recursion.
    fn depth(&self) -> usize {
        let mut depth = vec![0usize; self.nodes.len()];
        let mut seen = vec![false; self.nodes.len()];
        seen[0] = true;
        // Each node on the current chain, with the next of its edges to follow.
        let mut chain: Vec<(usize, usize)> = vec![(0, 0)];
        while let Some(top) = chain.last_mut() {
            let (node, next) = *top;
            let edges = &self.nodes[node].edges;
            if let Some(&(child, _)) = edges.get(next) {
                top.1 += 1;
                if !seen[child] {
                    seen[child] = true;
                    chain.push((child, 0));
                }
                continue;
            }
            // Nodes still on the chain have depth 0 yet: recursion adds nothing.
            depth[node] = 1 + edges.iter().map(|&(c, _)| depth[c]).max().unwrap_or(0);
            chain.pop();
        }
        depth[0]
    }
}

struct Builder<'a> {
    root: &'a Value,
    nodes: Vec<Node<'a>>,
    by_pointer: HashMap<String, usize>,
}

impl<'a> Builder<'a> {
    /// The node of the schema at `pointer`, added if new.
    fn node_at(&mut self, pointer: String, schema: &'a Value) -> usize {
        if let Some(&i) = self.by_pointer.get(&pointer) {
            return i;
        }
        let i = self.nodes.len();
        self.nodes.push(Node {
            name: format!("#{pointer}"),
            schema,
            edges: Vec::new(),
        });
        self.by_pointer.insert(pointer, i);
        i
    }

    /// The edges of node `i`, adding the nodes they lead to.
    fn edges_of(&mut self, i: usize) -> Vec<(usize, Edge)> {
        let Value::Object(map) = self.nodes[i].schema else {
            return Vec::new();
        };
        let base = self.nodes[i].name[1..].to_owned();
        let mut edges = Vec::new();
        for (key, value) in map {
            let here = format!("{base}/{}", escape(key));
            let key = key.as_str();
            if key == "$ref" {
                let target = value.as_str().and_then(local_pointer);
                if let Some((pointer, schema)) =
                    target.and_then(|p| self.root.pointer(&p).map(|s| (p, s)))
                {
                    edges.push((self.node_at(pointer, schema), Edge::Whole));
                }
            } else if key == "items" && value.is_object() || ONE_PART.contains(&key) {
                edges.push((self.node_at(here, value), Edge::Part));
            } else if let Value::Array(list) = value {
                let edge = match key {
                    "allOf" => Edge::Whole,
                    "anyOf" | "oneOf" => Edge::Alternative,
                    "items" | "prefixItems" => Edge::Part,
                    _ => continue,
                };
                for (n, sub) in list.iter().enumerate() {
                    edges.push((self.node_at(format!("{here}/{n}"), sub), edge));
                }
            } else if let Value::Object(named) = value {
                let definitions = DEFINITION_MAPS.contains(&key);
                if !(definitions || PART_MAPS.contains(&key)) {
                    continue;
                }
                for (name, sub) in named {
                    let node = self.node_at(format!("{here}/{}", escape(name)), sub);
                    if !definitions {
                        edges.push((node, Edge::Part));
                    }
                }
            }
        }
        edges
    }
}

/// A JSON pointer segment for `key` (`~` and `/` escaped).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON pointer of a local reference (`#` or `#/...`).
fn local_pointer(reference: &str) -> Option<String> {
    let rest = reference.strip_prefix('#')?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(n: usize) -> Value {
        let properties: serde_json::Map<String, Value> = (0..n)
            .map(|i| (format!("p{i}"), json!({"type": "integer"})))
            .collect();
        json!({"type": "object", "properties": properties})
    }

    /// `n` definitions, each an object whose one property refers to the next.
    fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn ordinary_schemas_pass() {
        let person = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "address": {"$ref": "#/$defs/address"},
                "either": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/address"}]}
            },
            "$defs": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}}
        });
        assert_eq!(check(&person), Ok(()));
        assert_eq!(check(&json!({})), Ok(()));
        assert_eq!(check(&json!(true)), Ok(()));
    }

    #[test]
    fn recursion_through_parts_passes() {
        let tree = json!({
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}
        });
        assert_eq!(check(&tree), Ok(()));
        let alternatives = json!({"anyOf": [{"$ref": "#"}, {"type": "string"}]});
        assert_eq!(check(&alternatives), Ok(()));
    }

    #[test]
    fn properties_are_counted_across_objects() {
        assert_eq!(check(&props(MAX_SCHEMA_PROPERTIES)), Ok(()));
        let why = check(&props(MAX_SCHEMA_PROPERTIES + 1)).unwrap_err();
        assert!(
            why.contains(&format!("{}", MAX_SCHEMA_PROPERTIES + 1)),
            "{why}"
        );
        let half = props(MAX_SCHEMA_PROPERTIES / 2 + 1);
        let two = json!({"type": "object", "properties": {"a": half.clone(), "b": half}});
        assert!(check(&two).is_err());
    }

    #[test]
    fn depth_counts_through_refs() {
        // Each definition is two levels (the object, its property); the root one more.
        assert_eq!(SchemaGraph::of(&ref_chain(3)).depth(), 2 * 3 + 2);
        assert_eq!(check(&ref_chain(MAX_SCHEMA_DEPTH / 2 - 1)), Ok(()));
        let why = check(&ref_chain(5000)).unwrap_err();
        assert!(why.contains("deep"), "{why}");
    }

    #[test]
    fn depth_counts_inline_nesting() {
        let mut schema = json!({"type": "integer"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            schema = json!({"type": "array", "items": schema});
        }
        assert_eq!(SchemaGraph::of(&schema).depth(), MAX_SCHEMA_DEPTH + 1);
        assert!(check(&schema).unwrap_err().contains("deep"));
    }

    #[test]
    fn size_is_bounded() {
        let long = "x".repeat(MAX_SCHEMA_BYTES);
        let why = check(&json!({"description": long})).unwrap_err();
        assert!(why.contains("bytes"), "{why}");
    }

    #[test]
    fn only_local_refs_are_followed() {
        assert_eq!(local_pointer("#"), Some(String::new()));
        assert_eq!(local_pointer("#/$defs/a"), Some("/$defs/a".into()));
        assert_eq!(local_pointer("#anchor"), None);
        assert_eq!(local_pointer("other.json#/a"), None);
        let external = json!({"$ref": "https://example.com/schema.json"});
        assert_eq!(check(&external), Ok(()));
    }
}

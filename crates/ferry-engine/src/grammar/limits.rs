//! What a JSON schema may be before llguidance compiles it. llguidance recurses along a
//! schema's nesting and its object properties, so these bounds, with the compile thread's
//! stack ([`super::thread`]), keep any one request from exhausting a stack: at most
//! [`MAX_SCHEMA_BYTES`] of JSON, at most [`MAX_SCHEMA_PROPERTIES`] object properties in all, and
//! subschemas nested at most [`MAX_SCHEMA_DEPTH`] deep (a `$ref` counts as a step into its
//! target).
//!
//! It also refuses a `$ref` cycle that never reaches a value where an output could enter it: a
//! schema that can only be matched by matching itself first, through `$ref`s and `allOf`
//! members, or through `anyOf`/`oneOf` alternatives none of which gets out (`{"$ref": "#"}`,
//! two definitions naming each other, `{"anyOf": [{"$ref": "#"}]}`). llguidance compiles those,
//! then fails the generation once it gets there. Recursion through a value's parts (a tree
//! whose `children` items are `{"$ref": "#"}`) is allowed, and so is a cycle no output enters
//! (an unused definition, an alternative beside one that reaches a value).
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
    if let Some(cycle) = graph.ungrounded_cycle() {
        return Err(format!(
            "its `$ref`s form a cycle that never reaches a value: {}",
            cycle.join(" -> ")
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

    /// Which schemas can be matched without first matching themselves: those whose
    /// [`Edge::Whole`] subschemas all can, and, when they have alternatives, one of those can
    /// (a least fixed point, by counting down what each schema still waits for). The others
    /// are `$ref` cycles that never reach a value.
    fn grounded(&self) -> Vec<bool> {
        let n = self.nodes.len();
        let mut parents: Vec<Vec<(usize, Edge)>> = vec![Vec::new(); n];
        let mut wholes_left = vec![0usize; n];
        let mut has_alternatives = vec![false; n];
        for (i, node) in self.nodes.iter().enumerate() {
            for &(child, edge) in &node.edges {
                match edge {
                    Edge::Part => continue,
                    Edge::Whole => wholes_left[i] += 1,
                    Edge::Alternative => has_alternatives[i] = true,
                }
                parents[child].push((i, edge));
            }
        }
        let mut grounded = vec![false; n];
        let mut alternative_grounded = vec![false; n];
        let mut ready: Vec<usize> = (0..n)
            .filter(|&i| wholes_left[i] == 0 && !has_alternatives[i])
            .collect();
        while let Some(node) = ready.pop() {
            if grounded[node] {
                continue;
            }
            grounded[node] = true;
            for &(parent, edge) in &parents[node] {
                if edge == Edge::Whole {
                    wholes_left[parent] -= 1;
                } else {
                    alternative_grounded[parent] = true;
                }
                if wholes_left[parent] == 0
                    && (!has_alternatives[parent] || alternative_grounded[parent])
                {
                    ready.push(parent);
                }
            }
        }
        grounded
    }

    /// A `$ref` cycle that never reaches a value, where an output could enter it: a schema
    /// reachable from the root that is not [`grounded`](Self::grounded) (alternatives that are
    /// not grounded, beside one that is, are never entered, so they are passed over). The
    /// names along the cycle, the first again at the end.
    fn ungrounded_cycle(&self) -> Option<Vec<String>> {
        let grounded = self.grounded();
        let mut seen = vec![false; self.nodes.len()];
        seen[0] = true;
        let mut next = vec![0];
        while let Some(node) = next.pop() {
            if !grounded[node] {
                return Some(self.cycle_from(node, &grounded));
            }
            for &(child, edge) in &self.nodes[node].edges {
                if edge == Edge::Alternative && !grounded[child] || seen[child] {
                    continue;
                }
                seen[child] = true;
                next.push(child);
            }
        }
        None
    }

    /// The cycle an ungrounded `start` leads into: from each ungrounded schema, its first
    /// ungrounded [`Edge::Whole`] subschema, or else its first alternative (none is grounded).
    fn cycle_from(&self, start: usize, grounded: &[bool]) -> Vec<String> {
        let mut path = vec![start];
        let mut at = HashMap::from([(start, 0usize)]);
        let mut node = start;
        loop {
            let edges = &self.nodes[node].edges;
            let step = edges
                .iter()
                .find(|&&(c, e)| e == Edge::Whole && !grounded[c])
                .or_else(|| edges.iter().find(|&&(_, e)| e == Edge::Alternative));
            let Some(&(child, _)) = step else {
                break;
            };
            path.push(child);
            if let Some(&from) = at.get(&child) {
                path.drain(..from);
                break;
            }
            at.insert(child, path.len() - 1);
            node = child;
        }
        path.iter().map(|&n| self.nodes[n].name.clone()).collect()
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
    fn cycles_that_never_reach_a_value_are_refused_with_their_path() {
        let own = check(&json!({"$ref": "#"})).unwrap_err();
        assert!(own.contains("cycle") && own.ends_with(": # -> #"), "{own}");
        let two = json!({
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a"
        });
        let why = check(&two).unwrap_err();
        assert!(
            why.ends_with(": #/$defs/a -> #/$defs/b -> #/$defs/a"),
            "{why}"
        );
        let all_of = json!({"allOf": [{"$ref": "#"}, {"type": "object"}]});
        assert!(check(&all_of)
            .unwrap_err()
            .ends_with(": # -> #/allOf/0 -> #"));
        let only_itself = json!({"anyOf": [{"$ref": "#"}, {"$ref": "#"}]});
        assert!(check(&only_itself)
            .unwrap_err()
            .ends_with(": # -> #/anyOf/0 -> #"));
        // Reached after a prefix of the output (`{"a":`), optional or not.
        let behind_a_property = json!({
            "type": "object",
            "properties": {"a": {"$ref": "#/definitions/x"}},
            "definitions": {"x": {"anyOf": [{"$ref": "#/definitions/x"}]}}
        });
        let why = check(&behind_a_property).unwrap_err();
        assert!(
            why.ends_with(": #/definitions/x -> #/definitions/x/anyOf/0 -> #/definitions/x"),
            "{why}"
        );
    }

    #[test]
    fn cycles_no_output_can_enter_pass() {
        let unused = json!({"type": "string", "$defs": {"x": {"$ref": "#/$defs/x"}}});
        assert_eq!(check(&unused), Ok(()));
        let beside_a_value = json!({
            "anyOf": [{"$ref": "#/$defs/x"}, {"type": "string"}],
            "$defs": {"x": {"$ref": "#/$defs/x"}}
        });
        assert_eq!(check(&beside_a_value), Ok(()));
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

//! Qwen3-Coder's XML calls:
//! `<tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>`.
//! Parameter values are text; each becomes a JSON value by its schema type in the tool's
//! `parameters` (strings stay strings, other types are parsed as JSON when they parse). The
//! arguments text grows one finished parameter at a time: `{"city": "Paris"` then `}` when the
//! function closes. A `<tool_call>` holding JSON is read as Hermes.

use serde_json::Value;

use super::{could_be, hermes, skip_ws, PartialCall, RegionEnd, RegionScan, ToolSpec};

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// Reads the region starting at `<tool_call>`.
pub fn scan(region: &str, tools: &[ToolSpec]) -> RegionScan {
    let body = skip_ws(region, hermes::OPEN.len());
    let rest = &region[body..];
    if rest.starts_with('{') {
        return hermes::scan(region);
    }
    if !rest.starts_with(FUNCTION) {
        return if could_be(rest, FUNCTION) {
            RegionScan::open(Vec::new())
        } else {
            RegionScan::not_a_call()
        };
    }
    let name_at = body + FUNCTION.len();
    let Some(close) = region[name_at..].find('>') else {
        return RegionScan::open(Vec::new());
    };
    let name = region[name_at..name_at + close].trim().to_owned();
    let tool = tools.iter().find(|t| t.name == name);
    let mut call = PartialCall {
        name: Some(name),
        arguments: "{".to_owned(),
    };
    let mut pos = name_at + close + 1;
    let mut first = true;
    loop {
        pos = skip_ws(region, pos);
        let rest = &region[pos..];
        if let Some(after) = rest.strip_prefix(FUNCTION_END) {
            call.arguments.push('}');
            let end = skip_ws(region, region.len() - after.len());
            let tail = &region[end..];
            let end = if let Some(t) = tail.strip_prefix(hermes::CLOSE) {
                RegionEnd::Closed(region.len() - t.len())
            } else if could_be(tail, hermes::CLOSE) {
                RegionEnd::Open
            } else {
                RegionEnd::Closed(region.len() - after.len())
            };
            return RegionScan {
                calls: vec![call],
                end,
            };
        }
        let Some(param) = rest.strip_prefix(PARAMETER) else {
            return RegionScan::open(vec![call]);
        };
        let param_at = region.len() - param.len();
        let (Some(name_end), Some(value_end)) = (param.find('>'), param.find(PARAMETER_END)) else {
            return RegionScan::open(vec![call]);
        };
        if value_end < name_end {
            return RegionScan::open(vec![call]);
        }
        let key = param[..name_end].trim();
        let raw = &param[name_end + 1..value_end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        if !first {
            call.arguments.push_str(", ");
        }
        first = false;
        call.arguments.push_str(&format!(
            "{}: {}",
            serde_json::to_string(key).unwrap_or_default(),
            typed(raw, key, tool)
        ));
        pos = param_at + value_end + PARAMETER_END.len();
    }
}

/// A parameter's text as JSON: a string unless its schema type says otherwise and it parses.
fn typed(raw: &str, key: &str, tool: Option<&ToolSpec>) -> String {
    let kind = tool
        .and_then(|t| t.parameters.get("properties"))
        .and_then(|p| p.get(key))
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("string");
    if kind != "string" {
        if let Ok(value) = serde_json::from_str::<Value>(raw.trim()) {
            return value.to_string();
        }
    }
    Value::String(raw.to_owned()).to_string()
}

/// One call in this markup (`arguments` is a JSON object's text; anything else is one
/// parameter named `arguments`).
pub fn render_call(name: &str, arguments: &str) -> String {
    let mut out = format!("{}\n{FUNCTION}{name}>\n", hermes::OPEN);
    let params = match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => map.into_iter().collect(),
        _ => vec![("arguments".to_owned(), Value::String(arguments.to_owned()))],
    };
    for (key, value) in params {
        let text = match value {
            Value::String(s) => s,
            other => other.to_string(),
        };
        out.push_str(&format!("{PARAMETER}{key}>\n{text}\n{PARAMETER_END}\n"));
    }
    out.push_str(&format!("{FUNCTION_END}\n{}", hermes::CLOSE));
    out
}

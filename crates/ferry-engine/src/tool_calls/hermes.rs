//! Hermes / Qwen markup: `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>`, one
//! block per call (the fallback format too). The arguments are the JSON text the model wrote.

use super::json_scan::{object_call, Extent};
use super::{could_be, skip_ws, RegionEnd, RegionScan};

/// Opens a call.
pub const OPEN: &str = "<tool_call>";
/// Closes it.
pub const CLOSE: &str = "</tool_call>";

/// Reads the region starting at [`OPEN`].
pub fn scan(region: &str) -> RegionScan {
    let body = skip_ws(region, OPEN.len());
    match region.as_bytes().get(body) {
        None => return RegionScan::open(Vec::new()),
        Some(b'{') => {}
        Some(_) => return RegionScan::not_a_call(),
    }
    let (call, scan) = object_call(region, body, &["arguments", "parameters"]);
    let end = match scan.extent {
        Extent::Complete(end) => {
            let after = skip_ws(region, end);
            let rest = &region[after..];
            if let Some(tail) = rest.strip_prefix(CLOSE) {
                RegionEnd::Closed(region.len() - tail.len())
            } else if could_be(rest, CLOSE) {
                RegionEnd::Open
            } else {
                RegionEnd::Closed(end)
            }
        }
        Extent::Partial => RegionEnd::Open,
        // Not JSON: the call runs to its closing tag (or the end).
        Extent::Invalid => match region[body..].find(CLOSE) {
            Some(at) => RegionEnd::Closed(body + at + CLOSE.len()),
            None => RegionEnd::Open,
        },
    };
    RegionScan {
        calls: vec![call],
        end,
    }
}

/// One call in this markup.
pub fn render_call(name: &str, arguments: &str) -> String {
    format!(
        "{OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CLOSE}",
        serde_json::to_string(name).unwrap_or_default()
    )
}

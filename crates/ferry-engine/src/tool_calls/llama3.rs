//! Llama 3.x JSON calls: `{"name": "f", "parameters": {..}}` as the whole reply, optionally
//! after `<|python_tag|>` (a special token, so usually gone from the decoded text), several
//! separated by `;`. A reply that starts with `{` is a call only if its first key is `name`.

use super::json_scan::{object_call, Extent};
use super::{skip_ws, RegionEnd, RegionScan};

/// The token Llama 3.1+ may write before a call.
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// Reads a region starting at [`PYTHON_TAG`] or at the reply's first `{`.
pub fn scan(region: &str) -> RegionScan {
    let mut pos = region
        .strip_prefix(PYTHON_TAG)
        .map_or(0, |_| PYTHON_TAG.len());
    let mut calls = Vec::new();
    let mut last_end = pos;
    loop {
        pos = skip_ws(region, pos);
        match region.as_bytes().get(pos) {
            None => return RegionScan::open(calls),
            Some(b'{') => {}
            Some(_) if calls.is_empty() => return RegionScan::not_a_call(),
            Some(_) => return closed(calls, last_end),
        }
        let (call, scan) = object_call(region, pos, &["parameters", "arguments"]);
        if scan.entries.first().is_some_and(|e| e.key != "name") {
            return if calls.is_empty() {
                RegionScan::not_a_call()
            } else {
                closed(calls, last_end)
            };
        }
        calls.push(call);
        let Extent::Complete(end) = scan.extent else {
            // Partial, or not JSON after a name: the rest of the reply is this call.
            return RegionScan::open(calls);
        };
        last_end = end;
        pos = skip_ws(region, end);
        match region.as_bytes().get(pos) {
            None => return RegionScan::open(calls),
            Some(b';') => pos += 1,
            Some(_) => return closed(calls, end),
        }
    }
}

fn closed(calls: Vec<super::PartialCall>, end: usize) -> RegionScan {
    RegionScan {
        calls,
        end: RegionEnd::Closed(end),
    }
}

/// One call in this format.
pub fn render_call(name: &str, arguments: &str) -> String {
    format!(
        "{{\"name\": {}, \"parameters\": {arguments}}}",
        serde_json::to_string(name).unwrap_or_default()
    )
}

//! Mistral calls: `[TOOL_CALLS][{"name": "f", "arguments": {..}}, ..]` (v3 tokenizers) or
//! `[TOOL_CALLS]f[ARGS]{..}` (v11+). `[TOOL_CALLS]` and `[ARGS]` are control tokens, usually
//! gone from the decoded text, so a reply that starts with `[{"name"` is read as calls too.

use super::json_scan::{object_call, value_end, Extent};
use super::{could_be, skip_ws, PartialCall, RegionEnd, RegionScan};

/// The token before the calls.
pub const TOOL_CALLS: &str = "[TOOL_CALLS]";
/// The token between a name and its arguments (v11+).
pub const ARGS: &str = "[ARGS]";

/// Reads a region starting at [`TOOL_CALLS`] or at the reply's first `[`.
pub fn scan(region: &str) -> RegionScan {
    let marked = region.starts_with(TOOL_CALLS);
    let start = skip_ws(region, if marked { TOOL_CALLS.len() } else { 0 });
    match region.as_bytes().get(start) {
        None => RegionScan::open(Vec::new()),
        Some(b'[') => array(region, start),
        Some(_) if marked => named(region, start),
        Some(_) => RegionScan::not_a_call(),
    }
}

/// `[{..}, {..}]`.
fn array(region: &str, open: usize) -> RegionScan {
    let mut calls = Vec::new();
    let mut pos = skip_ws(region, open + 1);
    loop {
        match region.as_bytes().get(pos) {
            None => return RegionScan::open(calls),
            Some(b'{') => {}
            Some(_) if calls.is_empty() => return RegionScan::not_a_call(),
            Some(_) => return RegionScan::open(calls),
        }
        let (call, scan) = object_call(region, pos, &["arguments", "parameters"]);
        if calls.is_empty() && scan.entries.first().is_some_and(|e| e.key != "name") {
            return RegionScan::not_a_call();
        }
        calls.push(call);
        let Extent::Complete(end) = scan.extent else {
            return RegionScan::open(calls);
        };
        pos = skip_ws(region, end);
        match region.as_bytes().get(pos) {
            None => return RegionScan::open(calls),
            Some(b',') => pos = skip_ws(region, pos + 1),
            Some(b']') => {
                return RegionScan {
                    calls,
                    end: RegionEnd::Closed(pos + 1),
                }
            }
            Some(_) => {
                return RegionScan {
                    calls,
                    end: RegionEnd::Closed(end),
                }
            }
        }
    }
}

/// `name[ARGS]{..}` (or `name{..}` with `[ARGS]` dropped by the decoder).
fn named(region: &str, start: usize) -> RegionScan {
    let name_len = region[start..]
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        .count();
    let name_end = start + name_len;
    if name_len == 0 {
        return RegionScan::not_a_call();
    }
    let rest = &region[name_end..];
    if rest.is_empty() || (could_be(rest, ARGS) && rest.len() < ARGS.len()) {
        return RegionScan::open(Vec::new());
    }
    let args_at = skip_ws(
        region,
        name_end + rest.strip_prefix(ARGS).map_or(0, |_| ARGS.len()),
    );
    let name = Some(region[start..name_end].to_owned());
    match region.as_bytes().get(args_at) {
        None => RegionScan::open(vec![PartialCall {
            name,
            arguments: String::new(),
        }]),
        Some(b'{') => {
            let (arguments, end) = match value_end(region, args_at) {
                Extent::Complete(end) => (&region[args_at..end], RegionEnd::Closed(end)),
                _ => (region[args_at..].trim_end(), RegionEnd::Open),
            };
            RegionScan {
                calls: vec![PartialCall {
                    name,
                    arguments: arguments.to_owned(),
                }],
                end,
            }
        }
        Some(_) => RegionScan::not_a_call(),
    }
}

/// One call in this format.
pub fn render_call(name: &str, arguments: &str) -> String {
    format!(
        "{TOOL_CALLS}[{{\"name\": {}, \"arguments\": {arguments}}}]",
        serde_json::to_string(name).unwrap_or_default()
    )
}

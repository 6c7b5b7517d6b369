//! The forms real models write their calls in besides their family's own markup, read for every
//! format: a fenced block around the calls (```` ```json ````, ```` ```xml ```` or any other
//! tag, or none, up to the closing ```` ``` ````) holding the family's markup or JSON call
//! objects, and a bare JSON call object (`{"name": .., "arguments": ..}`) at the start of a
//! line. JSON written this way is a call only when its first key is `name` and it names an
//! offered tool (anything else, a code sample or an example call of some other function, stays
//! text); the family's markup inside a fence is read as [`super::stream`] reads it anywhere.

use super::json_scan::{object_call, scan_object, Extent};
use super::{
    could_be, hermes, llama3, mistral, qwen3_coder, skip_ws, RegionEnd, RegionScan, ToolCallFormat,
    ToolSpec,
};

/// Opens (and closes) a fenced block.
pub const FENCE: &str = "```";

/// Reads the region starting at [`FENCE`]: the tag, then calls until the closing fence.
pub fn fence(region: &str, format: ToolCallFormat, tools: &[ToolSpec]) -> RegionScan {
    let tag = region[FENCE.len()..]
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.'))
        .count();
    let mut pos = skip_ws(region, FENCE.len() + tag);
    let mut calls = Vec::new();
    // Where the last call ended (`None` before the first).
    let mut last_end = None;
    loop {
        let rest = &region[pos..];
        if rest.is_empty() || (last_end.is_some() && could_be(rest, FENCE)) {
            return RegionScan::open(calls);
        }
        if last_end.is_some() && rest.starts_with(FENCE) {
            return closed(calls, pos + FENCE.len());
        }
        let item = item(rest, format, tools);
        match (item.end, last_end) {
            (RegionEnd::NotACall, None) => return RegionScan::not_a_call(),
            // Something else after a call: the calls end there, the fence stays unclosed.
            (RegionEnd::NotACall, Some(end)) => return closed(calls, end),
            (RegionEnd::Open, _) => {
                calls.extend(item.calls);
                return RegionScan::open(calls);
            }
            (RegionEnd::Closed(n), _) => {
                calls.extend(item.calls);
                last_end = Some(pos + n);
                pos = skip_ws(region, pos + n);
            }
        }
    }
}

/// Reads a region starting at a bare `{`: a call only if it names an offered tool first.
pub fn object(region: &str, tools: &[ToolSpec]) -> RegionScan {
    let scan = scan_object(region, 0);
    let Some(first) = scan.entries.first() else {
        // Only `{` and whitespace, or the first key still arriving: it must become `"name"`.
        let key = region[1..].trim_start();
        let may_be_name = match key.strip_prefix("\"name\"") {
            Some(after) => after.trim_start().is_empty(),
            None => could_be(key, "\"name\""),
        };
        return if scan.extent == Extent::Partial && may_be_name {
            RegionScan::open(Vec::new())
        } else {
            RegionScan::not_a_call()
        };
    };
    if first.key != "name" {
        return RegionScan::not_a_call();
    }
    let Some(name) = first.string(region) else {
        // The name still arriving (while it may become an offered one), or not a string.
        let so_far = first.text(region);
        let arriving = first.value_end.is_none()
            && (so_far.is_empty()
                || so_far.strip_prefix('"').is_some_and(|raw| {
                    raw.contains('\\') || tools.iter().any(|t| t.name.starts_with(raw))
                }));
        return if arriving {
            RegionScan::open(Vec::new())
        } else {
            RegionScan::not_a_call()
        };
    };
    if !tools.iter().any(|t| t.name == name) {
        return RegionScan::not_a_call();
    }
    let (call, scan) = object_call(region, 0, &["arguments", "parameters"]);
    let end = match scan.extent {
        Extent::Complete(end) => RegionEnd::Closed(end),
        // Cut short, or not JSON after an offered name: the rest of the reply is this call.
        Extent::Partial | Extent::Invalid => RegionEnd::Open,
    };
    RegionScan {
        calls: vec![call],
        end,
    }
}

/// One item inside a fence: the family's markup, a call object or an array of them.
fn item(rest: &str, format: ToolCallFormat, tools: &[ToolSpec]) -> RegionScan {
    let marker = match format {
        ToolCallFormat::Hermes | ToolCallFormat::Qwen3Coder | ToolCallFormat::Harmony => {
            hermes::OPEN
        }
        ToolCallFormat::Llama3Json => llama3::PYTHON_TAG,
        ToolCallFormat::Mistral => mistral::TOOL_CALLS,
    };
    let scan = if rest.starts_with(marker) {
        match format {
            ToolCallFormat::Hermes | ToolCallFormat::Harmony => hermes::scan(rest),
            ToolCallFormat::Qwen3Coder => qwen3_coder::scan(rest, tools),
            ToolCallFormat::Llama3Json => llama3::scan(rest),
            ToolCallFormat::Mistral => mistral::scan(rest),
        }
    } else if rest.len() < marker.len() && could_be(rest, marker) {
        RegionScan::open(Vec::new())
    } else if rest.starts_with('{') {
        object(rest, tools)
    } else if rest.starts_with('[') {
        array(rest, tools)
    } else {
        RegionScan::not_a_call()
    };
    // A region that closed without a named call is no call.
    scan.settle(rest.len(), false)
}

/// `[{..}, {..}]`, each object a call of an offered tool.
fn array(region: &str, tools: &[ToolSpec]) -> RegionScan {
    let mut calls = Vec::new();
    let mut pos = skip_ws(region, 1);
    // Where the last call ended (`None` before the first).
    let mut last_end = None;
    loop {
        if pos == region.len() {
            return RegionScan::open(calls);
        }
        let scan = object(&region[pos..], tools);
        calls.extend(scan.calls);
        let n = match (scan.end, last_end) {
            (RegionEnd::Closed(n), _) => n,
            (RegionEnd::Open, _) => return RegionScan::open(calls),
            (RegionEnd::NotACall, None) => return RegionScan::not_a_call(),
            (RegionEnd::NotACall, Some(end)) => return closed(calls, end),
        };
        last_end = Some(pos + n);
        pos = skip_ws(region, pos + n);
        match region.as_bytes().get(pos) {
            None => return RegionScan::open(calls),
            Some(b',') => pos = skip_ws(region, pos + 1),
            Some(b']') => return closed(calls, pos + 1),
            Some(_) => return closed(calls, pos),
        }
    }
}

fn closed(calls: Vec<super::PartialCall>, end: usize) -> RegionScan {
    RegionScan {
        calls,
        end: RegionEnd::Closed(end),
    }
}

//! Issue 24 items 2 and 8: JSON schemas the grammar engine must not be handed as they are.
//!
//! A real `ferry serve` process on the default configuration: a schema with 10 000 or 20 000
//! object properties, or nested 5000 deep through `$ref`s, sent as `response_format` or as a
//! tool's `parameters` (every tool is compiled, even with `tool_choice: auto`), is a 400 naming
//! the field, and the server answers the next request. (Such schemas overflowed a server
//! thread's stack in llguidance's recursion and aborted the whole process.) An object with a
//! thousand optional properties, within the bounds, generates (it failed mid-output).
//!
//! A real server on a loopback port: `$ref` cycles no value can match (`{"$ref": "#"}`, two
//! definitions naming each other, an `anyOf` of only itself) are a 400 naming the field, streamed
//! or not, with a one-line reason and none of llguidance's parser state (they were a 500 whose
//! message dumped it). Recursion through a value's parts still works.

use crate::common::Loopback;
use crate::real_model;
use crate::serve_process::ServeProcess;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Map, Value};

use ferry::server::ServerOptions;

/// An object schema with `n` integer properties.
fn properties(n: usize) -> Value {
    let properties: Map<String, Value> = (0..n)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": properties})
}

/// `n` definitions, each an object whose one property refers to the next (nested `n` objects
/// deep, while the JSON itself is only four levels deep).
fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}},
                "required": ["a"]}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn with_format(schema: &Value, stream: bool) -> Value {
    json!({
        "model": real_model::MODEL,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": 8,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    })
}

fn with_tool(parameters: &Value) -> Value {
    json!({
        "model": real_model::MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
    })
}

async fn post(base: &str, body: &Value) -> Result<(StatusCode, String), reqwest::Error> {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .timeout(Duration::from_secs(300))
        .send()
        .await?;
    let status = response.status();
    Ok((status, response.text().await?))
}

/// Checks a 400 naming `param`, with a one-line reason free of llguidance's parser state.
fn assert_refused(what: &str, status: StatusCode, body: &str, param: &str) -> String {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
    let v: Value = serde_json::from_str(body).expect("a JSON error");
    let error = &v["error"];
    assert_eq!(error["param"], param, "{what}: {body}");
    assert_eq!(error["type"], "invalid_request_error", "{what}: {body}");
    assert_eq!(error["code"], "invalid_value", "{what}: {body}");
    let message = error["message"].as_str().expect("a message").to_owned();
    for dump in ["\n", "<state>", "Tokens:", "Parser:"] {
        assert!(!message.contains(dump), "{what}: {dump:?} in {message:?}");
    }
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_schemas_are_a_400_and_the_server_goes_on() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
    let args: Vec<OsString> = vec!["--config".into(), config.into()];
    let server = ServeProcess::start(&args).await;
    let field = "response_format";
    let tool = "tools[0].function.parameters";
    let cases = [
        (
            "10 000 properties",
            with_format(&properties(10_000), false),
            field,
            "properties",
        ),
        (
            "20 000 properties",
            with_format(&properties(20_000), false),
            field,
            "properties",
        ),
        (
            "5000 deep",
            with_format(&ref_chain(5000), false),
            field,
            "deep",
        ),
        (
            "a tool's 10 000 properties",
            with_tool(&properties(10_000)),
            tool,
            "properties",
        ),
        (
            "a tool's 5000 deep",
            with_tool(&ref_chain(5000)),
            tool,
            "deep",
        ),
    ];
    let small = with_format(&properties(3), false);
    for (what, body, param, reason) in cases {
        let (status, text) = post(&server.base, &body)
            .await
            .unwrap_or_else(|e| panic!("{what}: no answer, the server died? {e}"));
        let message = assert_refused(what, status, &text, param);
        assert!(message.contains(reason), "{what}: {message}");
        let (status, text) = post(&server.base, &small)
            .await
            .unwrap_or_else(|e| panic!("after {what}: no answer, the server died? {e}"));
        assert_eq!(status, StatusCode::OK, "after {what}: {text}");
    }
}

/// An object with 1000 optional properties and one required (so the output must open a key),
/// greedy:
/// llguidance's default bound on one parser row (2000 items, about four per optional property)
/// failed the generation as soon as the model wrote `{"`.
#[tokio::test]
async fn an_object_with_a_thousand_optional_properties_generates() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let mut schema = properties(1000);
    schema["required"] = json!(["p999"]);
    schema["additionalProperties"] = json!(false);
    let mut body = with_format(&schema, false);
    body["temperature"] = json!(0);
    let (status, text) = post(&server.url(""), &body).await.expect("an answer");
    assert_eq!(status, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("text");
    assert!(content.starts_with("{\"p"), "{content}");
}

#[tokio::test]
async fn ref_cycles_are_a_400_without_the_parser_state() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let base = server.url("");
    let two = json!({
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a"
    });
    let only_itself = json!({"anyOf": [{"$ref": "#"}]});
    let cases = [
        (
            "self",
            with_format(&json!({"$ref": "#"}), false),
            "response_format",
            "# -> #",
        ),
        (
            "self, streamed",
            with_format(&json!({"$ref": "#"}), true),
            "response_format",
            "# -> #",
        ),
        (
            "two",
            with_format(&two, false),
            "response_format",
            "#/$defs/a -> #/$defs/b -> #/$defs/a",
        ),
        (
            "two, streamed",
            with_format(&two, true),
            "response_format",
            "#/$defs/b",
        ),
        (
            "anyOf itself",
            with_format(&only_itself, false),
            "response_format",
            "# -> #/anyOf/0 -> #",
        ),
        (
            "a tool's self",
            with_tool(&json!({"$ref": "#"})),
            "tools[0].function.parameters",
            "cycle",
        ),
    ];
    for (what, body, param, reason) in cases {
        let (status, text) = post(&base, &body).await.expect("an answer");
        let message = assert_refused(what, status, &text, param);
        assert!(message.contains(reason), "{what}: {message}");
    }
    let tree = json!({
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["kids"]
    });
    let (status, text) = post(&base, &with_format(&tree, false))
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "recursion through parts: {text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("text");
    assert!(content.starts_with("{\"kids\":["), "{content}");
}

//! Issue 15 item 2, structured outputs, on the real SmolLM2 model through a real server on a
//! loopback port: `response_format` `json_schema` output validates against its schema over 20
//! seeds at temperature 1 (the grammar is enforced while sampling, so a 135M model cannot get
//! it wrong), `json_object` output is a JSON object, streaming carries the constraint, and a
//! schema the grammar engine rejects is a 400 naming `response_format`.

use crate::common::{sse_events, Loopback};
use crate::real_model;

use std::time::Instant;

use reqwest::StatusCode;
use serde_json::{json, Value};

use ferry::engine::grammar::{GrammarSpec, GrammarState};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::server::ServerOptions;

const ENUM: [&str; 3] = ["red", "green", "blue"];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "color": {"enum": ENUM},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
        },
        "required": ["name", "age", "color", "tags"],
        "additionalProperties": false
    })
}

/// Checks `text` against [`schema`] by hand; the message says what is wrong.
fn validate(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text:?}"))?;
    let obj = v.as_object().ok_or(format!("not an object: {text}"))?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "color", "name", "tags"] {
        return Err(format!("keys {keys:?}: {text}"));
    }
    let name = obj["name"].as_str().ok_or(format!("name: {text}"))?;
    if name.chars().count() > 20 {
        return Err(format!("name too long: {text}"));
    }
    let age = obj["age"]
        .as_i64()
        .ok_or(format!("age not an integer: {text}"))?;
    if !(18..=99).contains(&age) {
        return Err(format!("age {age} out of range: {text}"));
    }
    let color = obj["color"].as_str().ok_or(format!("color: {text}"))?;
    if !ENUM.contains(&color) {
        return Err(format!("color {color:?} not in the enum: {text}"));
    }
    let tags = obj["tags"].as_array().ok_or(format!("tags: {text}"))?;
    if tags.len() > 3 {
        return Err(format!("too many tags: {text}"));
    }
    for t in tags {
        let t = t.as_str().ok_or(format!("a tag is not a string: {text}"))?;
        if t.chars().count() > 10 {
            return Err(format!("tag too long: {text}"));
        }
    }
    Ok(())
}

fn request(format: Value, seed: u64) -> Value {
    json!({
        "model": real_model::MODEL,
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "max_tokens": 200,
        "temperature": 1,
        "seed": seed,
        "response_format": format,
    })
}

fn json_schema_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": schema()}})
}

async fn chat(server: &Loopback, body: &Value) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("response");
    let status = response.status();
    (status, response.json().await.expect("json body"))
}

#[tokio::test]
async fn json_schema_outputs_validate_over_twenty_seeds() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let format = json_schema_format();
    let bodies: Vec<Value> = (0..20).map(|seed| request(format.clone(), seed)).collect();
    let replies = futures::future::join_all(bodies.iter().map(|body| chat(&server, body))).await;
    let mut distinct = std::collections::HashSet::new();
    for (seed, (status, body)) in replies.into_iter().enumerate() {
        assert_eq!(status, StatusCode::OK, "seed {seed}: {body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "seed {seed}: {body}");
        let text = choice["message"]["content"].as_str().expect("content");
        if let Err(why) = validate(text) {
            panic!("seed {seed}: {why}");
        }
        distinct.insert(text.to_owned());
    }
    assert!(distinct.len() > 1, "temperature 1 over 20 seeds varies");
}

#[tokio::test]
async fn json_object_output_is_an_object_and_streaming_keeps_the_constraint() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    for seed in [1, 2, 3] {
        let (status, body) = chat(&server, &request(json!({"type": "json_object"}), seed)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let choice = &body["choices"][0];
        let text = choice["message"]["content"].as_str().expect("content");
        if choice["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object(), "{text}");
        } else {
            // Cut by max_tokens: still the start of an object.
            assert!(text.starts_with('{'), "{text:?}");
        }
    }
    let mut body = request(json_schema_format(), 7);
    body["stream"] = json!(true);
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let sse = response.text().await.expect("stream");
    let mut text = String::new();
    let mut finish = Value::Null;
    for event in sse_events(&sse) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).expect("chunk");
        let choice = &chunk["choices"][0];
        if let Some(delta) = choice["delta"]["content"].as_str() {
            text.push_str(delta);
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(finish, "stop", "{sse}");
    validate(&text).unwrap_or_else(|why| panic!("streamed: {why}"));
}

#[tokio::test]
async fn schemas_the_engine_rejects_are_a_400_naming_response_format() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let bad = [
        json!({"type": 12}),
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ];
    for schema in bad {
        let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let (status, body) = chat(&server, &request(format, 0)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{schema}: {body}");
        assert_eq!(body["error"]["param"], "response_format", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("schema"), "{message}");
    }
    // The server still serves after the refusals.
    let (status, body) = chat(&server, &request(json_schema_format(), 3)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The mask's cost per token, printed (no timed assertion): the real tokenizer's trie, the
/// test schema, and a schema-valid output fed token by token, a mask computed before each.
#[test]
fn mask_cost_per_token_is_reported() {
    let config = real_model::model_config(ferry::config::DtypeChoice::Auto);
    let hub = ferry::model::source::HubOptions::from_env(|_| None);
    let loaded = ferry::runtime::load::load_for_serving(&config, &candle_core::Device::Cpu, &hub)
        .expect("the default model loads");
    let codec: &dyn TextCodec = &*loaded.codec;
    let start = Instant::now();
    let compiler = codec.grammar_compiler().expect("grammar engine");
    let trie_time = start.elapsed();
    let start = Instant::now();
    let grammar = compiler
        .compile(&GrammarSpec::JsonSchema(schema()))
        .expect("the schema compiles");
    let compile_time = start.elapsed();
    let text = r#"{"name":"Ada Lovelace","age":36,"color":"green","tags":["math","poet"]}"#;
    validate(text).expect("the sample is valid");
    let tokens = codec.encode(text, false).expect("encode");
    let vocab = loaded.runner.vocab_size();
    let mut state = GrammarState::new(&grammar);
    let mut logits = vec![0.0f32; vocab];
    for &t in &tokens {
        logits.fill(0.0);
        state.mask(&mut logits).expect("mask");
        assert!(
            logits[t as usize].is_finite(),
            "token {t} of a valid output is allowed"
        );
        state.commit(t).expect("commit");
    }
    logits.fill(0.0);
    state.mask(&mut logits).expect("mask");
    let eos = codec.eos_token_ids()[0] as usize;
    assert!(
        logits[eos].is_finite(),
        "EOS is allowed once the object is complete"
    );
    let allowed = logits.iter().filter(|l| l.is_finite()).count();
    assert!(
        allowed <= codec.eos_token_ids().len(),
        "only EOS after a complete object"
    );
    let (masks, average, engine) = state.mask_stats();
    eprintln!(
        "grammar: token trie + factory {trie_time:?}, schema compile {compile_time:?}, \
         {masks} masks over {} tokens, {average:?} per mask ({engine:?} in llguidance; vocab {vocab})",
        tokens.len()
    );
}

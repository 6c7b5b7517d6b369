//! HTTP API tests against a deterministic test backend (no model): response shapes, SSE framing
//! byte for byte, real OpenAI clients on a loopback port, a table of bad requests, the checks
//! before work (auth, admission, shapes) and connection handling with the stop sequence.

mod bad_requests;
use crate::common;
mod connections;
mod embeddings;
mod guards;
mod metrics;
mod openai_client;
mod shape;
mod streaming;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use common::*;
use ferry::engine::{Backend, ChatMessage};
use ferry::server::{app, ServerOptions};

fn test_app(backend: &Arc<TestBackend>) -> Router {
    app(
        backend.clone() as Arc<dyn Backend>,
        ServerOptions::default(),
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn assert_recent(created: &Value) {
    let created = created.as_u64().expect("created is an integer");
    assert!(created.abs_diff(now()) < 60, "created {created} is not now");
}

fn bytes_prompt(text: &str, bos: bool) -> Vec<u32> {
    bos.then_some(BOS)
        .into_iter()
        .chain(text.bytes().map(u32::from))
        .collect()
}

#[tokio::test]
async fn completion_response_has_every_field() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "Say hi", "max_tokens": 3, "temperature": 0,
            "top_p": 0.9, "top_k": 5, "min_p": 0.05, "seed": 7, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stop": ["zz", "yy"],
            "logprobs": 2, "ignore_eos": true, "user": "u", "n": 1, "echo": false, "best_of": 1}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_recent(&v["created"]);
    assert_eq!(v["model"], READY);
    assert_eq!(
        v["choices"],
        json!([{
            "index": 0,
            "text": "Hello, world",
            "logprobs": {
                "tokens": ["Hello", ",", " world"],
                "token_logprobs": [-0.25, -0.5, -0.75],
                "top_logprobs": [{"Hello": -0.25, "alt1": -1.25}, {",": -0.5, "alt1": -1.5},
                    {" world": -0.75, "alt1": -1.75}],
                "text_offset": [0, 5, 6]
            },
            "finish_reason": "length"
        }])
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
    );

    let sent = backend.last();
    assert_eq!(sent.model, READY);
    assert_eq!(sent.prompt, bytes_prompt("Say hi", true));
    let p = &sent.params;
    assert_eq!((p.max_tokens, p.logprobs, p.ignore_eos), (3, Some(2), true));
    assert_eq!(p.stop, ["zz", "yy"]);
    let s = &p.sampling;
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (0.0, 0.9, 5, 0.05)
    );
    assert_eq!(s.seed, Some(7));
    assert_eq!(
        (
            s.presence_penalty,
            s.frequency_penalty,
            s.repetition_penalty
        ),
        (0.5, -0.5, 1.1)
    );
}

/// `chat_template_kwargs` and `reasoning_effort` reach the chat template as variables (the
/// test double writes them before the prompt); `verbosity` and `modalities: ["text"]` are
/// accepted; without any, the template sees no extra variables.
#[tokio::test]
async fn template_variables_reach_the_template() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let messages = json!([{"role": "user", "content": "hi"}]);
    let prompt_of = |backend: &TestBackend| {
        String::from_utf8(backend.last().prompt.iter().map(|&id| id as u8).collect()).unwrap()
    };
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": messages,
            "chat_template_kwargs": {"a": 1}, "max_tokens": 1,
            "reasoning_effort": "low", "verbosity": "high", "modalities": ["text"]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let prompt = prompt_of(&backend);
    assert!(
        prompt.starts_with(r#"<|v|>{"a":1,"reasoning_effort":"low"}"#),
        "{prompt}"
    );
    // The kwargs win over the top-level field.
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": messages,
            "chat_template_kwargs": {"reasoning_effort": "high"}, "reasoning_effort": "low",
            "max_tokens": 1}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(prompt_of(&backend).starts_with(r#"<|v|>{"reasoning_effort":"high"}"#));
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": messages}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(prompt_of(&backend).starts_with("<|user|>hi"));
}

#[tokio::test]
async fn completion_defaults_and_token_prompts() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": [[5, 6, 7]]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["choices"][0]["text"], "Hello, world! How are you?");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    let sent = backend.last();
    assert_eq!(sent.prompt, vec![5, 6, 7]);
    assert_eq!(sent.params.max_tokens, 16, "OpenAI's default max_tokens");
    assert_eq!(sent.params.logprobs, None);
    assert_eq!(
        sent.params.sampling,
        common::model_sampling_defaults(),
        "the model's sampling defaults, not OpenAI's"
    );
    // Chat too; a field the request sends wins, even one that means "off".
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [{"role": "user", "content": "hi"}], "top_k": 0}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let sent = backend.last().params.sampling;
    assert_eq!(
        sent,
        ferry::engine::SamplingParams {
            top_k: 0,
            ..common::model_sampling_defaults()
        }
    );
}

#[tokio::test]
async fn chat_response_has_every_field() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [
                {"role": "system", "content": "Be brief"},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "logprobs": true, "top_logprobs": 2, "seed": 1, "store": false, "metadata": {"a": "b"}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_recent(&v["created"]);
    assert_eq!(v["model"], READY);
    let choice = &v["choices"][0];
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "Hello, world! How are you?", "refusal": null,
            "annotations": []}),
        "`refusal` (null) and `annotations` ([]) are in OpenAI's schema"
    );
    assert_eq!(choice["finish_reason"], "stop");
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), CONTINUATION.len());
    assert_eq!(
        content[1],
        json!({"token": ",", "logprob": -0.5, "bytes": [44],
            "top_logprobs": [{"token": ",", "logprob": -0.5, "bytes": [44]},
                             {"token": "alt1", "logprob": -1.5, "bytes": [97, 108, 116, 49]}]})
    );

    let messages = [
        ChatMessage {
            role: "system".into(),
            content: "Be brief".into(),
            ..Default::default()
        },
        ChatMessage {
            role: "user".into(),
            content: "Hi".into(),
            ..Default::default()
        },
    ];
    let prompt = bytes_prompt(&render(&messages), false);
    let sent = backend.last();
    assert_eq!(sent.prompt, prompt);
    assert_eq!(
        sent.params.max_tokens,
        MAX_CONTEXT - prompt.len(),
        "chat's default max_tokens is lowered to the rest of the context"
    );
    assert_eq!(sent.params.logprobs, Some(2));
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt.len(), "completion_tokens": 8,
            "total_tokens": prompt.len() + 8})
    );
}

#[tokio::test]
async fn models_list_and_aliases() {
    let backend = TestBackend::new();
    let options = ServerOptions::default().with_alias("gpt-4o-mini", READY);
    let app = app(backend.clone() as Arc<dyn Backend>, options);
    let reply = get(&app, "/v1/models").await;
    assert_eq!(reply.status, StatusCode::OK);
    let v = reply.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [READY, BROKEN, SLOW, OUT_OF_MEMORY, STUCK, "gpt-4o-mini"]
    );
    for m in data {
        assert_eq!(m["object"], "model");
        assert_eq!(m["owned_by"], "ferry");
        assert_eq!(m["created"], CREATED);
        assert_eq!(m["max_model_len"], MAX_CONTEXT);
    }
    assert_eq!(data[5]["root"], READY);

    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": "gpt-4o-mini", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.json()["model"],
        "gpt-4o-mini",
        "the name sent is echoed"
    );
    assert_eq!(
        backend.last().model,
        READY,
        "the alias resolves to the served id"
    );
}

#[tokio::test]
async fn tokenize_and_detokenize() {
    let app = test_app(&TestBackend::new());
    let reply = post(&app, "/tokenize", json!({"model": READY, "prompt": "abc"})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!({"tokens": [BOS, 97, 98, 99], "count": 4, "max_model_len": MAX_CONTEXT})
    );
    let reply = post(
        &app,
        "/tokenize",
        json!({"model": READY, "prompt": "abc", "add_special_tokens": false}),
    )
    .await;
    assert_eq!(reply.json()["tokens"], json!([97, 98, 99]));
    let reply = post(
        &app,
        "/tokenize",
        json!({"model": READY, "prompt": "ab", "with_pieces": true}),
    )
    .await;
    assert_eq!(
        reply.json(),
        json!({"tokens": [{"id": BOS, "piece": "<s>"}, {"id": 97, "piece": "a"},
            {"id": 98, "piece": "b"}], "count": 3, "max_model_len": MAX_CONTEXT})
    );
    let reply = post(
        &app,
        "/detokenize",
        json!({"model": READY, "tokens": [104, 105]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"prompt": "hi"}));
    let reply = post(
        &app,
        "/detokenize",
        json!({"model": READY, "tokens": [99999]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["param"], "tokens");
}

#[tokio::test]
async fn health_reflects_loading() {
    let ready = test_app(&TestBackend::new());
    let reply = get(&ready, "/health").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["status"], "ok");

    let loading = test_app(&TestBackend::with_loading());
    let reply = get(&loading, "/health").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let err = &reply.json()["error"];
    assert_eq!(err["type"], "server_error");
    assert_eq!(err["code"], "model_not_ready");
    assert!(err["message"].as_str().unwrap().contains(LOADING));

    // The ready model still serves; the loading one answers 503.
    let body = json!({"model": READY, "prompt": "x", "max_tokens": 1});
    assert_eq!(
        post(&loading, "/v1/completions", body).await.status,
        StatusCode::OK
    );
    let body = json!({"model": LOADING, "prompt": "x", "max_tokens": 1});
    let reply = post(&loading, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error"]["code"], "model_not_ready");
}

#[tokio::test]
async fn api_key_protects_everything_but_health() {
    let backend = TestBackend::new();
    let app = app(
        backend as Arc<dyn Backend>,
        ServerOptions::default().with_api_key("sekrit"),
    );
    let reply = get(&app, "/v1/models").await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.json()["error"]["code"], "invalid_api_key");
    let request = axum::http::Request::builder()
        .uri("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sekrit")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::OK);
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
}

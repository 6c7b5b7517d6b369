//! Issue 15's API details on the real SmolLM2 model through the real HTTP stack: `n` choices
//! (the prompt prefilled once, its KV copied to the other choices, which then generate exactly
//! what independent requests would), `logit_bias` steering and banning tokens, `messages[].name`
//! accepted, and the async-openai client reading `n` choices and `GET /v1/models/{id}`.

use crate::real_model as common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use ferry::engine::worker::EngineOptions;
use ferry::engine::Backend;
use ferry::metrics::Metrics;
use ferry::server::{app, ServerOptions};

async fn post_to(backend: Arc<dyn Backend>, path: &str, body: Value) -> (StatusCode, String) {
    let router = app(backend, ServerOptions::default());
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let response = router.oneshot(request).await.expect("response");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

async fn post(path: &str, body: Value) -> (StatusCode, Value) {
    let (status, text) = post_to(common::backend(), path, body).await;
    (status, serde_json::from_str(&text).expect("json body"))
}

/// The texts of a response's choices, in index order (checking the indices).
fn texts(body: &Value, field: fn(&Value) -> &Value) -> Vec<String> {
    let choices = body["choices"].as_array().expect("choices");
    choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i, "{body}");
            field(c).as_str().expect("text").to_owned()
        })
        .collect()
}

fn completion(c: &Value) -> &Value {
    &c["text"]
}

fn message(c: &Value) -> &Value {
    &c["message"]["content"]
}

const PROMPT: &str = "The capital of France is";

#[tokio::test]
async fn greedy_choices_all_equal_the_single_answer() {
    let base =
        json!({"model": common::MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0});
    let (status, one) = post("/v1/completions", base.clone()).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    let mut three = base;
    three["n"] = json!(3);
    let (status, body) = post("/v1/completions", three).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let single = texts(&one, completion).remove(0);
    assert!(single.starts_with(" Paris"), "{single:?}");
    assert_eq!(texts(&body, completion), vec![single; 3]);
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], 5, "the prompt counts once");
    assert_eq!(
        usage["completion_tokens"].as_u64().unwrap(),
        3 * one["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        5 + usage["completion_tokens"].as_u64().unwrap()
    );
}

#[tokio::test]
async fn seeded_choices_equal_independent_requests_with_their_seeds() {
    let request = |seed: u64, n: usize| {
        json!({"model": common::MODEL, "max_tokens": 16, "temperature": 1.0, "seed": seed, "n": n,
               "messages": [{"role": "user", "content": "Write a word about the sea."}]})
    };
    let (status, body) = post("/v1/chat/completions", request(11, 3)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = texts(&body, message);
    for (i, text) in choices.iter().enumerate() {
        let (_, alone) = post("/v1/chat/completions", request(11 + i as u64, 1)).await;
        assert_eq!(
            text,
            &texts(&alone, message)[0],
            "choice {i} (from a copy of choice 0's KV) = a request with seed {}",
            11 + i
        );
    }
    assert!(
        choices.iter().any(|t| t != &choices[0]),
        "sampled choices differ: {choices:?}"
    );
}

#[tokio::test]
async fn the_prompt_is_prefilled_once_for_all_choices() {
    let metrics = Metrics::new();
    let engine = common::engine_with(EngineOptions {
        metrics: metrics.clone(),
        ..EngineOptions::default()
    });
    let body = json!({"model": common::MODEL, "prompt": PROMPT, "max_tokens": 4, "n": 4,
                      "temperature": 0.7, "seed": 3, "ignore_eos": true});
    let (status, text) = post_to(Arc::new(engine), "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(texts(&body, completion).len(), 4);
    assert_eq!(
        metrics.prompt_tokens(),
        5,
        "five prompt tokens computed for four choices"
    );
    assert_eq!(metrics.generated_tokens(), 16);
    assert_eq!(body["usage"]["completion_tokens"], 16);
}

#[tokio::test]
async fn streamed_choices_reassemble_by_index() {
    let base = json!({"model": common::MODEL, "max_tokens": 12, "temperature": 0,
                      "messages": [{"role": "user", "content": "Name a colour."}]});
    let (_, whole) = post("/v1/chat/completions", base.clone()).await;
    let expected = texts(&whole, message).remove(0);
    let mut streaming = base;
    streaming["n"] = json!(2);
    streaming["stream"] = json!(true);
    let (status, text) = post_to(common::backend(), "/v1/chat/completions", streaming).await;
    assert_eq!(status, StatusCode::OK);
    let mut got = vec![String::new(); 2];
    let mut finishes = [0; 2];
    for data in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).expect("chunk");
        let choice = &chunk["choices"][0];
        let index = choice["index"].as_u64().expect("index") as usize;
        got[index].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        finishes[index] += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(got, vec![expected; 2]);
    assert_eq!(finishes, [1, 1]);
}

#[tokio::test]
async fn logit_bias_steers_and_bans_tokens() {
    let engine = common::engine();
    let paris = engine.tokenize(common::MODEL, " Paris", false).unwrap();
    let london = engine.tokenize(common::MODEL, " London", false).unwrap();
    assert_eq!((paris.len(), london.len()), (1, 1), "single tokens");
    let request = |bias: Value| {
        json!({"model": common::MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0,
               "logit_bias": bias})
    };
    let (_, body) = post("/v1/completions", request(json!({}))).await;
    assert_eq!(texts(&body, completion), [" Paris"]);
    let (_, body) = post(
        "/v1/completions",
        request(json!({london[0].to_string(): 100})),
    )
    .await;
    assert_eq!(texts(&body, completion), [" London"]);
    let (_, body) = post(
        "/v1/completions",
        request(json!({paris[0].to_string(): -100})),
    )
    .await;
    let text = texts(&body, completion).remove(0);
    assert_ne!(text, " Paris", "a -100 bias bans the token");

    let (status, body) = post("/v1/completions", request(json!({"999999": 1}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "logit_bias", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("999999"));
}

#[tokio::test]
async fn more_choices_than_the_batch_is_a_400_naming_n() {
    let (status, body) = post(
        "/v1/completions",
        json!({"model": common::MODEL, "prompt": PROMPT, "max_tokens": 1, "n": 9}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        (&body["error"]["param"], &body["error"]["code"]),
        (&json!("n"), &json!("invalid_value")),
        "{body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_batch"));
}

#[tokio::test]
async fn a_message_name_is_accepted_and_this_template_ignores_it() {
    let request = |name: Option<&str>| {
        let mut message = json!({"role": "user", "content": "Say hi."});
        if let Some(name) = name {
            message["name"] = json!(name);
        }
        json!({"model": common::MODEL, "max_tokens": 6, "temperature": 0, "messages": [message],
               "response_format": {"type": "text"}})
    };
    let (status, named) = post("/v1/chat/completions", request(Some("alice"))).await;
    assert_eq!(status, StatusCode::OK, "{named}");
    let (_, plain) = post("/v1/chat/completions", request(None)).await;
    // The same token counts (the second may find the first's prompt in the prefix cache, which
    // only `prompt_tokens_details` tells).
    for count in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(named["usage"][count], plain["usage"][count], "{count}");
    }
    assert_eq!(texts(&named, message), texts(&plain, message));
    assert_eq!(named["choices"][0]["message"]["refusal"], Value::Null);
}

#[tokio::test]
async fn the_openai_client_reads_choices_and_one_model() {
    use async_openai::types::{
        ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
    };

    let (client, server) = common::openai_client().await;
    let model = client
        .models()
        .retrieve(common::MODEL)
        .await
        .expect("model");
    assert_eq!(
        (model.id.as_str(), model.owned_by.as_str()),
        (common::MODEL, "ferry")
    );
    assert!(client.models().retrieve("gpt-9").await.is_err());

    let user = ChatCompletionRequestUserMessageArgs::default()
        .content("Name a fruit.")
        .name("alice")
        .build()
        .expect("message");
    let chat = client
        .chat()
        .create(
            CreateChatCompletionRequestArgs::default()
                .model(common::MODEL)
                .messages([user.into()])
                .max_tokens(8_u32)
                .n(2)
                .seed(5)
                .temperature(0.8)
                .build()
                .expect("request"),
        )
        .await
        .expect("chat");
    assert_eq!(chat.choices.len(), 2);
    for (i, choice) in chat.choices.iter().enumerate() {
        assert_eq!(choice.index, i as u32);
        assert!(choice.message.refusal.is_none());
        assert!(choice
            .message
            .content
            .as_deref()
            .is_some_and(|t| !t.is_empty()));
    }
    let usage = chat.usage.expect("usage");
    assert_eq!(
        usage.total_tokens,
        usage.prompt_tokens + usage.completion_tokens
    );
    server.abort();
}

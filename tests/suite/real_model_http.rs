//! The real SmolLM2 model behind the real HTTP stack: in-process through `Router::oneshot`, and on a
//! loopback port through the async-openai client. Greedy answers, seeds, stop strings, streaming.

use crate::common as http;
use crate::real_model as common;

use axum::http::StatusCode;
use serde_json::{json, Value};

use ferry::server::{app, ServerOptions};

async fn post(path: &str, body: Value) -> (StatusCode, Value) {
    let router = app(common::backend(), ServerOptions::default());
    let reply = http::post(&router, path, body).await;
    (reply.status, reply.json())
}

async fn post_stream(path: &str, body: Value) -> Vec<Value> {
    let router = app(common::backend(), ServerOptions::default());
    let reply = http::post(&router, path, body).await;
    assert_eq!(reply.status, StatusCode::OK);
    let text = reply.text();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block
            .strip_prefix("data: ")
            .expect("every event is a data line");
        if data == "[DONE]" {
            break;
        }
        events.push(serde_json::from_str(data).expect("event json"));
    }
    events
}

fn completion_text(body: &Value) -> String {
    body["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string()
}

#[tokio::test]
async fn capital_of_france_is_paris() {
    let (status, body) = post(
        "/v1/completions",
        json!({"model": common::MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = completion_text(&body);
    assert!(
        text.starts_with(" Paris"),
        "greedy continuation was {text:?}"
    );
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn chat_returns_an_assistant_message() {
    let (status, body) = post(
        "/v1/chat/completions",
        json!({"model": common::MODEL, "max_tokens": 24, "temperature": 0,
               "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().expect("content");
    assert!(!content.trim().is_empty(), "empty assistant message");
    assert!(
        matches!(choice["finish_reason"].as_str(), Some("stop" | "length")),
        "{choice}"
    );
    // The 135M Q4_1 model answers this in French fragments; tests/suite/model_real.rs checks that the
    // same greedy tokens come out of candle-transformers' reference implementation.
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 20,
        "{body}"
    );
}

#[tokio::test]
async fn same_seed_same_text_other_seeds_differ() {
    let request = |seed: u64| {
        json!({"model": common::MODEL, "prompt": "Once upon a time", "max_tokens": 16,
               "temperature": 1.0, "seed": seed})
    };
    let (_, first) = post("/v1/completions", request(7)).await;
    let (_, again) = post("/v1/completions", request(7)).await;
    assert_eq!(completion_text(&first), completion_text(&again));
    let mut others = Vec::new();
    for seed in [8, 9, 10] {
        let (_, body) = post("/v1/completions", request(seed)).await;
        others.push(completion_text(&body));
    }
    assert!(
        others.iter().any(|t| *t != completion_text(&first)),
        "sampling at temperature 1 ignored the seed: {others:?}"
    );
}

#[tokio::test]
async fn stop_strings_end_the_text_and_are_never_emitted() {
    let base = json!({"model": common::MODEL, "prompt": "The capital of France is", "max_tokens": 24, "temperature": 0});
    let (_, full) = post("/v1/completions", base.clone()).await;
    let full_text = completion_text(&full);
    // Stop on a word from the middle of the greedy continuation, which spans token boundaries.
    let words: Vec<&str> = full_text.split_whitespace().collect();
    assert!(words.len() >= 4, "continuation too short: {full_text:?}");
    let stop = words[3];
    let expected = &full_text[..full_text.find(stop).expect("stop in text")];

    let mut with_stop = base.clone();
    with_stop["stop"] = json!(["zzzz-never", stop]);
    let (status, body) = post("/v1/completions", with_stop.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(completion_text(&body), expected);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    with_stop["stream"] = json!(true);
    let events = post_stream("/v1/completions", with_stop).await;
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(
        streamed, expected,
        "streaming must hold back partial stop strings"
    );
    let finishes: Vec<&Value> = events
        .iter()
        .filter(|e| !e["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1);
    assert_eq!(finishes[0]["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn streamed_chat_equals_the_non_streamed_answer() {
    let request = json!({"model": common::MODEL, "max_tokens": 16, "temperature": 0,
                          "messages": [{"role": "user", "content": "Name a colour."}]});
    let (_, whole) = post("/v1/chat/completions", request.clone()).await;
    let mut streaming = request;
    streaming["stream"] = json!(true);
    let events = post_stream("/v1/chat/completions", streaming).await;
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        streamed,
        whole["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
    );
}

#[tokio::test]
async fn logprobs_describe_the_greedy_choice() {
    let (status, body) = post(
        "/v1/completions",
        json!({"model": common::MODEL, "prompt": "The capital of France is", "max_tokens": 2,
               "temperature": 0, "logprobs": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let logprobs = &body["choices"][0]["logprobs"];
    let chosen = logprobs["token_logprobs"][0].as_f64().expect("logprob");
    let top = logprobs["top_logprobs"][0].as_object().expect("top map");
    assert_eq!(top.len(), 3);
    let best = top
        .values()
        .filter_map(Value::as_f64)
        .fold(f64::MIN, f64::max);
    assert!(
        (chosen - best).abs() < 1e-4,
        "greedy picks the most likely token"
    );
    assert!(chosen < 0.0);
    assert_eq!(logprobs["tokens"][0], " Paris");
}

#[tokio::test]
async fn openai_client_on_a_loopback_port() {
    use async_openai::types::{
        ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
        CreateCompletionRequestArgs,
    };

    let (client, server) = common::openai_client().await;
    let completion = client
        .completions()
        .create(
            CreateCompletionRequestArgs::default()
                .model(common::MODEL)
                .prompt("The capital of France is")
                .max_tokens(3_u32)
                .temperature(0.0)
                .build()
                .expect("request"),
        )
        .await
        .expect("completion");
    assert!(completion.choices[0].text.starts_with(" Paris"));

    let chat = client
        .chat()
        .create(
            CreateChatCompletionRequestArgs::default()
                .model(common::MODEL)
                .max_tokens(12_u32)
                .temperature(0.0)
                .messages([ChatCompletionRequestUserMessageArgs::default()
                    .content("Hello!")
                    .build()
                    .expect("message")
                    .into()])
                .build()
                .expect("request"),
        )
        .await
        .expect("chat");
    let content = chat.choices[0].message.content.clone().unwrap_or_default();
    assert!(!content.is_empty());
    assert!(chat.usage.expect("usage").completion_tokens > 0);
    server.abort();
}

/// Issue 24 item 12: OpenAI's chat message has `annotations` (`[]` when there are none), and
/// clients (llm-comply) check for it: in the whole message and in a stream's first delta, on a
/// loopback port.
#[tokio::test]
async fn chat_messages_carry_empty_annotations() {
    let server = http::Loopback::start(common::backend(), ServerOptions::default()).await;
    let client = reqwest::Client::new();
    let body = |stream: bool| {
        json!({"model": common::MODEL, "max_tokens": 4, "temperature": 0, "stream": stream,
               "messages": [{"role": "user", "content": "Hello!"}]})
    };
    let whole: Value = client
        .post(server.url("/v1/chat/completions"))
        .json(&body(false))
        .send()
        .await
        .expect("response")
        .json()
        .await
        .expect("JSON");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["annotations"], json!([]), "{whole}");
    let streamed = client
        .post(server.url("/v1/chat/completions"))
        .json(&body(true))
        .send()
        .await
        .expect("response")
        .text()
        .await
        .expect("text");
    let events = http::sse_events(&streamed);
    let first: Value = serde_json::from_str(&events[0]).expect("a chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": "", "annotations": []}),
        "{streamed}"
    );
    for event in &events[1..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).expect("a chunk");
        assert!(
            chunk["choices"][0]["delta"].get("annotations").is_none(),
            "only the first delta: {event}"
        );
    }
}

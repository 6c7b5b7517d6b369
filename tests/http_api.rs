//! HTTP API tests against a deterministic test backend (no model): response shapes, SSE framing
//! byte for byte, real OpenAI clients on a loopback port, and a table of bad requests.

mod common;

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
use ferry::engine::{Backend, ChatMessage, PromptInput};
use ferry::server::{app, ServerOptions};

fn test_app(backend: &Arc<TestBackend>) -> Router {
    app(backend.clone() as Arc<dyn Backend>, ServerOptions::default())
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
    assert_eq!(sent.prompt, PromptInput::Tokens(bytes_prompt("Say hi", true)));
    let p = &sent.params;
    assert_eq!(
        (p.max_tokens, p.logprobs, p.ignore_eos),
        (3, Some(2), true)
    );
    assert_eq!(p.stop, ["zz", "yy"]);
    let s = &p.sampling;
    assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p), (0.0, 0.9, 5, 0.05));
    assert_eq!(s.seed, Some(7));
    assert_eq!(
        (s.presence_penalty, s.frequency_penalty, s.repetition_penalty),
        (0.5, -0.5, 1.1)
    );
}

#[tokio::test]
async fn completion_defaults_and_token_prompts() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(&app, "/v1/completions", json!({"model": READY, "prompt": [[5, 6, 7]]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["choices"][0]["text"], "Hello, world! How are you?");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    let sent = backend.last();
    assert_eq!(sent.prompt, PromptInput::Tokens(vec![5, 6, 7]));
    assert_eq!(sent.params.max_tokens, 16, "OpenAI's default max_tokens");
    assert_eq!(sent.params.logprobs, None);
    assert_eq!(sent.params.sampling, ferry::engine::SamplingParams::default());
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
        json!({"role": "assistant", "content": "Hello, world! How are you?"})
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
        ChatMessage { role: "system".into(), content: "Be brief".into() },
        ChatMessage { role: "user".into(), content: "Hi".into() },
    ];
    let prompt = bytes_prompt(&render(&messages), false);
    let sent = backend.last();
    assert_eq!(sent.prompt, PromptInput::Tokens(prompt.clone()));
    assert_eq!(
        sent.params.max_tokens,
        MAX_CONTEXT - prompt.len(),
        "chat max_tokens defaults to the rest of the context"
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
    assert_eq!(ids, [READY, BROKEN, SLOW, "gpt-4o-mini"]);
    for m in data {
        assert_eq!(m["object"], "model");
        assert_eq!(m["owned_by"], "ferry");
        assert_eq!(m["created"], CREATED);
        assert_eq!(m["max_model_len"], MAX_CONTEXT);
    }
    assert_eq!(data[3]["root"], READY);

    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": "gpt-4o-mini", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["model"], "gpt-4o-mini", "the name sent is echoed");
    assert_eq!(backend.last().model, READY, "the alias resolves to the served id");
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
    let reply = post(&app, "/detokenize", json!({"model": READY, "tokens": [104, 105]})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"prompt": "hi"}));
    let reply = post(&app, "/detokenize", json!({"model": READY, "tokens": [99999]})).await;
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
    assert_eq!(post(&loading, "/v1/completions", body).await.status, StatusCode::OK);
    let body = json!({"model": LOADING, "prompt": "x", "max_tokens": 1});
    let reply = post(&loading, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error"]["code"], "model_not_ready");
}

/// Checks a stream's JSON chunks: same id/created/object/model everywhere, exactly one
/// finish_reason; returns the chunks.
fn check_chunks(events: &[String], object: &str, id_prefix: &str) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("not JSON: {e}")))
        .collect();
    assert!(!chunks.is_empty());
    let (id, created) = (&chunks[0]["id"], &chunks[0]["created"]);
    assert!(id.as_str().unwrap().starts_with(id_prefix));
    assert_recent(created);
    for c in &chunks {
        assert_eq!((&c["id"], &c["created"]), (id, created), "{c}");
        assert_eq!(c["object"], object);
        assert_eq!(c["model"], READY);
    }
    let finishes: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .filter(|choice| !choice["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1, "exactly one finish_reason");
    chunks
}

async fn stream_events(app: &Router, uri: &str, body: Value) -> Vec<String> {
    let reply = post(app, uri, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let ct = reply.headers[header::CONTENT_TYPE].to_str().unwrap();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    sse_events(&reply.text())
}

#[tokio::test]
async fn completion_stream_framing() {
    let app = test_app(&TestBackend::new());
    let body = json!({"model": READY, "prompt": "hi", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}});
    let events = stream_events(&app, "/v1/completions", body).await;
    let chunks = check_chunks(&events, "text_completion", "cmpl-");
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6})
    );
    let text: String = rest
        .iter()
        .map(|c| {
            assert!(c["usage"].is_null() && c.as_object().unwrap().contains_key("usage"));
            c["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, "Hello, world");
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "length");

    // Without include_usage no chunk carries a usage key.
    let body = json!({"model": READY, "prompt": "hi", "max_tokens": 2, "stream": true});
    let events = stream_events(&app, "/v1/completions", body).await;
    for c in check_chunks(&events, "text_completion", "cmpl-") {
        assert!(!c.as_object().unwrap().contains_key("usage"), "{c}");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn chat_stream_framing() {
    let app = test_app(&TestBackend::new());
    let body = json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}],
        "max_completion_tokens": 4, "stream": true, "stream_options": {"include_usage": true},
        "logprobs": true});
    let events = stream_events(&app, "/v1/chat/completions", body).await;
    let chunks = check_chunks(&events, "chat.completion.chunk", "chatcmpl-");
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 4);
    let mut text = String::new();
    for (i, c) in rest.iter().enumerate() {
        assert!(c["usage"].is_null());
        let delta = &c["choices"][0]["delta"];
        assert_eq!(delta.get("role").is_some(), i == 0, "role only in the first chunk");
        text.push_str(delta["content"].as_str().unwrap_or(""));
        if (1..=4).contains(&i) {
            let lp = &c["choices"][0]["logprobs"]["content"];
            assert_eq!(lp.as_array().unwrap().len(), 1, "{c}");
            assert_eq!(lp[0]["token"], delta["content"]);
        }
    }
    assert_eq!(text, "Hello, world!");
    assert_eq!(rest.last().unwrap()["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn mid_stream_failure_sends_error_then_done() {
    let app = test_app(&TestBackend::new());
    let body = json!({"model": BROKEN, "messages": [{"role": "user", "content": "Hi"}],
        "stream": true, "max_tokens": 4});
    let events = stream_events(&app, "/v1/chat/completions", body).await;
    assert_eq!(events.len(), 4, "{events:?}"); // role chunk, one token, error, [DONE]
    let err: Value = serde_json::from_str(&events[2]).unwrap();
    assert_eq!(err["error"]["type"], "server_error");
    assert_eq!(err["error"]["code"], "internal_error");
    assert!(err["error"]["message"].as_str().unwrap().contains("broke"));
    assert_eq!(events[3], "[DONE]");

    let body = json!({"model": BROKEN, "prompt": "x", "max_tokens": 4});
    let reply = post(&app, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(reply.json()["error"]["code"], "internal_error");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let body = json!({"model": SLOW, "prompt": "x", "max_tokens": 1000, "stream": true});
    let request = raw(Method::POST, "/v1/completions", Some("application/json"), body.to_string());
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: {"));
    assert!(!backend.cancelled.load(Ordering::SeqCst));
    drop(body);
    for _ in 0..200 {
        if backend.cancelled.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the engine never saw the receiver dropped");
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

mod openai_client {
    //! A real OpenAI client (async-openai 0.28) against the router on a loopback port.
    use super::*;
    use async_openai::config::OpenAIConfig;
    use async_openai::types::{
        ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
        CreateCompletionRequestArgs, FinishReason, Role,
    };
    use async_openai::Client;
    use futures::StreamExt;

    async fn serve() -> (Client<OpenAIConfig>, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = test_app(&TestBackend::new());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ferry::server::serve(listener, router, async move {
            let _ = stopped.await;
        }));
        let config = OpenAIConfig::new()
            .with_api_base(format!("http://{addr}/v1"))
            .with_api_key("x");
        (Client::with_config(config), stop)
    }

    #[tokio::test]
    async fn chat_and_completions_parse() {
        let (client, _stop) = serve().await;
        let message = ChatCompletionRequestUserMessageArgs::default()
            .content("Hi")
            .build()
            .unwrap();
        let request = CreateChatCompletionRequestArgs::default()
            .model(READY)
            .messages([message.into()])
            .max_completion_tokens(4u32)
            .temperature(0.0f32)
            .build()
            .unwrap();
        let response = client.chat().create(request.clone()).await.unwrap();
        assert_eq!(response.object, "chat.completion");
        assert_eq!(response.choices[0].message.role, Role::Assistant);
        assert_eq!(response.choices[0].message.content.as_deref(), Some("Hello, world!"));
        assert_eq!(response.choices[0].finish_reason, Some(FinishReason::Length));
        assert_eq!(response.usage.unwrap().completion_tokens, 4);

        let mut stream = client.chat().create_stream(request).await.unwrap();
        let mut text = String::new();
        let mut finishes = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            for choice in chunk.choices {
                text.push_str(choice.delta.content.as_deref().unwrap_or(""));
                finishes += usize::from(choice.finish_reason.is_some());
            }
        }
        assert_eq!((text.as_str(), finishes), ("Hello, world!", 1));

        let request = CreateCompletionRequestArgs::default()
            .model(READY)
            .prompt("Once")
            .max_tokens(2u32)
            .logprobs(1u8)
            .build()
            .unwrap();
        let response = client.completions().create(request.clone()).await.unwrap();
        assert_eq!(response.choices[0].text, "Hello,");
        let logprobs = response.choices[0].logprobs.as_ref().unwrap();
        assert_eq!(logprobs.tokens, ["Hello", ","]);
        assert_eq!(response.usage.unwrap().prompt_tokens, 5);

        let mut stream = client.completions().create_stream(request).await.unwrap();
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            for choice in chunk.unwrap().choices {
                text.push_str(&choice.text);
            }
        }
        assert_eq!(text, "Hello,");
    }
}

mod bad_requests {
    //! Each bad request gets the right status and error fields; afterwards the server is fine.
    use super::*;

    const LIMIT: usize = 4096;

    struct Case {
        name: &'static str,
        request: axum::http::Request<Body>,
        status: u16,
        kind: &'static str,
        param: Option<&'static str>,
        code: &'static str,
    }

    fn json_case(
        name: &'static str,
        uri: &str,
        body: Value,
        status: u16,
        param: Option<&'static str>,
        code: &'static str,
    ) -> Case {
        Case {
            name,
            request: raw(Method::POST, uri, Some("application/json"), body.to_string()),
            status,
            kind: if status >= 500 { "server_error" } else { "invalid_request_error" },
            param,
            code,
        }
    }

    fn chat(extra: Value) -> Value {
        let mut body = json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }

    fn cmpl(extra: Value) -> Value {
        let mut body = json!({"model": READY, "prompt": "Hi"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    }

    fn cases() -> Vec<Case> {
        const CHAT: &str = "/v1/chat/completions";
        const CMPL: &str = "/v1/completions";
        let raw_case = |name, request, status, code| Case {
            name,
            request,
            status,
            kind: "invalid_request_error",
            param: None,
            code,
        };
        let big = json!({"model": READY, "prompt": "x".repeat(LIMIT)}).to_string();
        vec![
            raw_case("malformed JSON", raw(Method::POST, CHAT, Some("application/json"), "{\"model\":"), 400, "invalid_json"),
            raw_case("not an object", raw(Method::POST, CHAT, Some("application/json"), "[1]"), 400, "invalid_json"),
            raw_case("no content type", raw(Method::POST, CHAT, None, chat(json!({})).to_string()), 415, "unsupported_media_type"),
            raw_case("text content type", raw(Method::POST, CMPL, Some("text/plain"), cmpl(json!({})).to_string()), 415, "unsupported_media_type"),
            raw_case("body over the limit", raw(Method::POST, CMPL, Some("application/json"), big), 413, "request_too_large"),
            raw_case("unknown route", raw(Method::GET, "/v1/nope", None, Body::empty()), 404, "not_found"),
            raw_case("wrong method", raw(Method::GET, CHAT, None, Body::empty()), 405, "method_not_allowed"),
            json_case("missing model", CHAT, json!({"messages": [{"role": "user", "content": "Hi"}]}), 400, Some("model"), "missing_required_parameter"),
            json_case("missing prompt", CMPL, json!({"model": READY}), 400, Some("prompt"), "missing_required_parameter"),
            json_case("unknown model", CHAT, chat(json!({"model": "gpt-9"})), 404, Some("model"), "model_not_found"),
            json_case("temperature 3", CHAT, chat(json!({"temperature": 3})), 400, Some("temperature"), "invalid_value"),
            json_case("top_p 0", CMPL, cmpl(json!({"top_p": 0})), 400, Some("top_p"), "invalid_value"),
            json_case("presence_penalty 2.5", CMPL, cmpl(json!({"presence_penalty": 2.5})), 400, Some("presence_penalty"), "invalid_value"),
            json_case("repetition_penalty 0", CMPL, cmpl(json!({"repetition_penalty": 0})), 400, Some("repetition_penalty"), "invalid_value"),
            json_case("logprobs 21", CMPL, cmpl(json!({"logprobs": 21})), 400, Some("logprobs"), "invalid_value"),
            json_case("top_logprobs 21", CHAT, chat(json!({"logprobs": true, "top_logprobs": 21})), 400, Some("top_logprobs"), "invalid_value"),
            json_case("top_logprobs without logprobs", CHAT, chat(json!({"top_logprobs": 2})), 400, Some("top_logprobs"), "invalid_value"),
            json_case("n 2", CHAT, chat(json!({"n": 2})), 400, Some("n"), "unsupported_value"),
            json_case("echo true", CMPL, cmpl(json!({"echo": true})), 400, Some("echo"), "unsupported_value"),
            json_case("batched prompts", CMPL, cmpl(json!({"prompt": ["a", "b"]})), 400, Some("prompt"), "unsupported_value"),
            json_case("tools", CHAT, chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})), 400, Some("tools"), "unsupported_parameter"),
            json_case("response_format", CHAT, chat(json!({"response_format": {"type": "json_object"}})), 400, Some("response_format"), "unsupported_parameter"),
            json_case("logit_bias", CHAT, chat(json!({"logit_bias": {"50256": -100}})), 400, Some("logit_bias"), "unsupported_parameter"),
            json_case("suffix", CMPL, cmpl(json!({"suffix": "!"})), 400, Some("suffix"), "unsupported_parameter"),
            json_case("unknown field", CHAT, chat(json!({"frobnicate": 1})), 400, Some("frobnicate"), "unknown_parameter"),
            json_case("unknown stream option", CHAT, chat(json!({"stream": true, "stream_options": {"x": true}})), 400, Some("stream_options.x"), "unknown_parameter"),
            json_case("messages empty", CHAT, chat(json!({"messages": []})), 400, Some("messages"), "invalid_value"),
            json_case("image part", CHAT, chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]})), 400, Some("messages[0].content[0].type"), "unsupported_value"),
            json_case("bad role", CHAT, chat(json!({"messages": [{"role": "robot", "content": "x"}]})), 400, Some("messages[0].role"), "invalid_value"),
            json_case("prompt too long", CMPL, cmpl(json!({"prompt": "x".repeat(MAX_CONTEXT)})), 400, Some("prompt"), "context_length_exceeded"),
            json_case("max_tokens over context", CHAT, chat(json!({"max_tokens": MAX_CONTEXT})), 400, Some("messages"), "context_length_exceeded"),
            json_case("max_tokens 0", CMPL, cmpl(json!({"max_tokens": 0})), 400, Some("max_tokens"), "invalid_value"),
            json_case("max_tokens -1", CHAT, chat(json!({"max_completion_tokens": -1})), 400, Some("max_completion_tokens"), "invalid_value"),
            json_case("temperature string", CHAT, chat(json!({"temperature": "hot"})), 400, Some("temperature"), "invalid_type"),
            json_case("messages string", CHAT, chat(json!({"messages": "Hi"})), 400, Some("messages"), "invalid_type"),
            json_case("stream string", CHAT, chat(json!({"stream": "yes"})), 400, Some("stream"), "invalid_type"),
            json_case("max_tokens float", CMPL, cmpl(json!({"max_tokens": 1.5})), 400, Some("max_tokens"), "invalid_type"),
            json_case("prompt number", CMPL, cmpl(json!({"prompt": 5})), 400, Some("prompt"), "invalid_type"),
            json_case("content number", CHAT, chat(json!({"messages": [{"role": "user", "content": 5}]})), 400, Some("messages[0].content"), "invalid_type"),
            json_case("stop non-string", CMPL, cmpl(json!({"stop": ["a", 1]})), 400, Some("stop[1]"), "invalid_type"),
            json_case("tokenize unknown model", "/tokenize", json!({"model": "nope", "prompt": "x"}), 404, Some("model"), "model_not_found"),
        ]
    }

    #[tokio::test]
    async fn each_gets_its_error_and_the_server_survives() {
        let backend = TestBackend::new();
        let app = app(
            backend.clone() as Arc<dyn Backend>,
            ServerOptions::default().with_body_limit(LIMIT),
        );
        for case in cases() {
            let reply = send(&app, case.request).await;
            let v = reply.json();
            let err = &v["error"];
            let got = (
                reply.status.as_u16(),
                err["type"].as_str(),
                err["param"].as_str(),
                err["code"].as_str(),
            );
            let want = (case.status, Some(case.kind), case.param, Some(case.code));
            assert_eq!(got, want, "{}: {v}", case.name);
            assert!(
                err["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{}: message",
                case.name
            );
            let keys: Vec<&String> = err.as_object().unwrap().keys().collect();
            assert_eq!(keys.len(), 4, "{}: {keys:?}", case.name);
        }
        assert!(backend.submitted.lock().unwrap().is_empty(), "nothing reached the engine");
        assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
        let reply = post(&app, "/v1/chat/completions", chat(json!({"max_tokens": 2}))).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json()["choices"][0]["message"]["content"], "Hello,");
    }
}

//! Each bad request gets the right status and error fields; afterwards the server is fine.

use axum::http::Request;

use super::*;

const LIMIT: usize = 4096;

struct Case {
    name: &'static str,
    request: Request<Body>,
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
        request: raw(
            Method::POST,
            uri,
            Some("application/json"),
            body.to_string(),
        ),
        status,
        kind: if status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        },
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

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";

fn raw_case(name: &'static str, request: Request<Body>, status: u16, code: &'static str) -> Case {
    Case {
        name,
        request,
        status,
        kind: "invalid_request_error",
        param: None,
        code,
    }
}

/// A browser's CORS preflight for a chat completion from `origin`.
pub(super) fn preflight(origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri(CHAT)
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization,content-type",
        )
        .body(Body::empty())
        .unwrap()
}

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let json = "application/json";
    let big = json!({"model": READY, "prompt": "x".repeat(LIMIT)}).to_string();
    let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]);
    let tool = json!([{"type": "function", "function": {"name": "f"}}]);
    vec![
        raw_case("malformed JSON", raw(Method::POST, CHAT, Some(json), "{\"model\":"), 400, "invalid_json"),
        raw_case("not an object", raw(Method::POST, CHAT, Some(json), "[1]"), 400, "invalid_json"),
        raw_case("no content type", raw(Method::POST, CHAT, None, chat(json!({})).to_string()), 415, "unsupported_media_type"),
        raw_case("text content type", raw(Method::POST, CMPL, Some("text/plain"), cmpl(json!({})).to_string()), 415, "unsupported_media_type"),
        raw_case("body over the limit", raw(Method::POST, CMPL, Some(json), big), 413, "request_too_large"),
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
        json_case("top_logprobs alone", CHAT, chat(json!({"top_logprobs": 2})), 400, Some("top_logprobs"), "invalid_value"),
        json_case("n 0", CHAT, chat(json!({"n": 0})), 400, Some("n"), "invalid_value"),
        json_case("n 129", CMPL, cmpl(json!({"n": 129})), 400, Some("n"), "invalid_value"),
        json_case("n string", CMPL, cmpl(json!({"n": "2"})), 400, Some("n"), "invalid_type"),
        json_case("echo true", CMPL, cmpl(json!({"echo": true})), 400, Some("echo"), "unsupported_value"),
        json_case("batched prompts", CMPL, cmpl(json!({"prompt": ["a", "b"]})), 400, Some("prompt"), "unsupported_value"),
        json_case("functions (deprecated)", CHAT, chat(json!({"functions": tool})), 400, Some("functions"), "unsupported_parameter"),
        json_case("tool_choice required without tools", CHAT, chat(json!({"tool_choice": "required"})), 400, Some("tool_choice"), "invalid_value"),
        json_case("tool without a name", CHAT, chat(json!({"tools": [{"type": "function", "function": {}}]})), 400, Some("tools[0].function.name"), "missing_required_parameter"),
        json_case("response_format json_object", CHAT, chat(json!({"response_format": {"type": "json_object"}})), 400, Some("response_format"), "invalid_value"),
        json_case("response_format json_schema", CHAT, chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}})), 400, Some("response_format"), "invalid_value"),
        json_case("response_format yaml", CHAT, chat(json!({"response_format": {"type": "yaml"}})), 400, Some("response_format.type"), "invalid_value"),
        json_case("response_format on completions", CMPL, cmpl(json!({"response_format": {"type": "text"}})), 400, Some("response_format"), "unsupported_parameter"),
        json_case("logit_bias key not a token id", CHAT, chat(json!({"logit_bias": {"hello": -100}})), 400, Some("logit_bias"), "invalid_value"),
        json_case("logit_bias value 101", CMPL, cmpl(json!({"logit_bias": {"5": 101}})), 400, Some("logit_bias"), "invalid_value"),
        json_case("logit_bias value string", CHAT, chat(json!({"logit_bias": {"5": "up"}})), 400, Some("logit_bias.5"), "invalid_type"),
        json_case("logit_bias array", CMPL, cmpl(json!({"logit_bias": [5]})), 400, Some("logit_bias"), "invalid_type"),
        json_case("name number", CHAT, chat(json!({"messages": [{"role": "user", "content": "x", "name": 5}]})), 400, Some("messages[0].name"), "invalid_type"),
        json_case("suffix", CMPL, cmpl(json!({"suffix": "!"})), 400, Some("suffix"), "unsupported_parameter"),
        json_case("min_tokens", CHAT, chat(json!({"min_tokens": 4})), 400, Some("min_tokens"), "unsupported_parameter"),
        json_case("template kwargs replace messages", CHAT, chat(json!({"chat_template_kwargs": {"messages": []}})), 400, Some("chat_template_kwargs"), "invalid_value"),
        json_case("template kwargs not an object", CHAT, chat(json!({"chat_template_kwargs": true})), 400, Some("chat_template_kwargs"), "invalid_type"),
        json_case("reasoning_effort extreme", CHAT, chat(json!({"reasoning_effort": "extreme"})), 400, Some("reasoning_effort"), "invalid_value"),
        json_case("verbosity loud", CHAT, chat(json!({"verbosity": "loud"})), 400, Some("verbosity"), "invalid_value"),
        json_case("audio modality", CHAT, chat(json!({"modalities": ["text", "audio"]})), 400, Some("modalities"), "unsupported_value"),
        json_case("unknown field", CHAT, chat(json!({"frobnicate": 1})), 400, Some("frobnicate"), "unknown_parameter"),
        json_case("unknown stream option", CHAT, chat(json!({"stream": true, "stream_options": {"x": true}})), 400, Some("stream_options.x"), "unknown_parameter"),
        json_case("messages empty", CHAT, chat(json!({"messages": []})), 400, Some("messages"), "invalid_value"),
        json_case("image part", CHAT, chat(json!({"messages": image})), 400, Some("messages[0].content[0].type"), "unsupported_value"),
        json_case("bad role", CHAT, chat(json!({"messages": [{"role": "robot", "content": "x"}]})), 400, Some("messages[0].role"), "invalid_value"),
        json_case("prompt too long", CMPL, cmpl(json!({"prompt": "x".repeat(MAX_CONTEXT)})), 400, Some("prompt"), "context_length_exceeded"),
        json_case("max_tokens over context", CHAT, chat(json!({"max_tokens": MAX_CONTEXT})), 400, Some("messages"), "context_length_exceeded"),
        json_case("max_tokens 0", CMPL, cmpl(json!({"max_tokens": 0})), 400, Some("max_tokens"), "invalid_value"),
        json_case("max_completion_tokens -1", CHAT, chat(json!({"max_completion_tokens": -1})), 400, Some("max_completion_tokens"), "invalid_value"),
        json_case("temperature string", CHAT, chat(json!({"temperature": "hot"})), 400, Some("temperature"), "invalid_type"),
        json_case("messages string", CHAT, chat(json!({"messages": "Hi"})), 400, Some("messages"), "invalid_type"),
        json_case("stream string", CHAT, chat(json!({"stream": "yes"})), 400, Some("stream"), "invalid_type"),
        json_case("max_tokens float", CMPL, cmpl(json!({"max_tokens": 1.5})), 400, Some("max_tokens"), "invalid_type"),
        json_case("prompt number", CMPL, cmpl(json!({"prompt": 5})), 400, Some("prompt"), "invalid_type"),
        json_case("content number", CHAT, chat(json!({"messages": [{"role": "user", "content": 5}]})), 400, Some("messages[0].content"), "invalid_type"),
        json_case("stop non-string", CMPL, cmpl(json!({"stop": ["a", 1]})), 400, Some("stop[1]"), "invalid_type"),
        json_case("tokenize unknown model", "/tokenize", json!({"model": "nope", "prompt": "x"}), 404, Some("model"), "model_not_found"),
        Case { param: Some("model"), ..raw_case("retrieve unknown model", raw(Method::GET, "/v1/models/gpt-9", None, Body::empty()), 404, "model_not_found") },
        raw_case("CORS preflight while CORS is off", preflight("https://app.example"), 405, "method_not_allowed"),
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
    assert!(
        backend.submitted.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    assert_eq!(get(&app, "/health").await.status, StatusCode::OK);
    let reply = post(&app, "/v1/chat/completions", chat(json!({"max_tokens": 2}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["choices"][0]["message"]["content"], "Hello,");
}

//! What a request passes before any work: the `Host` allow-list and the API key (before
//! routing), admission (the prompt's length in characters and the engine's capacity checked
//! before the tokeniser is called), the `max_tokens` settings, and the shape rules (integral
//! floats, accepted-and-ignored fields, `/health` with a failed model).

use super::*;

fn with_key(options: ServerOptions) -> Router {
    app(
        TestBackend::new() as Arc<dyn Backend>,
        options.with_api_key("sekrit"),
    )
}

fn request(method: Method, uri: &str, headers: &[(&str, &str)]) -> axum::http::Request<Body> {
    let mut builder = axum::http::Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::empty()).unwrap()
}

async fn status(app: &Router, method: Method, uri: &str, headers: &[(&str, &str)]) -> u16 {
    send(app, request(method, uri, headers))
        .await
        .status
        .as_u16()
}

#[tokio::test]
async fn the_key_is_checked_before_routing_with_the_scheme_in_any_case() {
    let app = with_key(ServerOptions::default());
    let bearer = |v: &'static str| [("authorization", v)];
    // Unknown routes and wrong methods do not reveal themselves without the key.
    assert_eq!(status(&app, Method::GET, "/v1/nope", &[]).await, 401);
    assert_eq!(
        status(&app, Method::GET, "/v1/chat/completions", &[]).await,
        401
    );
    assert_eq!(status(&app, Method::DELETE, "/tokenize", &[]).await, 401);
    let reply = send(&app, request(Method::GET, "/v1/nope", &[])).await;
    assert_eq!(reply.json()["error"]["type"], "authentication_error");
    // With it, routing answers as usual.
    assert_eq!(
        status(&app, Method::GET, "/v1/nope", &bearer("Bearer sekrit")).await,
        404
    );
    assert_eq!(
        status(
            &app,
            Method::GET,
            "/v1/chat/completions",
            &bearer("Bearer sekrit")
        )
        .await,
        405
    );
    for good in [
        "Bearer sekrit",
        "bearer sekrit",
        "BEARER sekrit",
        "Bearer  sekrit ",
    ] {
        assert_eq!(
            status(&app, Method::GET, "/v1/models", &bearer(good)).await,
            200,
            "{good}"
        );
    }
    for bad in [
        "Bearer sekri",
        "Bearer sekritt",
        "Basic sekrit",
        "sekrit",
        "Bearer",
    ] {
        assert_eq!(
            status(&app, Method::GET, "/v1/models", &bearer(bad)).await,
            401,
            "{bad}"
        );
    }
    assert_eq!(status(&app, Method::GET, "/health", &[]).await, 200);
}

#[tokio::test]
async fn metrics_is_public_unless_metrics_auth() {
    let public = with_key(ServerOptions::default());
    assert_eq!(status(&public, Method::GET, "/metrics", &[]).await, 200);
    let guarded = with_key(ServerOptions {
        metrics_auth: true,
        ..ServerOptions::default()
    });
    assert_eq!(status(&guarded, Method::GET, "/metrics", &[]).await, 401);
    let key = [("authorization", "Bearer sekrit")];
    assert_eq!(status(&guarded, Method::GET, "/metrics", &key).await, 200);
}

#[tokio::test]
async fn a_key_less_loopback_server_answers_only_to_loopback_host_names() {
    let options = ServerOptions {
        allowed_hosts: ferry::server::options::default_allowed_hosts("127.0.0.1", false, &[]),
        ..ServerOptions::default()
    };
    let app = app(TestBackend::new() as Arc<dyn Backend>, options);
    for host in [
        "localhost:8080",
        "127.0.0.1:8080",
        "[::1]:8080",
        "LOCALHOST",
        "localhost.",
    ] {
        assert_eq!(
            status(&app, Method::GET, "/v1/models", &[("host", host)]).await,
            200,
            "{host}"
        );
    }
    // A DNS name an attacker's page resolves to 127.0.0.1 (rebinding) is refused.
    for host in [
        "evil.example",
        "evil.example:8080",
        "localhost.evil.example",
    ] {
        let reply = send(&app, request(Method::GET, "/v1/models", &[("host", host)])).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{host}");
        assert_eq!(reply.json()["error"]["code"], "host_not_allowed");
    }
    assert_eq!(
        status(&app, Method::GET, "/health", &[("host", "evil.example")]).await,
        200
    );
}

#[tokio::test]
async fn a_10_mb_prompt_is_rejected_before_the_tokenizer_is_called() {
    let backend = TestBackend::new();
    let app = app(
        backend.clone() as Arc<dyn Backend>,
        ServerOptions::default(),
    );
    let huge = "a".repeat(10 * 1024 * 1024);
    let bodies = [
        (
            "/v1/completions",
            json!({"model": READY, "prompt": huge}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"model": READY, "messages": [{"role": "user", "content": huge}]}),
            "messages",
        ),
        (
            "/tokenize",
            json!({"model": READY, "prompt": huge}),
            "prompt",
        ),
        (
            "/v1/embeddings",
            json!({"model": READY, "input": ["short", huge]}),
            "input",
        ),
    ];
    for (uri, body, param) in bodies {
        let reply = post(&app, uri, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{uri}");
        let err = &reply.json()["error"];
        assert_eq!(err["code"], "context_length_exceeded", "{uri}");
        assert_eq!(err["param"], param, "{uri}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("10485760 characters"),
            "{err}"
        );
    }
    assert_eq!(
        backend.tokenize_calls.load(Ordering::SeqCst),
        0,
        "the tokenizer was called"
    );
    // Just under the bound, the tokenizer runs (and the token count decides).
    let edge = "a".repeat(MAX_CONTEXT * ferry::server::admission::MAX_CHARS_PER_TOKEN);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": edge}),
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(backend.tokenize_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn tool_call_arguments_count_toward_the_character_bound() {
    let backend = TestBackend::new();
    let app = app(
        backend.clone() as Arc<dyn Backend>,
        ServerOptions::default(),
    );
    // A short conversation whose assistant turn called a tool with a 10 MB argument.
    let arguments = json!({"text": "a".repeat(10 * 1024 * 1024)}).to_string();
    let messages = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "echo", "arguments": arguments}
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    ]);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": messages}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let err = &reply.json()["error"];
    assert_eq!(err["code"], "context_length_exceeded", "{err}");
    assert_eq!(err["param"], "messages", "{err}");
    assert_eq!(
        backend.tokenize_calls.load(Ordering::SeqCst),
        0,
        "the tokenizer was called"
    );
}

/// `chat_template_kwargs` reach the template, so their text counts toward the character bound
/// too: a 10 MB variable is refused before the tokenizer runs.
#[tokio::test]
async fn template_variables_count_toward_the_character_bound() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"context": "a".repeat(10 * 1024 * 1024)}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.json()["error"]["code"],
        "context_length_exceeded",
        "{}",
        reply.text()
    );
    assert_eq!(backend.tokenize_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_overloaded_engine_refuses_before_tokenizing() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    backend.overloaded.store(true, Ordering::SeqCst);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "hello"}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error"]["code"], "overloaded");
    assert_eq!(reply.headers[header::RETRY_AFTER], "1");
    let chat = json!({"model": READY, "messages": [{"role": "user", "content": "hello"}]});
    let reply = post(&app, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(backend.tokenize_calls.load(Ordering::SeqCst), 0);
    backend.overloaded.store(false, Ordering::SeqCst);
    assert_eq!(
        post(&app, "/v1/chat/completions", chat).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn max_tokens_default_and_limit_are_operator_settings() {
    let backend = TestBackend::new();
    let options = ServerOptions {
        default_max_tokens: 5,
        max_tokens_limit: Some(20),
        ..ServerOptions::default()
    };
    let app = app(backend.clone() as Arc<dyn Backend>, options);
    let chat = |extra: Value| {
        let mut body = json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // No max_tokens, or null: the operator's default.
    for body in [chat(json!({})), chat(json!({"max_tokens": null}))] {
        assert_eq!(
            post(&app, "/v1/chat/completions", body).await.status,
            StatusCode::OK
        );
        assert_eq!(backend.last().params.max_tokens, 5);
    }
    assert_eq!(
        post(
            &app,
            "/v1/chat/completions",
            chat(json!({"max_tokens": 20}))
        )
        .await
        .status,
        StatusCode::OK
    );
    let reply = post(
        &app,
        "/v1/chat/completions",
        chat(json!({"max_completion_tokens": 21})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let err = &reply.json()["error"];
    assert_eq!(
        (err["param"].as_str(), err["code"].as_str()),
        (Some("max_completion_tokens"), Some("invalid_value"))
    );
    assert!(err["message"]
        .as_str()
        .unwrap()
        .contains("server.max_tokens_limit"));
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "x", "max_tokens": 21}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // The built-in default is finite too.
    assert_eq!(
        ServerOptions::default().default_max_tokens,
        ferry::server::options::DEFAULT_MAX_TOKENS
    );
}

#[tokio::test]
async fn integral_floats_count_as_integers() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": [104.0, 105.0], "max_tokens": 2.0, "n": 1.0,
            "seed": 7.0, "logprobs": 1.0, "top_k": 5.0}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let sent = backend.last();
    assert_eq!(sent.prompt, vec![104, 105]);
    assert_eq!((sent.params.max_tokens, sent.params.logprobs), (2, Some(1)));
    assert_eq!(
        (sent.params.sampling.seed, sent.params.sampling.top_k),
        (Some(7), 5)
    );
    let reply = post(&app, "/tokenize", json!({"model": READY, "prompt": "x"})).await;
    assert_eq!(reply.status, StatusCode::OK);
    let reply = post(
        &app,
        "/detokenize",
        json!({"model": READY, "tokens": [104.0, 105.0]}),
    )
    .await;
    assert_eq!(reply.json()["prompt"], "hi");
    for bad in [json!([104.5]), json!(2.5)] {
        let body = if bad.is_array() {
            json!({"model": READY, "prompt": bad})
        } else {
            json!({"model": READY, "prompt": "x", "max_tokens": bad})
        };
        let reply = post(&app, "/v1/completions", body).await;
        assert_eq!(reply.json()["error"]["code"], "invalid_type", "{bad}");
    }
}

#[tokio::test]
async fn fields_that_only_steer_openais_service_are_accepted_and_ignored() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let ignored = json!({"prompt_cache_key": "k1", "safety_identifier": "user-1",
        "service_tier": "auto", "user": "u"});
    let mut chat = json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1});
    let mut cmpl = json!({"model": READY, "prompt": "Hi", "max_tokens": 1});
    for (k, v) in ignored.as_object().unwrap() {
        chat[k] = v.clone();
        cmpl[k] = v.clone();
    }
    assert_eq!(
        post(&app, "/v1/chat/completions", chat).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&app, "/v1/completions", cmpl).await.status,
        StatusCode::OK
    );
    // Still typed: an ignored field with a wrong type is a 400 naming it.
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "Hi", "prompt_cache_key": 5}),
    )
    .await;
    assert_eq!(reply.json()["error"]["param"], "prompt_cache_key");
}

#[tokio::test]
async fn health_is_not_ok_while_a_configured_model_failed_to_load() {
    let app = test_app(&TestBackend::with_failed());
    let reply = get(&app, "/health").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["error"]["code"], "model_failed");
    assert!(reply.text().contains(LOADING));
}

#[tokio::test]
async fn error_texts_name_the_setting_or_the_prompt() {
    let app = app(
        TestBackend::new() as Arc<dyn Backend>,
        ServerOptions::default().with_body_limit(100),
    );
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "x".repeat(200)}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        reply.text().contains("server.body_limit"),
        "{}",
        reply.text()
    );
    let app = test_app(&TestBackend::new());
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "x", "max_tokens": MAX_CONTEXT}),
    )
    .await;
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("in the prompt") && !message.contains("messages"),
        "{message}"
    );
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [{"role": "user", "content": "x"}], "max_tokens": MAX_CONTEXT}),
    )
    .await;
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("in the messages"), "{message}");
}

//! The shape details of issue 15: `n` choices (index, usage counting the prompt once),
//! `GET /v1/models/{id}`, CORS (off by default, preflights answered when on), and the
//! request fields that now reach the engine (`logit_bias`, `messages[].name`,
//! `response_format: text`).

use super::bad_requests::preflight;
use super::*;

const ORIGIN: &str = "https://app.example";

#[tokio::test]
async fn retrieve_one_model_or_alias() {
    let backend = TestBackend::new();
    let options = ServerOptions::default()
        .with_alias("gpt-4o-mini", READY)
        .with_alias("org/name", READY);
    let app = app(backend as Arc<dyn Backend>, options);
    let listed = get(&app, "/v1/models").await.json();
    for id in [READY, "gpt-4o-mini", "org/name"] {
        let reply = get(&app, &format!("/v1/models/{id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{id}: {}", reply.text());
        let v = reply.json();
        let in_list = listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .unwrap();
        assert_eq!(&v, in_list, "the same object as in the list");
        assert_eq!(
            (&v["object"], &v["owned_by"], &v["created"]),
            (&json!("model"), &json!("ferry"), &json!(CREATED))
        );
    }
    let reply = get(&app, "/v1/models/gpt-9").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let err = &reply.json()["error"];
    assert_eq!(
        (&err["code"], &err["param"], &err["type"]),
        (
            &json!("model_not_found"),
            &json!("model"),
            &json!("invalid_request_error")
        )
    );
    assert!(err["message"].as_str().unwrap().contains("gpt-9"));
}

#[tokio::test]
async fn cors_preflights_are_answered_for_allowed_origins_only() {
    let backend = TestBackend::new();
    let options = ServerOptions {
        cors_origins: vec![ORIGIN.into()],
        ..ServerOptions::default().with_api_key("sk-test")
    };
    let app = app(backend as Arc<dyn Backend>, options);
    let allow_origin = |reply: &Reply| {
        reply
            .headers
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    // The preflight carries no key and still gets its answer.
    let reply = send(&app, preflight(ORIGIN)).await;
    assert!(reply.status.is_success(), "{}", reply.status);
    assert_eq!(allow_origin(&reply).as_deref(), Some(ORIGIN));
    let methods = reply.headers[header::ACCESS_CONTROL_ALLOW_METHODS]
        .to_str()
        .unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let headers = reply.headers[header::ACCESS_CONTROL_ALLOW_HEADERS]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        headers.contains("authorization") || headers == "*",
        "{headers}"
    );
    // Another origin gets no permission.
    let reply = send(&app, preflight("https://evil.example")).await;
    assert_eq!(allow_origin(&reply), None);
    // A real request still needs the key; its error is readable by the allowed origin.
    let request = |key: Option<&str>| {
        let mut builder = axum::http::Request::builder()
            .method(Method::POST)
            .uri("/v1/completions")
            .header(header::ORIGIN, ORIGIN)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let body = json!({"model": READY, "prompt": "x", "max_tokens": 1}).to_string();
        builder.body(Body::from(body)).unwrap()
    };
    let reply = send(&app, request(None)).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(allow_origin(&reply).as_deref(), Some(ORIGIN));
    let reply = send(&app, request(Some("sk-test"))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(allow_origin(&reply).as_deref(), Some(ORIGIN));
    let exposed = reply.headers[header::ACCESS_CONTROL_EXPOSE_HEADERS]
        .to_str()
        .unwrap();
    assert!(exposed.contains("x-request-id"), "{exposed}");

    // `*` allows any origin.
    let any = ServerOptions {
        cors_origins: vec!["*".into()],
        ..ServerOptions::default()
    };
    let app = ferry::server::app(TestBackend::new() as Arc<dyn Backend>, any);
    let reply = send(&app, preflight("https://anything.example")).await;
    assert!(reply.status.is_success(), "{}", reply.status);
    assert_eq!(allow_origin(&reply).as_deref(), Some("*"));
    // Off by default: no CORS headers at all.
    let app = test_app(&TestBackend::new());
    let reply = send(&app, request(None)).await;
    assert_eq!(allow_origin(&reply), None);
}

#[tokio::test]
async fn n_choices_count_the_prompt_once() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}],
            "n": 3, "seed": 7, "logprobs": true}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["message"]["content"], "Hello, world! How are you?");
        assert_eq!(choice["message"]["refusal"], Value::Null);
        assert_eq!(choice["finish_reason"], "stop");
        assert!(choice["logprobs"]["content"].is_array());
    }
    let submitted = backend.submitted.lock().unwrap().clone();
    assert_eq!(submitted.len(), 3);
    let prompt = submitted[0].prompt.len();
    let seeds: Vec<Option<u64>> = submitted.iter().map(|r| r.params.sampling.seed).collect();
    assert_eq!(
        seeds,
        [Some(7), Some(8), Some(9)],
        "each choice its own seed"
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": 3 * 8,
            "total_tokens": prompt + 3 * 8}),
        "the prompt counts once"
    );

    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "Once", "n": 2, "max_tokens": 2, "logprobs": 0}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let v = reply.json();
    let texts: Vec<(&Value, &Value)> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (&c["index"], &c["text"]))
        .collect();
    assert_eq!(
        texts,
        [(&json!(0), &json!("Hello,")), (&json!(1), &json!("Hello,"))]
    );
    assert_eq!(v["choices"][1]["logprobs"]["text_offset"], json!([0, 5]));
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

/// Every chunk of a stream, parsed (the `[DONE]` sentinel checked and dropped).
fn chunks(reply: &Reply) -> Vec<Value> {
    let mut events = sse_events(&reply.text());
    assert_eq!(events.pop().as_deref(), Some("[DONE]"));
    events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[tokio::test]
async fn streamed_choices_carry_their_index() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "messages": [{"role": "user", "content": "Hi"}], "n": 2,
            "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let events = chunks(&reply);
    let (last, with_choices) = events.split_last().unwrap();
    let prompt = backend.last().prompt.len();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": 16, "total_tokens": prompt + 16})
    );
    for index in 0..2 {
        let mine: Vec<&Value> = with_choices
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert_eq!(mine[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = mine
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, world! How are you?", "choice {index}");
        let finishes = mine
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .count();
        assert_eq!(finishes, 1, "choice {index}");
        assert!(mine.iter().all(|c| c["usage"].is_null()));
    }
    assert!(with_choices
        .iter()
        .all(|c| c["choices"].as_array().unwrap().len() == 1));

    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "Once", "n": 3, "max_tokens": 3, "stream": true}),
    )
    .await;
    let events = chunks(&reply);
    for index in 0..3 {
        let text: String = events
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(text, "Hello, world", "choice {index}");
    }
    assert!(events.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn logit_bias_name_and_text_format_reach_the_engine() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/chat/completions",
        json!({"model": READY, "response_format": {"type": "text"},
            "logit_bias": {"72": -100, " 44 ": 2.5},
            "messages": [{"role": "user", "content": "Hi", "name": "alice"}]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let mut bias = backend.last().params.sampling.logit_bias;
    bias.sort_by_key(|&(id, _)| id);
    assert_eq!(bias, [(44, 2.5), (72, -100.0)]);
    let reply = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "x", "max_tokens": 1, "logit_bias": {}}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(backend.last().params.sampling.logit_bias.is_empty());
}

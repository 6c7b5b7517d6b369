//! SSE framing byte for byte, mid-stream failures and cancellation on disconnect.

use super::*;

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
    assert_eq!(
        rest.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

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
        json!({"role": "assistant", "content": "", "annotations": []})
    );
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 4);
    let mut text = String::new();
    for (i, c) in rest.iter().enumerate() {
        assert!(c["usage"].is_null());
        let delta = &c["choices"][0]["delta"];
        assert_eq!(
            delta.get("role").is_some(),
            i == 0,
            "role only in the first chunk"
        );
        text.push_str(delta["content"].as_str().unwrap_or(""));
        if (1..=4).contains(&i) {
            let lp = &c["choices"][0]["logprobs"]["content"];
            assert_eq!(lp.as_array().unwrap().len(), 1, "{c}");
            assert_eq!(lp[0]["token"], delta["content"]);
        }
    }
    assert_eq!(text, "Hello, world!");
    assert_eq!(
        rest.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
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
async fn out_of_device_memory_is_a_503_and_the_server_goes_on() {
    let app = test_app(&TestBackend::new());
    let body = json!({"model": OUT_OF_MEMORY, "prompt": "x", "max_tokens": 4});
    let reply = post(&app, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let err = reply.json();
    assert_eq!(err["error"]["code"], "out_of_memory");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("out of memory"));
    assert!(reply.headers.contains_key(header::RETRY_AFTER));

    let body = json!({"model": READY, "prompt": "x", "max_tokens": 2});
    let reply = post(&app, "/v1/completions", body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["choices"][0]["text"], "Hello,");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let body = json!({"model": SLOW, "prompt": "x", "max_tokens": 50, "stream": true});
    let request = raw(
        Method::POST,
        "/v1/completions",
        Some("application/json"),
        body.to_string(),
    );
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

//! `GET /metrics` over the router: every name is exported, and the counters move by exactly the
//! number of requests and the usage they reported.

use axum::http::{header, StatusCode};
use serde_json::json;

use super::test_app;
use crate::common::*;

#[tokio::test]
async fn counters_move_by_exactly_the_requests_and_their_usage() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let before = get(&app, "/metrics").await;
    assert_eq!(before.status, StatusCode::OK);
    let ct = before.headers[header::CONTENT_TYPE].to_str().unwrap();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let page = before.text();
    // Label families without a sample yet (requests_total, model_resident) are not listed.
    for name in [
        "ferry_prompt_tokens_total",
        "ferry_generated_tokens_total",
        "ferry_requests_running",
        "ferry_requests_waiting",
        "ferry_time_to_first_token_seconds",
        "ferry_inter_token_latency_seconds",
        "ferry_device_memory_bytes",
        "ferry_device_memory_budget_bytes",
        "ferry_offload_bytes_copied_total",
        "ferry_offload_wait_seconds_total",
        "ferry_model_swaps_total",
    ] {
        assert!(
            page.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{page}"
        );
    }

    let (mut prompt, mut completion) = (0.0, 0.0);
    let bodies = [
        (
            "/v1/completions",
            json!({"model": READY, "prompt": "Say hi", "max_tokens": 3}),
        ),
        (
            "/v1/completions",
            json!({"model": READY, "prompt": "x", "max_tokens": 20}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": READY, "messages": [{"role": "user", "content": "hey"}], "max_tokens": 5}),
        ),
        (
            "/v1/completions",
            json!({"model": READY, "prompt": "streamed", "max_tokens": 4, "stream": true,
                "stream_options": {"include_usage": true}}),
        ),
    ];
    for (uri, body) in &bodies {
        let reply = post(&app, uri, body.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let usage = if body["stream"] == true {
            let events = sse_events(&reply.text());
            let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
            last["usage"].clone()
        } else {
            reply.json()["usage"].clone()
        };
        prompt += usage["prompt_tokens"].as_f64().unwrap();
        completion += usage["completion_tokens"].as_f64().unwrap();
    }
    let bad = post(
        &app,
        "/v1/completions",
        json!({"model": READY, "prompt": "x", "temperature": 9}),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let missing = post(
        &app,
        "/v1/completions",
        json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    // Not a generation request: not counted.
    assert_eq!(get(&app, "/v1/models").await.status, StatusCode::OK);

    let page = get(&app, "/metrics").await.text();
    let m = |name: &str| metric(&page, name);
    assert!(
        page.contains("# TYPE ferry_requests_total counter"),
        "{page}"
    );
    let ok = format!(r#"ferry_requests_total{{model="{READY}",status="200"}}"#);
    assert_eq!(m(&ok), bodies.len() as f64, "{page}");
    let bad = format!(r#"ferry_requests_total{{model="{READY}",status="400"}}"#);
    assert_eq!(m(&bad), 1.0, "{page}");
    assert_eq!(
        m(r#"ferry_requests_total{model="unknown",status="404"}"#),
        1.0,
        "{page}"
    );
    assert!(prompt > 0.0 && completion > 0.0);
    assert_eq!(m("ferry_prompt_tokens_total"), prompt, "{page}");
    assert_eq!(m("ferry_generated_tokens_total"), completion, "{page}");
    assert!(
        !page.contains("nope"),
        "client-chosen names never become labels"
    );
}

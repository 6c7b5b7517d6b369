//! `POST /v1/embeddings` over the router with the test double: the response shape, float and
//! base64 vectors (the same values), every input form in order, usage, the errors (dimensions,
//! empty, too long, too many, unknown model, a model without embeddings, unknown fields) and
//! the request counter.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::test_app;
use crate::common::*;

/// Decodes standard padded base64 (the test's own, independent of the server's encoder).
pub fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes = text.as_bytes();
    assert_eq!(bytes.len() % 4, 0, "padded base64");
    let mut out = Vec::new();
    for quad in bytes.chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n = quad
            .iter()
            .map(|&c| if c == b'=' { 0 } else { value(c) })
            .fold(0u32, |n, v| (n << 6) | v);
        let three = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    out
}

/// Little-endian f32 values of base64 text.
pub fn base64_floats(text: &str) -> Vec<f32> {
    base64_decode(text)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array of numbers: {value}"))
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

/// The double's tokens for `text` (BOS, then bytes).
fn tokens(text: &str) -> Vec<u32> {
    std::iter::once(BOS)
        .chain(text.bytes().map(u32::from))
        .collect()
}

async fn embed(body: Value) -> Reply {
    let backend = TestBackend::new();
    post(&test_app(&backend), "/v1/embeddings", body).await
}

#[tokio::test]
async fn float_vectors_in_input_order_with_usage() {
    let reply = embed(json!({"model": READY, "input": ["hello", "abc", "hello"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], READY);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (i, (item, text)) in data.iter().zip(["hello", "abc", "hello"]).enumerate() {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], i);
        let got = floats(&item["embedding"]);
        assert_eq!(got.len(), EMBEDDING_WIDTH);
        // JSON carries an f32 exactly (serde writes the shortest round-tripping form).
        assert_eq!(got, fake_embedding(&tokens(text)), "input {i}");
    }
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    assert_eq!(data[0]["embedding"], data[2]["embedding"]);
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 6 + 4 + 6, "total_tokens": 6 + 4 + 6})
    );
}

#[tokio::test]
async fn base64_decodes_to_the_float_vectors() {
    let input = json!(["hello", "a longer input, with punctuation"]);
    let float = embed(json!({"model": READY, "input": input, "encoding_format": "float"})).await;
    let b64 = embed(json!({"model": READY, "input": input, "encoding_format": "base64"})).await;
    assert_eq!(b64.status, StatusCode::OK, "{}", b64.text());
    let (float, b64) = (float.json(), b64.json());
    for i in 0..2 {
        let text = b64["data"][i]["embedding"]
            .as_str()
            .expect("a base64 string");
        let decoded = base64_floats(text);
        assert_eq!(decoded, floats(&float["data"][i]["embedding"]), "input {i}");
        assert_eq!(b64["data"][i]["index"], i);
    }
    assert_eq!(b64["usage"], float["usage"]);
}

#[tokio::test]
async fn token_id_inputs_are_used_as_they_are() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let reply = post(
        &app,
        "/v1/embeddings",
        json!({"model": READY, "input": [1, 2, 3]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(
        floats(&body["data"][0]["embedding"]),
        fake_embedding(&[1, 2, 3])
    );
    assert_eq!(body["usage"]["prompt_tokens"], 3);

    let input = json!([[7, 8], [9], [7, 8, 9]]);
    let reply = post(
        &app,
        "/v1/embeddings",
        json!({"model": READY, "input": input}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    let lists: [&[u32]; 3] = [&[7, 8], &[9], &[7, 8, 9]];
    for (i, list) in lists.iter().enumerate() {
        assert_eq!(body["data"][i]["index"], i);
        assert_eq!(floats(&body["data"][i]["embedding"]), fake_embedding(list));
    }
    assert_eq!(body["usage"]["total_tokens"], 6);
    let sent = backend.embedded.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].inputs, vec![vec![7, 8], vec![9], vec![7, 8, 9]]);
    // `user` is accepted and ignored; `dimensions` equal to the width is accepted.
    let body = json!({"model": READY, "input": "x", "user": "u-1", "dimensions": EMBEDDING_WIDTH});
    assert_eq!(
        post(&app, "/v1/embeddings", body).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn refuses_what_it_cannot_embed() {
    let long_text = "x".repeat(MAX_CONTEXT); // BOS + 64 bytes: one token over the context
    let long_ids: Vec<u32> = vec![5; MAX_CONTEXT + 1];
    let many: Vec<&str> = vec!["a"; 2049];
    let cases: Vec<(Value, StatusCode, &str, &str)> = vec![
        (
            json!({"model": READY, "input": "a", "dimensions": 4}),
            StatusCode::BAD_REQUEST,
            "dimensions",
            "unsupported_value",
        ),
        (
            json!({"model": READY, "input": ""}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": []}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": ["a", ""]}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": [[]]}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": long_text}),
            StatusCode::BAD_REQUEST,
            "input",
            "context_length_exceeded",
        ),
        (
            json!({"model": READY, "input": [long_ids]}),
            StatusCode::BAD_REQUEST,
            "input",
            "context_length_exceeded",
        ),
        (
            json!({"model": READY, "input": many}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_value",
        ),
        (
            json!({"model": "no-such-model", "input": "a"}),
            StatusCode::NOT_FOUND,
            "model",
            "model_not_found",
        ),
        (
            json!({"model": BROKEN, "input": "a"}),
            StatusCode::BAD_REQUEST,
            "model",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": "a", "temperature": 0}),
            StatusCode::BAD_REQUEST,
            "temperature",
            "unknown_parameter",
        ),
        (
            json!({"model": READY, "input": "a", "encoding_format": "int8"}),
            StatusCode::BAD_REQUEST,
            "encoding_format",
            "invalid_value",
        ),
        (
            json!({"model": READY}),
            StatusCode::BAD_REQUEST,
            "input",
            "missing_required_parameter",
        ),
        (
            json!({"model": READY, "input": 5}),
            StatusCode::BAD_REQUEST,
            "input",
            "invalid_type",
        ),
    ];
    let backend = TestBackend::new();
    let app = test_app(&backend);
    for (body, status, param, code) in cases {
        let reply = post(&app, "/v1/embeddings", body.clone()).await;
        let json = reply.json();
        let what = format!("{body:.80}: {json}");
        assert_eq!(reply.status, status, "{what}");
        let error = &json["error"];
        assert_eq!(error["param"], param, "{what}");
        assert_eq!(error["code"], code, "{what}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        let kind = if status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        assert_eq!(error["type"], kind, "{what}");
    }
    assert!(
        backend.embedded.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    // The context check counts the tokens: exactly the context fits.
    let fits = "x".repeat(MAX_CONTEXT - 1);
    let reply = post(
        &app,
        "/v1/embeddings",
        json!({"model": READY, "input": fits}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn counted_by_model_and_status() {
    let backend = TestBackend::new();
    let app = test_app(&backend);
    let ok = format!("ferry_requests_total{{model=\"{READY}\",status=\"200\"}}");
    let bad = format!("ferry_requests_total{{model=\"{READY}\",status=\"400\"}}");
    let before = get(&app, "/metrics").await.text();
    post(
        &app,
        "/v1/embeddings",
        json!({"model": READY, "input": "a"}),
    )
    .await;
    post(
        &app,
        "/v1/embeddings",
        json!({"model": READY, "input": "b"}),
    )
    .await;
    post(&app, "/v1/embeddings", json!({"model": READY, "input": ""})).await;
    let after = get(&app, "/metrics").await.text();
    assert_eq!(metric(&after, &ok) - metric(&before, &ok), 2.0, "{after}");
    assert_eq!(metric(&after, &bad) - metric(&before, &bad), 1.0, "{after}");
}

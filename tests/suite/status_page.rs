//! Issue 34: `GET /v1/ferry/status` (the placement the runtime set, combined with the metrics
//! registry) and the page on `GET /` (served, 404 with `web_ui = false`, behind the API key when
//! one is set). First against the test double, whose placement and metrics the tests set; then
//! against a real `ferry serve` of SmolLM2 in offload mode `sequential` on the CPU device,
//! whose status must say what `ferry plan --json` planned.

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};

use crate::common::{get, send, TestBackend, READY, SLOW};
use crate::real_model::{model_path, MODEL};
use crate::serve_process::ServeProcess;
use ferry::engine::placement::{BudgetUse, ExpertLocation, LayerExperts, LayerLocation, LayerSite};
use ferry::engine::ModelPlacement;
use ferry::metrics::MemoryKind;
use ferry::server::{app, ServerOptions};

fn placement() -> ModelPlacement {
    ModelPlacement {
        offload_mode: "auto".into(),
        budget: BudgetUse {
            budget: 1000,
            weights: 500,
            slots: 100,
            kv_cache: 200,
            workspace: 50,
            reserve: 10,
            device_total: 860,
            host: 300,
        },
        layers: vec![
            LayerSite {
                index: 0,
                location: LayerLocation::Device,
                bytes: 250,
            },
            LayerSite {
                index: 1,
                location: LayerLocation::Streamed,
                bytes: 150,
            },
            LayerSite {
                index: 2,
                location: LayerLocation::HostComputed,
                bytes: 150,
            },
        ],
        experts: vec![LayerExperts {
            layer: 1,
            experts: vec![
                ExpertLocation::Resident,
                ExpertLocation::Cached,
                ExpertLocation::Host,
            ],
        }],
        expert_cache_slots: 4,
        max_context: 64,
        max_batch: 2,
        link_bytes_per_s: Some(2000.0),
    }
}

fn model<'a>(status: &'a Value, id: &str) -> &'a Value {
    status["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {status}"))
}

#[tokio::test]
async fn status_reports_the_placement_set_and_the_metrics() {
    let backend = TestBackend::new();
    backend
        .placements
        .lock()
        .unwrap()
        .push((READY.to_owned(), placement()));
    let m = &backend.metrics;
    m.set_device_memory(MemoryKind::Weights, 500);
    m.set_device_memory(MemoryKind::Kv, 120);
    m.set_device_memory_budget(1000);
    m.set_kv_usage(READY, 16, 128);
    m.set_prefix_cache_tokens(READY, 32);
    m.prefix_cache_lookup(READY, 40, 10);
    m.add_offload_experts(6, 2, 1, 0);
    m.add_tier_decisions("stream", 5);
    m.add_tier_decisions("host", 3);
    m.add_offload_bytes_copied(4096);
    let app = app(backend.clone(), ServerOptions::default());

    let reply = get(&app, "/v1/ferry/status").await;
    assert_eq!(reply.status, StatusCode::OK);
    let status = reply.json();
    assert_eq!(status["object"], "ferry.status");
    let ready = model(&status, READY);
    assert_eq!(ready["status"], "ready");
    let p = &ready["placement"];
    assert_eq!(p["offload_mode"], "auto");
    assert_eq!(
        p["budget"],
        json!({"budget": 1000, "weights": 500, "slots": 100, "kv_cache": 200,
               "workspace": 50, "reserve": 10, "device_total": 860, "host": 300})
    );
    let locations: Vec<&str> = p["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["location"].as_str().unwrap())
        .collect();
    assert_eq!(locations, ["device", "streamed", "host_computed"]);
    assert_eq!(p["layers"][1]["bytes"], 150);
    assert_eq!(
        p["experts"],
        json!([{"layer": 1, "experts": ["resident", "cached", "host"]}])
    );
    assert_eq!(p["expert_cache_slots"], 4);
    assert_eq!(
        ready["kv_cache"],
        json!({"used_tokens": 16, "capacity_tokens": 128, "fill": 0.125})
    );
    assert_eq!(ready["prefix_cache"]["tokens"], 32);
    assert_eq!(ready["prefix_cache"]["fill"], 0.25);
    assert_eq!(ready["prefix_cache"]["hit_rate"], 0.25);
    // A model the backend has no placement for.
    assert_eq!(model(&status, SLOW)["placement"], Value::Null);

    let live = &status["live"];
    assert_eq!(live["experts"]["hit"], 6);
    assert_eq!(live["experts"]["miss"], 2);
    assert_eq!(live["experts"]["host"], 1);
    assert_eq!(live["experts"]["hit_rate"], 0.75);
    assert_eq!(live["tier_decisions"], json!({"stream": 5, "host": 3}));
    assert_eq!(live["link"]["bytes_total"], 4096);
    assert_eq!(live["link"]["measured_bytes_per_s"], 2000.0);
    assert_eq!(live["device_memory"]["weights"], 500);
    assert_eq!(live["device_memory"]["kv"], 120);
    assert_eq!(live["device_memory"]["budget"], 1000);
    assert_eq!(live["requests"], json!({"running": 0, "waiting": 0}));
    // The first poll has no window yet.
    assert_eq!(live["tokens_per_s"]["generation"], 0.0);
}

#[tokio::test]
async fn rates_are_measured_between_polls() {
    let backend = TestBackend::new();
    let app = app(backend.clone(), ServerOptions::default());
    get(&app, "/v1/ferry/status").await;
    let started = std::time::Instant::now();
    // What the engine counts as it samples: the model's tokens and the total.
    let generated = 40;
    backend.metrics.add_model_generated_tokens(READY, generated);
    backend.metrics.add_model_prompt_tokens(READY, 12);
    // And the offload engine's waits for copies: 0.35 s of stall.
    backend.metrics.add_offload_wait(Duration::from_millis(350));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let status = get(&app, "/v1/ferry/status").await.json();
    let elapsed = started.elapsed().as_secs_f64();
    let rate = status["live"]["tokens_per_s"]["generation"]
        .as_f64()
        .unwrap();
    // The window began before `started` and ended after the sleep.
    assert!(
        rate <= generated as f64 / 0.7 && rate >= generated as f64 / (elapsed + 0.5),
        "{rate} tokens/s for {generated} tokens over about {elapsed} s"
    );
    let link = &status["live"]["link"];
    let stall = link["stall_seconds_per_s"].as_f64().unwrap();
    assert!(
        stall <= 0.35 / 0.7 && stall >= 0.35 / (elapsed + 0.5),
        "{stall} s/s of stall for 0.35 s over about {elapsed} s"
    );
    assert!((link["stall_seconds_total"].as_f64().unwrap() - 0.35).abs() < 1e-9);
    let per_model = model(&status, READY)["tokens_per_s"]["generation"]
        .as_f64()
        .unwrap();
    assert_eq!(per_model, rate, "the only model that generated");
    assert_eq!(
        model(&status, SLOW)["tokens_per_s"]["generation"],
        0.0,
        "a model that did not"
    );
}

fn page_request(uri: &str, key: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(Method::GET).uri(uri);
    if let Some(key) = key {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    builder.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn the_page_is_served_with_its_style_and_script() {
    let app = app(TestBackend::new(), ServerOptions::default());
    let page = get(&app, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.headers[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let html = page.text();
    for needle in [
        "href=\"/page/style.css\"",
        "src=\"/page/app.js\"",
        "id=\"transcript\"",
        "class=\"strip\"",
    ] {
        assert!(html.contains(needle), "{needle} missing from the page");
    }
    let script = get(&app, "/page/app.js").await;
    assert_eq!(script.status, StatusCode::OK);
    assert_eq!(
        script.headers[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    let js = script.text();
    for needle in [
        "/v1/ferry/status",
        "/v1/chat/completions",
        "stream: true",
        "/v1/models",
    ] {
        assert!(js.contains(needle), "{needle} missing from the script");
    }
    let style = get(&app, "/page/style.css").await;
    assert_eq!(style.status, StatusCode::OK);
    assert_eq!(
        style.headers[header::CONTENT_TYPE],
        "text/css; charset=utf-8"
    );
    assert_eq!(
        get(&app, "/page/other.js").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn web_ui_off_makes_the_page_404_but_keeps_the_status() {
    let options = ServerOptions {
        web_ui: false,
        ..ServerOptions::default()
    };
    let app = app(TestBackend::new(), options);
    for path in ["/", "/page/style.css", "/page/app.js"] {
        let reply = get(&app, path).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(reply.json()["error"]["code"], "not_found", "{path}");
    }
    assert_eq!(get(&app, "/v1/ferry/status").await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_page_and_the_status_need_the_key_when_one_is_set() {
    let options = ServerOptions {
        api_keys: vec!["sekrit".into()],
        ..ServerOptions::default()
    };
    let app = app(TestBackend::new(), options);
    for path in ["/", "/page/app.js", "/v1/ferry/status"] {
        let without = send(&app, page_request(path, None)).await;
        assert_eq!(without.status, StatusCode::UNAUTHORIZED, "{path}");
        let wrong = send(&app, page_request(path, Some("nope"))).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path}");
        let with = send(&app, page_request(path, Some("sekrit"))).await;
        assert_eq!(with.status, StatusCode::OK, "{path}");
    }
}

/// The model's flags for both `ferry plan` and `ferry serve`: offload `sequential` with a
/// budget that leaves some layers on the host.
fn flags() -> Vec<&'static str> {
    vec![
        "--served-name",
        MODEL,
        "--offload",
        "sequential",
        "--max-context",
        "512",
        "--gpu-memory",
        "256MiB",
    ]
}

#[tokio::test]
async fn a_real_server_reports_the_plan_it_serves_and_counts_its_work() {
    // What `ferry plan` says.
    let output = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("plan")
        .arg("--model")
        .arg(model_path())
        .args(flags())
        .args(["--device", "cpu", "--json"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("ferry plan runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let plan = &document["models"][0]["plan"];
    let planned_layers = plan["layers"].as_array().expect("layers");
    assert!(
        planned_layers.iter().any(|l| l["home"] == "host"),
        "sequential offloads layers: {plan}"
    );

    let mut args: Vec<OsString> = vec!["--model".into(), model_path().into()];
    args.extend(flags().into_iter().map(OsString::from));
    let server = ServeProcess::start(&args).await;
    let client = reqwest::Client::new();
    let status_url = format!("{}/v1/ferry/status", server.base);
    let status: Value = client
        .get(&status_url)
        .send()
        .await
        .expect("GET status")
        .json()
        .await
        .expect("JSON");
    let served = model(&status, MODEL);
    let p = &served["placement"];
    assert_eq!(p["offload_mode"], "sequential");
    assert_eq!(p["budget"]["budget"], plan["budget_bytes"]);
    assert_eq!(p["budget"]["kv_cache"], plan["kv_bytes"]);
    let layers = p["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), planned_layers.len());
    for (shown, planned) in layers.iter().zip(planned_layers) {
        assert_eq!(shown["index"], planned["index"]);
        assert_eq!(shown["bytes"], planned["bytes"]);
        let location = shown["location"].as_str().unwrap();
        match planned["home"].as_str().unwrap() {
            "device" => assert_eq!(location, "device", "{shown}"),
            _ => assert!(["streamed", "host_computed"].contains(&location), "{shown}"),
        }
    }
    assert_eq!(p["experts"], json!([]), "a dense model");

    // A request: the generated tokens, the KV capacity and the offload work show up.
    let reply: Value = client
        .post(format!("{}/v1/completions", server.base))
        // Greedy and past the end-of-sequence token: always four tokens (a sampled reply could
        // stop after " Paris.").
        .json(
            &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
                      "temperature": 0, "ignore_eos": true}),
        )
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("JSON");
    assert_eq!(reply["usage"]["completion_tokens"], 4, "{reply}");
    // The offload engine's counters reach the registry twice a second (`runtime::telemetry`).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let after: Value = client
            .get(&status_url)
            .send()
            .await
            .expect("GET status")
            .json()
            .await
            .expect("JSON");
        let decisions = &after["live"]["tier_decisions"];
        let total = decisions["stream"].as_u64().unwrap() + decisions["host"].as_u64().unwrap();
        if total > 0 || std::time::Instant::now() > deadline {
            break after;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let served = model(&after, MODEL);
    assert!(
        served["kv_cache"]["capacity_tokens"].as_u64().unwrap() >= 512,
        "{served}"
    );
    let decisions = &after["live"]["tier_decisions"];
    let total = decisions["stream"].as_u64().unwrap() + decisions["host"].as_u64().unwrap();
    assert!(total > 0, "offloaded layers were decided: {decisions}");
    // The status reads the registry /metrics renders (published periodically: read after).
    let copied = after["live"]["link"]["bytes_total"].as_u64().unwrap();
    let rendered = server.metric("ferry_offload_bytes_copied_total").await;
    assert!(copied as f64 <= rendered, "{copied} > {rendered}");
}

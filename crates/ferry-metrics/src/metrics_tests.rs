//! Tests for [`Metrics`] and [`RequestTracker`]: names, labels, rendering and exact counts.

use std::time::Instant;

use super::*;

/// The value of the sample line `name` (labels included, exactly as rendered).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn renders_every_metric_with_the_prefix() {
    let m = Metrics::new();
    m.record_request("smollm2", 200);
    m.record_request("smollm2", 200);
    m.record_request("smollm2", 503);
    m.add_offload_wait(Duration::from_millis(250));
    m.set_model_resident("smollm2", true);
    let text = m.render();
    let r = |name: &str| sample(&text, name);
    assert_eq!(
        r(r#"ferry_requests_total{model="smollm2",status="200"}"#),
        Some(2.0)
    );
    assert_eq!(
        r(r#"ferry_requests_total{model="smollm2",status="503"}"#),
        Some(1.0)
    );
    for name in [
        "ferry_prompt_tokens_total",
        "ferry_generated_tokens_total",
        "ferry_requests_running",
        "ferry_requests_waiting",
        "ferry_time_to_first_token_seconds_count",
        "ferry_inter_token_latency_seconds_count",
        "ferry_device_memory_budget_bytes",
        "ferry_offload_bytes_copied_total",
        "ferry_model_swaps_total",
    ] {
        assert_eq!(r(name), Some(0.0), "{name} in\n{text}");
    }
    for kind in MemoryKind::ALL {
        let name = format!(r#"ferry_device_memory_bytes{{kind="{}"}}"#, kind.as_str());
        assert_eq!(r(&name), Some(0.0), "{name} in\n{text}");
    }
    assert_eq!(r("ferry_offload_wait_seconds_total"), Some(0.25));
    assert_eq!(r(r#"ferry_model_resident{model="smollm2"}"#), Some(1.0));
    assert!(text.contains("# TYPE ferry_time_to_first_token_seconds histogram"));
    assert!(text.lines().all(|l| l.is_empty()
        || l.starts_with('#')
        || l.starts_with("ferry_")
        || l.starts_with("vllm:")));
    for alias in [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ] {
        assert_eq!(r(alias), Some(0.0), "{alias} in\n{text}");
        assert!(text.contains(&format!("# TYPE {alias} gauge")), "{alias}");
    }
}

#[test]
fn tracker_counts_tokens_and_latencies() {
    let m = Metrics::new();
    m.request_queued();
    m.request_started();
    assert_eq!((m.waiting(), m.running()), (0, 1));
    let mut t = RequestTracker::new(
        &m,
        TrackedRequest {
            model: "m1".into(),
            accepted: Instant::now(),
            prompt_tokens: 7,
            context: None,
        },
    );
    t.admitted();
    t.prefilled(7);
    for _ in 0..3 {
        t.token();
    }
    t.end(RequestEnd::Finished { reason: "length" });
    t.end(RequestEnd::Cancelled);
    m.request_ended();
    assert_eq!((m.prompt_tokens(), m.generated_tokens()), (7, 3));
    assert_eq!(m.model_generated_tokens("m1"), 3);
    assert_eq!(m.model_generated_tokens("other"), 0);
    assert_eq!(m.running(), 0);
    let text = m.render();
    assert_eq!(
        sample(&text, "ferry_time_to_first_token_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "ferry_inter_token_latency_seconds_count"),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, r#"ferry_model_prompt_tokens_total{model="m1"}"#),
        Some(7.0)
    );
    assert_eq!(
        sample(&text, "ferry_request_queue_seconds_count"),
        Some(1.0)
    );
    // One end-to-end sample: the second end() of the same request changes nothing.
    assert_eq!(
        sample(&text, r#"ferry_request_duration_seconds_count{model="m1"}"#),
        Some(1.0)
    );
    let mut detached = RequestTracker::detached();
    detached.prefilled(5);
    detached.token();
    assert_eq!(m.generated_tokens(), 3);
    assert_eq!(m.clone(), m);
    assert_ne!(Metrics::new(), m);
}

#[test]
fn registered_models_are_on_the_page_before_any_request() {
    let m = Metrics::new();
    m.register_model("a");
    let text = m.render();
    for name in [
        r#"ferry_model_prompt_tokens_total{model="a"}"#,
        r#"ferry_model_generated_tokens_total{model="a"}"#,
        r#"ferry_request_duration_seconds_count{model="a"}"#,
        r#"ferry_request_duration_seconds_sum{model="a"}"#,
    ] {
        assert_eq!(sample(&text, name), Some(0.0), "{name} in\n{text}");
    }
}

#[test]
fn kv_usage_sums_entries_over_capacities_of_every_model() {
    let m = Metrics::new();
    assert_eq!(m.kv_usage(), 0.0);
    m.set_kv_usage("a", 50, 100);
    assert_eq!(m.kv_usage(), 0.5);
    m.set_kv_usage("b", 0, 300);
    assert_eq!(m.kv_usage(), 0.125);
    m.set_kv_usage("a", 0, 100);
    assert_eq!(m.kv_usage(), 0.0);
    m.set_kv_usage("a", 900, 100);
    assert_eq!(m.kv_usage(), 1.0, "never above 1");
    let text = m.render();
    assert_eq!(sample(&text, "ferry_kv_cache_usage_ratio"), Some(1.0));
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), Some(1.0));
}

#[test]
fn the_request_line_names_the_request_and_its_numbers() {
    let m = Metrics::new();
    let ((), text) = ferry_testkit::capture_logs(|| {
        let context = RequestContext::new("req-42");
        let mut t = RequestTracker::new(
            &m,
            TrackedRequest {
                model: "m1".into(),
                accepted: Instant::now(),
                prompt_tokens: 5,
                context: Some(context.clone()),
            },
        );
        assert!(context.reached_engine());
        t.admitted();
        t.prefilled(5);
        t.token();
        t.token();
        t.end(RequestEnd::Finished { reason: "stop" });
        let failed = RequestTracker::new(
            &m,
            TrackedRequest {
                model: "m1".into(),
                accepted: Instant::now(),
                prompt_tokens: 3,
                context: None,
            },
        );
        failed.end(RequestEnd::Failed {
            error: "out of memory",
        });
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains(" INFO "), "{text}");
    for field in [
        "request finished",
        "request_id=req-42",
        "model=m1",
        "prompt_tokens=5",
        "completion_tokens=2",
        "status=finished",
        "finish_reason=stop",
        "queue_ms=",
        "ttft_ms=",
        "e2e_ms=",
        "tok_s=",
    ] {
        assert!(lines[0].contains(field), "{field} not in {}", lines[0]);
    }
    assert!(!lines[0].contains("error="), "{}", lines[0]);
    assert!(lines[1].contains(" WARN "), "{text}");
    for field in [
        "request_id=-",
        "status=failed",
        "completion_tokens=0",
        "error=out of memory",
    ] {
        assert!(lines[1].contains(field), "{field} not in {}", lines[1]);
    }
}

#[test]
fn a_request_offered_tools_logs_its_calls_and_the_apis_finish_reason() {
    let m = Metrics::new();
    let request = || TrackedRequest {
        model: "m1".into(),
        accepted: Instant::now(),
        prompt_tokens: 3,
        context: None,
    };
    let ((), text) = ferry_testkit::capture_logs(|| {
        let called = RequestTracker::new(&m, request());
        called.tool_calls(2);
        called.end(RequestEnd::Finished { reason: "stop" });
        let cut = RequestTracker::new(&m, request());
        cut.tool_calls(1);
        cut.end(RequestEnd::Finished { reason: "length" });
        let answered = RequestTracker::new(&m, request());
        answered.tool_calls(0);
        answered.end(RequestEnd::Finished { reason: "stop" });
        RequestTracker::new(&m, request()).end(RequestEnd::Finished { reason: "stop" });
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let ends = [
        "finish_reason=tool_calls tool_calls=2",
        "finish_reason=length tool_calls=1",
        "finish_reason=stop tool_calls=0",
    ];
    for (line, end) in lines.iter().zip(ends) {
        assert!(line.ends_with(end), "{end} ends {line}");
    }
    assert!(lines[3].ends_with("finish_reason=stop"), "{}", lines[3]);
}

#[test]
fn a_speculating_request_logs_its_acceptance() {
    let m = Metrics::new();
    let ((), text) = ferry_testkit::capture_logs(|| {
        let tracker = RequestTracker::new(
            &m,
            TrackedRequest {
                model: "m1".into(),
                accepted: Instant::now(),
                prompt_tokens: 3,
                context: None,
            },
        );
        tracker.speculated(4, 3);
        tracker.speculated(4, 0);
        tracker.fed(9);
        tracker.unfed(4);
        assert_eq!(tracker.kv_tokens(), 5);
        tracker.end(RequestEnd::Finished { reason: "stop" });
    });
    assert!(
        text.contains("spec_drafted=8 spec_accepted=3 spec_acceptance=0.38"),
        "{text}"
    );
    assert_eq!(m.speculation_counts("m1"), (8, 3));
}

#[test]
fn readings_return_what_was_set() {
    let m = Metrics::new();
    assert_eq!(m.device_memory(MemoryKind::Kv), 0);
    assert_eq!(m.model_kv_usage("a"), (0, 0));
    m.set_device_memory(MemoryKind::Kv, 1234);
    m.set_device_memory(MemoryKind::Weights, 99);
    m.set_device_memory_budget(5000);
    m.add_offload_bytes_copied(77);
    m.add_offload_experts(3, 2, 1, 10);
    m.add_model_prompt_tokens("a", 5);
    m.set_kv_usage("a", 6, 64);
    m.set_prefix_cache_tokens("a", 12);
    assert_eq!(m.device_memory(MemoryKind::Kv), 1234);
    assert_eq!(m.device_memory(MemoryKind::Weights), 99);
    assert_eq!(m.device_memory_budget(), 5000);
    assert_eq!(m.offload_bytes_copied(), 77);
    assert_eq!(
        [
            m.offload_experts("hit"),
            m.offload_experts("miss"),
            m.offload_experts("host")
        ],
        [3, 2, 1]
    );
    assert_eq!(m.model_prompt_tokens("a"), 5);
    assert_eq!(m.model_prompt_tokens("b"), 0);
    assert_eq!(m.model_kv_usage("a"), (6, 64));
    assert_eq!(m.prefix_cache_tokens("a"), 12);
}

#[test]
fn expert_decisions_and_rates_are_per_step_kind() {
    let m = Metrics::new();
    let text = m.render();
    // Every pair exists at 0 before anything is served.
    for step in STEP_LABELS {
        for tier in EXPERT_SERVED_LABELS {
            let name =
                format!("ferry_offload_expert_decisions_total{{tier=\"{tier}\",step=\"{step}\"}}");
            assert_eq!(sample(&text, &name), Some(0.0), "{name}");
        }
        for name in [
            format!("ferry_offload_expert_cache_hit_rate{{step=\"{step}\"}}"),
            format!("ferry_offload_expert_link_bytes_per_token{{step=\"{step}\"}}"),
            format!("ferry_offload_expert_link_bytes_total{{step=\"{step}\"}}"),
            format!("ferry_offload_expert_step_tokens_total{{step=\"{step}\"}}"),
        ] {
            assert_eq!(sample(&text, &name), Some(0.0), "{name}");
        }
    }
    // Decode: 2 resident, 3 hits, 1 streamed, 4 host; 10 tokens, 1000 bytes.
    m.add_expert_step_counts("decode", [2, 3, 1, 4], 1000, 10);
    // Prefill: 16 streamed, 4 hits; 512 tokens, 8192 bytes, in two publications.
    m.add_expert_step_counts("prefill", [0, 4, 8, 0], 4096, 256);
    m.add_expert_step_counts("prefill", [0, 0, 8, 0], 4096, 256);
    assert_eq!(m.expert_decisions("streamed", "prefill"), 16);
    assert_eq!(m.expert_decisions("host", "decode"), 4);
    assert_eq!(m.expert_decisions("host", "prefill"), 0);
    assert_eq!(m.expert_step_rates("decode"), (3.0 / 8.0, 100.0));
    assert_eq!(m.expert_step_rates("prefill"), (4.0 / 20.0, 16.0));
    let text = m.render();
    assert_eq!(
        sample(
            &text,
            r#"ferry_offload_expert_decisions_total{tier="cache_hit",step="decode"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"ferry_offload_expert_link_bytes_per_token{step="prefill"}"#
        ),
        Some(16.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"ferry_offload_expert_cache_hit_rate{step="decode"}"#
        ),
        Some(0.375)
    );
}

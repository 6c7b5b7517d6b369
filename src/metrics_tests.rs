//! Tests for [`Metrics`] and [`RequestTracker`]: names, labels, rendering and exact counts.

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
    assert!(text
        .lines()
        .all(|l| l.is_empty() || l.starts_with('#') || l.starts_with("ferry_")));
}

#[test]
fn tracker_counts_tokens_and_latencies() {
    let m = Metrics::new();
    m.request_queued();
    m.request_started();
    assert_eq!((m.waiting(), m.running()), (0, 1));
    let mut t = RequestTracker::new(&m, Instant::now());
    t.prefilled(7);
    for _ in 0..3 {
        t.token();
    }
    m.request_ended();
    assert_eq!((m.prompt_tokens(), m.generated_tokens()), (7, 3));
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
    let mut detached = RequestTracker::detached();
    detached.prefilled(5);
    detached.token();
    assert_eq!(m.generated_tokens(), 3);
    assert_eq!(m.clone(), m);
    assert_ne!(Metrics::new(), m);
}

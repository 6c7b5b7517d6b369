//! The expert cache's hottest experts (issue 30, item 3) on the tiny Qwen3-MoE of
//! tests/suite/expert_offload.rs (8 experts, top 2, Q8_0) on the CPU device: the expert store
//! counts every routed row per layer and expert (checked against the routing of mode `none`,
//! recorded outside the offload engine), the counts survive a round trip through the routes
//! file, a plan made from them keeps the most routed experts resident and decodes mode
//! `none`'s tokens, and `ferry plan` reads them from `$XDG_CACHE_HOME/ferry/expert-routes.json`
//! and says so.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ferry::config::{OffloadMode, TierChoice};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::source::ModelFiles;
use ferry::offload::expert_routes::{ModelKey, RouteCache};
use ferry::offload::{load_placed, Plan, StreamConfig};

use crate::expert_offload::{
    greedy, options, plan_counted, plan_for, prompts, qwen3_moe, qwen3_moe_servable, reference,
    EXPERTS, NEW_TOKENS,
};
use crate::serve_process::ServeProcess;

/// Decodes `prompts` with `plan` and `tier`: the tokens and the store's route counts.
fn decode(
    checkpoint: &Checkpoint,
    plan: &Plan,
    tier: TierChoice,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<u32>>, Vec<Vec<u64>>) {
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };
    let mut placed = load_placed(checkpoint, &options(), plan, stream, &mut |_| {}).unwrap();
    placed
        .store
        .experts()
        .expect("experts offloaded")
        .set_tier(tier);
    let tokens = greedy(&placed.model, &mut placed.store, prompts);
    (tokens, placed.store.accounting().routes().snapshot())
}

/// The residents of each layer of `plan`.
fn residents(plan: &Plan) -> Vec<BTreeSet<usize>> {
    plan.experts
        .as_ref()
        .expect("placed by expert")
        .layers
        .iter()
        .map(|l| (0..l.n_experts()).filter(|&e| l.is_resident(e)).collect())
        .collect()
}

#[test]
fn routes_are_counted_kept_and_make_the_hot_experts_resident() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe(dir.path());
    let files = ModelFiles::Gguf { path: path.clone() };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let prompts = prompts();
    let (expected, routes) = reference(&files, &prompts);

    // Every expert offloaded: the store sees every routed row.
    let all = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 2);
    let (tokens, counts) = decode(&checkpoint, &all, TierChoice::Auto, &prompts);
    assert_eq!(tokens, expected);
    let n_layers = checkpoint.spec().n_layers;
    assert_eq!(counts.len(), n_layers);
    // Prompt rows, then one row per sequence for each further step; top 2 of each.
    let rows: usize =
        prompts.iter().map(Vec::len).sum::<usize>() + (NEW_TOKENS - 1) * prompts.len();
    for (layer, line) in counts.iter().enumerate() {
        assert_eq!(line.len(), EXPERTS);
        assert_eq!(line.iter().sum::<u64>(), 2 * rows as u64, "layer {layer}");
        let counted: BTreeSet<usize> = (0..EXPERTS).filter(|&e| line[e] > 0).collect();
        let routed: BTreeSet<usize> = routes
            .iter()
            .filter(|(_, l, _)| *l == layer)
            .flat_map(|(_, _, wanted)| wanted.iter().copied())
            .collect();
        assert_eq!(
            counted, routed,
            "layer {layer}: the experts `none` routed to"
        );
    }

    // Kept in the routes file and read back for the same file.
    let cache = RouteCache::at(dir.path().join("expert-routes.json"));
    let key = ModelKey::of(&files).expect("model key");
    cache.merge(&key, &counts).unwrap();
    let kept = cache.load(&key).unwrap().expect("counts kept");
    assert_eq!(kept, counts);

    // Room for the other parts, a pool of 3 and about a third of the experts.
    let expert = all.experts.as_ref().unwrap().layers[0].expert_bytes[0];
    let budget = all.device_bytes + expert + (n_layers * EXPERTS) as u64 / 3 * expert;
    let plain = plan_for(&checkpoint, OffloadMode::Auto, budget, 3);
    let hot = plan_counted(&checkpoint, OffloadMode::Auto, budget, 3, kept.clone());
    assert_eq!(hot.device_bytes, plain.device_bytes);
    let (hot_residents, plain_residents) = (residents(&hot), residents(&plain));
    for (layer, resident) in hot_residents.iter().enumerate() {
        let line = &kept[layer];
        // No host expert was routed more than a resident one.
        let coldest = resident.iter().map(|&e| line[e]).min().unwrap_or(u64::MAX);
        let hottest_host = (0..EXPERTS)
            .filter(|e| !resident.contains(e))
            .map(|e| line[e])
            .max()
            .unwrap_or(0);
        assert!(
            coldest >= hottest_host,
            "layer {layer}: {resident:?} of {line:?}"
        );
        assert_eq!(resident.len(), plain_residents[layer].len());
    }
    assert_ne!(
        hot_residents, plain_residents,
        "the counts moved some residents: {kept:?}"
    );
    // Which experts are resident changes no token.
    for tier in [TierChoice::Auto, TierChoice::Host, TierChoice::Stream] {
        let (tokens, _) = decode(&checkpoint, &hot, tier, &prompts);
        assert_eq!(tokens, expected, "{tier:?}");
    }
}

/// Flags that set the context, batch and step size (never lowered to fit) and a budget some
/// experts' bytes smaller than the whole model's, so some experts of each layer are on the
/// host; `plan` runs `ferry plan --json` with flags.
fn offloading_flags(plan: &dyn Fn(&[&str]) -> (serde_json::Value, String)) -> Vec<String> {
    let fixed = [
        "--max-context",
        "64",
        "--max-batch",
        "8",
        "--max-step-tokens",
        "512",
    ];
    let (whole, _) = plan(&[&fixed[..], &["--gpu-memory", "1GiB"]].concat());
    assert!(whole["experts"].is_null(), "{whole}");
    let device = whole["device_bytes"].as_u64().expect("device_bytes");
    let mut flags: Vec<String> = fixed.iter().map(|f| f.to_string()).collect();
    flags.extend(["--gpu-memory".to_string(), (device - 90_000).to_string()]);
    flags
}

/// `ferry plan --json` of the model at `path` with `extra` flags and the caches under
/// `cache_home`: the model's plan and stderr.
fn plan_json(path: &Path, cache_home: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let (ok, stdout, stderr) = crate::fit::run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["plan", "--json", "--device", "cpu", "--model"])
            .arg(path)
            .args(extra)
            .env("XDG_CACHE_HOME", cache_home),
    );
    assert!(ok, "{stderr}");
    let document: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    (document["models"][0]["plan"].clone(), stderr)
}

/// `ferry plan` orders the residents by the counts in the user's routes file, says where they
/// came from, and ignores a corrupt file with a warning; `offload.expert_routes = false`
/// ignores the counts.
#[test]
fn ferry_plan_reads_the_counts_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe(dir.path());
    let cache_home = tempfile::tempdir().unwrap();
    let plan = |extra: &[&str]| plan_json(&path, cache_home.path(), extra);
    let budget = offloading_flags(&plan);
    let budget: Vec<&str> = budget.iter().map(String::as_str).collect();
    let (before, _) = plan(&budget);
    let layers = before["experts"]["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("placed by expert: {before}"))
        .clone();
    let resident = |layer: &serde_json::Value| -> Vec<u64> {
        layer["resident_experts"]
            .as_array()
            .expect("resident_experts")
            .iter()
            .map(|e| e.as_u64().unwrap())
            .collect()
    };
    let k = resident(&layers[0]).len();
    assert!(k > 0 && k < EXPERTS, "{before}");
    assert_eq!(resident(&layers[0]), (0..k as u64).collect::<Vec<_>>());

    // Counts that make the last experts the hottest in every layer.
    let counts: Vec<Vec<u64>> = layers
        .iter()
        .map(|_| (0..EXPERTS as u64).map(|e| 10 * e).collect())
        .collect();
    let file = cache_home.path().join("ferry").join("expert-routes.json");
    let key = ModelKey::of(&ModelFiles::Gguf { path: path.clone() }).unwrap();
    RouteCache::at(&file).merge(&key, &counts).unwrap();
    let (after, _) = plan(&budget);
    let hot: Vec<u64> = (EXPERTS - k..EXPERTS).map(|e| e as u64).collect();
    let layers = after["experts"]["layers"].as_array().unwrap().clone();
    assert_eq!(resident(&layers[0]), hot, "{after}");
    assert_eq!(after["device_bytes"], before["device_bytes"]);
    let notes = after["notes"].to_string();
    assert!(
        notes.contains("the most routed first") && notes.contains("expert-routes.json"),
        "{notes}"
    );
    // Turned off: the plan without counts.
    let (off, _) = plan(&[&budget[..], &["--expert-routes", "false"]].concat());
    assert_eq!(off["experts"], before["experts"]);

    // A corrupt file: no counts, a warning, still a plan.
    std::fs::write(&file, "{ corrupt").unwrap();
    let (corrupt, stderr) = plan(&budget);
    assert_eq!(corrupt["experts"], before["experts"]);
    assert!(stderr.contains("expert route counts ignored"), "{stderr}");
}

/// A real `ferry serve` with offloaded experts counts the routes of a completion and, stopped
/// by SIGTERM, adds them to the routes file under its `XDG_CACHE_HOME`, keyed by its model file.
#[tokio::test(flavor = "multi_thread")]
async fn serve_writes_the_counts_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe_servable(dir.path());
    let cache_home = tempfile::tempdir().unwrap();
    let flags = offloading_flags(&|extra| plan_json(&path, cache_home.path(), extra));
    let (planned, _) = plan_json(
        &path,
        cache_home.path(),
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(planned["experts"].is_object(), "{planned}");
    let mut args: Vec<OsString> = vec!["--model".into(), path.clone().into()];
    args.extend(["--served-name", "tiny"].map(OsString::from));
    args.extend(flags.iter().map(OsString::from));
    let mut server = ServeProcess::start_with(&args, |command| {
        command.env("XDG_CACHE_HOME", cache_home.path());
    })
    .await;
    let reply: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/completions", server.base))
        .json(
            &serde_json::json!({"model": "tiny", "prompt": "hello world", "max_tokens": 4,
                                  "temperature": 0, "ignore_eos": true}),
        )
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    let usage = &reply["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("usage"),
        usage["completion_tokens"].as_u64().expect("usage"),
    );
    assert_eq!(completion, 4, "{reply}");
    let file = cache_home.path().join("ferry").join("expert-routes.json");
    assert!(!file.exists(), "nothing written before the server stops");
    server.sigterm();
    assert!(server.wait_exit(Duration::from_secs(60)).success());
    let key = ModelKey::of(&ModelFiles::Gguf { path: path.clone() }).unwrap();
    let counts = RouteCache::at(&file)
        .load(&key)
        .unwrap()
        .expect("counts written at shutdown");
    // Every row the model computed (the prompt, then each token but the last), top 2.
    let rows = prompt + completion - 1;
    assert_eq!(counts.len(), planned["layers"].as_array().unwrap().len());
    for line in &counts {
        assert_eq!(line.iter().sum::<u64>(), 2 * rows, "{counts:?}");
    }
}

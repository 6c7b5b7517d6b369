//! ferry against llama.cpp on the GGUF types people download: the tiny synthetic Llama of
//! tests/fixtures/quant-llamacpp/ (hidden 256, so every row is whole k-quant super-blocks),
//! quantized by llama.cpp's own quantizer to Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, IQ4_NL and
//! MXFP4, with llama.cpp's top-10 logits at the last position of five token-id prompts
//! (scripts/make-quant-fixture-llamacpp.py). Each file is served through the real loader,
//! engine and HTTP API (`/v1/completions` with token ids, greedy, `logprobs: 5`), and must
//! agree with llama.cpp: top-1 equal on at least 4 of 5 prompts, top-5 overlap of at least 80%
//! over the prompts, and the chosen token's logprob close to llama.cpp's.
//!
//! Types ferry cannot load yet are listed in [`NOT_YET`], the one place to switch them on: such
//! a row must be refused with the loader's readable error, and once the loader accepts the file
//! the row is checked like the others.

use crate::common as http;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::http::StatusCode;
use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode};
use ferry::engine::{EngineHandle, TextCodec};
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;
use ferry::server::{app, ServerOptions};
use serde_json::{json, Value as Json};

/// Rows whose GGUF type ferry cannot compute yet (none since IQ4_NL, IQ4_XS and MXFP4 got
/// kernels; a type added to the fixture before its kernel goes here).
const NOT_YET: &[&str] = &[];

/// Largest difference between ferry's and llama.cpp's logprob of the token both chose. Both
/// quantize the activations to 8-bit blocks for the dot products (Q8_0 / Q8_K, as ggml does),
/// so they agree closely: measured at most 1e-4 on the k-quant, Q8_0 and MXFP4 rows.
const LOGPROB_TOL: f32 = 0.01;

/// The IQ4 rows' tolerance. ferry's IQ4 kernels take activations in 32-element int8 blocks;
/// ggml takes IQ4_XS's in 256-element Q8_K blocks (one scale per 256), so the two round the
/// activations differently. Measured on 2026-12-01: at most 0.038 (IQ4_XS) and 0.012 (IQ4_NL),
/// with top-1 and the top-5 sets equal on every prompt. IQ4_NL's 0.012 is not explained by the
/// activation blocks (ggml uses Q8_0 there too) and is worth a look.
const IQ4_LOGPROB_TOL: f32 = 0.05;

fn logprob_tol(kind: &str) -> f32 {
    if kind.starts_with("iq4") {
        IQ4_LOGPROB_TOL
    } else {
        LOGPROB_TOL
    }
}

fn dir() -> PathBuf {
    crate::fixtures::path("quant-llamacpp")
}

fn expected() -> Json {
    crate::fixtures::json("quant-llamacpp/expected.json")
}

fn config(file: &str) -> ModelConfig {
    ModelConfig {
        name: "tiny".into(),
        source: dir().join(file).to_string_lossy().into_owned(),
        dtype: DtypeChoice::Auto,
        max_context: Some(64),
        max_batch: Some(1),
        // Like with like: the fixture's llama.cpp logits were made with an f32 KV cache.
        kv_dtype: DtypeChoice::F32,
        offload: OffloadConfig {
            mode: OffloadMode::None,
            gpu_memory: MemoryBudget::Bytes(1 << 30),
            prefetch: 0,
            keep_alive: std::time::Duration::from_secs(1),
        },
        ..ModelConfig::default()
    }
}

/// One prompt's answer from ferry's HTTP API: the greedy token and the top-5 `{text: logprob}`.
struct Answer {
    chosen: String,
    chosen_logprob: f32,
    top5: HashMap<String, f32>,
}

/// Serves `file` and asks for one greedy token with top-5 logprobs after each prompt; `Err`
/// when the loader refuses the file.
fn serve_and_ask(file: &str, prompts: &[Vec<u32>]) -> Result<Vec<Answer>, String> {
    let hub = HubOptions::from_env(|_| None);
    let loaded = load_for_serving(&config(file), &candle_core::Device::Cpu, &hub)
        .map_err(|e| e.to_string())?;
    let engine = EngineHandle::new(["tiny"]);
    engine
        .model_ready("tiny", loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .expect("engine starts");
    let router = app(Arc::new(engine), ServerOptions::default());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    Ok(prompts
        .iter()
        .map(|ids| {
            let body = json!({"model": "tiny", "prompt": ids, "max_tokens": 1,
                              "temperature": 0, "logprobs": 5});
            let reply = runtime.block_on(http::post(&router, "/v1/completions", body));
            assert_eq!(reply.status, StatusCode::OK, "{file}: {}", reply.text());
            let logprobs = &reply.json()["choices"][0]["logprobs"];
            let top5: HashMap<String, f32> = logprobs["top_logprobs"][0]
                .as_object()
                .expect("top logprobs")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap() as f32))
                .collect();
            Answer {
                chosen: logprobs["tokens"][0].as_str().unwrap().to_string(),
                chosen_logprob: logprobs["token_logprobs"][0].as_f64().unwrap() as f32,
                top5,
            }
        })
        .collect())
}

/// Checks fixture row `kind` (see the module header).
fn check(kind: &str) {
    let fx = expected();
    let vocab: Vec<String> = fx["vocab"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let model = &fx["models"][kind];
    let results = model["results"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = results
        .iter()
        .map(|r| crate::fixtures::ids(&r["ids"]))
        .collect();
    let file = model["gguf_file"].as_str().unwrap();
    let answers = match serve_and_ask(file, &prompts) {
        Ok(answers) => answers,
        Err(e) if NOT_YET.contains(&kind) => {
            println!("{kind}: not loadable yet: {e}");
            assert!(
                e.contains("a GGUF type ferry cannot compute yet"),
                "{kind}: refused without the loader's readable error: {e}"
            );
            return;
        }
        Err(e) => panic!("{kind}: {e}"),
    };
    let (mut top1_equal, mut overlap) = (0, 0);
    for (r, ours) in results.iter().zip(&answers) {
        let ids: Vec<usize> = r["top10_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let logits: Vec<f32> = r["top10_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let theirs: Vec<&str> = ids[..5].iter().map(|&i| vocab[i].as_str()).collect();
        let shared = theirs
            .iter()
            .filter(|t| ours.top5.contains_key(**t))
            .count();
        overlap += shared;
        let their_logprob = logits[0] - r["logsumexp"].as_f64().unwrap() as f32;
        println!(
            "{kind} {:?}: ours {:?} ({:.4}) top-5 {:?}; llama.cpp {:?} ({their_logprob:.4}), \
             top-5 shared {shared}/5",
            r["ids"],
            ours.chosen,
            ours.chosen_logprob,
            ours.top5.keys().collect::<Vec<_>>(),
            theirs,
        );
        if ours.chosen == theirs[0] {
            top1_equal += 1;
            assert!(
                (ours.chosen_logprob - their_logprob).abs() < logprob_tol(kind),
                "{kind} {:?}: logprob {} vs llama.cpp {their_logprob}",
                r["ids"],
                ours.chosen_logprob
            );
        }
    }
    assert!(
        top1_equal >= 4,
        "{kind}: top-1 equal on {top1_equal}/5 prompts"
    );
    assert!(
        overlap * 100 >= 80 * 5 * results.len(),
        "{kind}: top-5 overlap {overlap}/{}",
        5 * results.len()
    );
    if NOT_YET.contains(&kind) {
        println!("{kind} loads now and matches llama.cpp: take it off NOT_YET");
    }
}

#[test]
fn q4_k_m_matches_llamacpp_through_the_server() {
    check("q4_k_m");
}

#[test]
fn q5_k_m_matches_llamacpp_through_the_server() {
    check("q5_k_m");
}

#[test]
fn q6_k_matches_llamacpp_through_the_server() {
    check("q6_k");
}

#[test]
fn q8_0_matches_llamacpp_through_the_server() {
    check("q8_0");
}

#[test]
fn iq4_xs_matches_llamacpp_through_the_server() {
    check("iq4_xs");
}

#[test]
fn iq4_nl_matches_llamacpp_through_the_server() {
    check("iq4_nl");
}

#[test]
fn mxfp4_matches_llamacpp_through_the_server() {
    check("mxfp4");
}

#[test]
fn the_fixture_lists_every_row_and_its_types() {
    let fx = expected();
    let models = fx["models"].as_object().unwrap();
    let mut kinds: Vec<&str> = models.keys().map(String::as_str).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["iq4_nl", "iq4_xs", "mxfp4", "q4_k_m", "q5_k_m", "q6_k", "q8_0"]
    );
    // The file really holds the type its row is named after (llama.cpp's quantizer chose it).
    for (kind, ty) in [
        ("q4_k_m", "Q4_K"),
        ("q5_k_m", "Q5_K"),
        ("q6_k", "Q6_K"),
        ("q8_0", "Q8_0"),
        ("iq4_xs", "IQ4_XS"),
        ("iq4_nl", "IQ4_NL"),
        ("mxfp4", "MXFP4"),
    ] {
        assert!(
            models[kind]["tensor_types"][ty].as_u64().unwrap_or(0) > 0,
            "{kind}: {}",
            models[kind]["tensor_types"]
        );
    }
}

//! `POST /v1/embeddings` on the real SmolLM2 GGUF: unit vectors of the model's width, the same
//! text twice gives the same vector, related sentences are closer than unrelated ones, a batch
//! equals its inputs sent one by one; the hidden-state path in mode `sequential` (streamed
//! layers) agrees with mode `none` and with the logits path; LangChain's `OpenAIEmbeddings` and
//! the openai SDK (base64 by default) get the server's vectors.

use crate::common::{post, run_python_client, Loopback};
use crate::offload_modes::{device_config, hub};
use crate::real_model;

use axum::http::StatusCode;
use candle_core::Device;
use serde_json::{json, Value};

use ferry::config::{DtypeChoice, OffloadMode};
use ferry::engine::traits::LanguageModel;
use ferry::engine::traits::TextCodec;
use ferry::runtime::adapters::EMBED_CHUNK;
use ferry::runtime::load::load_for_serving_on;
use ferry::server::{app, ServerOptions};

/// SmolLM2-135M's hidden size.
const WIDTH: usize = 576;

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array of numbers: {value}"))
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The server's float vectors for `input` (and the whole body).
async fn embed(input: Value) -> (Vec<Vec<f32>>, Value) {
    let router = app(real_model::backend(), ServerOptions::default());
    let reply = post(
        &router,
        "/v1/embeddings",
        json!({"model": real_model::MODEL, "input": input}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    let vectors = body["data"]
        .as_array()
        .expect("data")
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i);
            floats(&item["embedding"])
        })
        .collect();
    (vectors, body)
}

/// (anchor, related, unrelated): a paraphrase and an unrelated sentence.
const TRIPLES: [[&str; 3]; 3] = [
    [
        "The cat is sleeping on the sofa.",
        "A kitten naps on the couch.",
        "Quarterly revenue grew by ten percent.",
    ],
    [
        "How do I bake bread at home?",
        "What is a good recipe for homemade bread?",
        "The train to Berlin leaves at noon.",
    ],
    [
        "The football match ended in a draw.",
        "Neither team won the soccer game.",
        "Add two cups of flour to the bowl.",
    ],
];

#[tokio::test]
async fn real_vectors_are_unit_stable_and_meaningful() {
    let texts: Vec<&str> = TRIPLES.iter().flatten().copied().collect();
    let (vectors, body) = embed(json!(texts)).await;
    assert_eq!(vectors.len(), texts.len());
    for (v, text) in vectors.iter().zip(&texts) {
        assert_eq!(v.len(), WIDTH, "{text}");
        let norm = dot(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{text}: norm {norm}");
    }
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(prompt_tokens >= texts.len() as u64 * 5, "{body}");
    assert_eq!(body["usage"]["total_tokens"], prompt_tokens);
    for (t, triple) in vectors.chunks(3).zip(TRIPLES) {
        let related = dot(&t[0], &t[1]);
        let unrelated = dot(&t[0], &t[2]);
        let also_unrelated = dot(&t[1], &t[2]);
        // Measured: related 0.87..0.93, unrelated 0.55..0.80, the closest gap 0.07.
        assert!(
            related > unrelated.max(also_unrelated) + 0.05,
            "{triple:?}: related {related}, unrelated {unrelated} / {also_unrelated}"
        );
    }

    // The same text twice, and each input alone: the vectors of the batch, bit for bit.
    let (twice, _) = embed(json!([texts[0], texts[0]])).await;
    assert_eq!(twice[0], twice[1]);
    assert_eq!(twice[0], vectors[0]);
    for (i, text) in texts.iter().enumerate() {
        let (alone, _) = embed(json!(text)).await;
        assert_eq!(alone[0], vectors[i], "{text}");
    }
    // `dimensions` equal to the width is accepted; token ids embed as their text does.
    let router = app(real_model::backend(), ServerOptions::default());
    let body = json!({"model": real_model::MODEL, "input": "x", "dimensions": WIDTH});
    assert_eq!(
        post(&router, "/v1/embeddings", body).await.status,
        StatusCode::OK
    );
    let ids = real_model::backend()
        .tokenize(real_model::MODEL, texts[0], true)
        .expect("tokenize");
    let (by_ids, _) = embed(json!([ids])).await;
    assert_eq!(by_ids[0], vectors[0]);
}

/// Mode `sequential` streams every layer through one slot: its hidden states (and so its
/// embeddings) are mode `none`'s, and through the output head its last row gives the logits.
#[test]
fn streamed_hidden_states_match_mode_none_and_the_logits() {
    let load = |mode| {
        let mut config = real_model::offloaded(DtypeChoice::Auto, mode);
        // Room for an input longer than one embedding chunk (`EMBED_CHUNK`).
        config.max_context = Some(1024);
        load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub())
            .unwrap_or_else(|e| panic!("load {mode:?}: {e}"))
    };
    let none = load(OffloadMode::None);
    let prompt = none
        .codec
        .encode(
            "The capital of France is Paris, and the capital of Italy is",
            true,
        )
        .expect("encode");
    let mut none = none.runner;
    let mut streamed = load(OffloadMode::Sequential).runner;
    assert_eq!(streamed.store().resident_layers(), 0, "every layer streams");

    let hidden = |runner: &mut ferry::runtime::adapters::ModelRunner| {
        let mut seq = runner.new_sequence();
        runner
            .hidden_states(&mut seq, &prompt)
            .expect("hidden states")
    };
    let (h_none, h_streamed) = (hidden(&mut none), hidden(&mut streamed));
    let rows = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(h_streamed.dims(), &[prompt.len(), WIDTH]);
    let diff = max_diff(&rows(&h_none), &rows(&h_streamed));
    assert!(
        diff < 1e-4,
        "streamed hidden states differ from mode none by {diff}"
    );

    // Through the head: the streamed last row gives the streamed logits.
    let last = h_streamed.narrow(0, prompt.len() - 1, 1).unwrap();
    let head = streamed.model().fixed().lm_head.forward(&last).unwrap();
    let head = head.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut seq = streamed.new_sequence();
    let logits = streamed.forward(&mut seq, &prompt).expect("logits");
    let diff = max_diff(&head, &logits);
    assert!(
        diff < 1e-3,
        "head(hidden) differs from the logits by {diff}"
    );

    let (e_none, e_streamed) = (
        none.embed(&prompt).unwrap(),
        streamed.embed(&prompt).unwrap(),
    );
    let diff = max_diff(&e_none, &e_streamed);
    assert!(diff < 1e-5, "streamed embedding differs by {diff}");
    // A long input runs in chunks: the same vector as one pass would give (mean of all rows).
    let long: Vec<u32> = prompt
        .iter()
        .copied()
        .cycle()
        .take(EMBED_CHUNK + 188)
        .collect();
    let mut seq = none.new_sequence();
    let whole = none.hidden_states(&mut seq, &long).unwrap();
    let mean = whole.mean(0).unwrap().to_vec1::<f32>().unwrap();
    let norm = dot(&mean, &mean).sqrt();
    let want: Vec<f32> = mean.iter().map(|x| x / norm).collect();
    let diff = max_diff(&none.embed(&long).unwrap(), &want);
    assert!(
        diff < 1e-4,
        "the pooled embedding differs from the mean by {diff}"
    );
}

const TEXTS: [&str; 3] = [
    "The cat is sleeping on the sofa.",
    "Quarterly revenue grew by ten percent.",
    "A kitten naps on the couch.",
];

#[tokio::test]
async fn langchain_and_the_openai_sdk_get_the_servers_vectors() {
    let (expected, _) = embed(json!(TEXTS)).await;
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let script = format!(
        r#"
import json, os
from langchain_openai import OpenAIEmbeddings
from openai import OpenAI
base = os.environ["FERRY_BASE_URL"]
lc = OpenAIEmbeddings(model="{model}", base_url=base, api_key="unused",
                      check_embedding_ctx_length=False)
docs = lc.embed_documents(["{a}", "{b}"])
query = lc.embed_query("{c}")
client = OpenAI(base_url=base, api_key="unused")
default = client.embeddings.create(model="{model}", input=["{a}", "{b}", "{c}"])
floats = client.embeddings.create(model="{model}", input=["{a}", "{b}", "{c}"],
                                  encoding_format="float")
print(json.dumps({{
    "docs": docs, "query": query,
    "default": [list(map(float, d.embedding)) for d in default.data],
    "float": [d.embedding for d in floats.data],
    "usage": default.usage.prompt_tokens,
}}))
"#,
        model = real_model::MODEL,
        a = TEXTS[0],
        b = TEXTS[1],
        c = TEXTS[2],
    );
    let out = run_python_client(&script, &server.url("/v1")).await;
    server.stop.stop();
    let out: Value = serde_json::from_str(out.trim()).expect("the client prints JSON");
    let list = |v: &Value| -> Vec<Vec<f32>> { v.as_array().unwrap().iter().map(floats).collect() };
    let docs = list(&out["docs"]);
    assert_eq!(docs.len(), 2);
    assert!(max_diff(&docs[0], &expected[0]) < 1e-6);
    assert!(max_diff(&docs[1], &expected[1]) < 1e-6);
    assert!(max_diff(&floats(&out["query"]), &expected[2]) < 1e-6);
    // The SDK's default (base64) decodes to exactly the float vectors.
    let (default, float) = (list(&out["default"]), list(&out["float"]));
    assert_eq!(default, float);
    for (got, want) in float.iter().zip(&expected) {
        assert!(max_diff(got, want) < 1e-6);
    }
    assert!(out["usage"].as_u64().is_some_and(|n| n > 0), "{out}");
}

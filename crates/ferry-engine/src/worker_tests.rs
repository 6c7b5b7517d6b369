//! Tests for the engine threads and [`EngineHandle`], with a scripted model and a real
//! byte-level BPE tokenizer.

use std::time::{Duration, Instant};

use super::*;
use crate::{
    request::FinishReason,
    test_support::{greedy_request, ScriptModel, TestCodec},
};

fn codec() -> Arc<dyn TextCodec> {
    Arc::new(TestCodec::new())
}

fn status(handle: &EngineHandle, name: &str) -> ModelStatus {
    let cards = handle.models();
    cards
        .iter()
        .find(|c| c.id == name)
        .map(|c| c.status)
        .unwrap()
}

fn wait_until(handle: &EngineHandle, name: &str, want: ModelStatus) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(handle, name) != want {
        assert!(
            Instant::now() < deadline,
            "model {name} never became {want:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Receives every event of one request: (text, final event).
async fn collect(mut rx: mpsc::Receiver<GenerationEvent>) -> (String, GenerationEvent) {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenerationEvent::Token(t) => text.push_str(&t.text),
            GenerationEvent::Finished {
                ref trailing_text, ..
            } => {
                text.push_str(trailing_text);
                return (text, event);
            }
            GenerationEvent::Failed(_) => return (text, event),
        }
    }
    panic!("the stream ended without a final event");
}

#[tokio::test]
async fn serves_requests_once_loaded() {
    let handle = EngineHandle::new(["a", "b"]);
    let (release, gate) = std_mpsc::channel::<()>();
    handle
        .load("a", move || {
            gate.recv().ok();
            Ok((ScriptModel::saying("he wo café 😀"), codec()))
        })
        .unwrap();
    let cards = handle.models();
    assert_eq!(cards.len(), 2);
    assert!(cards
        .iter()
        .all(|c| c.status == ModelStatus::Loading && c.max_context.is_none()));
    assert_eq!(
        handle.submit(greedy_request("a", vec![1], 4)).err(),
        Some(EngineError::NotReady("a".into()))
    );
    assert_eq!(
        handle.max_context("a"),
        Err(EngineError::NotReady("a".into()))
    );

    release.send(()).unwrap();
    wait_until(&handle, "a", ModelStatus::Ready);
    assert_eq!(handle.max_context("a"), Ok(1024));
    assert_eq!(status(&handle, "b"), ModelStatus::Loading);

    let prompt = handle.tokenize("a", "he said", false).unwrap();
    assert_eq!(handle.detokenize("a", &prompt).unwrap(), "he said");
    let n = handle.tokenize("a", "he wo café 😀", false).unwrap().len();
    let (text, last) = collect(
        handle
            .submit(greedy_request("a", prompt.clone(), 50))
            .unwrap(),
    )
    .await;
    assert_eq!(text, "he wo café 😀");
    match last {
        GenerationEvent::Finished { reason, usage, .. } => {
            assert_eq!(reason, FinishReason::Stop);
            assert_eq!(usage.prompt_tokens, prompt.len());
            assert_eq!(usage.completion_tokens, n + 1);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn unknown_models_and_bad_prompts_are_refused_up_front() {
    let handle = EngineHandle::new(["a"]);
    handle
        .model_ready("a", ScriptModel::saying("x"), codec())
        .unwrap();
    wait_until(&handle, "a", ModelStatus::Ready);
    let missing = EngineError::ModelNotFound("zz".into());
    assert_eq!(
        handle.submit(greedy_request("zz", vec![1], 1)).err(),
        Some(missing.clone())
    );
    assert_eq!(
        handle.tokenize("zz", "x", false).err(),
        Some(missing.clone())
    );
    assert_eq!(
        handle.render_chat("zz", &[], true).err(),
        Some(missing.clone())
    );
    assert!(matches!(
        handle.submit(greedy_request("a", vec![1; 1000], 100)),
        Err(EngineError::ContextLengthExceeded {
            requested: 1100,
            ..
        })
    ));
    assert!(matches!(
        handle.submit(greedy_request("a", vec![], 1)),
        Err(EngineError::InvalidRequest { .. })
    ));
    assert!(matches!(
        handle.detokenize("a", &[100_000]),
        Err(EngineError::InvalidRequest { .. })
    ));
    let msgs = [ChatMessage {
        role: "user".into(),
        content: "hi".into(),
        ..Default::default()
    }];
    assert_eq!(
        handle.render_chat("a", &msgs, true).unwrap(),
        "user: hi\nassistant:"
    );
    assert!(matches!(
        handle.model_ready("a", ScriptModel::saying("x"), codec()),
        Err(EngineError::Internal(_))
    ));
}

#[tokio::test]
async fn requests_are_served_in_order_and_all_complete() {
    let handle = EngineHandle::new(["a"]);
    handle
        .model_ready("a", ScriptModel::saying("he wo"), codec())
        .unwrap();
    wait_until(&handle, "a", ModelStatus::Ready);
    let receivers: Vec<_> = (0..4)
        .map(|_| handle.submit(greedy_request("a", vec![1, 2], 10)).unwrap())
        .collect();
    for rx in receivers {
        let (text, last) = collect(rx).await;
        assert_eq!(text, "he wo");
        assert!(matches!(
            last,
            GenerationEvent::Finished {
                reason: FinishReason::Stop,
                ..
            }
        ));
    }
}

#[tokio::test]
async fn a_panicking_model_fails_the_request_but_not_the_engine() {
    let handle = EngineHandle::new(["a"]);
    let mut model = ScriptModel::saying("he");
    model.poison = Some(7);
    handle.model_ready("a", model, codec()).unwrap();
    wait_until(&handle, "a", ModelStatus::Ready);
    let (_, last) = collect(handle.submit(greedy_request("a", vec![7], 5)).unwrap()).await;
    assert!(
        matches!(&last, GenerationEvent::Failed(EngineError::Internal(m)) if m.contains("scripted panic")),
        "{last:?}"
    );
    let (text, last) = collect(handle.submit(greedy_request("a", vec![1], 5)).unwrap()).await;
    assert_eq!(text, "he");
    assert!(matches!(last, GenerationEvent::Finished { .. }));
}

#[tokio::test]
async fn an_engine_that_stops_says_so_and_refuses_new_requests() {
    let handle = EngineHandle::new(["a"]);
    let mut model = ScriptModel::saying("he");
    model.sequences_before_panic = Some(1);
    handle.model_ready("a", model, codec()).unwrap();
    let (text, _) = collect(handle.submit(greedy_request("a", vec![1], 5)).unwrap()).await;
    assert_eq!(text, "he");
    // The second sequence panics outside the request's isolation: the engine thread ends.
    if let Ok(mut events) = handle.submit(greedy_request("a", vec![1], 5)) {
        while events.recv().await.is_some() {}
    }
    wait_until(&handle, "a", ModelStatus::Stopped);
    assert!(matches!(
        handle.submit(greedy_request("a", vec![1], 5)),
        Err(EngineError::Unavailable)
    ));
}

#[tokio::test]
async fn failed_loads_are_reported() {
    let handle = EngineHandle::new(["err", "panic"]);
    handle
        .load(
            "err",
            || -> EngineResult<(ScriptModel, Arc<dyn TextCodec>)> {
                Err(EngineError::Internal("no such file".into()))
            },
        )
        .unwrap();
    handle
        .load(
            "panic",
            || -> EngineResult<(ScriptModel, Arc<dyn TextCodec>)> { panic!("loader blew up") },
        )
        .unwrap();
    wait_until(&handle, "err", ModelStatus::Failed);
    wait_until(&handle, "panic", ModelStatus::Failed);
    assert!(matches!(
        handle.submit(greedy_request("err", vec![1], 1)),
        Err(EngineError::LoadFailed(m)) if m.contains("no such file")
    ));
    assert!(matches!(
        handle.tokenize("panic", "x", false),
        Err(EngineError::LoadFailed(m)) if m.contains("loader blew up")
    ));
    assert!(handle
        .models()
        .iter()
        .all(|c| c.status == ModelStatus::Failed));
}

/// An engine serving "a" with one place in its batch and no queue, whose model answers `a`s at
/// 20 ms a step (so a long request holds the place).
fn one_place_engine() -> EngineHandle {
    let handle = EngineHandle::with_options(
        ["a"],
        EngineOptions {
            max_queue: 0,
            max_batch: 1,
            ..EngineOptions::default()
        },
    );
    let mut model = ScriptModel::saying("");
    model.after = b'a' as u32;
    model.step_delay = Duration::from_millis(20);
    handle.model_ready("a", model, codec()).unwrap();
    handle
}

#[tokio::test]
async fn max_queue_refuses_extra_requests_and_cancellation_frees_its_place() {
    let handle = one_place_engine();
    wait_until(&handle, "a", ModelStatus::Ready);
    let mut long = handle.submit(greedy_request("a", vec![1], 500)).unwrap();
    assert!(matches!(long.recv().await, Some(GenerationEvent::Token(_))));
    assert!(matches!(
        handle.submit(greedy_request("a", vec![1], 1)),
        Err(EngineError::Overloaded(_))
    ));
    drop(long);
    let deadline = Instant::now() + Duration::from_secs(10);
    let rx = loop {
        match handle.submit(greedy_request("a", vec![1], 2)) {
            Ok(rx) => break rx,
            Err(EngineError::Overloaded(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("cancellation did not free the queue: {e:?}"),
        }
    };
    let (text, _) = collect(rx).await;
    assert_eq!(text, "aa");
}

#[test]
fn threads_exit_when_the_last_handle_is_dropped() {
    let handle = EngineHandle::new(["a"]);
    let thread = handle
        .model_ready("a", ScriptModel::saying("x"), codec())
        .unwrap();
    let clone = handle.clone();
    wait_until(&clone, "a", ModelStatus::Ready);
    drop(handle);
    drop(clone);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !thread.is_finished() {
        assert!(Instant::now() < deadline, "engine thread still running");
        std::thread::sleep(Duration::from_millis(5));
    }
    thread.join().unwrap();
}

#[tokio::test]
async fn metrics_count_exactly_the_usage_and_gauges_return_to_zero() {
    let handle = EngineHandle::new(["a"]);
    let metrics = handle.metrics();
    handle
        .model_ready("a", ScriptModel::saying("he wo café"), codec())
        .unwrap();
    let mut receivers = Vec::new();
    for (prompt, max_tokens) in [(vec![1, 2, 3], 2), (vec![4; 5], 50), (vec![7], 0)] {
        receivers.push(
            handle
                .submit(greedy_request("a", prompt, max_tokens))
                .unwrap(),
        );
    }
    let (mut prompt, mut completion) = (0, 0);
    for rx in receivers {
        match collect(rx).await.1 {
            GenerationEvent::Finished { usage, .. } => {
                prompt += usage.prompt_tokens;
                completion += usage.completion_tokens;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(prompt, 9);
    assert!(completion > 2, "{completion}");
    assert_eq!(metrics.prompt_tokens(), prompt as u64);
    assert_eq!(metrics.generated_tokens(), completion as u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.running() != 0 {
        assert!(Instant::now() < deadline, "running never returned to 0");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metrics.waiting(), 0);
    assert!(metrics
        .render()
        .contains("ferry_model_resident{model=\"a\"} 1"));
}

/// One batched step: `(sequence id, tokens fed)` per member.
type Step = Vec<(usize, usize)>;

/// [`ScriptModel`] that records every batched step.
struct Recording {
    inner: ScriptModel,
    next_id: std::cell::Cell<usize>,
    steps: Arc<Mutex<Vec<Step>>>,
}

impl LanguageModel for Recording {
    type Sequence = (usize, crate::test_support::ScriptSeq);
    type Block = ();

    fn new_sequence(&self) -> Self::Sequence {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        (id, self.inner.new_sequence())
    }

    fn forward(&mut self, seq: &mut Self::Sequence, tokens: &[u32]) -> EngineResult<Vec<f32>> {
        self.inner.forward(&mut seq.1, tokens)
    }

    fn forward_rows(
        &mut self,
        batch: &mut [(&mut Self::Sequence, &[u32])],
        outputs: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>> {
        let step = batch
            .iter()
            .map(|(seq, tokens)| (seq.0, tokens.len()))
            .collect();
        self.steps.lock().unwrap().push(step);
        let mut rows = Vec::new();
        for ((seq, tokens), &n) in batch.iter_mut().zip(outputs) {
            rows.extend(
                self.inner
                    .forward_rows(&mut [(&mut seq.1, *tokens)], &[n])?,
            );
        }
        Ok(rows)
    }

    fn max_context(&self) -> usize {
        self.inner.max_context()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}

#[tokio::test]
async fn a_long_prompt_beside_a_stream_keeps_every_step_within_the_token_budget() {
    const BUDGET: usize = 16;
    let handle = EngineHandle::with_options(
        ["a"],
        EngineOptions {
            max_batch: 4,
            prefill_chunk: 64,
            max_step_tokens: BUDGET,
            ..EngineOptions::default()
        },
    );
    let steps = Arc::new(Mutex::new(Vec::new()));
    let mut inner = ScriptModel::saying("");
    inner.after = b'a' as u32;
    inner.max_context = 4096;
    handle
        .model_ready(
            "a",
            Recording {
                inner,
                next_id: std::cell::Cell::new(0),
                steps: Arc::clone(&steps),
            },
            codec(),
        )
        .unwrap();
    // The stream starts first and decodes (long enough to outlast the prefill beside it);
    // then a 1000-token prompt arrives.
    let mut stream = handle
        .submit(greedy_request("a", vec![1, 2], 3000))
        .unwrap();
    assert!(matches!(
        stream.recv().await,
        Some(GenerationEvent::Token(_))
    ));
    let long = handle
        .submit(greedy_request("a", vec![3; 1000], 1))
        .unwrap();
    let (_, finished) = collect(long).await;
    assert!(matches!(finished, GenerationEvent::Finished { .. }));
    assert!(
        matches!(stream.try_recv(), Ok(GenerationEvent::Token(_))),
        "the stream is still running"
    );
    drop(stream);

    let steps = steps.lock().unwrap().clone();
    // Every step computed at most BUDGET tokens, and the long prompt took many steps.
    for step in &steps {
        let tokens: usize = step.iter().map(|(_, n)| n).sum();
        assert!(tokens <= BUDGET, "a step of {tokens} tokens: {step:?}");
    }
    // Sequence 0 is the stream, 1 the long prompt.
    let prefill_steps: Vec<&Step> = steps
        .iter()
        .filter(|s| s.iter().any(|&(id, n)| id == 1 && n > 1))
        .collect();
    assert!(
        prefill_steps.len() >= 1000 / BUDGET,
        "{} prefill steps",
        prefill_steps.len()
    );
    // The stream decoded in every one of them: its gap between two tokens was one step of at
    // most BUDGET tokens, however long the prompt beside it.
    for step in &prefill_steps {
        assert!(
            step.contains(&(0, 1)),
            "a prefill step without the stream's decode: {step:?}"
        );
    }
}

#[tokio::test]
async fn check_capacity_refuses_before_submit_and_names_max_queue() {
    let handle = one_place_engine();
    assert_eq!(handle.check_capacity("a"), Ok(()));
    let mut long = handle.submit(greedy_request("a", vec![1], 500)).unwrap();
    assert!(matches!(long.recv().await, Some(GenerationEvent::Token(_))));
    match handle.check_capacity("a") {
        Err(EngineError::Overloaded(message)) => {
            assert!(message.contains("server.max_queue"), "{message}")
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
    assert_eq!(
        handle.check_capacity("zz"),
        Err(EngineError::ModelNotFound("zz".into()))
    );
}

/// Embeddings run on the model's thread between the steps of a running generation: the
/// vectors come back in input order, and the generation still finishes as it would alone.
#[tokio::test]
async fn embeds_between_generation_steps() {
    let handle = EngineHandle::new(["m"]);
    let mut model = ScriptModel::saying("he wo café he wo café he wo");
    model.step_delay = Duration::from_millis(2);
    handle.model_ready("m", model, codec()).unwrap();
    assert_eq!(handle.embedding_size("m"), Ok(3));

    let generation = handle.submit(greedy_request("m", vec![1, 2], 64)).unwrap();
    let inputs = vec![vec![5, 6, 7], vec![9], vec![5, 6, 8]];
    let request = EmbeddingRequest {
        model: "m".into(),
        inputs: inputs.clone(),
    };
    let vectors = handle.embed(request).unwrap().await.unwrap().unwrap();
    assert_eq!(vectors.len(), 3);
    for (input, vector) in inputs.iter().zip(&vectors) {
        let v = [
            input.len() as f32,
            input[0] as f32 + 1.0,
            input[input.len() - 1] as f32 + 1.0,
        ];
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let want: Vec<f32> = v.iter().map(|x| x / norm).collect();
        assert_eq!(vector, &want, "input {input:?}");
    }
    let (text, end) = collect(generation).await;
    assert_eq!(text, "he wo café he wo café he wo");
    assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
}

#[tokio::test]
async fn refuses_embedding_inputs_it_cannot_run() {
    let handle = EngineHandle::new(["m"]);
    handle
        .model_ready("m", ScriptModel::saying("he"), codec())
        .unwrap();
    let refused = |inputs: Vec<Vec<u32>>| {
        let request = EmbeddingRequest {
            model: "m".into(),
            inputs,
        };
        match handle.embed(request) {
            Err(EngineError::InvalidRequest { message, param }) => {
                assert_eq!(param.as_deref(), Some("input"), "{message}");
                message
            }
            other => panic!("expected an invalid request, got {:?}", other.map(|_| ())),
        }
    };
    assert!(refused(Vec::new()).contains("must not be empty"));
    assert!(refused(vec![vec![1], Vec::new()]).contains("input 1 is empty"));
    let too_long = refused(vec![vec![1; 1025]]);
    assert!(
        too_long.contains("1025 tokens") && too_long.contains("1024"),
        "{too_long}"
    );
    assert!(refused(vec![vec![u32::MAX]]).contains("out of range"));
    let unknown = EmbeddingRequest {
        model: "x".into(),
        inputs: vec![vec![1]],
    };
    assert_eq!(
        handle.embed(unknown).err(),
        Some(EngineError::ModelNotFound("x".into()))
    );
}

/// A client that goes away before its inputs are embedded frees its place in the queue.
#[tokio::test]
async fn a_dropped_embedding_request_is_dropped() {
    let handle = EngineHandle::with_options(
        ["m"],
        EngineOptions {
            max_queue: 0,
            max_batch: 1,
            ..EngineOptions::default()
        },
    );
    let mut model = ScriptModel::saying("he");
    model.step_delay = Duration::from_millis(20);
    handle.model_ready("m", model, codec()).unwrap();
    let request = EmbeddingRequest {
        model: "m".into(),
        inputs: vec![vec![1]; 50],
    };
    let started = Instant::now();
    drop(handle.embed(request.clone()).unwrap());
    // Capacity is one request: the dropped one holds it until the loop sees it gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    let reply = loop {
        match handle.embed(request.clone()) {
            Ok(reply) => break reply,
            Err(EngineError::Overloaded(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("the dropped request kept its place: {e}"),
        }
    };
    assert_eq!(reply.await.unwrap().unwrap().len(), 50);
    // 50 inputs of 20 ms: had the dropped request's run too, this would take twice as long.
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(1600), "{elapsed:?}");
}

#[test]
fn placement_is_kept_per_model_and_unknown_names_are_refused() {
    use crate::placement::{BudgetUse, LayerLocation, LayerSite};
    let handle = EngineHandle::new(["a", "b"]);
    assert_eq!(handle.placement("a"), None, "nothing set yet");
    let placement = ModelPlacement {
        offload_mode: "auto".into(),
        budget: BudgetUse {
            budget: 100,
            weights: 60,
            ..BudgetUse::default()
        },
        layers: vec![LayerSite {
            index: 0,
            location: LayerLocation::Streamed,
            bytes: 40,
        }],
        experts: Vec::new(),
        expert_cache_slots: 0,
        max_context: 64,
        max_batch: 2,
        link_bytes_per_s: Some(1e9),
    };
    handle.set_placement("a", placement.clone()).unwrap();
    assert_eq!(handle.placement("a"), Some(placement.clone()));
    assert_eq!(handle.placement("b"), None, "only the model it was set on");
    assert!(handle.set_placement("nope", placement).is_err());
    assert_eq!(handle.placement("nope"), None);
}

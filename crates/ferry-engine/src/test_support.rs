//! Test fixtures shared by the engine's unit tests: a real byte-level BPE `tokenizers::Tokenizer`
//! built in memory (the 256 byte symbols plus a few merges, one of which splits an emoji across
//! tokens) wrapped as a [`TextCodec`], and a scripted [`LanguageModel`].

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;

use serde_json::json;
use tokenizers::Tokenizer;

use ferry_metrics::Metrics;

use super::{
    prefix_cache::PrefixCacheOptions,
    queue::{Job, Work},
    request::{ChatMessage, GenerationEvent, GenerationParams, GenerationRequest, SamplingParams},
    scheduler::StepLimits,
    serve_loop::{serve_requests, LoopContext},
    speculative::Speculation,
    traits::{LanguageModel, TextCodec},
    worker::{DEFAULT_MAX_STEP_TOKENS, DEFAULT_PREFILL_CHUNK},
    EngineError, EngineResult,
};

/// GPT-2's byte -> printable char table (what ByteLevel uses), as (byte, char) pairs.
pub fn byte_chars() -> Vec<(u8, char)> {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).collect();
    printable.extend('¡' as u32..='¬' as u32);
    printable.extend('®' as u32..='ÿ' as u32);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            (b as u8, char::from_u32(c).unwrap_or('?'))
        })
        .collect()
}

/// Merges on top of the byte alphabet, as symbol strings.
const MERGES: &[(&str, &str)] = &[
    ("Ġ", "w"),  // " w"
    ("Ã", "©"),  // "é" (C3 A9) as one token
    ("ð", "Ł"),  // first two bytes of a U+1F6xx/1F60x emoji (F0 9F)
    ("Ġw", "o"), // " wo"
    ("h", "e"),  // "he"
];

/// Id of the special end token in [`tiny_tokenizer`].
pub const EOS: u32 = 256 + MERGES.len() as u32;

/// A byte-level BPE tokenizer: ids 0..256 are the bytes, then the merges, then `<eos>` (special).
pub fn tiny_tokenizer() -> Tokenizer {
    tiny_tokenizer_with(&[])
}

/// gpt-oss's harmony markers, special tokens of [`TestCodec::harmony`] (ids after [`EOS`]).
pub const HARMONY_SPECIALS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
];

/// [`tiny_tokenizer`] with `specials` added as special tokens after `<eos>`.
pub fn tiny_tokenizer_with(specials: &[&str]) -> Tokenizer {
    let mut vocab: HashMap<String, u32> = byte_chars()
        .into_iter()
        .map(|(b, c)| (c.to_string(), b as u32))
        .collect();
    for (i, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), 256 + i as u32);
    }
    vocab.insert("<eos>".to_owned(), EOS);
    let mut added = vec![json!({
        "id": EOS, "content": "<eos>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true
    })];
    for (i, special) in specials.iter().enumerate() {
        let id = EOS + 1 + i as u32;
        vocab.insert((*special).to_owned(), id);
        added.push(json!({
            "id": id, "content": special, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    });
    Tokenizer::from_str(&spec.to_string()).expect("test tokenizer spec is valid")
}

/// [`TextCodec`] over a `tokenizers::Tokenizer` (what the model layer's adapter will do too).
pub struct TestCodec {
    tok: Tokenizer,
    eos: Vec<u32>,
    byte_of: HashMap<char, u8>,
    /// Special tokens besides `<eos>` (ids after it).
    specials: usize,
}

impl TestCodec {
    /// The codec over [`tiny_tokenizer`], with `<eos>` as its only EOS id.
    pub fn new() -> Self {
        Self {
            tok: tiny_tokenizer(),
            eos: vec![EOS],
            byte_of: byte_chars().into_iter().map(|(b, c)| (c, b)).collect(),
            specials: 0,
        }
    }

    /// The codec with gpt-oss's harmony markers as special tokens ([`HARMONY_SPECIALS`]);
    /// `<|return|>` and `<|call|>` end a generation, as in gpt-oss's vocabulary.
    pub fn harmony() -> Self {
        let tok = tiny_tokenizer_with(&HARMONY_SPECIALS);
        let id = |t: &str| tok.token_to_id(t).expect("a harmony special");
        let eos = vec![EOS, id("<|return|>"), id("<|call|>")];
        Self {
            eos,
            tok,
            byte_of: byte_chars().into_iter().map(|(b, c)| (c, b)).collect(),
            specials: HARMONY_SPECIALS.len(),
        }
    }

    /// Vocabulary size including the special tokens.
    pub fn vocab_size(&self) -> usize {
        EOS as usize + 1 + self.specials
    }
}

impl Default for TestCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl TextCodec for TestCodec {
    fn sampling_defaults(&self) -> SamplingParams {
        SamplingParams::default()
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>> {
        let enc = self
            .tok
            .encode(text, add_special_tokens)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> EngineResult<String> {
        self.tok
            .decode(ids, skip_special_tokens)
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self.tok.id_to_token(id) {
            Some(t) if id < EOS => t
                .chars()
                .filter_map(|c| self.byte_of.get(&c))
                .copied()
                .collect(),
            Some(t) => t.into_bytes(),
            None => Vec::new(),
        }
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    fn is_special_token(&self, id: u32) -> bool {
        id >= EOS
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        let mut out: String = messages
            .iter()
            .map(|m| format!("{}: {}\n", m.role, m.content))
            .collect();
        if add_generation_prompt {
            out.push_str("assistant:");
        }
        Ok(out)
    }
}

/// A model that "generates" a fixed script: after the prompt, the logits favour `script[k]` at
/// step k (strongly, so greedy and seeded sampling agree), then `after` forever.
#[derive(Debug, Clone)]
pub struct ScriptModel {
    /// Tokens to favour, in order.
    pub script: Vec<u32>,
    /// Token favoured once the script is exhausted.
    pub after: u32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Context window.
    pub max_context: usize,
    /// A step panics when fed this token id (to test panic isolation).
    pub poison: Option<u32>,
    /// Sleep this long in every step (to keep the engine busy in queue tests).
    pub step_delay: std::time::Duration,
    /// Sequence steps so far, across sequences (a step of `n` sequences counts `n`).
    pub sequence_steps: usize,
    /// Tokens fed so far, across sequences.
    pub tokens_fed: usize,
    /// Whether [`LanguageModel::fork_sequence`] copies sequences (else it declines).
    pub forks: bool,
    /// Whether [`LanguageModel::copy_block`] copies positions for the prefix cache (else it
    /// declines, and the cache stays off). Default false.
    pub blocks: bool,
    /// [`LanguageModel::new_sequence`] panics (outside any request's isolation, so the engine
    /// stops) once this many sequences were made. Default none.
    pub sequences_before_panic: Option<usize>,
    /// Sequences made so far.
    pub sequences_made: std::cell::Cell<usize>,
    /// Whether [`LanguageModel::truncate_sequence`] works (so the serving loop may
    /// speculate). Default true.
    pub truncate: bool,
    /// What [`LanguageModel::speculation`] says. Default off.
    pub speculation: Speculation,
}

impl ScriptModel {
    /// A model scripted to produce `script` then `after`.
    pub fn new(script: Vec<u32>, after: u32, vocab: usize) -> Self {
        Self {
            script,
            after,
            vocab,
            max_context: 1024,
            poison: None,
            step_delay: std::time::Duration::ZERO,
            sequence_steps: 0,
            tokens_fed: 0,
            forks: true,
            blocks: false,
            sequences_before_panic: None,
            sequences_made: std::cell::Cell::new(0),
            truncate: true,
            speculation: Speculation::default(),
        }
    }

    /// A model scripted to say `text` (in [`TestCodec`]'s tokens), then EOS.
    pub fn saying(text: &str) -> Self {
        let codec = TestCodec::new();
        Self::new(codec.encode(text, false).unwrap(), EOS, codec.vocab_size())
    }
}

/// A greedy (temperature 0) request to `model` continuing `prompt` by at most `max_tokens`.
pub fn greedy_request(model: &str, prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        cache_partition: None,
        model: model.into(),
        prompt,
        params: GenerationParams {
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            ..GenerationParams::default()
        },
    }
}

/// The concatenated token texts of `events` and the final event's trailing text.
pub fn text_of(events: &[GenerationEvent]) -> String {
    events
        .iter()
        .map(|e| match e {
            GenerationEvent::Token(t) => t.text.clone(),
            GenerationEvent::Finished { trailing_text, .. } => trailing_text.clone(),
            GenerationEvent::Failed(_) => String::new(),
        })
        .collect()
}

/// Sequence state of [`ScriptModel`]: how many tokens were fed and in how many steps.
#[derive(Debug, Default, Clone)]
pub struct ScriptSeq {
    /// Tokens fed so far.
    pub fed: Vec<u32>,
    /// Steps of this sequence.
    pub steps: usize,
}

impl ScriptModel {
    /// One sequence's part of a step: for each of its last `outputs` positions, the logits
    /// favouring its next scripted token (each output row counts as one step, as feeding the
    /// positions one at a time would).
    fn step(&mut self, seq: &mut ScriptSeq, tokens: &[u32], outputs: usize) -> Vec<Vec<f32>> {
        self.sequence_steps += 1;
        self.tokens_fed += tokens.len();
        seq.fed.extend_from_slice(tokens);
        (0..outputs)
            .map(|_| {
                let next = self.script.get(seq.steps).copied().unwrap_or(self.after);
                seq.steps += 1;
                let mut logits = vec![0.0; self.vocab];
                if let Some(l) = logits.get_mut(next as usize) {
                    *l = 30.0;
                }
                logits
            })
            .collect()
    }
}

impl LanguageModel for ScriptModel {
    type Sequence = ScriptSeq;
    /// The tokens the block's positions were fed.
    type Block = Vec<u32>;

    fn new_sequence(&self) -> ScriptSeq {
        let made = self.sequences_made.get();
        if self
            .sequences_before_panic
            .is_some_and(|limit| made >= limit)
        {
            panic!("scripted engine failure");
        }
        self.sequences_made.set(made + 1);
        ScriptSeq::default()
    }

    /// Three values from the input's length, first and last ids, L2-normalised: inputs that
    /// differ there get different vectors.
    fn embedding_size(&self) -> Option<usize> {
        Some(3)
    }

    fn embed(&mut self, tokens: &[u32]) -> EngineResult<Vec<f32>> {
        std::thread::sleep(self.step_delay);
        self.tokens_fed += tokens.len();
        let first = tokens.first().copied().unwrap_or(0) as f32;
        let last = tokens.last().copied().unwrap_or(0) as f32;
        let v = [tokens.len() as f32, first + 1.0, last + 1.0];
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        Ok(v.iter().map(|x| x / norm).collect())
    }

    fn forward_rows(
        &mut self,
        batch: &mut [(&mut ScriptSeq, &[u32])],
        outputs: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>> {
        let poisoned = self
            .poison
            .filter(|p| batch.iter().any(|(_, t)| t.contains(p)));
        if let Some(p) = poisoned {
            panic!("scripted panic on token {p}");
        }
        std::thread::sleep(self.step_delay);
        Ok(batch
            .iter_mut()
            .zip(outputs)
            .flat_map(|((seq, tokens), &n)| self.step(seq, tokens, n))
            .collect())
    }

    /// Drops the tokens fed from `len` on and the scripted steps their rows took.
    fn truncate_sequence(&self, seq: &mut ScriptSeq, len: usize) -> EngineResult<()> {
        let dropped = seq.fed.len().checked_sub(len).ok_or_else(|| {
            EngineError::Internal(format!("truncating {} positions to {len}", seq.fed.len()))
        })?;
        seq.fed.truncate(len);
        seq.steps -= dropped.min(seq.steps);
        Ok(())
    }

    fn supports_truncate(&self) -> bool {
        self.truncate
    }

    fn speculation(&self) -> Speculation {
        self.speculation
    }

    fn fork_sequence(&self, seq: &ScriptSeq) -> EngineResult<Option<ScriptSeq>> {
        Ok(self.forks.then(|| seq.clone()))
    }

    fn supports_blocks(&self) -> bool {
        self.blocks
    }

    fn copy_block(
        &self,
        seq: &ScriptSeq,
        start: usize,
        len: usize,
    ) -> EngineResult<Option<Vec<u32>>> {
        if !self.blocks {
            return Ok(None);
        }
        let tokens = seq.fed.get(start..start + len).ok_or_else(|| {
            EngineError::Internal(format!("block {start}+{len} of {} tokens", seq.fed.len()))
        })?;
        Ok(Some(tokens.to_vec()))
    }

    fn extend_sequence(&self, seq: &mut ScriptSeq, blocks: &[&Vec<u32>]) -> EngineResult<()> {
        for block in blocks {
            seq.fed.extend_from_slice(block);
        }
        Ok(())
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}

#[test]
fn tiny_tokenizer_round_trips_and_splits_an_emoji() {
    let codec = TestCodec::new();
    let text = "he wo café 😀!";
    let ids = codec.encode(text, false).unwrap();
    assert_eq!(codec.decode(&ids, true).unwrap(), text);
    // "😀" is F0 9F 98 80: the merge makes it two-bytes + two single bytes.
    let emoji = codec.encode("😀", false).unwrap();
    assert_eq!(emoji.len(), 3);
    assert_eq!(codec.token_bytes(emoji[0]), vec![0xF0, 0x9F]);
    assert!(codec
        .decode(&emoji[..1], false)
        .unwrap()
        .contains('\u{FFFD}'));
    assert_eq!(codec.encode("é", false).unwrap().len(), 1);
}

/// Serves `job` to `model` through the serving loop on this thread (batches of up to
/// `max_batch`, counting into `metrics`) until it and every fork of it have ended.
pub fn serve_job(model: &mut ScriptModel, job: Job, max_batch: usize, metrics: &Metrics) {
    serve_job_with(model, job, max_batch, metrics, &TestCodec::new());
}

/// [`serve_job`] with `codec` as the model's text codec.
pub fn serve_job_with(
    model: &mut ScriptModel,
    job: Job,
    max_batch: usize,
    metrics: &Metrics,
    codec: &TestCodec,
) {
    let pending = AtomicUsize::new(1 + job.forks.len());
    let (jobs, receiver) = std_mpsc::channel();
    jobs.send(Work::Generate(Box::new(job)))
        .expect("the receiver is alive");
    drop(jobs);
    let context = LoopContext {
        name: "m",
        jobs: &receiver,
        pending: &pending,
        metrics,
        limits: StepLimits {
            max_batch,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            max_step_tokens: DEFAULT_MAX_STEP_TOKENS,
            step_time: None,
        },
        prefix: PrefixCacheOptions::default(),
    };
    serve_requests(model, codec, &context);
    assert_eq!(pending.load(Ordering::SeqCst), 0, "every choice ended");
}

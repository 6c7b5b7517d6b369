//! Validation: wire request -> [`ValidRequest`], the only way to build one. It checks ranges
//! (each failure a 400 naming its field), resolves the model (404 unknown, 503 loading or
//! failed), runs the [`admission`](super::admission) checks before any work (the prompt's length
//! in characters, the engine's capacity), tokenises the prompt on the bounded tokeniser pool,
//! and checks that prompt + `max_tokens` fit the model's context (400
//! `context_length_exceeded`) before any response starts. For chat with `tools`: every tool's
//! `parameters` schema must compile (400 naming it), the tools reach the template (or are
//! folded into the messages when the template does not render them), and `tool_choice:
//! required` or a named function compiles the grammar that enforces the call.

use ferry_config::sampling::{Fraction, Nucleus, Penalty, Range, Temperature};
use std::sync::Arc;

use super::admission::check_prompt_chars;
use super::auth::Caller;
use super::error::ApiError;
use super::openai::chat::ChatRequest;
use super::openai::common::SamplingWire;
use super::openai::completions::{CompletionRequest, PromptWire};
use super::{AppState, ServerOptions};
use ferry_engine::reasoning::{ReasoningFormat, ReasoningParsing};
use ferry_engine::tool_calls::{
    constrain, prompt, ToolCallFormat, ToolChoice, ToolParsing, ToolSpec,
};
use ferry_engine::{
    Backend, ChatMessage, EngineError, GenerationParams, GenerationRequest, GrammarSpec,
    ModelStatus, SamplingParams,
};

/// Most top alternatives a request may ask for per token.
pub const MAX_LOGPROBS: i64 = 20;

/// Completions' `max_tokens` when the client gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// Most choices (`n`) a request may ask for here; the engine may allow fewer (its `max_batch`,
/// since the choices of one request run side by side).
pub const MAX_CHOICES: i64 = 128;

/// The range of one `logit_bias` value (OpenAI's).
pub const LOGIT_BIAS_LIMIT: f64 = 100.0;

/// A request that passed validation: the model exists and is ready, the prompt is tokenised
/// and fits the context with its `max_tokens`. Only this module can build one.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    model: String,
    served_name: String,
    prompt: Vec<u32>,
    params: GenerationParams,
    n: usize,
    stream: bool,
    include_usage: bool,
    cache_partition: Option<u64>,
}

impl ValidRequest {
    /// The model name as the client sent it (echoed in responses).
    pub fn served_name(&self) -> &str {
        &self.served_name
    }

    /// Generation parameters, `max_tokens` final.
    pub fn params(&self) -> &GenerationParams {
        &self.params
    }

    /// How many choices to generate (`n`, at least 1).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Whether to answer with an SSE stream.
    pub fn stream(&self) -> bool {
        self.stream
    }

    /// Whether a stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.include_usage
    }

    /// How to read tool calls from the reply; `None` when no tools are offered.
    pub fn tool_calls(&self) -> Option<&ToolParsing> {
        self.params.tool_calls.as_ref()
    }

    /// The request for the engine.
    pub fn generation_request(&self) -> GenerationRequest {
        GenerationRequest {
            cache_partition: self.cache_partition,
            model: self.model.clone(),
            prompt: self.prompt.clone(),
            params: self.params.clone(),
        }
    }
}

/// The prefix-cache partition of a request from `caller` (which of several keys it presented)
/// with `salt` (`cache_salt`): the shared one (`None`) when neither is given, else a hash of
/// both, so each key and each salt has blocks of its own.
fn cache_partition(caller: Option<Caller>, salt: Option<&str>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    if caller.is_none() && salt.is_none() {
        return None;
    }
    // SipHash with fixed keys: the same key and salt give the same partition for the life of
    // the process (the cache's own keys are made the same way).
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    caller.map(|c| c.0).hash(&mut hasher);
    salt.hash(&mut hasher);
    Some(hasher.finish())
}

/// Validates a `/v1/completions` request from `caller`. `max_tokens` defaults to OpenAI's 16.
pub async fn completion(
    state: &AppState,
    req: CompletionRequest,
    caller: Option<Caller>,
) -> Result<ValidRequest, ApiError> {
    let options = &state.options;
    let sampling = sampling(&req.sampling)?;
    let n = choices(req.sampling.n)?;
    let max_tokens = max_tokens(req.max_tokens, "max_tokens", options)?;
    let logprobs = req
        .logprobs
        .map(|n| logprob_count(n, "logprobs"))
        .transpose()?;
    let model = resolve_model(&state.backend, options, &req.model)?;
    let max_context = state.backend.max_context(&model)?;
    let sampling = model_defaults(
        sampling,
        &req.sampling,
        &state.backend.sampling_defaults(&model)?,
    );
    let prompt = match req.prompt {
        PromptWire::Tokens(ids) => ids,
        PromptWire::Text(text) => {
            check_prompt_chars(text.chars().count(), max_context, "prompt")?;
            state.backend.check_capacity(&model)?;
            let (b, m) = (Arc::clone(&state.backend), model.clone());
            state
                .admission
                .tokenize(move || b.tokenize(&m, &text, true))
                .await?
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid_value(
            "prompt",
            "The prompt must not be empty.",
        ));
    }
    let max_tokens = fit(
        prompt.len(),
        max_tokens,
        DEFAULT_COMPLETION_MAX_TOKENS,
        max_context,
        "prompt",
    )?;
    Ok(ValidRequest {
        model,
        served_name: req.model,
        prompt,
        params: params(max_tokens, sampling, &req.sampling, logprobs),
        n,
        stream: req.sampling.stream,
        include_usage: req.sampling.include_usage,
        cache_partition: cache_partition(caller, req.sampling.cache_salt.as_deref()),
    })
}

/// Validates a `/v1/chat/completions` request from `caller`. `max_tokens` defaults to
/// [`ServerOptions::default_max_tokens`], lowered to what the context leaves.
pub async fn chat(
    state: &AppState,
    req: ChatRequest,
    caller: Option<Caller>,
) -> Result<ValidRequest, ApiError> {
    let partition = cache_partition(caller, req.sampling.cache_salt.as_deref());
    let options = &state.options;
    let sampling = sampling(&req.sampling)?;
    let n = choices(req.sampling.n)?;
    let max_tokens = max_tokens(req.max_tokens, req.max_tokens_param, options)?;
    let top = req
        .top_logprobs
        .map(|n| logprob_count(n, "top_logprobs"))
        .transpose()?;
    if !req.logprobs && top.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid_value(
            "top_logprobs",
            "`top_logprobs` requires `logprobs` to be true.",
        ));
    }
    let logprobs = req.logprobs.then(|| top.unwrap_or(0));
    let model = resolve_model(&state.backend, options, &req.model)?;
    let max_context = state.backend.max_context(&model)?;
    let sampling = model_defaults(
        sampling,
        &req.sampling,
        &state.backend.sampling_defaults(&model)?,
    );
    let tool_chars: usize = req
        .tools
        .tools
        .iter()
        .map(|t| t.to_template_value().to_string().chars().count())
        .sum();
    let variable_chars = if req.template_variables.is_empty() {
        0
    } else {
        serde_json::Value::Object(req.template_variables.clone())
            .to_string()
            .chars()
            .count()
    };
    let chars = tool_chars + variable_chars + req.messages.iter().map(message_chars).sum::<usize>();
    check_prompt_chars(chars, max_context, "messages")?;
    state.backend.check_capacity(&model)?;
    let tools = Tools::choose(&state.backend, &model, &req)?;
    let tool_calls = tools.parsing();
    let reasoning_format = state.backend.reasoning_format(&model)?;
    let (b, m, mut messages) = (Arc::clone(&state.backend), model.clone(), req.messages);
    let parse_special = options.parse_special_in_content;
    let format = req.response_format;
    let variables = req.template_variables;
    // Grammars compile here, on the tokeniser pool, so a bad schema is a 400 before the
    // request is queued (the first one also builds the model's token trie).
    let (prompt, grammar, reasoning) = state
        .admission
        .tokenize(move || {
            tools.check_schemas(b.as_ref(), &m)?;
            let grammar = match tools.grammar() {
                Some(spec) => Some(
                    b.compile_grammar(&m, &spec)
                        .map_err(|e| reparam(e, "tools".into()))?,
                ),
                None => format
                    .map(|spec| b.compile_grammar(&m, &spec))
                    .transpose()?,
            };
            let offered: Vec<serde_json::Value> = if tools.renders {
                tools
                    .offered
                    .iter()
                    .map(ToolSpec::to_template_value)
                    .collect()
            } else {
                prompt::fold_into_messages(&mut messages, &tools.offered, tools.format);
                Vec::new()
            };
            let prompt = if offered.is_empty() && variables.is_empty() {
                b.encode_chat(&m, &messages, true, parse_special)?
            } else {
                b.encode_chat_with_tools(&m, &messages, &offered, &variables, true, parse_special)?
            };
            let reasoning = reasoning_format
                .map(|format| -> Result<_, EngineError> {
                    // Whether the prompt opened a think block: its last few tokens tell.
                    let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL_TOKENS)..];
                    let text = match format {
                        ReasoningFormat::Think => b.detokenize(&m, tail)?,
                        ReasoningFormat::Harmony => String::new(),
                    };
                    Ok(ReasoningParsing::for_prompt(format, &text))
                })
                .transpose()?;
            Ok((prompt, grammar, reasoning))
        })
        .await?;
    let max_tokens = fit(
        prompt.len(),
        max_tokens,
        options.default_max_tokens,
        max_context,
        "messages",
    )?;
    Ok(ValidRequest {
        model,
        served_name: req.model,
        prompt,
        params: GenerationParams {
            grammar,
            tool_calls,
            reasoning,
            ..params(max_tokens, sampling, &req.sampling, logprobs)
        },
        n,
        stream: req.sampling.stream,
        include_usage: req.sampling.include_usage,
        cache_partition: partition,
    })
}

/// A chat request's tools as this model will see them.
struct Tools {
    /// Every tool the request lists (their schemas are checked even when not offered).
    all: Vec<ToolSpec>,
    /// The tools shown to the model (none for `tool_choice: none`).
    offered: Vec<ToolSpec>,
    choice: ToolChoice,
    parallel: bool,
    format: ToolCallFormat,
    /// The template renders `tools` itself.
    renders: bool,
}

impl Tools {
    fn choose(
        backend: &Arc<dyn Backend>,
        model: &str,
        req: &ChatRequest,
    ) -> Result<Self, ApiError> {
        let wire = &req.tools;
        let choice = wire.choice.clone().unwrap_or(if wire.tools.is_empty() {
            ToolChoice::None
        } else {
            ToolChoice::Auto
        });
        let forced = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
        if forced && req.response_format.is_some() {
            return Err(ApiError::invalid_value(
                "tool_choice",
                "`tool_choice` `required` or a named function cannot be combined with \
                 `response_format`.",
            ));
        }
        let support = backend.tool_support(model)?;
        let offered = if choice == ToolChoice::None {
            Vec::new()
        } else {
            wire.tools.clone()
        };
        Ok(Self {
            all: wire.tools.clone(),
            offered,
            choice,
            parallel: wire.parallel,
            format: support.format,
            renders: support.template_renders_tools,
        })
    }

    /// How the reply is read, when tools are offered.
    fn parsing(&self) -> Option<ToolParsing> {
        (!self.offered.is_empty()).then(|| ToolParsing {
            format: self.format,
            tools: self.offered.clone().into(),
        })
    }

    /// Each tool's `parameters` must be a schema the grammar engine compiles.
    fn check_schemas(&self, backend: &dyn Backend, model: &str) -> Result<(), EngineError> {
        for (i, tool) in self.all.iter().enumerate() {
            if tool.parameters.as_object().is_some_and(|p| p.is_empty()) {
                continue;
            }
            backend
                .compile_grammar(model, &GrammarSpec::JsonSchema(tool.parameters.clone()))
                .map_err(|e| reparam(e, format!("tools[{i}].function.parameters")))?;
        }
        Ok(())
    }

    /// The grammar that enforces `required` or a named function.
    fn grammar(&self) -> Option<GrammarSpec> {
        let tools: Vec<ToolSpec> = match &self.choice {
            ToolChoice::Required => self.offered.clone(),
            ToolChoice::Named(name) => self
                .offered
                .iter()
                .filter(|t| &t.name == name)
                .cloned()
                .collect(),
            ToolChoice::None | ToolChoice::Auto => return None,
        };
        Some(GrammarSpec::Lark(constrain::lark(
            self.format,
            &tools,
            self.parallel,
        )))
    }
}

/// An invalid-request error from the engine, blamed on `param` (its message says why).
fn reparam(err: EngineError, param: String) -> EngineError {
    match err {
        EngineError::InvalidRequest { message, .. } => EngineError::InvalidRequest {
            message: format!("Invalid `{param}`: {message}"),
            param: Some(param),
        },
        other => other,
    }
}

/// Maps a client's model name (or alias) to a ready backend model id: unknown is 404
/// `model_not_found`, loading 503 `model_not_ready`, failed 503 `model_failed`.
pub fn resolve_model(
    backend: &Arc<dyn Backend>,
    options: &ServerOptions,
    name: &str,
) -> Result<String, ApiError> {
    let target = options
        .served_name_aliases
        .get(name)
        .map_or(name, String::as_str);
    let cards = backend.models();
    let card = cards
        .iter()
        .find(|c| c.id == target)
        .ok_or_else(|| EngineError::ModelNotFound(name.to_owned()))?;
    match card.status {
        ModelStatus::Ready => Ok(card.id.clone()),
        ModelStatus::Loading => Err(EngineError::NotReady(name.to_owned()).into()),
        ModelStatus::Failed => Err(ApiError::model_failed(name)),
        ModelStatus::Stopped => Err(ApiError::engine_stopped(name)),
    }
}

fn params(
    max_tokens: usize,
    sampling: SamplingParams,
    wire: &SamplingWire,
    logprobs: Option<usize>,
) -> GenerationParams {
    GenerationParams {
        max_tokens,
        sampling,
        stop: wire.stop.clone(),
        ignore_eos: wire.ignore_eos,
        logprobs,
        grammar: None,
        tool_calls: None,
        reasoning: None,
    }
}

/// How many of a chat prompt's last tokens are decoded to see whether it opens a think block
/// (`<think>\n` is one to three tokens).
const PROMPT_TAIL_TOKENS: usize = 8;

/// Checks the context and returns the final `max_tokens`: `requested` must fit with the
/// prompt; without one, `default` is lowered to what the context leaves (an error only when the
/// prompt leaves nothing).
fn fit(
    prompt_tokens: usize,
    requested: Option<usize>,
    default: usize,
    max_context: usize,
    param: &str,
) -> Result<usize, ApiError> {
    let left = max_context.saturating_sub(prompt_tokens);
    let max_tokens = requested.unwrap_or_else(|| default.min(left)).max(1);
    if prompt_tokens.saturating_add(max_tokens) > max_context {
        return Err(ApiError::context_length_exceeded(
            max_context,
            prompt_tokens,
            max_tokens,
            param,
        ));
    }
    Ok(max_tokens)
}

fn max_tokens(
    value: Option<i64>,
    param: &str,
    options: &ServerOptions,
) -> Result<Option<usize>, ApiError> {
    let n = match value {
        None => return Ok(None),
        Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            return Err(ApiError::invalid_value(
                param,
                format!("`{param}` must be at least 1, got {n}."),
            ))
        }
    };
    match options.max_tokens_limit {
        Some(limit) if n > limit => Err(ApiError::invalid_value(
            param,
            format!(
                "`{param}` = {n} is more than this server allows per request ({limit}, \
                 `server.max_tokens_limit`)."
            ),
        )),
        _ => Ok(Some(n)),
    }
}

fn choices(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid_value(
            "n",
            format!("`n` must be between 1 and {MAX_CHOICES}, got {n}."),
        )),
    }
}

/// `logit_bias` keys must be token ids and values within ±[`LOGIT_BIAS_LIMIT`]; whether an id
/// is in the model's vocabulary the engine checks when the request is submitted.
fn logit_bias(wire: &[(String, f64)]) -> Result<Vec<(u32, f32)>, ApiError> {
    wire.iter()
        .map(|(key, bias)| {
            let id = key.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid_value(
                    "logit_bias",
                    format!("`logit_bias` keys must be token ids (integers), got `{key}`."),
                )
            })?;
            if !(bias.is_finite() && bias.abs() <= LOGIT_BIAS_LIMIT) {
                return Err(ApiError::invalid_value(
                    "logit_bias",
                    format!(
                        "`logit_bias` values must be between -{LOGIT_BIAS_LIMIT} and \
                         {LOGIT_BIAS_LIMIT}, got {bias} for token {id}."
                    ),
                ));
            }
            Ok((id, *bias as f32))
        })
        .collect()
}

fn logprob_count(n: i64, param: &str) -> Result<usize, ApiError> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n as i64 <= MAX_LOGPROBS)
        .ok_or_else(|| {
            ApiError::invalid_value(
                param,
                format!("`{param}` must be between 0 and {MAX_LOGPROBS}, got {n}."),
            )
        })
}

fn in_range(
    value: Option<f64>,
    param: &str,
    ok: impl Fn(f64) -> bool,
    rule: &str,
    default: f32,
) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && ok(v) => Ok(v as f32),
        Some(v) => Err(ApiError::invalid_value(
            param,
            format!("`{param}` must be {rule}, got {v}."),
        )),
    }
}

fn sampling(w: &SamplingWire) -> Result<SamplingParams, ApiError> {
    let d = SamplingParams::default();
    let top_k = match w.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid_value(
                "top_k",
                format!("`top_k` must be -1 (off), 0 (off) or positive, got {k}."),
            ))
        }
    };
    let penalty = |v: f64| (-2.0..=2.0).contains(&v);
    Ok(SamplingParams {
        temperature: in_range(
            w.temperature,
            "temperature",
            Temperature::ok,
            Temperature::RULE,
            d.temperature,
        )?,
        top_p: in_range(w.top_p, "top_p", Nucleus::ok, Nucleus::RULE, d.top_p)?,
        top_k,
        min_p: in_range(w.min_p, "min_p", Fraction::ok, Fraction::RULE, d.min_p)?,
        seed: w.seed,
        presence_penalty: in_range(
            w.presence_penalty,
            "presence_penalty",
            penalty,
            "between -2 and 2",
            d.presence_penalty,
        )?,
        frequency_penalty: in_range(
            w.frequency_penalty,
            "frequency_penalty",
            penalty,
            "between -2 and 2",
            d.frequency_penalty,
        )?,
        repetition_penalty: in_range(
            w.repetition_penalty,
            "repetition_penalty",
            Penalty::ok,
            Penalty::RULE,
            d.repetition_penalty,
        )?,
        logit_bias: logit_bias(&w.logit_bias)?,
    })
}

/// `sampling` (checked, with neutral values for the fields the request left out) with the
/// model's defaults in those fields: `temperature`, `top_p`, `top_k`, `min_p` and
/// `repetition_penalty` (settings, else the model's files, else llama.cpp's; the penalties
/// OpenAI defines stay 0).
fn model_defaults(
    mut sampling: SamplingParams,
    w: &SamplingWire,
    defaults: &SamplingParams,
) -> SamplingParams {
    if w.temperature.is_none() {
        sampling.temperature = defaults.temperature;
    }
    if w.top_p.is_none() {
        sampling.top_p = defaults.top_p;
    }
    if w.top_k.is_none() {
        sampling.top_k = defaults.top_k;
    }
    if w.min_p.is_none() {
        sampling.min_p = defaults.min_p;
    }
    if w.repetition_penalty.is_none() {
        sampling.repetition_penalty = defaults.repetition_penalty;
    }
    sampling
}

/// Characters of a chat message that reach the template: its content, name, tool call id and
/// the calls it made (their JSON text, `arguments` included), counted without building the text.
fn message_chars(message: &ChatMessage) -> usize {
    let calls = message.tool_calls.as_ref().map_or(0, |calls| {
        let mut counter = CharCounter(0);
        // Writing into a counter cannot fail; a failure would only undercount.
        let _ = serde_json::to_writer(&mut counter, calls);
        counter.0
    });
    message.content.chars().count()
        + message.name.as_ref().map_or(0, |n| n.chars().count())
        + message
            .tool_call_id
            .as_ref()
            .map_or(0, |n| n.chars().count())
        + message
            .reasoning_content
            .as_ref()
            .map_or(0, |r| r.chars().count())
        + calls
}

/// An `io::Write` that counts the UTF-8 characters written to it (the bytes that start one).
struct CharCounter(usize);

impl std::io::Write for CharCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.iter().filter(|&&b| (b & 0xC0) != 0x80).count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_fills_only_the_fields_a_request_leaves_out() {
        let defaults = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 20,
            min_p: 0.05,
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        };
        let wire = SamplingWire {
            temperature: Some(0.0),
            top_k: Some(-1),
            presence_penalty: Some(0.5),
            ..Default::default()
        };
        let s = model_defaults(sampling(&wire).unwrap(), &wire, &defaults);
        // Sent: kept, even where they mean "off".
        assert_eq!((s.temperature, s.top_k, s.presence_penalty), (0.0, 0, 0.5));
        // Left out: the model's.
        assert_eq!((s.top_p, s.min_p, s.repetition_penalty), (0.9, 0.05, 1.1));
        // OpenAI's own penalties have no model default.
        assert_eq!(s.frequency_penalty, 0.0);
    }

    #[test]
    fn ranges() {
        let ok = SamplingWire {
            temperature: Some(0.0),
            top_p: Some(1.0),
            top_k: Some(-1),
            ..Default::default()
        };
        let s = sampling(&ok).unwrap();
        assert_eq!((s.temperature, s.top_p, s.top_k), (0.0, 1.0, 0));
        let bad = [
            (
                SamplingWire {
                    temperature: Some(2.5),
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingWire {
                    top_p: Some(0.0),
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingWire {
                    top_k: Some(-2),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingWire {
                    min_p: Some(1.5),
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingWire {
                    presence_penalty: Some(-3.0),
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingWire {
                    frequency_penalty: Some(2.1),
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingWire {
                    repetition_penalty: Some(0.0),
                    ..Default::default()
                },
                "repetition_penalty",
            ),
        ];
        for (wire, param) in bad {
            let e = sampling(&wire).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some(param), Some("invalid_value")));
        }
    }

    #[test]
    fn choices_and_logit_bias() {
        assert_eq!(choices(None).unwrap(), 1);
        assert_eq!(choices(Some(3)).unwrap(), 3);
        for bad in [0, -1, MAX_CHOICES + 1] {
            let e = choices(Some(bad)).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some("n"), Some("invalid_value")));
        }
        let ok = logit_bias(&[("17".into(), -100.0), ("3".into(), 100.0)]).unwrap();
        assert_eq!(ok, [(17, -100.0), (3, 100.0)]);
        for bad in [("x", 1.0), ("-1", 1.0), ("5", 100.5), ("5", -101.0)] {
            let e = logit_bias(&[(bad.0.into(), bad.1)]).unwrap_err();
            assert_eq!(
                (e.param(), e.code()),
                (Some("logit_bias"), Some("invalid_value")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn context_fit() {
        assert_eq!(fit(10, Some(6), 1024, 16, "prompt").unwrap(), 6);
        assert_eq!(
            fit(10, None, 1024, 16, "messages").unwrap(),
            6,
            "default lowered"
        );
        assert_eq!(fit(10, None, 3, 16, "messages").unwrap(), 3, "default kept");
        let e = fit(10, Some(7), 1024, 16, "prompt").unwrap_err();
        assert_eq!(
            (e.param(), e.code()),
            (Some("prompt"), Some("context_length_exceeded"))
        );
        assert!(e.message().contains("in the prompt"), "{}", e.message());
        let e = fit(16, None, 1024, 16, "messages").unwrap_err();
        assert!(
            e.message().contains("16 in the messages"),
            "{}",
            e.message()
        );
        assert_eq!(logprob_count(20, "logprobs").unwrap(), 20);
        assert!(logprob_count(21, "logprobs").is_err());
        assert!(logprob_count(-1, "logprobs").is_err());
    }

    #[test]
    fn max_tokens_limits() {
        let options = ServerOptions {
            max_tokens_limit: Some(100),
            ..ServerOptions::default()
        };
        assert!(max_tokens(Some(0), "max_tokens", &options).is_err());
        assert_eq!(
            max_tokens(Some(100), "max_tokens", &options).unwrap(),
            Some(100)
        );
        let e = max_tokens(Some(101), "max_completion_tokens", &options).unwrap_err();
        assert_eq!(
            (e.param(), e.code()),
            (Some("max_completion_tokens"), Some("invalid_value"))
        );
        assert!(e.message().contains("server.max_tokens_limit"));
        assert_eq!(max_tokens(None, "max_tokens", &options).unwrap(), None);
    }
}

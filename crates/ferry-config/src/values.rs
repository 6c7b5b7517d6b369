//! The value types a setting can hold, and one [`Codec`] per kind of value: how its text (from the
//! file, a `FERRY_*` variable or a flag, all alike) is parsed and how `ferry config` shows it.
//! Parsing is strict: text that cannot be meant (`"0.9"` as a size, `"tpu"` as a device) is an
//! error whose message says what is accepted.

use std::marker::PhantomData;
use std::time::Duration;

use super::units::{parse_bandwidth, parse_bytes, parse_duration, parse_percent};

/// Which compute device to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA device 0 when built with CUDA and one is present, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

/// A dtype choice: of the weights (`dtype`, read by the loader as
/// `model::loader::DtypeChoice`) and of the KV cache (`kv_dtype`, dense choices only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypeChoice {
    /// GGUF stays quantized; safetensors become f32 on the CPU and keep the checkpoint's dtype
    /// on CUDA.
    #[default]
    Auto,
    /// Dense f32 (GGUF is dequantized).
    F32,
    /// Dense f16 (GGUF is dequantized).
    F16,
    /// Dense bf16 (GGUF is dequantized). Not available on the CPU, whose matmul lacks bf16.
    BF16,
    /// A dense checkpoint's matrices (projections, embedding, head) quantized at load into GGUF
    /// blocks of this type; norms and biases stay dense f32. Refused for an already quantized
    /// GGUF.
    Quantize(QuantType),
}

impl DtypeChoice {
    /// The type matrices are quantized to at load, if this is a quantized choice.
    pub fn quantize(self) -> Option<QuantType> {
        match self {
            DtypeChoice::Quantize(q) => Some(q),
            _ => None,
        }
    }
}

/// A GGUF block type ferry can quantize a dense matrix into at load (what candle's CPU
/// quantizer writes and its matmuls read). Names as llama.cpp spells them, lowercased.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    /// 32-element blocks, 4-bit, one f16 scale (4.5 bits per weight).
    Q4_0,
    /// 32-element blocks, 4-bit, f16 scale and minimum (5 bits per weight).
    Q4_1,
    /// 32-element blocks, 5-bit, one scale (5.5 bits per weight).
    Q5_0,
    /// 32-element blocks, 5-bit, scale and minimum (6 bits per weight).
    Q5_1,
    /// 32-element blocks, 8-bit, one scale (8.5 bits per weight).
    Q8_0,
    /// 256-element super-blocks, 2-bit k-quant (2.625 bits per weight).
    Q2_K,
    /// 256-element super-blocks, 3-bit k-quant (3.4375 bits per weight).
    Q3_K,
    /// 256-element super-blocks, 4-bit k-quant (4.5 bits per weight).
    Q4_K,
    /// 256-element super-blocks, 5-bit k-quant (5.5 bits per weight).
    Q5_K,
    /// 256-element super-blocks, 6-bit k-quant (6.5625 bits per weight).
    Q6_K,
}

impl QuantType {
    /// Every type, in the order the error messages list them.
    pub const ALL: [QuantType; 10] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// The setting's spelling: `q4_0`, ..., `q6_k`.
    pub fn as_str(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q2_K => "q2_k",
            QuantType::Q3_K => "q3_k",
            QuantType::Q4_K => "q4_k",
            QuantType::Q5_K => "q5_k",
            QuantType::Q6_K => "q6_k",
        }
    }

    /// Parses `q4_0` .. `q6_k` (any case).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|q| q.as_str() == text)
    }
}

/// Which kernels multiply quantized weights on the CPU. A config type the model reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuQmatmul {
    /// ferry's own kernels where they support the block type, candle's `QMatMul` elsewhere;
    /// ferry's on the fastest instruction sets the CPU has.
    #[default]
    Auto,
    /// As `Auto`, on AVX-512 without AMX (the path of AVX-512 CPUs without AMX).
    Avx512,
    /// As `Auto`, on AVX2 with AVX-VNNI and no AVX-512 (the path of e.g. Alder Lake).
    AvxVnni,
    /// As `Auto`, on AVX2, FMA and F16C alone (the path of AVX2-only CPUs such as AMD Zen 2/3).
    Avx2,
    /// As `Auto`, on ferry's portable scalar kernels.
    Scalar,
    /// candle's `QMatMul` for every type (for comparisons).
    Candle,
}

/// Where the loader keeps the panel layouts it makes of k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and
/// Q5_1 matrices (`device.panel_cache`). A config type the model reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PanelCacheChoice {
    /// The user's cache: `$XDG_CACHE_HOME/ferry/panels`, else `~/.cache/ferry/panels`.
    #[default]
    Auto,
    /// No cache file: the panels are made at every load.
    Off,
    /// This folder.
    Dir(std::path::PathBuf),
}

/// Whether a reasoning template's replies are read apart (`reasoning_format`). A config type
/// the runtime reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningChoice {
    /// Split the reasoning off when the chat template is a reasoning one (think blocks,
    /// harmony).
    #[default]
    Auto,
    /// Leave think blocks in `content` (harmony replies are still read: their markup is
    /// special tokens, not text).
    None,
}

/// Where the KV cache lives (`kv_offload`). A config type the runtime reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvOffload {
    /// On the compute device, unless the context it must hold does not fit there (the context
    /// set, else the model's window) while it fits in host memory: then on the host. The same as
    /// `Off` on the CPU device, whose memory is host memory.
    #[default]
    Auto,
    /// On the compute device (the fit shortens an unset context to the budget).
    Off,
    /// In host memory, attention computed there: only a step's queries, new keys and values
    /// and the attention's output cross the link.
    On,
}

/// Where weights live (DESIGN.md 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadMode {
    /// Everything resident on the compute device.
    None,
    /// Layers in order until the budget, the rest streamed.
    Auto,
    /// Every decoder layer streamed through a small slot ring.
    Sequential,
    /// The whole model moves between host and device on demand.
    Model,
}

/// Where offloaded units run each step (`offload.tier`; the cost model is `offload::cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierChoice {
    /// Per unit and step, whichever the cost model estimates faster.
    #[default]
    Auto,
    /// Always copy the weights to the compute device.
    Stream,
    /// Always compute on the host, where the weights live.
    Host,
}

/// The device memory budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryBudget {
    /// A fixed number of bytes.
    Bytes(u64),
    /// A share (0, 1] of the device's free memory at start.
    FractionOfFree(f64),
}

/// A configured chat template (`models[].chat_template`): the Jinja itself, or a file of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplateSource {
    /// The template's text (a value with `{{` or `{%` in it).
    Inline(String),
    /// A file holding the template (any other value), read when the model loads.
    File(std::path::PathBuf),
}

/// A resolved value as `ferry config` shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Shown {
    /// A string (quoted in TOML).
    Text(String),
    /// An integer.
    Number(u64),
    /// A boolean.
    Bool(bool),
    /// Not set.
    Unset,
    /// Set, but secret: never printed.
    Hidden,
}

impl Shown {
    /// The TOML spelling of the value (`None` when unset).
    pub fn toml(&self) -> Option<String> {
        match self {
            Shown::Text(text) => Some(toml::Value::String(text.clone()).to_string()),
            Shown::Number(n) => Some(n.to_string()),
            Shown::Bool(b) => Some(b.to_string()),
            Shown::Unset => None,
            Shown::Hidden => Some("\"(hidden)\"".to_string()),
        }
    }

    /// The JSON value.
    pub fn json(&self) -> serde_json::Value {
        match self {
            Shown::Text(text) => serde_json::Value::String(text.clone()),
            Shown::Number(n) => serde_json::Value::from(*n),
            Shown::Bool(b) => serde_json::Value::Bool(*b),
            Shown::Unset => serde_json::Value::Null,
            Shown::Hidden => serde_json::Value::String("(hidden)".to_string()),
        }
    }
}

/// How one kind of value is parsed from text and shown.
pub trait Codec {
    /// The resolved type.
    type Value;
    /// Parses the text of a file value, variable or flag.
    fn parse(text: &str) -> Result<Self::Value, String>;
    /// The value for `ferry config`.
    fn show(value: &Self::Value) -> Shown;
}

/// Free text, kept as written.
pub struct Text;
impl Codec for Text {
    type Value = String;
    fn parse(text: &str) -> Result<String, String> {
        if text.trim().is_empty() {
            return Err("must not be empty".to_string());
        }
        Ok(text.to_string())
    }
    fn show(value: &String) -> Shown {
        Shown::Text(value.clone())
    }
}

/// Optional free text; the empty string means unset.
pub struct OptionalText;
impl Codec for OptionalText {
    type Value = Option<String>;
    fn parse(text: &str) -> Result<Option<String>, String> {
        Ok(Some(text.to_string()).filter(|t| !t.is_empty()))
    }
    fn show(value: &Option<String>) -> Shown {
        value.clone().map_or(Shown::Unset, Shown::Text)
    }
}

/// A secret (the API key): optional text that `ferry config` never prints.
pub struct Secret;
impl Codec for Secret {
    type Value = Option<String>;
    fn parse(text: &str) -> Result<Option<String>, String> {
        OptionalText::parse(text)
    }
    fn show(value: &Option<String>) -> Shown {
        if value.is_some() {
            Shown::Hidden
        } else {
            Shown::Unset
        }
    }
}

/// Several secrets (API keys), comma-separated: `ferry config` never prints them.
pub struct Secrets;
impl Codec for Secrets {
    type Value = Vec<String>;
    fn parse(text: &str) -> Result<Vec<String>, String> {
        Names::parse(text).map_err(|_| "a key must not contain spaces".to_string())
    }
    fn show(value: &Vec<String>) -> Shown {
        if value.is_empty() {
            Shown::Unset
        } else {
            Shown::Hidden
        }
    }
}

/// `true`, `false`, or unset (the empty string): a switch whose default depends on others.
pub struct OptionalSwitch;
impl Codec for OptionalSwitch {
    type Value = Option<bool>;
    fn parse(text: &str) -> Result<Option<bool>, String> {
        if text.trim().is_empty() {
            return Ok(None);
        }
        Switch::parse(text).map(Some)
    }
    fn show(value: &Option<bool>) -> Shown {
        value.map_or(Shown::Unset, Shown::Bool)
    }
}

/// A whole number (`u16`, `usize`, ...), zero allowed.
pub struct Number<T>(PhantomData<T>);
impl<T: std::str::FromStr + Copy + TryInto<u64>> Codec for Number<T> {
    type Value = T;
    fn parse(text: &str) -> Result<T, String> {
        text.trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a valid number"))
    }
    fn show(value: &T) -> Shown {
        Shown::Number((*value).try_into().unwrap_or(u64::MAX))
    }
}

/// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
pub struct Switch;
impl Codec for Switch {
    type Value = bool;
    fn parse(text: &str) -> Result<bool, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(format!("`{text}` is not true or false")),
        }
    }
    fn show(value: &bool) -> Shown {
        Shown::Bool(*value)
    }
}

/// A comma-separated list of names (spaces around them dropped); empty = none.
pub struct Names;
impl Codec for Names {
    type Value = Vec<String>;
    fn parse(text: &str) -> Result<Vec<String>, String> {
        let names: Vec<String> = text
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(bad) = names.iter().find(|n| n.contains(char::is_whitespace)) {
            return Err(format!("`{bad}` is not a name (a list is comma-separated)"));
        }
        Ok(names)
    }
    fn show(value: &Vec<String>) -> Shown {
        if value.is_empty() {
            Shown::Unset
        } else {
            Shown::Text(value.join(","))
        }
    }
}

/// A count of at least 1.
pub struct Positive;
impl Codec for Positive {
    type Value = usize;
    fn parse(text: &str) -> Result<usize, String> {
        let value: usize = text
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a valid number"))?;
        if value == 0 {
            return Err("must be at least 1".to_string());
        }
        Ok(value)
    }
    fn show(value: &usize) -> Shown {
        Shown::Number(*value as u64)
    }
}

/// An optional count of at least 1 (unset by default).
pub struct OptionalPositive;
impl Codec for OptionalPositive {
    type Value = Option<usize>;
    fn parse(text: &str) -> Result<Option<usize>, String> {
        Positive::parse(text).map(Some)
    }
    fn show(value: &Option<usize>) -> Shown {
        value.map_or(Shown::Unset, |v| Shown::Number(v as u64))
    }
}

/// A positive byte size (`16MiB`, `1048576`).
pub struct Size;
impl Codec for Size {
    type Value = usize;
    fn parse(text: &str) -> Result<usize, String> {
        let bytes = parse_bytes(text)?;
        if bytes == 0 {
            return Err("must be positive".to_string());
        }
        usize::try_from(bytes).map_err(|_| format!("`{text}` is too large"))
    }
    fn show(value: &usize) -> Shown {
        Shown::Text(exact_size(*value as u64))
    }
}

/// A duration (`30s`, `5m`).
pub struct Time;
impl Codec for Time {
    type Value = Duration;
    fn parse(text: &str) -> Result<Duration, String> {
        parse_duration(text)
    }
    fn show(value: &Duration) -> Shown {
        Shown::Text(exact_duration(*value))
    }
}

/// An optional link bandwidth (`16GB/s`), unset by default.
pub struct Bandwidth;
impl Codec for Bandwidth {
    type Value = Option<u64>;
    fn parse(text: &str) -> Result<Option<u64>, String> {
        parse_bandwidth(text).map(Some)
    }
    fn show(value: &Option<u64>) -> Shown {
        value.map_or(Shown::Unset, |v| {
            Shown::Text(format!("{}/s", exact_size(v)))
        })
    }
}

/// A device budget: a size or a share of free memory.
pub struct Budget;
impl Codec for Budget {
    type Value = MemoryBudget;
    fn parse(text: &str) -> Result<MemoryBudget, String> {
        if text.trim().ends_with('%') {
            parse_percent(text).map(MemoryBudget::FractionOfFree)
        } else {
            parse_bytes(text).map(MemoryBudget::Bytes)
        }
    }
    fn show(value: &MemoryBudget) -> Shown {
        Shown::Text(match value {
            MemoryBudget::Bytes(bytes) => exact_size(*bytes),
            MemoryBudget::FractionOfFree(fraction) => {
                let percent = format!("{:.4}", fraction * 100.0);
                format!("{}%", percent.trim_end_matches('0').trim_end_matches('.'))
            }
        })
    }
}

/// `auto`, `cpu`, `cuda` or `cuda:N`.
pub struct Device;
impl Codec for Device {
    type Value = DeviceChoice;
    fn parse(text: &str) -> Result<DeviceChoice, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("`{text}` is not a device (use auto, cpu or cuda:N)")),
        }
    }
    fn show(value: &DeviceChoice) -> Shown {
        Shown::Text(match value {
            DeviceChoice::Auto => "auto".to_string(),
            DeviceChoice::Cpu => "cpu".to_string(),
            DeviceChoice::Cuda(n) => format!("cuda:{n}"),
        })
    }
}

/// `auto`, `f32`, `f16`, `bf16`, or a type to quantize to at load (`q8_0`, `q4_k`, ...).
pub struct Dtype;
impl Codec for Dtype {
    type Value = DtypeChoice;
    fn parse(text: &str) -> Result<DtypeChoice, String> {
        if let Ok(dense) = KvDtype::parse(text) {
            return Ok(dense);
        }
        QuantType::parse(text)
            .map(DtypeChoice::Quantize)
            .ok_or_else(|| {
                format!(
                    "`{text}` is not a dtype (use auto, f32, f16, bf16, or one of {} to \
                     quantize a dense model at load)",
                    quant_names()
                )
            })
    }
    fn show(value: &DtypeChoice) -> Shown {
        KvDtype::show(value)
    }
}

/// `auto`, `f32`, `f16`, `bf16` (dense), or llama.cpp's `q8_0` / `q4_0` blocks: the KV cache's.
pub struct KvDtype;
impl Codec for KvDtype {
    type Value = DtypeChoice;
    fn parse(text: &str) -> Result<DtypeChoice, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DtypeChoice::Auto),
            "f32" | "float32" => Ok(DtypeChoice::F32),
            "f16" | "float16" | "half" => Ok(DtypeChoice::F16),
            "bf16" | "bfloat16" => Ok(DtypeChoice::BF16),
            "q8_0" => Ok(DtypeChoice::Quantize(QuantType::Q8_0)),
            "q4_0" => Ok(DtypeChoice::Quantize(QuantType::Q4_0)),
            other if QuantType::parse(other).is_some() => Err(format!(
                "`{text}` is a weight quantization type the KV cache does not take \
                 (use auto, f32, f16, bf16, q8_0 or q4_0)"
            )),
            _ => Err(format!(
                "`{text}` is not a KV cache dtype (use auto, f32, f16, bf16, q8_0 or q4_0)"
            )),
        }
    }
    fn show(value: &DtypeChoice) -> Shown {
        Shown::Text(
            match value {
                DtypeChoice::Auto => "auto",
                DtypeChoice::F32 => "f32",
                DtypeChoice::F16 => "f16",
                DtypeChoice::BF16 => "bf16",
                DtypeChoice::Quantize(q) => q.as_str(),
            }
            .to_string(),
        )
    }
}

/// `q4_0, q4_1, ..., q6_k`, for messages.
fn quant_names() -> String {
    QuantType::ALL.map(QuantType::as_str).join(", ")
}

/// `none`, `auto`, `sequential` or `model`.
pub struct Mode;
impl Codec for Mode {
    type Value = OffloadMode;
    fn parse(text: &str) -> Result<OffloadMode, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(OffloadMode::None),
            "auto" => Ok(OffloadMode::Auto),
            "sequential" => Ok(OffloadMode::Sequential),
            "model" => Ok(OffloadMode::Model),
            _ => Err(format!(
                "`{text}` is not an offload mode (use none, auto, sequential or model)"
            )),
        }
    }
    fn show(value: &OffloadMode) -> Shown {
        Shown::Text(
            match value {
                OffloadMode::None => "none",
                OffloadMode::Auto => "auto",
                OffloadMode::Sequential => "sequential",
                OffloadMode::Model => "model",
            }
            .to_string(),
        )
    }
}

/// How a model's decode steps speculate (`speculative.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculativeMethod {
    /// One token per sequence per step.
    #[default]
    None,
    /// A second, smaller model with the same vocabulary proposes the tokens
    /// (`speculative.draft`).
    Draft,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    /// last tokens are proposed; no second model.
    Ngram,
}

/// `none`, `draft` or `ngram`.
pub struct Speculation;
impl Codec for Speculation {
    type Value = SpeculativeMethod;
    fn parse(text: &str) -> Result<SpeculativeMethod, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(SpeculativeMethod::None),
            "draft" => Ok(SpeculativeMethod::Draft),
            "ngram" => Ok(SpeculativeMethod::Ngram),
            _ => Err(format!(
                "`{text}` is not a speculative method (use none, draft or ngram)"
            )),
        }
    }
    fn show(value: &SpeculativeMethod) -> Shown {
        Shown::Text(
            match value {
                SpeculativeMethod::None => "none",
                SpeculativeMethod::Draft => "draft",
                SpeculativeMethod::Ngram => "ngram",
            }
            .to_string(),
        )
    }
}

/// `auto`, `stream` or `host`.
pub struct Tiers;
impl Codec for Tiers {
    type Value = TierChoice;
    fn parse(text: &str) -> Result<TierChoice, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(TierChoice::Auto),
            "stream" => Ok(TierChoice::Stream),
            "host" => Ok(TierChoice::Host),
            _ => Err(format!(
                "`{text}` is not an offload tier (use auto, stream or host)"
            )),
        }
    }
    fn show(value: &TierChoice) -> Shown {
        Shown::Text(
            match value {
                TierChoice::Auto => "auto",
                TierChoice::Stream => "stream",
                TierChoice::Host => "host",
            }
            .to_string(),
        )
    }
}

/// A spread as a percentage of zero or more (`50%`, `0%`, `250%`), held as a fraction.
pub struct Spread;
impl Codec for Spread {
    type Value = f64;
    fn parse(text: &str) -> Result<f64, String> {
        let percent: f64 = text
            .trim()
            .strip_suffix('%')
            .and_then(|body| body.trim().parse().ok())
            .ok_or_else(|| format!("`{text}` is not a percentage (write it like `50%`)"))?;
        if !(percent.is_finite() && percent >= 0.0) {
            return Err(format!("`{text}` must be 0% or more"));
        }
        Ok(percent / 100.0)
    }
    fn show(value: &f64) -> Shown {
        let percent = format!("{:.4}", value * 100.0);
        Shown::Text(format!(
            "{}%",
            percent.trim_end_matches('0').trim_end_matches('.')
        ))
    }
}

/// An optional compute rate in GFLOP/s (`120`, `2.5`), positive and finite; unset by default.
pub struct Gflops;
impl Codec for Gflops {
    type Value = Option<f64>;
    fn parse(text: &str) -> Result<Option<f64>, String> {
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a rate in GFLOP/s (write it like `120`)"))?;
        if !(value.is_finite() && value > 0.0) {
            return Err(format!(
                "rate `{text}` must be a positive number of GFLOP/s"
            ));
        }
        Ok(Some(value))
    }
    fn show(value: &Option<f64>) -> Shown {
        value.map_or(Shown::Unset, |v| Shown::Text(v.to_string()))
    }
}

/// `auto`, `avx512`, `avx-vnni`, `avx2`, `scalar` or `candle`.
pub struct Kernels;

/// Every [`CpuQmatmul`] with its name.
const KERNEL_NAMES: [(CpuQmatmul, &str); 6] = [
    (CpuQmatmul::Auto, "auto"),
    (CpuQmatmul::Avx512, "avx512"),
    (CpuQmatmul::AvxVnni, "avx-vnni"),
    (CpuQmatmul::Avx2, "avx2"),
    (CpuQmatmul::Scalar, "scalar"),
    (CpuQmatmul::Candle, "candle"),
];

impl Codec for Kernels {
    type Value = CpuQmatmul;
    fn parse(text: &str) -> Result<CpuQmatmul, String> {
        let want = text.trim().to_ascii_lowercase();
        KERNEL_NAMES
            .iter()
            .find(|(_, name)| *name == want)
            .map(|&(value, _)| value)
            .ok_or_else(|| {
                format!("`{text}` is not a CPU kernel choice (use auto, avx512, avx-vnni, avx2, scalar or candle)")
            })
    }
    fn show(value: &CpuQmatmul) -> Shown {
        let name = KERNEL_NAMES
            .iter()
            .find(|(v, _)| v == value)
            .map_or("auto", |&(_, name)| name);
        Shown::Text(name.to_string())
    }
}

/// `auto`, `off` or a folder.
pub struct PanelCache;
impl Codec for PanelCache {
    type Value = PanelCacheChoice;
    fn parse(text: &str) -> Result<PanelCacheChoice, String> {
        let trimmed = text.trim();
        match trimmed.to_ascii_lowercase().as_str() {
            "" => Err("the panel cache is auto, off or a folder, not empty".to_string()),
            "auto" => Ok(PanelCacheChoice::Auto),
            "off" => Ok(PanelCacheChoice::Off),
            _ => Ok(PanelCacheChoice::Dir(trimmed.into())),
        }
    }
    fn show(value: &PanelCacheChoice) -> Shown {
        Shown::Text(match value {
            PanelCacheChoice::Auto => "auto".to_string(),
            PanelCacheChoice::Off => "off".to_string(),
            PanelCacheChoice::Dir(dir) => dir.display().to_string(),
        })
    }
}

/// `auto` or `none`.
pub struct Reasoning;
impl Codec for Reasoning {
    type Value = ReasoningChoice;
    fn parse(text: &str) -> Result<ReasoningChoice, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ReasoningChoice::Auto),
            "none" => Ok(ReasoningChoice::None),
            _ => Err(format!(
                "`{text}` is not a reasoning format (use auto or none)"
            )),
        }
    }
    fn show(value: &ReasoningChoice) -> Shown {
        Shown::Text(
            match value {
                ReasoningChoice::Auto => "auto",
                ReasoningChoice::None => "none",
            }
            .to_string(),
        )
    }
}

/// `auto`, `on` (or `true`) or `off` (or `false`).
pub struct KvPlace;
impl Codec for KvPlace {
    type Value = KvOffload;
    fn parse(text: &str) -> Result<KvOffload, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(KvOffload::Auto),
            "on" | "true" | "host" => Ok(KvOffload::On),
            "off" | "false" | "device" => Ok(KvOffload::Off),
            _ => Err(format!(
                "`{text}` is not a KV placement (use auto, on or off)"
            )),
        }
    }
    fn show(value: &KvOffload) -> Shown {
        Shown::Text(
            match value {
                KvOffload::Auto => "auto",
                KvOffload::On => "on",
                KvOffload::Off => "off",
            }
            .to_string(),
        )
    }
}

/// A chat template: Jinja written out (text with `{{` or `{%`), else a file's path; empty is
/// unset.
pub struct Template;
impl Codec for Template {
    type Value = Option<ChatTemplateSource>;
    fn parse(text: &str) -> Result<Option<ChatTemplateSource>, String> {
        if text.trim().is_empty() {
            Ok(None)
        } else if text.contains("{{") || text.contains("{%") {
            Ok(Some(ChatTemplateSource::Inline(text.to_string())))
        } else {
            Ok(Some(ChatTemplateSource::File(text.trim().into())))
        }
    }
    fn show(value: &Option<ChatTemplateSource>) -> Shown {
        match value {
            None => Shown::Unset,
            Some(ChatTemplateSource::Inline(text)) => Shown::Text(text.clone()),
            Some(ChatTemplateSource::File(path)) => Shown::Text(path.display().to_string()),
        }
    }
}

/// The shortest exact spelling of a byte count: `16MiB`, `6GB`, `1000`.
fn exact_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| bytes >= *unit && bytes.is_multiple_of(*unit))
        .map_or_else(
            || bytes.to_string(),
            |(unit, name)| format!("{}{name}", bytes / unit),
        )
}

/// The shortest exact spelling of a duration: `5m`, `30s`, `250ms`.
fn exact_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis == 0 || !millis.is_multiple_of(1000) {
        return format!("{millis}ms");
    }
    let seconds = millis / 1000;
    if seconds.is_multiple_of(3600) {
        format!("{}h", seconds / 3600)
    } else if seconds.is_multiple_of(60) {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_template_is_jinja_when_it_has_tags_and_a_path_otherwise() {
        let inline = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(
            Template::parse(inline),
            Ok(Some(ChatTemplateSource::Inline(inline.into())))
        );
        assert_eq!(
            Template::parse("{{ 'x' }}"),
            Ok(Some(ChatTemplateSource::Inline("{{ 'x' }}".into())))
        );
        assert_eq!(
            Template::parse(" templates/chat.jinja "),
            Ok(Some(ChatTemplateSource::File(
                "templates/chat.jinja".into()
            )))
        );
        assert_eq!(Template::parse(""), Ok(None));
        for text in [inline, "templates/chat.jinja"] {
            let value = Template::parse(text).unwrap();
            assert_eq!(Template::show(&value), Shown::Text(text.into()));
        }
        assert_eq!(Template::show(&None), Shown::Unset);
    }

    #[test]
    fn shown_values_parse_back_to_the_same_value() {
        for text in ["16MiB", "6GB", "1000", "1KiB"] {
            let size = Size::parse(text).expect("size");
            let Shown::Text(shown) = Size::show(&size) else {
                panic!("text");
            };
            assert_eq!(Size::parse(&shown), Ok(size), "{text} -> {shown}");
        }
        for text in ["5m", "30s", "250ms", "1h", "90s"] {
            let time = Time::parse(text).expect("duration");
            let Shown::Text(shown) = Time::show(&time) else {
                panic!("text");
            };
            assert_eq!(Time::parse(&shown), Ok(time), "{text} -> {shown}");
        }
        for text in ["90%", "12.5%", "6GiB"] {
            let budget = Budget::parse(text).expect("budget");
            assert_eq!(Budget::show(&budget), Shown::Text(text.to_string()));
        }
        assert_eq!(
            Bandwidth::show(&Bandwidth::parse("16GB/s").expect("rate")),
            Shown::Text("16GB/s".into())
        );
    }

    #[test]
    fn values_that_cannot_be_meant_are_errors() {
        let err = Budget::parse("0.9").expect_err("0.9 bytes");
        assert!(err.contains("90%"), "{err}");
        assert!(Size::parse("0").is_err());
        assert!(Positive::parse("0").is_err());
        assert!(Text::parse("  ").is_err());
        assert!(Kernels::parse("fast").is_err());
        assert_eq!(Number::<u16>::parse("70000").ok(), None);
    }

    #[test]
    fn panel_cache_choices_parse_and_show_back() {
        assert_eq!(PanelCache::parse(" AUTO "), Ok(PanelCacheChoice::Auto));
        assert_eq!(PanelCache::parse("off"), Ok(PanelCacheChoice::Off));
        let dir = PanelCacheChoice::Dir("/var/cache/ferry panels".into());
        assert_eq!(
            PanelCache::parse(" /var/cache/ferry panels "),
            Ok(dir.clone())
        );
        assert_eq!(
            PanelCache::show(&dir),
            Shown::Text("/var/cache/ferry panels".to_string())
        );
        assert_eq!(
            PanelCache::show(&PanelCacheChoice::Off),
            Shown::Text("off".to_string())
        );
        assert!(PanelCache::parse("  ").is_err());
    }

    #[test]
    fn cpu_kernel_choices_parse_in_any_case_and_show_back() {
        for (value, name) in KERNEL_NAMES {
            assert_eq!(
                Kernels::parse(&format!(" {} ", name.to_ascii_uppercase())),
                Ok(value)
            );
            assert_eq!(Kernels::show(&value), Shown::Text(name.to_string()));
        }
        assert_eq!(Kernels::parse("avx2"), Ok(CpuQmatmul::Avx2));
        let err = Kernels::parse("avx3").expect_err("no such choice");
        assert!(err.contains("avx-vnni") && err.contains("candle"), "{err}");
    }

    #[test]
    fn quantized_dtypes_parse_and_show_back_and_the_kv_cache_takes_q8_0_and_q4_0_only() {
        for q in QuantType::ALL {
            let parsed = Dtype::parse(&q.as_str().to_ascii_uppercase()).expect("quant type");
            assert_eq!(parsed, DtypeChoice::Quantize(q));
            assert_eq!(parsed.quantize(), Some(q));
            assert_eq!(Dtype::show(&parsed), Shown::Text(q.as_str().into()));
            match q {
                QuantType::Q8_0 | QuantType::Q4_0 => {
                    let kv = KvDtype::parse(q.as_str()).expect("a cache block type");
                    assert_eq!(kv, DtypeChoice::Quantize(q));
                    assert_eq!(KvDtype::show(&kv), Shown::Text(q.as_str().into()));
                }
                _ => {
                    let err = KvDtype::parse(q.as_str()).expect_err("not a cache block type");
                    assert!(err.contains("does not take"), "{err}");
                }
            }
        }
        assert_eq!(Dtype::parse("bf16"), Ok(DtypeChoice::BF16));
        assert_eq!(DtypeChoice::F16.quantize(), None);
        let err = Dtype::parse("q8_1").expect_err("not a load-time type");
        assert!(err.contains("q8_0") && err.contains("q6_k"), "{err}");
    }

    #[test]
    fn secrets_are_never_shown() {
        let key = Secret::parse("sk-123").expect("key");
        assert_eq!(Secret::show(&key), Shown::Hidden);
        assert_eq!(Secret::show(&None), Shown::Unset);
        assert!(!Shown::Hidden.toml().unwrap_or_default().contains("sk-"));
    }
}

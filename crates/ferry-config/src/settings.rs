//! The one definition of every setting: [`SETTINGS`]. Each entry names its flag (`--gpu-memory`,
//! from which the variable `FERRY_GPU_MEMORY` is derived), its key in the config file
//! (`models[].offload.gpu_memory`), its default, its doc line and the field of the resolved
//! config it fills (with the [`Codec`] that parses and shows it). The CLI's flags, the
//! environment lookup, the file's accepted keys, the resolver, `ferry config` and the README's
//! table are all driven by this list; adding a setting is adding one entry here and one field to
//! the struct in [`super::types`].

use super::expert_layers::ExpertLayers;
use super::sampling::{Fraction, Nucleus, OptionalCount, OptionalSampling, Penalty, Temperature};
use super::types::{DeviceConfig, ModelConfig, ServerConfig};
use super::values::{
    Bandwidth, Budget, Codec, Device, Dtype, Gflops, Kernels, KvDtype, KvPlace, Mode, Names,
    Number, OptionalPositive, OptionalSwitch, OptionalText, PanelCache, Positive, Reasoning,
    Secret, Secrets, Shown, Size, Speculation, Spread, Switch, Template, Text, Tiers, Time,
};

/// The table a setting lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `[server]`.
    Server,
    /// `[device]`.
    Device,
    /// Every `[[models]]` entry. A flag or variable applies to every model.
    Model,
}

impl Scope {
    /// The key prefix in the config file: `server.`, `device.` or `models[].`.
    pub fn prefix(self) -> &'static str {
        match self {
            Scope::Server => "server.",
            Scope::Device => "device.",
            Scope::Model => "models[].",
        }
    }
}

/// How a setting reads and writes its field of one resolved section.
pub struct Accessors<T> {
    /// Parses the text and stores the value.
    pub apply: fn(&mut T, &str) -> Result<(), String>,
    /// The stored value, for `ferry config`.
    pub show: fn(&T) -> Shown,
}

/// The field a setting fills, in the section its scope names.
pub enum Field {
    /// A field of [`ServerConfig`].
    Server(Accessors<ServerConfig>),
    /// A field of [`DeviceConfig`].
    Device(Accessors<DeviceConfig>),
    /// A field of [`ModelConfig`].
    Model(Accessors<ModelConfig>),
}

/// A resolved section a setting can fill.
pub trait Section: Sized {
    /// The setting's accessors for this section, if it belongs to it.
    fn accessors(field: &Field) -> Option<&Accessors<Self>>;
}

impl Section for ServerConfig {
    fn accessors(field: &Field) -> Option<&Accessors<Self>> {
        match field {
            Field::Server(accessors) => Some(accessors),
            _ => None,
        }
    }
}

impl Section for DeviceConfig {
    fn accessors(field: &Field) -> Option<&Accessors<Self>> {
        match field {
            Field::Device(accessors) => Some(accessors),
            _ => None,
        }
    }
}

impl Section for ModelConfig {
    fn accessors(field: &Field) -> Option<&Accessors<Self>> {
        match field {
            Field::Model(accessors) => Some(accessors),
            _ => None,
        }
    }
}

/// One setting.
pub struct Setting {
    /// The flag without dashes (`gpu-memory`); the variable is `FERRY_` + it in upper snake case.
    pub name: &'static str,
    /// A one-letter flag, if any.
    pub short: Option<char>,
    /// The key inside its table (`offload.gpu_memory`).
    pub key: &'static str,
    /// The placeholder in `--help` (`SIZE`).
    pub value_name: &'static str,
    /// The built-in default as text (parsed like any other value); `None` = unset.
    pub default: Option<&'static str>,
    /// How the README states the default when the text alone would mislead ("" = the text).
    pub default_note: &'static str,
    /// A valid value other than the default (used by the tests that walk every setting).
    pub example: &'static str,
    /// One line of documentation.
    pub help: &'static str,
    /// The field it fills.
    pub field: Field,
}

/// `--model` / `FERRY_MODEL` / `models[].source`: with a flag or variable, it replaces the
/// configured models with this one (keeping the first entry's other settings).
pub const SOURCE: &str = "model";
/// `--served-name` / `FERRY_SERVED_NAME` / `models[].name`: with a flag or variable, it names the
/// one served model (an error when several are configured and `--model` is not given).
pub const NAME: &str = "served-name";

/// `--chat-template` / `models[].chat_template`: a relative file path written in a config file
/// is relative to the file's folder.
pub const CHAT_TEMPLATE: &str = "chat-template";

/// `--draft-model` / `models[].speculative.draft`: a relative path written in a config file is
/// relative to the file's folder, as `source` is.
pub const DRAFT_MODEL: &str = "draft-model";

/// The model served when neither the config nor `--model` names one: the file
/// `scripts/fetch-model.sh` fetches, relative to the working directory.
pub const DEFAULT_MODEL_SOURCE: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The id of the default model.
pub const DEFAULT_MODEL_NAME: &str = "smollm2";

macro_rules! field {
    ($section:ident, $codec:ty, $($path:ident).+) => {
        Field::$section(Accessors {
            apply: |config, text| {
                config.$($path).+ = <$codec as Codec>::parse(text)?;
                Ok(())
            },
            show: |config| <$codec as Codec>::show(&config.$($path).+),
        })
    };
}

/// Every setting, in the order `--help`, `ferry config` and the README list them.
pub static SETTINGS: &[Setting] = &[
    Setting {
        name: "host",
        short: None,
        key: "host",
        value_name: "ADDR",
        default: Some("127.0.0.1"),
        default_note: "",
        example: "0.0.0.0",
        help: "Bind address (loopback unless asked; 0.0.0.0 is every interface).",
        field: field!(Server, Text, host),
    },
    Setting {
        name: "port",
        short: Some('p'),
        key: "port",
        value_name: "PORT",
        default: Some("8080"),
        default_note: "",
        example: "9123",
        help: "TCP port.",
        field: field!(Server, Number<u16>, port),
    },
    Setting {
        name: "api-key",
        short: None,
        key: "api_key",
        value_name: "KEY",
        default: None,
        default_note: "none",
        example: "secret-key",
        help: "Require `Authorization: Bearer KEY` on every request but GET /health (and GET /metrics unless metrics_auth).",
        field: field!(Server, Secret, api_key),
    },
    Setting {
        name: "api-keys",
        short: None,
        key: "api_keys",
        value_name: "KEYS",
        default: None,
        default_note: "none",
        example: "key-one,key-two",
        help: "More accepted keys, comma-separated, beside api_key. With more than one key, each key has its own prefix cache.",
        field: field!(Server, Secrets, api_keys),
    },
    Setting {
        name: "api-keys-file",
        short: None,
        key: "api_keys_file",
        value_name: "PATH",
        default: None,
        default_note: "none",
        example: "/etc/ferry/keys",
        help: "A file of more accepted keys, one per line (blank lines and # comments skipped), read at start.",
        field: field!(Server, OptionalText, api_keys_file),
    },
    Setting {
        name: "max-queue",
        short: None,
        key: "max_queue",
        value_name: "N",
        default: Some("64"),
        default_note: "",
        example: "7",
        help: "Requests allowed to wait for a place in the batch (beyond it: 503).",
        field: field!(Server, Number<usize>, max_queue),
    },
    Setting {
        name: "body-limit",
        short: None,
        key: "body_limit",
        value_name: "SIZE",
        default: Some("16MiB"),
        default_note: "",
        example: "1MiB",
        help: "Largest accepted request body (beyond it: 413).",
        field: field!(Server, Size, body_limit),
    },
    Setting {
        name: "shutdown-timeout",
        short: None,
        key: "shutdown_timeout",
        value_name: "DURATION",
        default: Some("30s"),
        default_note: "",
        example: "5s",
        help: "Grace period for in-flight requests on SIGINT/SIGTERM; then streams end with an error event, other requests with 503, and the exit code is 3.",
        field: field!(Server, Time, shutdown_timeout),
    },
    Setting {
        name: "max-connections",
        short: None,
        key: "max_connections",
        value_name: "N",
        default: Some("2048"),
        default_note: "",
        example: "100",
        help: "Most open connections (lowered to what the open-files limit allows). At the cap the connection idle or still sending its request body longest is closed; when all are busy, new ones get 503.",
        field: field!(Server, Positive, max_connections),
    },
    Setting {
        name: "header-read-timeout",
        short: None,
        key: "header_read_timeout",
        value_name: "DURATION",
        default: Some("10s"),
        default_note: "",
        example: "3s",
        help: "Longest time from a request head's first byte to its end (then the connection is closed).",
        field: field!(Server, Time, header_read_timeout),
    },
    Setting {
        name: "idle-timeout",
        short: None,
        key: "idle_timeout",
        value_name: "DURATION",
        default: Some("60s"),
        default_note: "",
        example: "5s",
        help: "How long a connection may stay open without a request in flight.",
        field: field!(Server, Time, idle_timeout),
    },
    Setting {
        name: "body-read-timeout",
        short: None,
        key: "body_read_timeout",
        value_name: "DURATION",
        default: Some("60s"),
        default_note: "",
        example: "20s",
        help: "Longest time a client may take to send a request body (beyond it: 408).",
        field: field!(Server, Time, body_read_timeout),
    },
    Setting {
        name: "default-max-tokens",
        short: None,
        key: "default_max_tokens",
        value_name: "TOKENS",
        default: Some("1024"),
        default_note: "",
        example: "256",
        help: "Chat completions' max_tokens when the request gives none (lowered to what the context leaves); completions keep OpenAI's 16.",
        field: field!(Server, Positive, default_max_tokens),
    },
    Setting {
        name: "max-tokens-limit",
        short: None,
        key: "max_tokens_limit",
        value_name: "TOKENS",
        default: None,
        default_note: "none (the context)",
        example: "4096",
        help: "Largest max_tokens a request may ask for (beyond it: 400).",
        field: field!(Server, OptionalPositive, max_tokens_limit),
    },
    Setting {
        name: "metrics-auth",
        short: None,
        key: "metrics_auth",
        value_name: "BOOL",
        default: None,
        default_note: "on when a key is set",
        example: "false",
        help: "Require the API key on GET /metrics too (/health never needs it). Unset: on whenever a key is set.",
        field: field!(Server, OptionalSwitch, metrics_auth),
    },
    Setting {
        name: "allowed-hosts",
        short: None,
        key: "allowed_hosts",
        value_name: "NAMES",
        default: None,
        default_note: "localhost names for a key-less server on a loopback address, else any",
        example: "ferry.example,localhost",
        help: "Comma-separated Host names requests may carry (others: 403); * allows any.",
        field: field!(Server, Names, allowed_hosts),
    },
    Setting {
        name: "parse-special-in-content",
        short: None,
        key: "parse_special_in_content",
        value_name: "BOOL",
        default: Some("false"),
        default_note: "",
        example: "true",
        help: "Parse special tokens written inside chat messages (<|im_start|>) as control tokens; off, message content is text and cannot open turns.",
        field: field!(Server, Switch, parse_special_in_content),
    },
    Setting {
        name: "web-ui",
        short: None,
        key: "web_ui",
        value_name: "BOOL",
        default: Some("true"),
        default_note: "",
        example: "false",
        help: "Serve the status and chat page on GET / (behind the API key when one is set); false: GET / is 404.",
        field: field!(Server, Switch, web_ui),
    },
    Setting {
        name: "cors-origins",
        short: None,
        key: "cors_origins",
        value_name: "ORIGINS",
        default: None,
        default_note: "none (CORS off)",
        example: "https://app.example,http://localhost:3000",
        help: "Comma-separated browser origins allowed to call the API cross-origin (CORS, preflights answered); * allows any.",
        field: field!(Server, Names, cors_origins),
    },
    Setting {
        name: "device",
        short: None,
        key: "kind",
        value_name: "DEVICE",
        default: Some("auto"),
        default_note: "",
        example: "cpu",
        help: "Compute device: auto, cpu or cuda:N.",
        field: field!(Device, Device, kind),
    },
    Setting {
        name: "link-bandwidth",
        short: None,
        key: "link_bandwidth",
        value_name: "RATE",
        default: None,
        default_note: "unthrottled",
        example: "8GB/s",
        help: "CPU device: throttle weight copies to this rate, e.g. 16GB/s (emulates PCIe). Any device: the link rate the tier cost model uses instead of measuring it.",
        field: field!(Device, Bandwidth, link_bandwidth),
    },
    Setting {
        name: "cpu-qmatmul",
        short: None,
        key: "cpu_qmatmul",
        value_name: "KERNELS",
        default: Some("auto"),
        default_note: "",
        example: "candle",
        help: "Quantized matmul on the CPU: auto (ferry's kernels where they apply, on the fastest instruction sets the CPU has), avx512, avx-vnni, avx2 or scalar (ferry's kernels held to those instruction sets, e.g. avx2 to measure an AVX2-only CPU's path) or candle.",
        field: field!(Device, Kernels, cpu_qmatmul),
    },
    Setting {
        name: "panel-cache",
        short: None,
        key: "panel_cache",
        value_name: "DIR",
        default: Some("auto"),
        default_note: "",
        example: "off",
        help: "Where the CPU loader keeps the eight-row layouts it makes of k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 matrices on AVX2 machines, one file per model, so that the next load maps them instead of making them again: auto (~/.cache/ferry/panels, $XDG_CACHE_HOME/ferry/panels when set), off (made at every load) or a folder.",
        field: field!(Device, PanelCache, panel_cache),
    },
    Setting {
        name: "recalibrate",
        short: None,
        key: "recalibrate",
        value_name: "BOOL",
        default: Some("false"),
        default_note: "",
        example: "true",
        help: "Measure the tier cost model's rates again instead of reading those cached in ~/.cache/ferry/calibration.json ($XDG_CACHE_HOME/ferry/ when set), and cache the new ones. `--recalibrate` alone means true.",
        field: field!(Device, Switch, recalibrate),
    },
    Setting {
        name: "calibration-spread",
        short: None,
        key: "calibration_spread",
        value_name: "PERCENT",
        default: Some("50%"),
        default_note: "",
        example: "100%",
        help: "Cache a calibration only when the repetitions of each probe stay within this of the fastest (slowest / fastest - 1): one measured under load is used for that start, not kept. 0% never caches.",
        field: field!(Device, Spread, calibration_spread),
    },
    Setting {
        name: SOURCE,
        short: Some('m'),
        key: "source",
        value_name: "SOURCE",
        default: Some(DEFAULT_MODEL_SOURCE),
        default_note: "",
        example: "org/name@v1",
        help: "Model source: a .gguf file, an HF directory or a hub id org/name[@revision]. As a flag or variable it replaces the configured models with this one.",
        field: field!(Model, Text, source),
    },
    Setting {
        name: NAME,
        short: None,
        key: "name",
        value_name: "NAME",
        default: Some(DEFAULT_MODEL_NAME),
        default_note: "derived from the source (`smollm2` for the built-in model)",
        example: "example-name",
        help: "The id clients send as \"model\".",
        field: field!(Model, Text, name),
    },
    Setting {
        name: "dtype",
        short: None,
        key: "dtype",
        value_name: "DTYPE",
        default: Some("auto"),
        default_note: "",
        example: "f16",
        help: "Weight dtype: auto (GGUF stays quantized), f32, f16 or bf16 (dense), or q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k (a dense model quantized at load).",
        field: field!(Model, Dtype, dtype),
    },
    Setting {
        name: "max-context",
        short: None,
        key: "max_context",
        value_name: "TOKENS",
        default: None,
        default_note: "the model's, lowered to fit the budget",
        example: "1024",
        help: "Context window to serve (at most the model's own). Unset: the model's, lowered (not below 4096) to fit the budget with every layer on the device.",
        field: field!(Model, OptionalPositive, max_context),
    },
    Setting {
        name: "max-batch",
        short: None,
        key: "max_batch",
        value_name: "N",
        default: None,
        default_note: "8, lowered to fit the budget",
        example: "3",
        help: "Sequences decoded together. Unset: 8, lowered to fit the budget once the context is at its floor (before any layer leaves the device).",
        field: field!(Model, OptionalPositive, max_batch),
    },
    Setting {
        name: "kv-dtype",
        short: None,
        key: "kv_dtype",
        value_name: "DTYPE",
        default: Some("auto"),
        default_note: "`auto`: f16 (bf16 for bf16 weights), on the CPU as on CUDA",
        example: "bf16",
        help: "KV cache dtype: auto, f32, f16, bf16, or llama.cpp's q8_0 / q4_0 blocks (f16 and bf16 halve the KV cache's bytes, q8_0 takes 0.53x and q4_0 0.28x those of f16; q8_0/q4_0 need heads a multiple of 32 wide and are read by the CPU's attention, so on CUDA they live in host memory (kv_offload); f32 for the last bit of accuracy).",
        field: field!(Model, KvDtype, kv_dtype),
    },
    Setting {
        name: "kv-offload",
        short: None,
        key: "kv_offload",
        value_name: "WHERE",
        default: Some("auto"),
        default_note: "`auto`: on the device, on the host when the device cannot hold the context",
        example: "on",
        help: "Where the KV cache lives: off (on the compute device; an unset max_context is lowered to fit the budget), on (in host memory, attention for every layer computed there by the CPU kernels: only a step's queries, new keys/values and outputs cross the link, like llama.cpp's --no-kv-offload), auto (on the device when it holds the context set, else the model's window, with every layer; otherwise on the host when host memory holds it). On the CPU device auto is off.",
        field: field!(Model, KvPlace, kv_offload),
    },
    Setting {
        name: "prefill-chunk",
        short: None,
        key: "prefill_chunk",
        value_name: "TOKENS",
        default: Some("512"),
        default_note: "",
        example: "128",
        help: "Most prompt tokens one sequence prefills per engine step.",
        field: field!(Model, Positive, prefill_chunk),
    },
    Setting {
        name: "max-step-tokens",
        short: None,
        key: "max_step_tokens",
        value_name: "TOKENS",
        default: None,
        default_note: "512, lowered to fit the budget",
        example: "256",
        help: "Most tokens one engine step computes: decodes first, then prompt chunks, so a stream's gap between tokens stays one step however long the prompts beside it. Unset: 512, lowered (in steps of 64, not below 64) when the activation workspace it sizes is what keeps the model from fitting the budget at the smallest context and batch.",
        field: field!(Model, OptionalPositive, max_step_tokens),
    },
    Setting {
        name: "step-time",
        short: None,
        key: "step_time",
        value_name: "TIME",
        default: Some("100ms"),
        default_note: "",
        example: "250ms",
        help: "Time an engine step aims at while other requests wait on it: its tokens are lowered (never below the decodes and one 64-token prompt share) to what the device computed in that time before; 0 = always max_step_tokens.",
        field: field!(Model, Time, step_time),
    },
    Setting {
        name: "prefix-cache",
        short: None,
        key: "prefix_cache",
        value_name: "BOOL",
        default: Some("true"),
        default_note: "",
        example: "false",
        help: "Reuse the KV state of prompt prefixes other requests computed (chat turns, shared system prompts), in blocks of 16 tokens; greedy output is the same with or without it.",
        field: field!(Model, Switch, prefix_cache),
    },
    Setting {
        name: "prefix-cache-tokens",
        short: None,
        key: "prefix_cache_tokens",
        value_name: "TOKENS",
        default: None,
        default_note: "the KV room running requests leave",
        example: "4096",
        help: "Most prompt tokens the prefix cache holds. It never takes KV room a running request may need (max_batch x max_context positions in all), least recently used blocks go first.",
        field: field!(Model, OptionalPositive, prefix_cache_tokens),
    },
    Setting {
        name: "speculative-method",
        short: None,
        key: "speculative.method",
        value_name: "METHOD",
        default: Some("none"),
        default_note: "",
        example: "ngram",
        help: "Speculative decoding: none, ngram (tokens copied from where the context's last tokens occurred before) or draft (a smaller model with the same vocabulary, `draft`, every layer of it on the device). The model checks every proposal in one step; the output is what it would give without.",
        field: field!(Model, Speculation, speculative.method),
    },
    Setting {
        name: DRAFT_MODEL,
        short: None,
        key: "speculative.draft",
        value_name: "SOURCE",
        default: None,
        default_note: "none",
        example: "models/draft.gguf",
        help: "The draft model of method draft (a source, as `source`): its vocabulary must be the model's (checked at load), and it runs with every layer on the device.",
        field: field!(Model, OptionalText, speculative.draft),
    },
    Setting {
        name: "speculative-tokens",
        short: None,
        key: "speculative.tokens",
        value_name: "N",
        default: Some("4"),
        default_note: "",
        example: "8",
        help: "Most tokens proposed per sequence and step (at most 15); each sequence proposes fewer, down to none, where its measured acceptance and the measured step cost say more would not pay.",
        field: field!(Model, Positive, speculative.tokens),
    },
    Setting {
        name: CHAT_TEMPLATE,
        short: None,
        key: "chat_template",
        value_name: "TEMPLATE",
        default: None,
        default_note: "the model's own, else a built-in one for its family",
        example: "templates/chat.jinja",
        help: "Chat template instead of the model's own: Jinja written out (a value with {{ or {%), else the path of a file of it. Unset, a model without one gets ferry's built-in Gemma, Llama 3, Mistral or ChatML template, chosen from its architecture and special tokens (the load log names it).",
        field: field!(Model, Template, chat_template),
    },
    Setting {
        name: "reasoning-format",
        short: None,
        key: "reasoning_format",
        value_name: "FORMAT",
        default: Some("auto"),
        default_note: "",
        example: "none",
        help: "auto: when the chat template is a reasoning one (think blocks: Qwen3, QwQ, DeepSeek-R1; gpt-oss's harmony), chat replies carry the thinking in `reasoning_content`, apart from `content`; none: think blocks stay in `content` as written (harmony replies are always split: their markup is special tokens).",
        field: field!(Model, Reasoning, reasoning_format),
    },
    Setting {
        name: "verify-weights",
        short: None,
        key: "verify_weights",
        value_name: "BOOL",
        default: Some("false"),
        default_note: "",
        example: "true",
        help: "Before loading, read every tensor once and refuse the model when one holds NaN or infinity (float values, block scales), naming the tensor; costs one read of the file.",
        field: field!(Model, Switch, verify_weights),
    },
    Setting {
        name: "temperature",
        short: None,
        key: "sampling.temperature",
        value_name: "T",
        default: None,
        default_note: "the model's own, else `0.8`",
        example: "0.6",
        help: "Sampling temperature for requests that send none (0 is greedy); unset = the model's generation_config.json or GGUF `general.sampling.temp`, else llama.cpp's 0.8. `ferry generate` uses it too.",
        field: field!(Model, OptionalSampling<Temperature>, sampling.temperature),
    },
    Setting {
        name: "top-p",
        short: None,
        key: "sampling.top_p",
        value_name: "P",
        default: None,
        default_note: "the model's own, else `0.95`",
        example: "0.9",
        help: "Nucleus mass for requests that send no `top_p` (1 is off); unset = the model's own, else llama.cpp's 0.95.",
        field: field!(Model, OptionalSampling<Nucleus>, sampling.top_p),
    },
    Setting {
        name: "top-k",
        short: None,
        key: "sampling.top_k",
        value_name: "K",
        default: None,
        default_note: "the model's own, else `40`",
        example: "20",
        help: "The k most likely tokens for requests that send no `top_k` (0 is off); unset = the model's own, else llama.cpp's 40.",
        field: field!(Model, OptionalCount, sampling.top_k),
    },
    Setting {
        name: "min-p",
        short: None,
        key: "sampling.min_p",
        value_name: "P",
        default: None,
        default_note: "the model's own, else `0.05`",
        example: "0",
        help: "Minimum probability relative to the top token for requests that send no `min_p` (0 is off); unset = the model's own, else llama.cpp's 0.05.",
        field: field!(Model, OptionalSampling<Fraction>, sampling.min_p),
    },
    Setting {
        name: "repetition-penalty",
        short: None,
        key: "sampling.repetition_penalty",
        value_name: "PENALTY",
        default: None,
        default_note: "the model's own, else `1`",
        example: "1.1",
        help: "Repetition penalty for requests that send none (1 is off); unset = the model's own, else 1.",
        field: field!(Model, OptionalSampling<Penalty>, sampling.repetition_penalty),
    },
    Setting {
        name: "offload",
        short: None,
        key: "offload.mode",
        value_name: "MODE",
        default: Some("auto"),
        default_note: "",
        example: "sequential",
        help: "Offload mode: none, auto, sequential or model.",
        field: field!(Model, Mode, offload.mode),
    },
    Setting {
        name: "gpu-memory",
        short: None,
        key: "offload.gpu_memory",
        value_name: "SIZE",
        default: Some("90%"),
        default_note: "",
        example: "6GiB",
        help: "Device memory budget: bytes (6GiB) or a share of free memory (90%).",
        field: field!(Model, Budget, offload.gpu_memory),
    },
    Setting {
        name: "prefetch",
        short: None,
        key: "offload.prefetch",
        value_name: "N",
        default: Some("2"),
        default_note: "",
        example: "5",
        help: "Layers in flight ahead of compute.",
        field: field!(Model, Number<usize>, offload.prefetch),
    },
    Setting {
        name: "offload-experts",
        short: None,
        key: "offload.experts",
        value_name: "BOOL",
        default: Some("true"),
        default_note: "",
        example: "false",
        help: "Offload a mixture of experts expert by expert: attention, norms and routers stay on the device, then experts until the budget; the rest are streamed into an expert cache or computed on the host each step (on CUDA experts held dense, f16/bf16 or a type CUDA's kernels lack, always stream). false: stream whole layers.",
        field: field!(Model, Switch, tier.experts),
    },
    Setting {
        name: "host-expert-layers",
        short: None,
        key: "offload.host_expert_layers",
        value_name: "LAYERS",
        default: Some("0"),
        default_note: "the budget decides",
        example: "0,2,5-7",
        help: "Keep every expert of these MoE layers on the host whatever the budget (llama.cpp's --n-cpu-moe): N, the first N MoE layers, or a list of layer indices and ranges like 0,2,5-7 (a layer out of range or without experts is an error at load); the other layers' experts placed by the budget; mode auto with offload.experts. Such experts are computed on the host or streamed per step by the cost model (on CUDA those held dense always stream).",
        field: field!(Model, ExpertLayers, tier.host_expert_layers),
    },
    Setting {
        name: "expert-routes",
        short: None,
        key: "offload.expert_routes",
        value_name: "BOOL",
        default: Some("true"),
        default_note: "",
        example: "false",
        help: "Count how often each expert is routed to while serving with offloaded experts, keep the counts per model file in expert-routes.json beside the calibration cache (written at shutdown and every few minutes), and make the most routed experts of each layer resident first; false: neither counts nor reads them (experts 0.. of each layer resident).",
        field: field!(Model, Switch, tier.expert_routes),
    },
    Setting {
        name: "offload-tier",
        short: None,
        key: "offload.tier",
        value_name: "TIER",
        default: Some("auto"),
        default_note: "",
        example: "host",
        help: "Where offloaded experts and layers run each step: auto (the cost model picks streaming to the device or computing on the host), stream or host (host on CUDA: offloaded experts held as GGUF blocks only, not whole layers).",
        field: field!(Model, Tiers, tier.choice),
    },
    Setting {
        name: "host-gflops",
        short: None,
        key: "offload.host_gflops",
        value_name: "GFLOPS",
        default: None,
        default_note: "measured at start-up",
        example: "120",
        help: "Tier cost model: host compute rate of the CPU kernels for the model's weight type, in GFLOP/s.",
        field: field!(Model, Gflops, tier.host_gflops),
    },
    Setting {
        name: "host-bandwidth",
        short: None,
        key: "offload.host_bandwidth",
        value_name: "RATE",
        default: None,
        default_note: "measured at start-up",
        example: "40GB/s",
        help: "Tier cost model: host memory rate at which the CPU kernels read weights, e.g. 40GB/s.",
        field: field!(Model, Bandwidth, tier.host_bandwidth),
    },
    Setting {
        name: "device-gflops",
        short: None,
        key: "offload.device_gflops",
        value_name: "GFLOPS",
        default: None,
        default_note: "measured at start-up",
        example: "20000",
        help: "Tier cost model: compute rate of the compute device, in GFLOP/s.",
        field: field!(Model, Gflops, tier.device_gflops),
    },
    Setting {
        name: "keep-alive",
        short: None,
        key: "offload.keep_alive",
        value_name: "DURATION",
        default: Some("5m"),
        default_note: "",
        example: "90s",
        help: "Mode model: idle time before the model leaves the device.",
        field: field!(Model, Time, offload.keep_alive),
    },
];

impl Setting {
    /// The table it lives in.
    pub fn scope(&self) -> Scope {
        match self.field {
            Field::Server(_) => Scope::Server,
            Field::Device(_) => Scope::Device,
            Field::Model(_) => Scope::Model,
        }
    }

    /// `--name`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name)
    }

    /// `FERRY_NAME`.
    pub fn env(&self) -> String {
        format!("FERRY_{}", self.name.to_ascii_uppercase().replace('-', "_"))
    }

    /// The key as the docs write it: `server.port`, `models[].offload.mode`.
    pub fn doc_key(&self) -> String {
        format!("{}{}", self.scope().prefix(), self.key)
    }

    /// The key of one value: `server.port`, or `models[2].offload.mode` for model `2`.
    pub fn key_at(&self, model: usize) -> String {
        match self.scope() {
            Scope::Model => format!("models[{model}].{}", self.key),
            _ => self.doc_key(),
        }
    }

    /// Parses `text` into this setting's field of `section`.
    pub fn apply<T: Section>(&self, section: &mut T, text: &str) -> Result<(), String> {
        match T::accessors(&self.field) {
            Some(accessors) => (accessors.apply)(section, text),
            None => Err(format!("`{}` is not a setting of this table", self.key)),
        }
    }

    /// This setting's value in `section` (`Unset` if it is not one of its fields).
    pub fn show<T: Section>(&self, section: &T) -> Shown {
        T::accessors(&self.field).map_or(Shown::Unset, |a| (a.show)(section))
    }

    /// Applies the built-in default (nothing when it is unset).
    pub(super) fn apply_default<T: Section>(&self, section: &mut T) {
        if let Some(text) = self.default {
            // The defaults are constants a unit test parses, so this cannot fail in practice.
            let applied = self.apply(section, text);
            debug_assert!(applied.is_ok(), "default of {}: {applied:?}", self.name);
        }
    }
}

/// The setting with this flag name (`gpu-memory`).
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The settings of one scope, in table order.
pub fn in_scope(scope: Scope) -> impl Iterator<Item = &'static Setting> {
    SETTINGS.iter().filter(move |s| s.scope() == scope)
}

/// The closest of `candidates` to `unknown`, if it is close enough to be a likely typo.
pub fn closest<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&unknown, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// The README's configuration table (tested against README.md).
pub fn markdown_table() -> String {
    let mut out = String::from("| flag | environment | config key | default | meaning |\n");
    out.push_str("|---|---|---|---|---|\n");
    for s in SETTINGS {
        let default = match (s.default_note, s.default) {
            ("", Some(text)) => format!("`{text}`"),
            ("", None) => "none".to_string(),
            (note, _) => note.to_string(),
        };
        out.push_str(&format!(
            "| `{}` | `{}` | `{}` | {default} | {} |\n",
            s.flag(),
            s.env(),
            s.doc_key(),
            s.help.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;

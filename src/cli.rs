//! The command line (clap): `ferry serve`, `ferry plan`, `ferry generate`. Flags are turned into
//! [`Overrides`] for configuration resolution; nothing here does I/O.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

/// ferry: serve large language models on small GPUs (OpenAI-compatible API).
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured models over HTTP.
    Serve(ServeArgs),
    /// Show how the model's weights would be placed, without loading them.
    Plan(PlanArgs),
    /// Generate text for one prompt and print it to stdout (logs go to stderr).
    Generate(GenerateArgs),
}

/// Model, device and offload flags shared by every subcommand. Each overrides the config file
/// and the matching `FERRY_*` environment variable.
#[derive(Debug, Clone, Default, Args)]
pub struct ModelArgs {
    /// TOML config file (see config/default.toml).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model source: a .gguf file, an HF directory or a hub id org/name[@revision]. Replaces the
    /// models of the config file with this one.
    #[arg(long, short = 'm', value_name = "SOURCE")]
    pub model: Option<String>,
    /// The id clients send as "model" (default: derived from --model).
    #[arg(long, value_name = "NAME")]
    pub served_name: Option<String>,
    /// Dense weight dtype: auto, f32, f16 or bf16 (auto keeps GGUF quantized).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    /// Compute device: auto, cpu or cuda:N.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Sequences decoded together.
    #[arg(long, value_name = "N")]
    pub max_batch: Option<String>,
    /// Context window to serve (at most the model's own).
    #[arg(long, value_name = "TOKENS")]
    pub max_context: Option<String>,
    /// Offload mode: none, auto, sequential or model.
    #[arg(long, value_name = "MODE")]
    pub offload: Option<String>,
    /// Device memory budget: bytes ("6GiB") or a share of free memory ("90%").
    #[arg(long, value_name = "SIZE")]
    pub gpu_memory: Option<String>,
    /// Layers in flight ahead of compute.
    #[arg(long, value_name = "N")]
    pub prefetch: Option<String>,
    /// CPU device: throttle weight copies to this rate, e.g. "8GB/s".
    #[arg(long, value_name = "RATE")]
    pub link_bandwidth: Option<String>,
}

/// `ferry serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Model and device flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Bind address (default 127.0.0.1).
    #[arg(long, value_name = "ADDR")]
    pub host: Option<String>,
    /// TCP port (default 8080).
    #[arg(long, short = 'p', value_name = "PORT")]
    pub port: Option<String>,
    /// Requests allowed to wait for a batch slot.
    #[arg(long, value_name = "N")]
    pub max_queue: Option<String>,
    /// Require `Authorization: Bearer KEY` on every request.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
}

/// `ferry plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Model and device flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `ferry generate`.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// Model and device flags.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, value_name = "TEXT")]
    pub prompt: String,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub top_p: f32,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// RNG seed for reproducible sampling.
    #[arg(long, value_name = "SEED")]
    pub seed: Option<u64>,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

fn tagged(flag: &str, value: &Option<String>) -> Option<(String, String)> {
    value.clone().map(|v| (format!("--{flag}"), v))
}

impl ModelArgs {
    /// The flags as configuration overrides.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            model: tagged("model", &self.model),
            served_name: tagged("served-name", &self.served_name),
            dtype: tagged("dtype", &self.dtype),
            device: tagged("device", &self.device),
            max_batch: tagged("max-batch", &self.max_batch),
            max_context: tagged("max-context", &self.max_context),
            offload: tagged("offload", &self.offload),
            gpu_memory: tagged("gpu-memory", &self.gpu_memory),
            prefetch: tagged("prefetch", &self.prefetch),
            link_bandwidth: tagged("link-bandwidth", &self.link_bandwidth),
            ..Overrides::default()
        }
    }
}

impl ServeArgs {
    /// The flags as configuration overrides.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            host: tagged("host", &self.host),
            port: tagged("port", &self.port),
            max_queue: tagged("max-queue", &self.max_queue),
            api_key: tagged("api-key", &self.api_key),
            ..self.model.overrides()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_flags_become_tagged_overrides() {
        let cli = Cli::try_parse_from([
            "ferry",
            "serve",
            "--model",
            "m.gguf",
            "--port",
            "9000",
            "--offload",
            "sequential",
            "--gpu-memory",
            "2GiB",
            "--max-batch",
            "4",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        let over = args.overrides();
        assert_eq!(over.port, Some(("--port".into(), "9000".into())));
        assert_eq!(over.model, Some(("--model".into(), "m.gguf".into())));
        assert_eq!(
            over.offload,
            Some(("--offload".into(), "sequential".into()))
        );
        assert_eq!(
            over.gpu_memory,
            Some(("--gpu-memory".into(), "2GiB".into()))
        );
        assert_eq!(over.max_batch, Some(("--max-batch".into(), "4".into())));
    }

    #[test]
    fn plan_and_generate_take_the_model_flags() {
        let plan =
            Cli::try_parse_from(["ferry", "plan", "--device", "cpu", "--json"]).expect("plan");
        assert!(matches!(
            plan.command,
            Command::Plan(PlanArgs { json: true, .. })
        ));
        let generate = Cli::try_parse_from([
            "ferry", "generate", "--prompt", "hi", "--dtype", "f32", "--seed", "7",
        ])
        .expect("generate");
        let Command::Generate(args) = generate.command else {
            panic!("expected generate");
        };
        assert_eq!(args.model.dtype.as_deref(), Some("f32"));
        assert_eq!(args.seed, Some(7));
        assert!(
            Cli::try_parse_from(["ferry", "generate"]).is_err(),
            "--prompt is required"
        );
    }
}

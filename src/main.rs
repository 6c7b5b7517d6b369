//! The `ferry` binary: parses the command line, resolves the configuration, sets up logging and
//! dispatches to `serve`, `plan`, `generate` or `config`. The only place `anyhow` is used.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use tracing_subscriber::EnvFilter;

use ferry::cli::{Cli, Command, ConfigFile, GenerateArgs};
use ferry::config::{Config, Overrides, Resolved};
use ferry::engine::traits::TextCodec;
use ferry::engine::worker::EngineHandle;
use ferry::engine::{
    Backend, ChatMessage, GenerationEvent, GenerationParams, GenerationRequest, SamplingParams,
};
use ferry::model::source::HubOptions;
use ferry::runtime::device::{free_bytes, select_device};
use ferry::runtime::device_plan::DevicePlan;
use ferry::runtime::load::load_for_serving_on;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let outcome = run(cli);
    // A panel cache file still being written (a short run: the first load of a model) is
    // finished rather than left as a temporary.
    ferry::model::loader::panel_cache::wait_for_panel_cache_writes();
    match outcome {
        Ok(code) => code,
        Err(err) => {
            // Written without `eprintln!`, which panics when stderr cannot be written.
            let _ = writeln!(std::io::stderr(), "error: {}", error_text(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: a cause whose text its parent already contains
/// (thiserror messages that embed their source) is not repeated.
fn error_text(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Logs to stderr (a line that cannot be written is dropped, never a panic); `RUST_LOG`
/// overrides the default `info` level.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(ferry::metrics::log_sink::lossy_stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve(load_config(&args.file, &args.settings.overrides)?),
        Command::Plan(args) => {
            let config = load_config(&args.file, &args.settings.overrides)?;
            ferry_plan(&config, args.json)
        }
        Command::Generate(args) => {
            let config = load_config(&args.file, &args.settings.overrides)?;
            generate(config, &args)
        }
        Command::Config(args) => {
            let resolved =
                ferry::config::load(args.file.config.as_deref(), &args.settings.overrides)?;
            ferry_config(&resolved, args.json)
        }
    }
}

/// Defaults < config file < FERRY_* environment < flags; applies the process-wide settings.
fn load_config(file: &ConfigFile, flags: &Overrides) -> anyhow::Result<Config> {
    let resolved = ferry::config::load(file.config.as_deref(), flags)?;
    ferry::model::weights::set_cpu_qmatmul(resolved.config.device.cpu_qmatmul);
    ferry::model::loader::panel_cache::set_panel_cache(&resolved.config.device.panel_cache);
    Ok(resolved.config)
}

/// `ferry config`: the effective configuration with the origin of every value.
fn ferry_config(resolved: &Resolved, json: bool) -> anyhow::Result<ExitCode> {
    let text = if json {
        format!("{:#}\n", ferry::config::show::render_json(resolved))
    } else {
        ferry::config::show::render_text(resolved)
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Exit code of a server that stopped with requests cut short (the shutdown deadline or a
/// second signal ended them with an error).
const EXIT_REQUESTS_CUT_SHORT: u8 = 3;

/// Serves until SIGINT/SIGTERM (a second one stops at once); the exit code says whether
/// requests were cut short.
fn serve(config: Config) -> anyhow::Result<ExitCode> {
    ferry::server::limits::tune_allocator();
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async move {
        let listener = ferry::runtime::serve::bind(&config.server).await?;
        let (trigger, signal) = ferry::server::shutdown_channel();
        tokio::spawn(forward_stop_signals(trigger));
        ferry::runtime::serve::serve(config, listener, signal).await
    });
    // Connections still open after the deadline are dropped with the runtime; do not wait
    // for stray blocking work (tokenisation) either. Engine threads end with the process.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    let report = outcome?;
    if report.cut_short > 0 {
        return Ok(ExitCode::from(EXIT_REQUESTS_CUT_SHORT));
    }
    Ok(ExitCode::SUCCESS)
}

/// Turns every SIGINT (Ctrl-C) and SIGTERM into a stop request.
async fn forward_stop_signals(trigger: ferry::server::ShutdownTrigger) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut terminate), Ok(mut interrupt)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::warn!("cannot listen for SIGTERM/SIGINT; stop the server with SIGKILL");
            return;
        };
        loop {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            trigger.stop();
        }
    }
    #[cfg(not(unix))]
    while tokio::signal::ctrl_c().await.is_ok() {
        trigger.stop();
    }
}

fn ferry_plan(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let device = select_device(config.device.kind)?;
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    let free = free_bytes(&device)?;
    let plan = DevicePlan::new(config, &device, &hub, free)?;
    let out = if json {
        format!("{:#}\n", plan.to_json())
    } else {
        plan.render_text()
    };
    write_stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout; a reader that went away (`ferry plan --json | head`) is not an error.
fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Loads the first configured model, generates for one prompt and streams the text to stdout.
fn generate(config: Config, args: &GenerateArgs) -> anyhow::Result<ExitCode> {
    let Some(model) = config.models.first().cloned() else {
        bail!("no model configured");
    };
    let device = select_device(config.device.kind)?;
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    let load_started = Instant::now();
    let loaded = load_for_serving_on(&model, &config.device, &device, &hub)?;
    let load_seconds = load_started.elapsed().as_secs_f64();

    let engine = EngineHandle::new([model.name.clone()]);
    engine.model_ready(
        &model.name,
        loaded.runner,
        loaded.codec as Arc<dyn TextCodec>,
    )?;

    let prompt_tokens = if args.chat {
        let messages = [ChatMessage {
            role: "user".to_string(),
            content: args.prompt.clone(),
            ..Default::default()
        }];
        engine.encode_chat(&model.name, &messages, true, false)?
    } else {
        engine.tokenize(&model.name, &args.prompt, true)?
    };
    let n_prompt = prompt_tokens.len();
    let request = GenerationRequest {
        cache_partition: None,
        model: model.name.clone(),
        prompt: prompt_tokens,
        params: GenerationParams {
            max_tokens: args.max_tokens,
            // The model's sampling defaults, as a request that sends none gets them
            // (`--temperature 0` is greedy).
            sampling: SamplingParams {
                seed: args.seed,
                ..engine.sampling_defaults(&model.name)?
            },
            ignore_eos: args.ignore_eos,
            ..GenerationParams::default()
        },
    };
    let started = Instant::now();
    let mut events = engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    let mut first_token_at = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Token(token) => {
                first_token_at.get_or_insert_with(Instant::now);
                stdout.write_all(token.text.as_bytes())?;
                stdout.flush()?;
            }
            GenerationEvent::Finished {
                reason,
                usage,
                trailing_text,
            } => {
                stdout.write_all(trailing_text.as_bytes())?;
                writeln!(stdout)?;
                stdout.flush()?;
                let total = started.elapsed().as_secs_f64();
                let prefill = first_token_at.map_or(total, |t| (t - started).as_secs_f64());
                let decode_tokens = usage.completion_tokens.saturating_sub(1);
                let decode_seconds = (total - prefill).max(f64::EPSILON);
                eprintln!(
                    "[ferry] load {load_seconds:.2}s | prompt {n_prompt} tokens, first token after {prefill:.3}s ({:.1} tok/s prefill) | {} tokens generated, {:.1} tok/s decode | finish_reason {}",
                    n_prompt as f64 / prefill.max(f64::EPSILON),
                    usage.completion_tokens,
                    decode_tokens as f64 / decode_seconds,
                    reason.as_str(),
                );
                return Ok(ExitCode::SUCCESS);
            }
            GenerationEvent::Failed(err) => bail!("generation failed: {err}"),
        }
    }
    bail!("the engine stopped before finishing the generation")
}

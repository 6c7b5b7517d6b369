//! The `ferry` binary: parses the command line, resolves the configuration, sets up logging and
//! dispatches to `serve`, `plan` or `generate`. The only place `anyhow` is used.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use tracing_subscriber::EnvFilter;

use ferry::cli::{Cli, Command, GenerateArgs, ModelArgs, ServeArgs};
use ferry::config::raw::RawConfig;
use ferry::config::{Config, Overrides};
use ferry::engine::traits::TextCodec;
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::{
    Backend, ChatMessage, EngineError, GenerationEvent, GenerationParams, GenerationRequest,
    PromptInput, SamplingParams,
};
use ferry::metrics::Metrics;
use ferry::model::source::HubOptions;
use ferry::offload::render::{render_json, render_text};
use ferry::runtime::device::{describe, free_bytes, select_device};
use ferry::runtime::load::{load_for_serving_on, load_for_serving_shared};
use ferry::runtime::planning::plan_model;
use ferry::runtime::swap::swap_manager_for;
use ferry::runtime::telemetry::Telemetry;
use ferry::server::{self, ServerOptions};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr; `RUST_LOG` overrides the default `info` level.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => {
            let config = load_config(&args.model, args.overrides())?;
            serve(config, &args)
        }
        Command::Plan(args) => {
            let config = load_config(&args.model, args.model.overrides())?;
            ferry_plan(&config, args.json)
        }
        Command::Generate(args) => {
            let config = load_config(&args.model, args.model.overrides())?;
            generate(config, &args)
        }
    }
}

/// Defaults < config file < FERRY_* environment < flags.
fn load_config(args: &ModelArgs, flags: Overrides) -> anyhow::Result<Config> {
    let raw = match &args.config {
        Some(path) => read_config_file(path)?,
        None => RawConfig::default(),
    };
    let env = Overrides::from_env(|key| std::env::var(key).ok());
    Ok(Config::resolve(&raw, &env, &flags)?)
}

fn read_config_file(path: &Path) -> anyhow::Result<RawConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    RawConfig::from_toml(&text).with_context(|| format!("invalid config file {}", path.display()))
}

fn serve(config: Config, _args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let device = select_device(config.device.kind)?;
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    let names: Vec<String> = config.models.iter().map(|m| m.name.clone()).collect();
    let metrics = Metrics::new();
    let engine = EngineHandle::with_options(
        names.clone(),
        EngineOptions {
            max_queue: config.server.max_queue,
            // The engine takes one batch size for every model: the smallest configured one,
            // so no model runs more sequences (and KV caches) than it was sized for.
            max_batch: config
                .models
                .iter()
                .map(|m| m.max_batch)
                .min()
                .unwrap_or(ferry::engine::worker::DEFAULT_MAX_BATCH),
            metrics: metrics.clone(),
            ..EngineOptions::default()
        },
    );

    // Mode `model`: one residency manager shared by every swapped model.
    let swap = swap_manager_for(&config, &device, &hub)?;
    if let Some(swap) = &swap {
        engine.set_residency(swap.clone());
    }
    let telemetry = Telemetry::new(metrics, swap.clone());

    // Each model loads on its own engine thread; the server answers /health 503 meanwhile.
    let (load_results, mut load_results_rx) = tokio::sync::mpsc::unbounded_channel();
    for model in config.models.clone() {
        let device = device.clone();
        let device_config = config.device.clone();
        let hub = hub.clone();
        let results = load_results.clone();
        let name = model.name.clone();
        let swap = swap.clone();
        let telemetry = Arc::clone(&telemetry);
        engine.load(&name, move || {
            let outcome =
                load_for_serving_shared(&model, &device_config, &device, &hub, swap.as_ref());
            if let Ok(loaded) = &outcome {
                telemetry.add_model(&model.name, Arc::clone(loaded.runner.store().accounting()));
            }
            let reply = outcome.as_ref().map(|_| ()).map_err(|e| e.to_string());
            let _ = results.send((model.name.clone(), reply));
            let loaded = outcome.map_err(|e| EngineError::Internal(e.to_string()))?;
            Ok((loaded.runner, loaded.codec as Arc<dyn TextCodec>))
        })?;
    }
    drop(load_results);

    let mut options = ServerOptions::default().with_body_limit(config.server.body_limit);
    if let Some(key) = &config.server.api_key {
        options = options.with_api_key(key.clone());
    }
    let router = server::app(Arc::new(engine), options);

    let grace = config.server.shutdown_timeout;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async move {
        let address = format!("{}:{}", config.server.host, config.server.port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("cannot listen on {address}"))?;
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_millis(500));
            loop {
                every.tick().await;
                telemetry.publish();
            }
        });
        tracing::info!(
            device = describe(&device),
            cuda_build = ferry::gpu::BUILT_WITH_CUDA,
            models = ?names,
            "listening on http://{address} (OpenAI API under /v1; /health turns 200 when loaded)"
        );

        let (fatal_tx, fatal_rx) = tokio::sync::oneshot::channel::<String>();
        let total = names.len();
        tokio::spawn(async move {
            let mut failed = Vec::new();
            while let Some((name, result)) = load_results_rx.recv().await {
                match result {
                    Ok(()) => tracing::info!(model = %name, "ready to serve"),
                    Err(err) => {
                        tracing::error!(model = %name, "failed to load: {err}");
                        failed.push(err);
                    }
                }
            }
            if failed.len() == total {
                let _ = fatal_tx.send(failed.join("; "));
            }
        });

        let fatal = Arc::new(std::sync::Mutex::new(None::<String>));
        let fatal_slot = Arc::clone(&fatal);
        // Fires once a signal asked to stop: from then on in-flight requests get `grace`.
        let stopping = Arc::new(tokio::sync::Notify::new());
        let stop_requested = Arc::clone(&stopping);
        let shutdown = async move {
            tokio::select! {
                _ = shutdown_signal() => {
                    tracing::info!(
                        "shutting down: no new connections; finishing in-flight requests (up to {grace:?})"
                    );
                    stop_requested.notify_one();
                }
                Ok(reason) = fatal_rx => {
                    if let Ok(mut slot) = fatal_slot.lock() {
                        *slot = Some(reason);
                    }
                }
            }
        };
        let serving = server::serve(listener, router, shutdown);
        let deadline = async {
            stopping.notified().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            served = serving => served?,
            () = deadline => tracing::warn!(
                "shutdown timeout ({grace:?}) reached: dropping the requests still in flight"
            ),
        }
        let failure = fatal.lock().ok().and_then(|mut slot| slot.take());
        match failure {
            Some(reason) => bail!("no model could be loaded: {reason}"),
            None => Ok(ExitCode::SUCCESS),
        }
    });
    // Connections still open after the grace period are dropped with the runtime; do not wait
    // for stray blocking work (tokenisation) either. Engine threads end with the process.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    outcome
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

fn ferry_plan(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let device = select_device(config.device.kind)?;
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    let free = free_bytes(&device)?;
    let mut out = String::new();
    for model in &config.models {
        let plan = plan_model(model, &config.device, &device, &hub, free)?;
        if json {
            out.push_str(&render_json(&plan));
        } else {
            out.push_str(&format!(
                "model {} ({}) on {}\n{}",
                model.name,
                model.source,
                describe(&device),
                render_text(&plan)
            ));
        }
        out.push('\n');
    }
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
        }];
        let text = engine.render_chat(&model.name, &messages, true)?;
        engine.tokenize(&model.name, &text, false)?
    } else {
        engine.tokenize(&model.name, &args.prompt, true)?
    };
    let n_prompt = prompt_tokens.len();
    let request = GenerationRequest {
        model: model.name.clone(),
        prompt: PromptInput::Tokens(prompt_tokens),
        params: GenerationParams {
            max_tokens: args.max_tokens,
            sampling: SamplingParams {
                temperature: args.temperature,
                top_p: args.top_p,
                top_k: args.top_k,
                seed: args.seed,
                ..SamplingParams::default()
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
                    "[ferry] load {load_seconds:.2}s | prompt {n_prompt} tokens, first token after {prefill:.3}s ({:.1} tok/s prefill) | {} tokens generated, {:.1} tok/s decode | finish_reason {reason:?}",
                    n_prompt as f64 / prefill.max(f64::EPSILON),
                    usage.completion_tokens,
                    decode_tokens as f64 / decode_seconds,
                );
                return Ok(ExitCode::SUCCESS);
            }
            GenerationEvent::Failed(err) => bail!("generation failed: {err}"),
        }
    }
    bail!("the engine stopped before finishing the generation")
}

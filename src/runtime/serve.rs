//! `ferry serve` as a library call: a resolved configuration, a bound listener and a shutdown
//! signal in, a report of how the server stopped out. So the whole lifecycle (loading, serving,
//! draining, the shutdown deadline) runs in-process in tests; `main` only parses, sets up
//! logging, turns OS signals into stop requests and maps the result to an exit code.
//!
//! Layering: `runtime` and `server` are both at the top. `server` knows only the engine's
//! `Backend` trait; this module builds the real engine from the configuration (device, mode
//! `model`'s residency manager, one loading thread per model, the metrics publisher) and hands
//! it to [`ferry_server::run`].

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::device::{describe, select_device};
use super::device_plan::prepare_serving;
use super::expert_routes::{RouteKeeper, ROUTES_INTERVAL};
use super::load::{load_planned, release_after_load, Planned};
use super::placement::model_placement;
use super::swap::SwapResidency;
use super::telemetry::Telemetry;
use super::RuntimeError;
use ferry_config::{Config, ServerConfig};
use ferry_engine::traits::TextCodec;
use ferry_engine::worker::{
    EngineHandle, EngineOptions, DEFAULT_MAX_BATCH, DEFAULT_MAX_STEP_TOKENS, DEFAULT_PREFILL_CHUNK,
    DEFAULT_STEP_TIME,
};
use ferry_engine::{Backend, EngineError, PrefixCacheOptions};
use ferry_metrics::Metrics;
use ferry_model::source::HubOptions;
use ferry_offload::expert_routes::{ModelKey, RouteCache};
use ferry_server::options::default_allowed_hosts;
use ferry_server::{ServeReport, ServerOptions, ShutdownSignal};

/// How often offload accounting and residency are published into the metrics.
const TELEMETRY_INTERVAL: Duration = Duration::from_millis(500);

/// Binds the configured address.
pub async fn bind(server: &ServerConfig) -> Result<TcpListener, RuntimeError> {
    let address = format!("{}:{}", server.host, server.port);
    TcpListener::bind(&address)
        .await
        .map_err(|source| RuntimeError::Listen { address, source })
}

/// Every key `server` accepts: `api_key`, `api_keys`, then the lines of `api_keys_file`
/// (blank lines and `#` comments skipped), each once, in that order.
pub fn accepted_keys(server: &ServerConfig) -> Result<Vec<String>, RuntimeError> {
    let mut keys: Vec<String> = server
        .api_key
        .iter()
        .chain(&server.api_keys)
        .cloned()
        .collect();
    if let Some(path) = &server.api_keys_file {
        let text = std::fs::read_to_string(path).map_err(|source| RuntimeError::KeysFile {
            path: path.clone(),
            source,
        })?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned),
        );
    }
    let mut seen = std::collections::HashSet::new();
    keys.retain(|key| seen.insert(key.clone()));
    Ok(keys)
}

/// The HTTP layer's options for `config`, accepting `api_keys` ([`accepted_keys`]).
pub fn server_options(config: &Config, api_keys: Vec<String>) -> ServerOptions {
    let server = &config.server;
    let has_key = !api_keys.is_empty();
    ServerOptions {
        body_limit: server.body_limit,
        body_read_timeout: server.body_read_timeout,
        header_read_timeout: server.header_read_timeout,
        idle_timeout: server.idle_timeout,
        max_connections: server.max_connections,
        shutdown_timeout: server.shutdown_timeout,
        api_keys,
        metrics_auth: server.metrics_auth.unwrap_or(has_key),
        allowed_hosts: default_allowed_hosts(&server.host, has_key, &server.allowed_hosts),
        default_max_tokens: server.default_max_tokens,
        max_tokens_limit: server.max_tokens_limit,
        parse_special_in_content: server.parse_special_in_content,
        cors_origins: server.cors_origins.clone(),
        web_ui: server.web_ui,
        ..ServerOptions::default()
    }
}

/// The engine's options for `config`, reporting into `metrics`.
pub fn engine_options(config: &Config, metrics: Metrics) -> EngineOptions {
    EngineOptions {
        max_queue: config.server.max_queue,
        // The engine takes one batch size for every model: the smallest configured one, so no
        // model runs more sequences (and KV caches) than it was sized for.
        max_batch: config
            .models
            .iter()
            .map(|m| m.max_batch.unwrap_or(DEFAULT_MAX_BATCH))
            .min()
            .unwrap_or(DEFAULT_MAX_BATCH),
        // Likewise one prefill chunk and one step budget: the smallest configured ones.
        prefill_chunk: config
            .models
            .iter()
            .map(|m| m.prefill_chunk)
            .min()
            .unwrap_or(DEFAULT_PREFILL_CHUNK),
        max_step_tokens: config
            .models
            .iter()
            .map(|m| m.max_step_tokens.unwrap_or(DEFAULT_MAX_STEP_TOKENS))
            .min()
            .unwrap_or(DEFAULT_MAX_STEP_TOKENS),
        // The shortest step time any model asks for (none when one asks for none).
        step_time: config
            .models
            .iter()
            .map(|m| m.step_time)
            .min()
            .map_or(Some(DEFAULT_STEP_TIME), |t| {
                Some(t).filter(|t| !t.is_zero())
            }),
        // One prefix cache setting too: off if any model turns it off, the smallest size.
        prefix_cache: PrefixCacheOptions {
            enabled: config.models.iter().all(|m| m.prefix_cache),
            max_tokens: config
                .models
                .iter()
                .filter_map(|m| m.prefix_cache_tokens)
                .min(),
            ..PrefixCacheOptions::default()
        },
        metrics,
    }
}

/// Serves `config`'s models on `listener` until `shutdown` stops the server (see
/// [`ferry_server::listen`] for the stop sequence). Models load in the background while
/// `/health` answers 503. Fails when no configured model could be loaded, or when the device
/// or the residency manager cannot be set up.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: ShutdownSignal,
) -> Result<ServeReport, RuntimeError> {
    let api_keys = accepted_keys(&config.server)?;
    if api_keys.len() > 1 {
        tracing::info!(
            keys = api_keys.len(),
            "several API keys: each key has its own prefix cache"
        );
    }
    let device = select_device(config.device.kind)?;
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    // The plan `ferry plan` prints, measured once before anything loads: a model that does not
    // fit (alone, in the mode `model` pool, or next to the others) fails here, said once. Each
    // model then loads with its budget pinned to the planned bytes, so serve executes that plan.
    let serving = prepare_serving(&config, &device, &hub)?;
    let swap = serving.swap;
    let names: Vec<String> = config.models.iter().map(|m| m.name.clone()).collect();
    let metrics = Metrics::new();
    // The engine runs the batch each model was planned for (`max_batch` fitted when unset).
    let as_planned = Config {
        models: serving
            .plan
            .models
            .iter()
            .map(|m| m.config.clone())
            .collect(),
        ..config.clone()
    };
    let engine =
        EngineHandle::with_options(names.clone(), engine_options(&as_planned, metrics.clone()));

    // Mode `model`: one residency manager shared by every swapped model.
    if let Some(swap) = &swap {
        engine.set_residency(Arc::new(SwapResidency(swap.clone())));
    }
    let telemetry = Telemetry::new(metrics, swap.clone());
    // The expert stores' route counts, added to the user's routes file every few minutes and
    // when the server stops, for the next plans' resident experts.
    let route_keeper = RouteCache::user().map(|cache| Arc::new(RouteKeeper::new(cache)));

    // Each model loads on its own engine thread; the server answers /health 503 meanwhile.
    let (load_results, mut load_results_rx) = tokio::sync::mpsc::unbounded_channel();
    let opened = serving
        .checkpoints
        .into_iter()
        .zip(serving.draft_checkpoints);
    for (planned, (checkpoint, draft_checkpoint)) in serving.plan.models.into_iter().zip(opened) {
        let model = planned.config;
        let plan = planned.plan;
        let draft_plan = planned.draft;
        let cost = planned.tiers.as_ref().map(|t| t.calibration.model);
        // What `GET /v1/ferry/status` shows of the model's placement: the plan it loads with.
        engine
            .set_placement(&model.name, model_placement(&plan, planned.tiers.as_ref()))
            .map_err(|source| RuntimeError::Engine {
                name: model.name.clone(),
                source,
            })?;
        // A model placed expert by expert counts its routes (when `offload.expert_routes`).
        let route_key = route_keeper
            .clone()
            .filter(|_| model.tier.expert_routes && plan.experts.is_some())
            .zip(ModelKey::of(checkpoint.files()));
        let device = device.clone();
        let device_config = config.device.clone();
        let results = load_results.clone();
        let swap = swap.clone();
        let telemetry = Arc::clone(&telemetry);
        let name = model.name.clone();
        engine
            .load(&name, move || {
                let outcome = load_planned(
                    &model,
                    &device_config,
                    &device,
                    Planned {
                        checkpoint: &checkpoint,
                        plan: &plan,
                        draft: draft_checkpoint.as_ref().zip(draft_plan.as_ref()),
                    },
                    cost,
                    swap.as_ref(),
                );
                release_after_load(checkpoint);
                if let Some(draft) = draft_checkpoint {
                    release_after_load(draft);
                }
                if let Ok(loaded) = &outcome {
                    telemetry
                        .add_model(&model.name, Arc::clone(loaded.runner.store().accounting()));
                    if let Some((keeper, key)) = route_key {
                        keeper.add(
                            &model.name,
                            key,
                            Arc::clone(loaded.runner.store().accounting()),
                        );
                    }
                    if let Some(draft) = loaded.runner.draft() {
                        telemetry.add_draft(
                            &model.name,
                            Arc::clone(draft.store().accounting()),
                            draft.live_kv(),
                        );
                    }
                }
                let reply = outcome.as_ref().map(|_| ()).map_err(|e| e.to_string());
                let _ = results.send((model.name.clone(), reply));
                let loaded = outcome.map_err(|e| EngineError::LoadFailed(e.to_string()))?;
                Ok((loaded.runner, loaded.codec as Arc<dyn TextCodec>))
            })
            .map_err(|source| RuntimeError::Engine { name, source })?;
    }
    drop(load_results);

    let publisher = tokio::spawn(async move {
        let mut every = tokio::time::interval(TELEMETRY_INTERVAL);
        loop {
            every.tick().await;
            telemetry.publish();
        }
    });
    let route_writer = route_keeper.clone().map(|keeper| {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(ROUTES_INTERVAL);
            every.tick().await;
            loop {
                every.tick().await;
                let keeper = Arc::clone(&keeper);
                let _ = tokio::task::spawn_blocking(move || keeper.write()).await;
            }
        })
    });
    let address = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    tracing::info!(
        device = describe(&device),
        cuda_build = ferry_gpu::BUILT_WITH_CUDA,
        models = ?names,
        "listening on http://{address} (OpenAI API under /v1; /health turns 200 when loaded)"
    );

    let total = names.len();
    let all_failed = async move {
        // Failures wait until one model is ready: if none ever is, they are the start-up error
        // (printed once, by the caller); once one serves, each is logged as it comes.
        let mut failed = Vec::new();
        let mut serving = false;
        while let Some((name, result)) = load_results_rx.recv().await {
            match result {
                Ok(()) => {
                    tracing::info!(model = %name, "ready to serve");
                    if !serving {
                        serving = true;
                        for err in &failed {
                            tracing::error!("{err}");
                        }
                    }
                }
                Err(err) if serving => tracing::error!("{err}"),
                Err(err) => failed.push(err),
            }
        }
        if failed.len() == total {
            failed.join("; ")
        } else {
            std::future::pending().await
        }
    };
    let options = server_options(&config, api_keys);
    let backend = Arc::new(engine) as Arc<dyn Backend>;
    let outcome = tokio::select! {
        served = ferry_server::run(backend, options, listener, shutdown) => {
            served.map_err(RuntimeError::Serve)
        }
        // Nothing can be served: stop (every request so far got 503, none is in flight).
        reason = all_failed => Err(RuntimeError::NoModelLoaded(reason)),
    };
    publisher.abort();
    if let Some(writer) = route_writer {
        writer.abort();
    }
    if let Some(keeper) = route_keeper {
        let _ = tokio::task::spawn_blocking(move || keeper.write()).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_config::{DeviceConfig, ModelConfig};

    fn config() -> Config {
        Config {
            server: ServerConfig::default(),
            device: DeviceConfig::default(),
            models: vec![ModelConfig::default()],
        }
    }

    #[test]
    fn the_settings_defaults_are_the_library_defaults() {
        let engine = engine_options(&config(), Metrics::new());
        let library = EngineOptions::default();
        assert_eq!(
            ferry_offload::fit::DEFAULT_MAX_BATCH,
            library.max_batch,
            "an unset max_batch that fits is the engine's default"
        );
        assert_eq!(
            (
                engine.max_batch,
                engine.prefill_chunk,
                engine.max_step_tokens,
                engine.step_time
            ),
            (
                library.max_batch,
                library.prefill_chunk,
                library.max_step_tokens,
                library.step_time
            )
        );
        assert_eq!(engine.prefix_cache, library.prefix_cache);
        let server = server_options(&config(), Vec::new());
        let library = ServerOptions::default();
        assert_eq!(
            (
                server.body_limit,
                server.body_read_timeout,
                server.header_read_timeout,
                server.idle_timeout,
                server.max_connections,
                server.shutdown_timeout,
                server.default_max_tokens,
                server.max_tokens_limit,
                server.metrics_auth,
                server.parse_special_in_content,
            ),
            (
                library.body_limit,
                library.body_read_timeout,
                library.header_read_timeout,
                library.idle_timeout,
                library.max_connections,
                library.shutdown_timeout,
                library.default_max_tokens,
                library.max_tokens_limit,
                library.metrics_auth,
                library.parse_special_in_content,
            )
        );
        // A key-less server on the default loopback address answers to localhost names.
        assert!(server.allowed_hosts.iter().any(|h| h == "localhost"));
    }

    #[test]
    fn settings_reach_the_options() {
        let mut config = config();
        config.server.allowed_hosts = vec!["ferry.example".into()];
        config.server.metrics_auth = Some(true);
        config.server.max_tokens_limit = Some(9);
        config.models[0].max_step_tokens = Some(77);
        let server = server_options(&config, Vec::new());
        assert_eq!(server.allowed_hosts, ["ferry.example"]);
        assert!(server.metrics_auth);
        assert_eq!(server.max_tokens_limit, Some(9));
        assert_eq!(engine_options(&config, Metrics::new()).max_step_tokens, 77);
    }

    #[test]
    fn a_key_puts_the_metrics_behind_it_unless_told_otherwise() {
        let mut config = config();
        assert!(!server_options(&config, Vec::new()).metrics_auth);
        assert!(server_options(&config, vec!["k".into()]).metrics_auth);
        config.server.metrics_auth = Some(false);
        assert!(!server_options(&config, vec!["k".into()]).metrics_auth);
    }

    #[test]
    fn keys_come_from_the_key_the_list_and_the_file_once_each() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, b"# tenants\n  two \n\nthree\none\n").unwrap();
        let mut config = config();
        config.server.api_key = Some("one".into());
        config.server.api_keys = vec!["two".into()];
        config.server.api_keys_file = Some(file.path().display().to_string());
        assert_eq!(
            accepted_keys(&config.server).unwrap(),
            ["one", "two", "three"]
        );
        config.server.api_keys_file = Some("/nonexistent/ferry-keys".into());
        let err = accepted_keys(&config.server).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ferry-keys"), "{err}");
    }
}

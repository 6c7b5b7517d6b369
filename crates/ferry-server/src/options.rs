//! [`ServerOptions`]: everything the HTTP layer can be told, with the defaults a user of
//! llama.cpp's server, vLLM or Ollama would expect. Build with `ServerOptions::default()` and
//! the `with_*` setters, or set the public fields.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use crate::response_store::StoreLimits;

/// Default [`ServerOptions::body_limit`]: 16 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Default [`ServerOptions::sse_keep_alive`]: 15 seconds.
pub const DEFAULT_SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Default [`ServerOptions::body_read_timeout`]: 60 seconds.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Default [`ServerOptions::header_read_timeout`]: 10 seconds.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`ServerOptions::idle_timeout`]: 60 seconds.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default [`ServerOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;

/// Default [`ServerOptions::shutdown_timeout`]: 30 seconds.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Default [`ServerOptions::default_max_tokens`].
pub const DEFAULT_MAX_TOKENS: usize = 1024;

/// `Host` names a key-less server bound to a loopback address answers to (any port).
pub const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// How the HTTP layer behaves. Its `Debug` output hides the API key.
#[derive(Clone, PartialEq)]
pub struct ServerOptions {
    /// Largest request body in bytes; larger bodies get 413. Default [`DEFAULT_BODY_LIMIT`].
    pub body_limit: usize,
    /// Longest time a client may take to send a request body; slower ones get 408. Default
    /// [`DEFAULT_BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// Longest time from the first byte of a request head to its end; the connection is closed
    /// after it. Default [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight (before its first
    /// request, or between keep-alive requests). Default [`DEFAULT_IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// Most open connections (also lowered to what the open-files limit allows). At the cap a
    /// new connection closes the longest-idle one that has no request in flight; when every
    /// one has a request in flight, new ones get 503 at once. Default
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// How long in-flight requests may run after a stop request before they are ended with
    /// an error. Default [`DEFAULT_SHUTDOWN_TIMEOUT`].
    pub shutdown_timeout: Duration,
    /// Extra names clients may send as `model`, each mapped to a served model id. They are
    /// listed by `GET /v1/models` (with `root` naming the target). Default: none.
    pub served_name_aliases: BTreeMap<String, String>,
    /// The keys accepted: when any is set, every request except `GET /health` (and `GET
    /// /metrics` unless [`metrics_auth`](Self::metrics_auth)) requires `Authorization: Bearer
    /// <one of them>` (401 otherwise), checked before routing. With more than one, each key's
    /// requests have a prefix cache partition of their own. Default: none (no authentication).
    pub api_keys: Vec<String>,
    /// Whether `GET /metrics` requires the API key too. Default false here; the configuration
    /// turns it on whenever a key is set, unless `metrics_auth = false`.
    pub metrics_auth: bool,
    /// `Host` names (without port) requests may carry; others get 403 (protection against DNS
    /// rebinding for a server without a key). Empty: any host. Default: empty; the runtime
    /// fills in [`LOOPBACK_HOSTS`] for a key-less server on a loopback address
    /// ([`default_allowed_hosts`]).
    pub allowed_hosts: Vec<String>,
    /// How often an idle SSE stream sends a keep-alive comment. Default
    /// [`DEFAULT_SSE_KEEP_ALIVE`].
    pub sse_keep_alive: Duration,
    /// Chat completions' `max_tokens` when the client gives none (lowered to what the context
    /// leaves). Default [`DEFAULT_MAX_TOKENS`].
    pub default_max_tokens: usize,
    /// Largest `max_tokens` a request may ask for (400 beyond it). Default: none (the
    /// context is the limit).
    pub max_tokens_limit: Option<usize>,
    /// Whether special tokens written inside chat message content (`<|im_start|>`) are parsed
    /// as control tokens. Default false: content is text, only the chat template's own markup
    /// is control tokens, so a message cannot open a turn of another role.
    pub parse_special_in_content: bool,
    /// Most tokenisations running at once (each on the blocking pool); more wait. Default:
    /// the number of CPUs.
    pub tokenize_concurrency: usize,
    /// Browser origins allowed to call the API cross-origin ([`super::cors`]); `*` allows any.
    /// Default: empty, CORS off (no CORS headers, preflights get 405).
    pub cors_origins: Vec<String>,
    /// How many responses of `POST /v1/responses` (`store: true`) are kept in memory for
    /// `previous_response_id` and `GET /v1/responses/{id}`, by count and by bytes, least
    /// recently used first out. Default [`StoreLimits::default`] (1024 responses, 64 MiB).
    pub response_store: StoreLimits,
    /// Whether `GET /` serves the status and chat page ([`super::page`]). Default true.
    pub web_ui: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            served_name_aliases: BTreeMap::new(),
            api_keys: Vec::new(),
            metrics_auth: false,
            allowed_hosts: Vec::new(),
            sse_keep_alive: DEFAULT_SSE_KEEP_ALIVE,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            max_tokens_limit: None,
            parse_special_in_content: false,
            tokenize_concurrency: std::thread::available_parallelism().map_or(2, |n| n.get()),
            cors_origins: Vec::new(),
            response_store: StoreLimits::default(),
            web_ui: true,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("body_limit", &self.body_limit)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("served_name_aliases", &self.served_name_aliases)
            .field("api_keys", &format!("<{} redacted>", self.api_keys.len()))
            .field("metrics_auth", &self.metrics_auth)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("sse_keep_alive", &self.sse_keep_alive)
            .field("default_max_tokens", &self.default_max_tokens)
            .field("max_tokens_limit", &self.max_tokens_limit)
            .field("parse_special_in_content", &self.parse_special_in_content)
            .field("tokenize_concurrency", &self.tokenize_concurrency)
            .field("cors_origins", &self.cors_origins)
            .field("response_store", &self.response_store)
            .field("web_ui", &self.web_ui)
            .finish()
    }
}

impl ServerOptions {
    /// Sets [`ServerOptions::body_limit`] (default 16 MiB).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Adds an alias: clients may send `alias` as `model` to reach `model_id` (default none).
    pub fn with_alias(mut self, alias: impl Into<String>, model_id: impl Into<String>) -> Self {
        self.served_name_aliases
            .insert(alias.into(), model_id.into());
        self
    }

    /// Adds a key to [`ServerOptions::api_keys`] (default none).
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_keys.push(key.into());
        self
    }
}

/// The `Host` allow-list for a server bound to `bind_host`: `configured` when it names any
/// host, else [`LOOPBACK_HOSTS`] for a key-less server on a loopback address (a web page the
/// user opens cannot reach it through a DNS name that resolves to 127.0.0.1), else none.
pub fn default_allowed_hosts(
    bind_host: &str,
    has_api_key: bool,
    configured: &[String],
) -> Vec<String> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let loopback = bind_host == "localhost"
        || bind_host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback && !has_api_key {
        LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect()
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_allow_list_guards_key_less_loopback_servers() {
        let loopback: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
        assert_eq!(default_allowed_hosts("127.0.0.1", false, &[]), loopback);
        assert_eq!(default_allowed_hosts("::1", false, &[]), loopback);
        assert_eq!(default_allowed_hosts("localhost", false, &[]), loopback);
        assert!(default_allowed_hosts("127.0.0.1", true, &[]).is_empty());
        assert!(default_allowed_hosts("0.0.0.0", false, &[]).is_empty());
        let mine = vec!["ferry.example".to_owned()];
        assert_eq!(default_allowed_hosts("0.0.0.0", true, &mine), mine);
    }

    #[test]
    fn debug_hides_the_key() {
        let options = ServerOptions::default()
            .with_api_key("sekrit")
            .with_api_key("hunter2");
        let text = format!("{options:?}");
        assert!(!text.contains("sekrit") && !text.contains("hunter2"));
        assert!(text.contains("<2 redacted>"), "{text}");
    }
}

//! Prefix caching on the real model through the real server (loopback HTTP): the second turn of
//! a chat reuses the first turn's prompt (`usage.prompt_tokens_details.cached_tokens` and
//! `ferry_prefix_cache_hits_total` say how much) and every greedy answer is exactly the one a
//! server without the cache gives, also when a tiny cache keeps evicting.

use crate::real_model;

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use ferry::engine::prefix_cache::reuse_len;
use ferry::engine::{Backend, EngineOptions, PrefixCacheOptions};
use ferry::server::{run, ServerOptions, ShutdownSignal};
use real_model::MODEL;

/// The tokens of one block of the engine's default cache.
const BLOCK: u64 = ferry::engine::prefix_cache::DEFAULT_BLOCK_TOKENS as u64;
/// Rows from which a prompt chunk computes alike whatever its length.
const EXACT: usize = ferry::engine::prefix_cache::EXACT_CHUNK_ROWS;

/// A server on a loopback port with its own engine and prefix cache options.
struct Server {
    base: String,
    client: reqwest::Client,
}

impl Server {
    async fn start(prefix_cache: PrefixCacheOptions) -> Self {
        Self::start_with(prefix_cache, ServerOptions::default()).await
    }

    async fn start_with(prefix_cache: PrefixCacheOptions, server: ServerOptions) -> Self {
        let options = EngineOptions {
            prefix_cache,
            ..EngineOptions::default()
        };
        let engine = tokio::task::spawn_blocking(move || real_model::engine_with(options))
            .await
            .expect("load");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(run(
            Arc::new(engine) as Arc<dyn Backend>,
            server,
            listener,
            ShutdownSignal::never(),
        ));
        Self {
            base,
            client: reqwest::Client::new(),
        }
    }

    /// A greedy chat completion of `messages`: the response body.
    async fn chat(&self, messages: &[Value], max_tokens: usize) -> Value {
        self.chat_as(None, None, messages, max_tokens).await
    }

    /// [`Self::chat`] with the bearer `key` and the `cache_salt` `salt`, when given.
    async fn chat_as(
        &self,
        key: Option<&str>,
        salt: Option<&str>,
        messages: &[Value],
        max_tokens: usize,
    ) -> Value {
        let mut body = json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let mut request = self
            .client
            .post(format!("{}/v1/chat/completions", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request
            .json(&body)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.expect("json")
    }

    /// One sample of the metrics page (0 when absent).
    async fn metric(&self, name: &str) -> f64 {
        let page = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}

fn on() -> PrefixCacheOptions {
    PrefixCacheOptions::default()
}

fn off() -> PrefixCacheOptions {
    PrefixCacheOptions {
        enabled: false,
        ..PrefixCacheOptions::default()
    }
}

fn answer(response: &Value) -> String {
    response["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

fn cached_tokens(response: &Value) -> Option<u64> {
    response["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64()
}

fn prompt_tokens(response: &Value) -> u64 {
    response["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens")
}

const SYSTEM: &str = "You are a careful assistant for a small lighthouse museum on a rocky \
    island. Visitors ask about the history of the lighthouse, the keepers who lived there, the \
    ships that passed, the birds that nest on the cliffs and the ferry timetable. Answer in one \
    or two short sentences, politely, and never invent opening hours you were not told.";

/// Runs a two-turn chat on `server`: both responses.
async fn two_turns(server: &Server, first_question: &str, second_question: &str) -> [Value; 2] {
    let system = json!({"role": "system", "content": SYSTEM});
    let first_user = json!({"role": "user", "content": first_question});
    let first = server.chat(&[system.clone(), first_user.clone()], 16).await;
    let reply = json!({"role": "assistant", "content": answer(&first)});
    let second_user = json!({"role": "user", "content": second_question});
    let second = server
        .chat(&[system, first_user, reply, second_user], 16)
        .await;
    [first, second]
}

fn hits_metric() -> String {
    format!(r#"ferry_prefix_cache_hits_total{{model="{MODEL}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_second_turn_reuses_the_first_turns_prompt_and_answers_the_same() {
    let (cached, plain) = tokio::join!(Server::start(on()), Server::start(off()));
    let questions = ("Who was the first keeper?", "And what birds nest there?");
    let [first, second] = two_turns(&cached, questions.0, questions.1).await;
    let [first_plain, second_plain] = two_turns(&plain, questions.0, questions.1).await;
    assert!(!answer(&first).is_empty());
    assert_eq!(answer(&first), answer(&first_plain));
    assert_eq!(answer(&second), answer(&second_plain));
    assert_eq!(prompt_tokens(&second), prompt_tokens(&second_plain));

    // The first turn found nothing; the second reused the whole blocks of the first's prompt,
    // less what keeps its own first chunk long enough to compute as an uncached prefill does.
    assert_eq!(cached_tokens(&first), Some(0));
    let first_blocks = prompt_tokens(&first) / BLOCK * BLOCK;
    assert!(prompt_tokens(&first) >= EXACT as u64, "{first}");
    let reused = reuse_len(
        first_blocks as usize,
        prompt_tokens(&second) as usize,
        ferry::engine::worker::DEFAULT_PREFILL_CHUNK,
        BLOCK as usize,
        EXACT,
    ) as u64;
    assert!(reused >= 48, "{first} {second}");
    assert_eq!(cached_tokens(&second), Some(reused), "{second}");
    assert_eq!(cached.metric(&hits_metric()).await, reused as f64);
    let queried = prompt_tokens(&first) + prompt_tokens(&second);
    let queries = format!(r#"ferry_prefix_cache_queries_total{{model="{MODEL}"}}"#);
    assert_eq!(cached.metric(&queries).await, queried as f64);
    // The usage still counts every prompt token.
    assert_eq!(
        cached.metric("ferry_prompt_tokens_total").await,
        queried as f64
    );

    // Without the cache nothing is reported or reused.
    assert_eq!(second_plain["usage"].get("prompt_tokens_details"), None);
    assert_eq!(plain.metric(&hits_metric()).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tiny_cache_keeps_evicting_and_answers_stay_the_same() {
    // Two blocks: each first turn evicts what the chat before it left.
    let tiny = PrefixCacheOptions {
        max_tokens: Some(2 * BLOCK as usize),
        ..PrefixCacheOptions::default()
    };
    let (cached, plain) = tokio::join!(Server::start(tiny), Server::start(off()));
    let chats = [
        ("Who was the first keeper?", "When did he leave?"),
        ("Which ships passed the island?", "Were any wrecked?"),
        ("Who was the first keeper?", "What did he eat?"),
    ];
    let mut reused = 0;
    for (first_question, second_question) in chats {
        let got = two_turns(&cached, first_question, second_question).await;
        let want = two_turns(&plain, first_question, second_question).await;
        for (got, want) in got.iter().zip(&want) {
            assert_eq!(answer(got), answer(want));
        }
        let hit = cached_tokens(&got[1]).expect("reported");
        assert!(hit <= 2 * BLOCK, "{hit}");
        reused += cached_tokens(&got[0]).expect("reported") + hit;
    }
    assert!(
        reused > 0,
        "the shared system prompt's first blocks are reused"
    );
    let held = format!(r#"ferry_prefix_cache_tokens{{model="{MODEL}"}}"#);
    assert_eq!(cached.metric(&held).await, (2 * BLOCK) as f64);
    assert_eq!(cached.metric(&hits_metric()).await, reused as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn salts_and_keys_keep_their_prefixes_apart() {
    let options = ServerOptions::default()
        .with_api_key("tenant-a")
        .with_api_key("tenant-b");
    let server = Server::start_with(on(), options).await;
    let system = json!({"role": "system", "content": SYSTEM});
    let ask = |q: &str| [system.clone(), json!({"role": "user", "content": q})];
    let (a, b) = (Some("tenant-a"), Some("tenant-b"));

    let first = server
        .chat_as(a, None, &ask("Who was the first keeper?"), 4)
        .await;
    assert_eq!(cached_tokens(&first), Some(0));
    // The same key finds its own system prompt again...
    let again = server
        .chat_as(a, None, &ask("What birds nest there?"), 4)
        .await;
    assert!(cached_tokens(&again).unwrap() > 0, "{again}");
    // ...another key does not, nor the first key with a salt...
    let other = server
        .chat_as(b, None, &ask("What birds nest there?"), 4)
        .await;
    assert_eq!(cached_tokens(&other), Some(0), "{other}");
    let salted = server
        .chat_as(a, Some("s1"), &ask("What birds nest there?"), 4)
        .await;
    assert_eq!(cached_tokens(&salted), Some(0), "{salted}");
    // ...but the same key and salt do, and the answers are those of an uncached server.
    let resalted = server
        .chat_as(a, Some("s1"), &ask("Who was the first keeper?"), 4)
        .await;
    assert!(cached_tokens(&resalted).unwrap() > 0, "{resalted}");
    assert_eq!(answer(&resalted), answer(&first));

    // An empty salt is refused, naming the field.
    let response = server
        .client
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth("tenant-a")
        .json(&json!({"model": MODEL, "messages": ask("Hi"), "cache_salt": ""}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "cache_salt", "{body}");
}

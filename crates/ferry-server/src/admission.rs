//! Admission before work: the cheap checks a request passes before any tokeniser runs, and the
//! bounded pool tokenisation runs in.
//!
//! 1. [`check_prompt_chars`]: a prompt of more than `max_context ×` [`MAX_CHARS_PER_TOKEN`]
//!    characters cannot fit the context, so it is a 400 `context_length_exceeded` without being
//!    tokenised (a 10 MB prompt would otherwise cost about a gigabyte and seconds of CPU).
//! 2. `Backend::check_capacity`: a request the engine would refuse as overloaded (503) is
//!    refused before its tokenisation, so shedding load sheds the tokeniser's work too.
//! 3. [`Admission::tokenize`]: tokenisation runs on tokio's blocking pool (never on the async
//!    workers), at most `tokenize_concurrency` at once; more requests wait for a slot.
//! 4. [`release_after_large_bodies`]: when the last request with a large body (at least
//!    [`LARGE_BODY_BYTES`], or of unknown length) ends, the allocator's freed memory goes back
//!    to the OS, so a burst of oversized prompts leaves the resident size where it was.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

use super::error::ApiError;
use super::{limits, AppState};
use ferry_engine::EngineError;

/// Request bodies from this size on count as large for [`release_after_large_bodies`].
pub const LARGE_BODY_BYTES: u64 = 1024 * 1024;

/// Most characters of prompt text one token stands for, for the bound checked before
/// tokenising. Real vocabularies' longest tokens are runs of spaces or punctuation well under
/// this, so a prompt it rejects could not fit the context anyway.
pub const MAX_CHARS_PER_TOKEN: usize = 64;

/// Rejects a prompt of `chars` characters that cannot fit `max_context` tokens, before
/// tokenising it. `param` names the field (`prompt`, `messages`).
pub fn check_prompt_chars(chars: usize, max_context: usize, param: &str) -> Result<(), ApiError> {
    let limit = max_context.saturating_mul(MAX_CHARS_PER_TOKEN);
    if chars <= limit {
        return Ok(());
    }
    Err(ApiError::prompt_too_long_to_tokenize(
        chars,
        max_context,
        MAX_CHARS_PER_TOKEN,
        param,
    ))
}

/// The tokeniser slots and the count of large requests in flight (cheap to clone: shared).
#[derive(Debug, Clone)]
pub struct Admission {
    tokenizers: Arc<Semaphore>,
    large_in_flight: Arc<AtomicUsize>,
}

impl Admission {
    /// At most `concurrency` tokenisations at once (at least 1).
    pub fn new(concurrency: usize) -> Self {
        Self {
            tokenizers: Arc::new(Semaphore::new(concurrency.max(1))),
            large_in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Runs CPU work (tokenising, template rendering) on the blocking pool once a slot is free.
    /// If the caller goes away while waiting, the work never starts.
    pub async fn tokenize<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, EngineError> + Send + 'static,
    {
        let permit = Arc::clone(&self.tokenizers)
            .acquire_owned()
            .await
            .map_err(|_| ApiError::internal("the tokeniser pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::internal(format!("a tokenizer task failed: {e}")))?
        .map_err(ApiError::from)
    }

    /// Tokeniser slots free now.
    pub fn free_slots(&self) -> usize {
        self.tokenizers.available_permits()
    }
}

/// Middleware: counts requests with large bodies while they run; when the last one ends (its
/// body and everything parsed from it freed), freed memory goes back to the OS on the blocking
/// pool.
pub async fn release_after_large_bodies(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    if !(chunked || length.is_some_and(|n| n >= LARGE_BODY_BYTES)) {
        return next.run(request).await;
    }
    let _large = LargeRequest::start(&state.admission.large_in_flight);
    next.run(request).await
}

/// One large request in flight; the last one to end (also when its client goes away and the
/// handler is dropped) releases freed memory.
struct LargeRequest(Arc<AtomicUsize>);

impl LargeRequest {
    fn start(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(counter))
    }
}

impl Drop for LargeRequest {
    fn drop(&mut self) {
        if self.0.fetch_sub(1, Ordering::SeqCst) == 1 {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn_blocking(limits::release_freed_memory);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_character_bound_follows_the_context() {
        assert!(check_prompt_chars(64 * 100, 100, "prompt").is_ok());
        let err = check_prompt_chars(64 * 100 + 1, 100, "prompt").unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(
            (err.param(), err.code()),
            (Some("prompt"), Some("context_length_exceeded"))
        );
        assert!(
            err.message().contains("6401 characters"),
            "{}",
            err.message()
        );
    }

    #[tokio::test]
    async fn tokenisations_wait_for_a_slot() {
        let admission = Admission::new(1);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let admission = admission.clone();
            tokio::spawn(async move {
                admission
                    .tokenize(move || {
                        started_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                        Ok(1)
                    })
                    .await
            })
        };
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(admission.free_slots(), 0);
        let second = admission.tokenize(|| Ok(2));
        tokio::pin!(second);
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "the second waits for the slot"
        );
        release_tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second.await.unwrap(), 2);
        assert_eq!(admission.free_slots(), 1);
    }
}

//! The thread a grammar compiles on: a fresh one per compile with a [`GRAMMAR_STACK_BYTES`]
//! stack, joined for its result, so that llguidance's recursion over a large schema (which
//! [`super::limits`] bounds) never runs on a server thread's small stack. The caller blocks
//! until it ends (compiles run on the bounded tokeniser pool, so their number is bounded too);
//! a panic in it is the request's error, not the server's.

use super::super::{EngineError, EngineResult};

/// The compile thread's stack (only what is used is ever resident).
pub const GRAMMAR_STACK_BYTES: usize = 64 << 20;

/// Runs `work` on a new thread with a [`GRAMMAR_STACK_BYTES`] stack and returns its result.
/// When it panics, the error is an invalid request naming `param`.
pub fn on_grammar_thread<T: Send>(
    param: &str,
    work: impl FnOnce() -> EngineResult<T> + Send,
) -> EngineResult<T> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("ferry-grammar".into())
            .stack_size(GRAMMAR_STACK_BYTES)
            .spawn_scoped(scope, work)
            .map_err(|e| EngineError::Internal(format!("cannot start a grammar thread: {e}")))?;
        thread.join().unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::warn!(panic = %what, "the grammar engine panicked while compiling");
            Err(EngineError::InvalidRequest {
                message: format!("Invalid `{param}`: the grammar engine could not compile it."),
                param: Some(param.into()),
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recursion `depth` deep with `frame` bytes of stack per level.
    fn recurse(depth: usize) -> usize {
        let frame = std::hint::black_box([1u8; 1024]);
        if depth == 0 {
            return frame[0] as usize;
        }
        recurse(depth - 1) + std::hint::black_box(frame[depth % 1024]) as usize
    }

    #[test]
    fn work_gets_the_large_stack() {
        // About 16 MiB of frames: beyond a default 2 MiB thread's stack.
        let levels = on_grammar_thread("x", || Ok(recurse(16 * 1024))).expect("runs");
        assert!(levels > 16 * 1024);
    }

    #[test]
    fn a_panic_is_an_invalid_request_naming_the_param() {
        let err = on_grammar_thread::<()>("response_format", || panic!("boom")).unwrap_err();
        match err {
            EngineError::InvalidRequest { param, message } => {
                assert_eq!(param.as_deref(), Some("response_format"));
                assert!(!message.contains("boom"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_come_back_as_they_are() {
        let err = on_grammar_thread::<()>("x", || Err(EngineError::Unavailable)).unwrap_err();
        assert_eq!(err, EngineError::Unavailable);
    }
}

//! The HTTP layer (axum): OpenAI-compatible endpoints over an [`crate::engine::Backend`].

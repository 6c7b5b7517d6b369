//! OpenAI (and vLLM extension) wire types. Requests are read from a JSON object field by field
//! ([`fields::Fields`]) so each type error and each unsupported field is reported with `param`
//! naming it; responses are plain `Serialize` structs.

pub mod base64;
pub mod chat;
pub mod common;
pub mod completions;
pub mod embeddings;
pub mod fields;
pub mod response_input;
pub mod response_object;
pub mod responses;
pub mod tokenize;
pub mod tools;

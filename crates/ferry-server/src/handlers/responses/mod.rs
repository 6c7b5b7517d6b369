//! `POST /v1/responses` (OpenAI's Responses API), `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`.
//!
//! A Responses request is turned into the chat request it stands for
//! ([`ResponsesRequest`]): `instructions` as a system message, then the conversation stored
//! under `previous_response_id`, then `input`. That request goes through the chat endpoint's
//! validation (`validate::chat`: sampling defaults, limits, tools, grammars, admission,
//! tokenisation, context), so everything chat enforces applies unchanged; errors name the
//! Responses fields (`input`, `text.format`, `tools[i].parameters`, `max_output_tokens`). The
//! engine's events become output items ([`output::OutputBuilder`]) and, with `stream: true`,
//! the Responses event sequence ([`stream`]). With `store` (the default) the finished response
//! and its conversation go to the bounded [`ResponseStore`](crate::response_store). With
//! several API keys, each key sees only the responses made with it (another key's id is 404,
//! as the prefix cache keeps keys apart).

mod output;
mod stream;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Map, Value};

use super::collect;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::JsonObject;
use crate::metrics::ModelLabel;
use crate::openai::common::{new_id, unix_now};
use crate::openai::response_input::template_call;
use crate::openai::response_object::{
    IncompleteDetails, OutputItem, ResponseObject, ResponseUsage, StreamEvent,
};
use crate::openai::responses::{Echo, ResponsesRequest};
use crate::response_store::{ResponseStore, StoredResponse};
use crate::validate::{self, ValidRequest};
use crate::AppState;
use ferry_engine::{ChatMessage, EngineError, FinishReason, Usage};
use output::OutputBuilder;

/// `POST /v1/responses`; its response carries the model label for `ferry_requests_total`.
pub async fn create(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    JsonObject(body): JsonObject,
) -> Response {
    let label = ModelLabel::of(&state, &body);
    label.attach(run(state, caller.map(|c| c.0), body).await)
}

/// The store's key for `id` made by `caller`: each API key has ids of its own.
fn store_key(caller: Option<Caller>, id: &str) -> String {
    match caller {
        Some(Caller(key)) => format!("{key}/{id}"),
        None => id.to_owned(),
    }
}

/// `GET /v1/responses/{id}`: a stored response as it was returned.
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
) -> Response {
    match state.responses.get(&store_key(caller.map(|c| c.0), &id)) {
        Some(entry) => (
            [(header::CONTENT_TYPE, "application/json")],
            entry.json.clone(),
        )
            .into_response(),
        None => not_found(&id).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
pub async fn delete(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
) -> Response {
    if state.responses.remove(&store_key(caller.map(|c| c.0), &id)) {
        Json(serde_json::json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        not_found(&id).into_response()
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "response_not_found",
        format!("Response with id '{id}' not found (never stored, not stored with `store: false`, or evicted from the bounded store)."),
    )
}

async fn run(
    state: AppState,
    caller: Option<Caller>,
    body: Map<String, Value>,
) -> Result<Response, ApiError> {
    let req = ResponsesRequest::from_json(body)?;
    let history = match &req.previous_response_id {
        Some(id) => state
            .responses
            .get(&store_key(caller, id))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "previous_response_not_found",
                    format!("Previous response with id '{id}' not found (never stored, stored with `store: false`, or evicted from the bounded store)."),
                )
                .with_param("previous_response_id")
            })?
            .conversation
            .clone(),
        None => Vec::new(),
    };
    let ResponsesRequest {
        mut chat,
        instructions,
        previous_response_id,
        store,
        echo,
    } = req;
    let mut conversation = history;
    conversation.append(&mut chat.messages);
    chat.messages = instructions
        .iter()
        .map(|text| ChatMessage {
            role: "system".into(),
            content: text.clone(),
            ..ChatMessage::default()
        })
        .chain(conversation.iter().cloned())
        .collect();
    let valid = validate::chat(&state, chat, caller)
        .await
        .map_err(responses_param)?;
    let id = new_id("resp_");
    let pending = Pending {
        key: store_key(caller, &id),
        id,
        created_at: unix_now(),
        model: valid.served_name().to_owned(),
        instructions,
        previous_response_id,
        store,
        temperature: echo
            .temperature
            .or(Some(shortest(valid.params().sampling.temperature))),
        top_p: echo.top_p.or(Some(shortest(valid.params().sampling.top_p))),
        echo,
        conversation,
        responses: state.responses.clone(),
    };
    let builder = OutputBuilder::new(valid.tool_calls(), valid.params().reasoning);
    let rx = submit(&state, &valid)?;
    if valid.stream() {
        return Ok(stream::response(
            rx,
            stream::Run { pending, builder },
            state.options.sse_keep_alive,
            state.lifecycle.clone(),
        ));
    }
    let done = tokio::select! {
        done = collect(rx) => done?,
        () = state.lifecycle.deadline() => return Err(ApiError::shutting_down()),
    };
    let mut builder = builder;
    builder.push(&done.text());
    builder.finish("", done.reason == FinishReason::Length);
    let response = pending.finished(builder.items(), done.reason, done.usage);
    Ok(Json(response).into_response())
}

fn submit(
    state: &AppState,
    valid: &ValidRequest,
) -> Result<tokio::sync::mpsc::Receiver<ferry_engine::GenerationEvent>, ApiError> {
    state
        .backend
        .submit_choices(valid.generation_request(), 1)?
        .into_iter()
        .next()
        .ok_or_else(|| EngineError::Unavailable.into())
}

/// A validation error's `param` (and the field named in its message) in the Responses API's
/// names.
fn responses_param(err: ApiError) -> ApiError {
    let Some(param) = err.param() else {
        return err;
    };
    let renamed = match param {
        "messages" => "input".to_owned(),
        "response_format" => "text.format".to_owned(),
        p if p.starts_with("tools[") => p.replacen(".function.", ".", 1),
        _ => return err,
    };
    let message = err
        .message()
        .replace(&format!("`{param}`"), &format!("`{renamed}`"));
    let code = err.code().unwrap_or("invalid_value").to_owned();
    ApiError::new(err.status(), &code, message).with_param(renamed)
}

/// What a response needs besides its output: the request's echo and the conversation to store.
pub struct Pending {
    id: String,
    /// The id as stored ([`store_key`]).
    key: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    previous_response_id: Option<String>,
    store: bool,
    temperature: Option<f64>,
    top_p: Option<f64>,
    echo: Echo,
    /// The previous conversation and this request's input (no instructions).
    conversation: Vec<ChatMessage>,
    responses: ResponseStore,
}

impl Pending {
    /// The response object with `output` and `status`.
    fn object(
        &self,
        status: &'static str,
        output: Vec<OutputItem>,
        usage: Option<Usage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            background: false,
            error: None,
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            instructions: self.instructions.clone(),
            max_output_tokens: self.echo.max_output_tokens,
            max_tool_calls: None,
            model: self.model.clone(),
            output,
            parallel_tool_calls: self.echo.parallel_tool_calls,
            previous_response_id: self.previous_response_id.clone(),
            reasoning: self.echo.reasoning.clone(),
            store: self.store,
            temperature: self.temperature,
            text: self.echo.text.clone(),
            tool_choice: self.echo.tool_choice.clone(),
            tools: self.echo.tools.clone(),
            top_p: self.top_p,
            truncation: "disabled",
            usage: usage.map(ResponseUsage::from),
            user: self.echo.user.clone(),
            metadata: self.echo.metadata.clone(),
        }
    }

    /// The response before any output (the stream's first events).
    fn started(&self) -> ResponseObject {
        self.object("in_progress", Vec::new(), None)
    }

    /// The finished response, stored when `store`.
    fn finished(&self, items: &[OutputItem], reason: FinishReason, usage: Usage) -> ResponseObject {
        let status = match reason {
            FinishReason::Length => "incomplete",
            FinishReason::Stop => "completed",
        };
        let response = self.object(status, items.to_vec(), Some(usage));
        if self.store {
            let mut conversation = self.conversation.clone();
            conversation.push(assistant_message(items));
            let json = serde_json::to_string(&response).unwrap_or_default();
            // An entry over the store's byte bound is not kept; a later continuation from it
            // gets `previous_response_not_found`.
            self.responses
                .insert(&self.key, StoredResponse { json, conversation });
        }
        response
    }

    /// The last event: `response.completed`, or `response.incomplete` at the token limit.
    fn last_event(response: ResponseObject) -> StreamEvent {
        if response.status == "incomplete" {
            StreamEvent::Incomplete {
                response: Box::new(response),
            }
        } else {
            StreamEvent::Completed {
                response: Box::new(response),
            }
        }
    }
}

/// The assistant turn a continuation's template sees: the text and the calls of `items`.
fn assistant_message(items: &[OutputItem]) -> ChatMessage {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for item in items {
        match item {
            OutputItem::Message { content: parts, .. } => {
                parts.iter().for_each(|p| content.push_str(&p.text));
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => calls.push(template_call(call_id, name, arguments)),
            // As a chat client sends it back: the template decides what to keep of it.
            OutputItem::Reasoning { content: parts, .. } => {
                parts.iter().for_each(|p| reasoning.push_str(&p.text));
            }
        }
    }
    ChatMessage {
        role: "assistant".into(),
        content,
        tool_calls: (!calls.is_empty()).then_some(calls),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        ..ChatMessage::default()
    }
}

/// An `f32` sampling value as the `f64` with the same shortest decimal (0.2, not
/// 0.20000000298023224), for the response's echo of the model's defaults.
fn shortest(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

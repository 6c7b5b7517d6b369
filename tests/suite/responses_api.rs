//! `POST /v1/responses` (OpenAI's Responses API) through a real server on a loopback port: the
//! response object and its usage, the stream's events (names, order, `sequence_number`, deltas
//! that add up to the final text), function calls read from a reply's tool-call markup and fed
//! back as `function_call_output`, `previous_response_id` continuations (the second prompt holds
//! the first exchange), `store`, `GET`/`DELETE /v1/responses/{id}`, errors in OpenAI's shape,
//! the response store's bound, and the official openai Python SDK (`responses.create`, streamed
//! and not, and the `responses.stream` helper) against the test double and the real model (on
//! which `text.format` JSON and a `required` tool call with its output sent back are checked
//! too).

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::common::{render, run_python_client, Loopback, TestBackend, CONTINUATION, READY};
use crate::real_model;
use ferry::engine::{
    Backend, ChatMessage, EngineResult, FinishReason, GenerationEvent, GenerationRequest,
    ModelCard, SamplingParams, TokenOutput, Usage,
};
use ferry::metrics::Metrics;
use ferry::server::response_store::StoreLimits;
use ferry::server::ServerOptions;

/// The test double with a wide context (continuations and folded tool definitions need more
/// than its 64 tokens) and, when `reply` is set, that reply (in pieces) instead of
/// [`CONTINUATION`]. Requests are recorded in `inner.submitted` either way.
struct Scripted {
    inner: Arc<TestBackend>,
    reply: Option<Vec<String>>,
}

const WIDE_CONTEXT: usize = 1 << 20;

impl Backend for Scripted {
    fn metrics(&self) -> Metrics {
        self.inner.metrics()
    }
    fn models(&self) -> Vec<ModelCard> {
        self.inner
            .models()
            .into_iter()
            .map(|mut c| {
                c.max_context = c.max_context.map(|_| WIDE_CONTEXT);
                c
            })
            .collect()
    }
    fn max_context(&self, model: &str) -> EngineResult<usize> {
        self.inner.max_context(model).map(|_| WIDE_CONTEXT)
    }
    fn sampling_defaults(&self, model: &str) -> EngineResult<SamplingParams> {
        self.inner.sampling_defaults(model)
    }
    fn encode_chat_with_tools(
        &self,
        model: &str,
        messages: &[ChatMessage],
        tools: &[Value],
        variables: &serde_json::Map<String, Value>,
        add_generation_prompt: bool,
        parse_special: bool,
    ) -> EngineResult<Vec<u32>> {
        self.inner.encode_chat_with_tools(
            model,
            messages,
            tools,
            variables,
            add_generation_prompt,
            parse_special,
        )
    }
    fn tokenize(&self, model: &str, text: &str, special: bool) -> EngineResult<Vec<u32>> {
        self.inner.tokenize(model, text, special)
    }
    fn token_bytes(&self, model: &str, tokens: &[u32]) -> EngineResult<Vec<Vec<u8>>> {
        self.inner.token_bytes(model, tokens)
    }
    fn encode_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        parse_special: bool,
    ) -> EngineResult<Vec<u32>> {
        self.inner
            .encode_chat(model, messages, add_generation_prompt, parse_special)
    }
    fn detokenize(&self, model: &str, tokens: &[u32]) -> EngineResult<String> {
        self.inner.detokenize(model, tokens)
    }
    fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        self.inner
            .render_chat(model, messages, add_generation_prompt)
    }
    fn submit(&self, request: GenerationRequest) -> EngineResult<mpsc::Receiver<GenerationEvent>> {
        let Some(reply) = self.reply.clone() else {
            return self.inner.submit(request);
        };
        self.inner.submitted.lock().unwrap().push(request.clone());
        let (tx, rx) = mpsc::channel(reply.len() + 1);
        let prompt_tokens = request.prompt.len();
        for (i, text) in reply.iter().enumerate() {
            let _ = tx.try_send(GenerationEvent::Token(TokenOutput {
                text: text.clone(),
                token_id: 1000 + i as u32,
                logprob: None,
                top_logprobs: Vec::new(),
            }));
        }
        let _ = tx.try_send(GenerationEvent::Finished {
            reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens,
                completion_tokens: reply.len(),
                total_tokens: prompt_tokens + reply.len(),
                prompt_tokens_details: None,
                completion_tokens_details: None,
            },
            trailing_text: String::new(),
        });
        Ok(rx)
    }
}

const CALL_REPLY: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// A reply of Hermes call markup, in pieces of 5 bytes.
fn call_pieces() -> Vec<String> {
    CALL_REPLY
        .as_bytes()
        .chunks(5)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect()
}

async fn server(reply: Option<Vec<String>>) -> (Loopback, Arc<TestBackend>) {
    server_with(reply, ServerOptions::default()).await
}

async fn server_with(
    reply: Option<Vec<String>>,
    options: ServerOptions,
) -> (Loopback, Arc<TestBackend>) {
    let inner = TestBackend::new();
    let backend = Arc::new(Scripted {
        inner: Arc::clone(&inner),
        reply,
    });
    (Loopback::start(backend, options).await, inner)
}

async fn post(server: &Loopback, body: &Value) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/responses"))
        .json(body)
        .send()
        .await
        .expect("response");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

async fn create(server: &Loopback, body: &Value) -> (StatusCode, Value) {
    let (status, text) = post(server, body).await;
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

async fn request(server: &Loopback, method: reqwest::Method, id: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .request(method, server.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .expect("response");
    let status = response.status();
    (status, response.json().await.expect("json"))
}

/// The prompt of the last request, as text (the double tokenises bytes).
fn last_prompt(backend: &TestBackend) -> String {
    let bytes: Vec<u8> = backend.last().prompt.iter().map(|&t| t as u8).collect();
    String::from_utf8(bytes).expect("a UTF-8 prompt")
}

fn user(text: &str) -> ChatMessage {
    message("user", text)
}

fn message(role: &str, text: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: text.into(),
        ..ChatMessage::default()
    }
}

/// An SSE body's events as (name, data), checking the framing: each event is one `event:`
/// line and one `data:` line whose JSON `type` is the event's name; keep-alive comments skipped.
fn named_events(body: &str) -> Vec<(String, Value)> {
    assert!(body.ends_with("\n\n"), "{body:?}");
    body[..body.len() - 2]
        .split("\n\n")
        .filter(|e| !e.starts_with(':'))
        .map(|event| {
            let lines: Vec<&str> = event.split('\n').collect();
            let [name, data] = lines[..] else {
                panic!("an event is two lines: {event:?}")
            };
            let name = name.strip_prefix("event: ").expect("event line").to_owned();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").expect("data line"))
                .expect("JSON data");
            assert_eq!(data["type"], name.as_str(), "{event}");
            (name, data)
        })
        .collect()
}

/// Checks the numbering and returns the names.
fn names_in_order(events: &[(String, Value)]) -> Vec<&str> {
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    events.iter().map(|(n, _)| n.as_str()).collect()
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_response_has_openais_shape_and_usage() {
    let (server, backend) = server(None).await;
    let (status, r) = create(
        &server,
        &json!({"model": READY, "input": "hi", "instructions": "be brief",
            "metadata": {"k": "v"}, "reasoning": {"effort": "low"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], READY);
    assert_eq!(r["instructions"], "be brief");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(r["reasoning"]["effort"], "low");
    assert_eq!(r["store"], true);
    assert_eq!(r["text"]["format"]["type"], "text");
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{r}");
    let item = &items[0];
    assert_eq!(
        (&item["type"], &item["role"], &item["status"]),
        (&json!("message"), &json!("assistant"), &json!("completed"))
    );
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    assert_eq!(output_text(&r), CONTINUATION.concat());
    // The instructions are a system message before the input; `reasoning.effort` reaches the
    // template as `reasoning_effort` (the test double writes template variables first).
    let prompt = last_prompt(&backend);
    assert_eq!(
        prompt,
        format!(
            "<|v|>{{\"reasoning_effort\":\"low\"}}\n{}",
            render(&[message("system", "be brief"), user("hi")])
        ),
        "{prompt}"
    );
    let usage = &r["usage"];
    assert_eq!(usage["input_tokens"], prompt.len());
    assert_eq!(usage["output_tokens"], CONTINUATION.len());
    assert_eq!(usage["total_tokens"], prompt.len() + CONTINUATION.len());
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn a_stream_sends_the_responses_events_in_order() {
    let (server, _backend) = server(None).await;
    let (status, body) = post(
        &server,
        &json!({"model": READY, "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains("[DONE]"), "a Responses stream has no [DONE]");
    let events = named_events(&body);
    let names = names_in_order(&events);
    let deltas = vec!["response.output_text.delta"; CONTINUATION.len()];
    let expected: Vec<&str> = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    .into_iter()
    .chain(deltas)
    .chain([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ])
    .collect();
    assert_eq!(names, expected);
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert!(created["usage"].is_null());
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect();
    let done = &events
        .iter()
        .find(|(n, _)| n == "response.output_text.done")
        .unwrap()
        .1;
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(deltas, CONTINUATION.concat());
    assert_eq!(done["text"], deltas.as_str());
    assert_eq!(output_text(completed), deltas);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["id"], created["id"]);
    assert_eq!(completed["usage"]["output_tokens"], CONTINUATION.len());
    // Every event of the one message names its item.
    let item_id = &events[2].1["item"]["id"];
    for (name, data) in &events[3..events.len() - 2] {
        assert_eq!(&data["item_id"], item_id, "{name}");
    }
    // The stored response is the streamed one.
    let id = completed["id"].as_str().unwrap();
    let (status, stored) = request(&server, reqwest::Method::GET, id).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&stored, completed);
}

#[tokio::test]
async fn max_output_tokens_makes_an_incomplete_response() {
    let (server, _backend) = server(None).await;
    let body = json!({"model": READY, "input": "hi", "max_output_tokens": 3});
    let (status, r) = create(&server, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["max_output_tokens"], 3);
    assert_eq!(r["output"][0]["status"], "incomplete", "{r}");
    assert_eq!(output_text(&r), CONTINUATION[..3].concat());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (_, text) = post(&server, &streamed).await;
    let events = named_events(&text);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(events[events.len() - 2].1["item"]["status"], "incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[tokio::test]
async fn a_failure_mid_stream_ends_it_with_an_error_event() {
    let (server, _backend) = server(None).await;
    let (status, body) = post(
        &server,
        &json!({"model": crate::common::BROKEN, "input": "hi", "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events = named_events(&body);
    let names = names_in_order(&events);
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "error"
        ]
    );
    let error = &events.last().unwrap().1;
    assert_eq!(error["code"], "internal_error", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("broke"),
        "{error}"
    );
    // A failed response is not stored.
    let id = events[0].1["response"]["id"].as_str().unwrap();
    let (status, _) = request(&server, reqwest::Method::GET, id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A tool for the double, which compiles no grammars: without a `parameters` schema, nothing
/// needs compiling (the real model's tool tests cover schemas).
fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {}})
}

#[tokio::test]
async fn tool_call_markup_becomes_function_call_items_and_outputs_go_back() {
    let (server, backend) = server(Some(call_pieces())).await;
    let body = json!({"model": READY, "input": "Weather in Paris?", "tools": [weather_tool()]});
    let (status, r) = create(&server, &body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.len(), 1, "only the call, no message: {r}");
    let call = &items[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = call["call_id"].as_str().unwrap();
    assert!(call_id.starts_with("call_"), "{call}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(
        r["tools"],
        json!([weather_tool()]),
        "tools are echoed as sent"
    );
    // The tool was offered: folded into the prompt (the double's template renders no tools).
    assert!(last_prompt(&backend).contains("get_weather"));

    // Streamed: the call's item, its argument deltas adding up, then done.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, text) = post(&server, &streamed).await;
    let events = named_events(&text);
    let names = names_in_order(&events);
    assert_eq!(names[2], "response.output_item.added");
    assert_eq!(events[2].1["item"]["type"], "function_call");
    assert_eq!(events[2].1["item"]["arguments"], "");
    let n = names.len();
    assert_eq!(
        names[n - 3..],
        [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert!(!names.contains(&"response.output_text.delta"), "{names:?}");
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events[n - 3].1["arguments"], deltas.as_str());
    assert_eq!(
        serde_json::from_str::<Value>(&deltas).unwrap(),
        json!({"city": "Paris"})
    );

    // The result goes back as a function_call_output, continuing the first response.
    let (status, second) = create(
        &server,
        &json!({"model": READY, "previous_response_id": r["id"], "tools": [weather_tool()],
            "input": [{"type": "function_call_output", "call_id": call_id, "output": "sunny, 21 C"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["previous_response_id"], r["id"]);
    let prompt = last_prompt(&backend);
    let asked = prompt.find("Weather in Paris?").expect("the first input");
    let called = prompt
        .find("{\"city\":\"Paris\"}")
        .expect("the call, as Hermes markup");
    let answered = prompt
        .find("<tool_response>\nsunny, 21 C\n</tool_response>")
        .expect("the tool's result");
    assert!(asked < called && called < answered, "{prompt}");

    // The same exchange sent as items, without the store.
    let (status, _) = create(
        &server,
        &json!({"model": READY, "store": false, "tools": [weather_tool()], "input": [
            {"role": "user", "content": "Weather in Paris?"},
            call,
            {"type": "function_call_output", "call_id": call_id, "output": "sunny, 21 C"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        last_prompt(&backend),
        prompt,
        "items replay the stored conversation"
    );
}

#[tokio::test]
async fn previous_response_id_continues_the_conversation() {
    let (server, backend) = server(None).await;
    let (_, first) = create(
        &server,
        &json!({"model": READY, "input": "hi", "instructions": "first rules"}),
    )
    .await;
    let (status, second) = create(
        &server,
        &json!({"model": READY, "input": "and you?", "previous_response_id": first["id"],
            "instructions": "second rules"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let reply = CONTINUATION.concat();
    // The first exchange, then the new input; the first instructions are not carried over.
    assert_eq!(
        last_prompt(&backend),
        render(&[
            message("system", "second rules"),
            user("hi"),
            message("assistant", &reply),
            user("and you?"),
        ])
    );
    // A third turn holds both exchanges.
    let (_, _third) = create(
        &server,
        &json!({"model": READY, "input": "bye", "previous_response_id": second["id"]}),
    )
    .await;
    assert_eq!(
        last_prompt(&backend),
        render(&[
            user("hi"),
            message("assistant", &reply),
            user("and you?"),
            message("assistant", &reply),
            user("bye"),
        ])
    );
}

#[tokio::test]
async fn store_get_and_delete() {
    let (server, _backend) = server(None).await;
    let (_, kept) = create(&server, &json!({"model": READY, "input": "hi"})).await;
    let id = kept["id"].as_str().unwrap();
    let (status, got) = request(&server, reqwest::Method::GET, id).await;
    assert_eq!((status, &got), (StatusCode::OK, &kept));

    let (_, unkept) = create(
        &server,
        &json!({"model": READY, "input": "hi", "store": false}),
    )
    .await;
    assert_eq!(unkept["store"], false);
    let unkept_id = unkept["id"].as_str().unwrap();
    let (status, err) = request(&server, reqwest::Method::GET, unkept_id).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(err["error"]["code"], "response_not_found");
    let (status, err) = create(
        &server,
        &json!({"model": READY, "input": "more", "previous_response_id": unkept_id}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");

    let (status, deleted) = request(&server, reqwest::Method::DELETE, id).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (status, _) = request(&server, reqwest::Method::GET, id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = request(&server, reqwest::Method::DELETE, id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn each_api_key_sees_only_its_own_responses() {
    let options = ServerOptions::default()
        .with_api_key("key-a")
        .with_api_key("key-b");
    let (server, _backend) = server_with(None, options).await;
    let client = reqwest::Client::new();
    let send = |key: &'static str, builder: reqwest::RequestBuilder| async move {
        let response = builder.bearer_auth(key).send().await.expect("response");
        let status = response.status();
        (status, response.json::<Value>().await.expect("json"))
    };
    let (status, r) = send(
        "key-a",
        client
            .post(server.url("/v1/responses"))
            .json(&json!({"model": READY, "input": "hi"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let url = server.url(&format!("/v1/responses/{}", r["id"].as_str().unwrap()));
    let (status, _) = send("key-a", client.get(&url)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send("key-b", client.get(&url)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send("key-b", client.delete(&url)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let follow = json!({"model": READY, "input": "more", "previous_response_id": r["id"]});
    let (status, err) = send(
        "key-b",
        client.post(server.url("/v1/responses")).json(&follow),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    let (status, _) = send(
        "key-a",
        client.post(server.url("/v1/responses")).json(&follow),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn an_unknown_previous_response_is_a_404_in_openais_shape() {
    let (server, backend) = server(None).await;
    let (status, err) = create(
        &server,
        &json!({"model": READY, "input": "hi", "previous_response_id": "resp_nope"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        err,
        json!({"error": {
            "message": "Previous response with id 'resp_nope' not found (never stored, stored with `store: false`, or evicted from the bounded store).",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found"}})
    );
    assert!(backend.submitted.lock().unwrap().is_empty(), "nothing ran");
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field() {
    let (server, _backend) = server(None).await;
    let cases = [
        (
            json!({"model": READY}),
            "input",
            "missing_required_parameter",
        ),
        (
            json!({"model": READY, "input": "x", "messages": []}),
            "messages",
            "unknown_parameter",
        ),
        (
            json!({"model": READY, "input": "x", "background": true}),
            "background",
            "unsupported_parameter",
        ),
        (
            json!({"model": READY, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}),
            "input[0].content[0].type",
            "unsupported_value",
        ),
        (
            json!({"model": READY, "input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
            "unsupported_value",
        ),
        (
            json!({"model": READY, "input": "x", "tool_choice": "required"}),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": "x", "temperature": 9}),
            "temperature",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
            "invalid_value",
        ),
        // Validation's errors name the Responses fields: the double has no grammars.
        (
            json!({"model": READY, "input": "x", "text": {"format": {"type": "json_object"}}}),
            "text.format",
            "invalid_value",
        ),
        (
            json!({"model": READY, "input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
            "tools[0].parameters",
            "invalid_value",
        ),
    ];
    for (body, param, code) in cases {
        let (status, err) = create(&server, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
        assert_eq!(
            (
                err["error"]["param"].as_str(),
                err["error"]["code"].as_str()
            ),
            (Some(param), Some(code)),
            "{body}: {err}"
        );
        let message = err["error"]["message"].as_str().unwrap();
        assert!(!message.contains(".function."), "{message}");
    }
    let (status, err) = create(&server, &json!({"model": "no-such-model", "input": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(err["error"]["code"], "model_not_found");
    // The double's own 64-token context: a long input is named as `input`.
    let narrow = Loopback::start(TestBackend::new(), ServerOptions::default()).await;
    let (status, err) = create(&narrow, &json!({"model": READY, "input": "x".repeat(100)})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert_eq!(err["error"]["code"], "context_length_exceeded");
    assert_eq!(err["error"]["param"], "input");
}

#[tokio::test]
async fn the_store_keeps_within_its_byte_bound() {
    let limits = StoreLimits {
        max_entries: 1000,
        max_bytes: 64 * 1024,
    };
    let options = ServerOptions {
        response_store: limits,
        ..ServerOptions::default()
    };
    let (server, _backend) = server_with(None, options).await;
    // 60 distinct responses of ~8 KB each (their input is stored with them): ~480 KB offered.
    let mut ids = Vec::new();
    for i in 0..60 {
        let input = format!("{i} {}", "y".repeat(8 * 1024));
        let (status, r) = create(&server, &json!({"model": READY, "input": input})).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        ids.push(r["id"].as_str().unwrap().to_owned());
    }
    let mut kept = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if request(&server, reqwest::Method::GET, id).await.0 == StatusCode::OK {
            kept.push(i);
        }
    }
    // At most 64 KiB / 8 KiB of them, and the newest are the ones kept.
    assert!(kept.len() <= 8, "{} kept: {kept:?}", kept.len());
    assert!(kept.len() >= 2, "{kept:?}");
    assert!(kept.contains(&59), "{kept:?}");
    assert!(!kept.contains(&0), "{kept:?}");
}

const SDK_SCRIPT: &str = r#"
import json, os
from openai import OpenAI
client = OpenAI(base_url=os.environ["FERRY_BASE_URL"])
out = {}
r = client.responses.create(model="test-model", input="hi", instructions="be brief")
out["create"] = {"id": r.id, "status": r.status, "text": r.output_text,
    "usage": [r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens,
              r.usage.output_tokens_details.reasoning_tokens]}
follow = client.responses.create(model="test-model", input="more", previous_response_id=r.id)
out["follow"] = {"previous": follow.previous_response_id, "input_tokens": follow.usage.input_tokens}
out["retrieved"] = client.responses.retrieve(r.id).output_text
kinds, deltas = [], []
for event in client.responses.create(model="test-model", input="hi", stream=True):
    kinds.append(event.type)
    if event.type == "response.output_text.delta":
        deltas.append(event.delta)
    if event.type == "response.completed":
        out["stream_final"] = event.response.output_text
out["stream_kinds"] = kinds
out["stream_deltas"] = "".join(deltas)
with client.responses.stream(model="test-model", input="hi") as stream:
    helper_deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    final = stream.get_final_response()
out["helper"] = {"deltas": "".join(helper_deltas), "final": final.output_text, "status": final.status}
try:
    client.responses.create(model="test-model", input="hi", previous_response_id="resp_missing")
except Exception as e:
    out["error"] = {"class": type(e).__name__, "status": e.status_code, "code": e.code, "param": e.param}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_python_sdk_creates_streams_and_continues() {
    let (server, _backend) = server(None).await;
    let out = run_python_client(SDK_SCRIPT, &server.url("/v1")).await;
    let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let reply = CONTINUATION.concat();
    let create = &out["create"];
    assert_eq!(create["status"], "completed", "{out}");
    assert_eq!(create["text"], reply.as_str());
    let usage = create["usage"].as_array().unwrap();
    assert_eq!(usage[1], CONTINUATION.len());
    assert_eq!(usage[3], 0);
    assert_eq!(out["follow"]["previous"], create["id"]);
    assert!(
        out["follow"]["input_tokens"].as_u64() > usage[0].as_u64(),
        "the continuation's prompt holds the first exchange: {out}"
    );
    assert_eq!(out["retrieved"], reply.as_str());
    assert_eq!(out["stream_deltas"], reply.as_str());
    assert_eq!(out["stream_final"], reply.as_str());
    let kinds = out["stream_kinds"].as_array().unwrap();
    assert_eq!(kinds.first().unwrap(), "response.created");
    assert_eq!(kinds.last().unwrap(), "response.completed");
    assert_eq!(
        out["helper"],
        json!({"deltas": reply, "final": reply, "status": "completed"})
    );
    assert_eq!(
        out["error"],
        json!({"class": "NotFoundError", "status": 404, "code": "previous_response_not_found", "param": "previous_response_id"})
    );
}

const SDK_TOOLS_SCRIPT: &str = r#"
import json, os
from openai import OpenAI
client = OpenAI(base_url=os.environ["FERRY_BASE_URL"])
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {}, "strict": False}]
r = client.responses.create(model="test-model", input="Weather in Paris?", tools=tools)
calls = [item for item in r.output if item.type == "function_call"]
out = {"calls": [{"name": c.name, "arguments": json.loads(c.arguments), "call_id": c.call_id} for c in calls]}
follow = client.responses.create(model="test-model", previous_response_id=r.id, tools=tools,
    input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
out["follow_status"] = follow.status
with client.responses.stream(model="test-model", input="Weather in Paris?", tools=tools) as stream:
    done = [e.arguments for e in stream if e.type == "response.function_call_arguments.done"]
    final = stream.get_final_response()
out["stream_done"] = [json.loads(a) for a in done]
out["stream_final"] = [item.type for item in final.output]
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_python_sdk_reads_function_calls() {
    let (server, backend) = server(Some(call_pieces())).await;
    let out = run_python_client(SDK_TOOLS_SCRIPT, &server.url("/v1")).await;
    let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let call = &out["calls"][0];
    assert_eq!(call["name"], "get_weather", "{out}");
    assert_eq!(call["arguments"], json!({"city": "Paris"}));
    assert_eq!(out["follow_status"], "completed");
    assert_eq!(out["stream_done"], json!([{"city": "Paris"}]));
    assert_eq!(out["stream_final"], json!(["function_call"]));
    let prompts = backend.submitted.lock().unwrap().len();
    assert_eq!(prompts, 3);
}

const SDK_REAL_SCRIPT: &str = r#"
import json, os
from openai import OpenAI
client = OpenAI(base_url=os.environ["FERRY_BASE_URL"])
r = client.responses.create(model="smollm2", input="Name a colour.", max_output_tokens=12,
    temperature=0)
out = {"text": r.output_text, "status": r.status, "usage": [r.usage.input_tokens, r.usage.output_tokens]}
deltas, last = [], None
with client.responses.stream(model="smollm2", input="Name a colour.", max_output_tokens=12,
        temperature=0) as stream:
    for e in stream:
        if e.type == "response.output_text.delta":
            deltas.append(e.delta)
        last = e
# At the token limit the last event is `response.incomplete` (as OpenAI's), which the helper's
# get_final_response does not take; the last event carries the response either way.
out["stream"] = {"deltas": "".join(deltas), "final": last.response.output_text, "last": last.type,
                 "status": last.response.status}
schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
          "additionalProperties": False}
j = client.responses.create(model="smollm2", input="Name a colour as JSON.", temperature=0,
    max_output_tokens=40,
    text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
out["json"] = {"text": j.output_text, "status": j.status}
tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False}, "strict": True}]
t = client.responses.create(model="smollm2", input="What is the weather in Paris?", tools=tools,
    tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=60)
calls = [item for item in t.output if item.type == "function_call"]
out["calls"] = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
answer = client.responses.create(model="smollm2", previous_response_id=t.id, tools=tools,
    temperature=0, max_output_tokens=20,
    input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
out["answer"] = {"status": answer.status, "text": answer.output_text,
                 "input_tokens": answer.usage.input_tokens, "first_input_tokens": t.usage.input_tokens}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_python_sdk_on_the_real_model() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let out = run_python_client(SDK_REAL_SCRIPT, &server.url("/v1")).await;
    let out: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let text = out["text"].as_str().unwrap();
    assert!(!text.trim().is_empty(), "{out}");
    let usage = out["usage"].as_array().unwrap();
    assert!(
        usage[0].as_u64().unwrap() > 3 && usage[1].as_u64().unwrap() <= 12,
        "{out}"
    );
    // Greedy: the streamed reply is the same text, and its deltas add up to it.
    assert_eq!(out["stream"]["deltas"], text, "{out}");
    assert_eq!(out["stream"]["final"], text, "{out}");
    assert_eq!(out["stream"]["status"], out["status"], "{out}");
    let last = if out["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    assert_eq!(out["stream"]["last"], last, "{out}");
    // `text.format` goes through the grammar: the reply is JSON of the schema.
    assert_eq!(out["json"]["status"], "completed", "{out}");
    let v: Value = serde_json::from_str(out["json"]["text"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["colour"].is_string(), "{out}");
    // `tool_choice: required` is enforced: one call with schema-valid arguments, and its
    // output sent back continues the conversation.
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{out}");
    assert_eq!(calls[0]["name"], "get_weather");
    assert!(calls[0]["arguments"]["city"].is_string(), "{out}");
    let answer = &out["answer"];
    assert!(
        answer["input_tokens"].as_u64() > answer["first_input_tokens"].as_u64(),
        "{out}"
    );
    assert!(!answer["text"].as_str().unwrap().is_empty(), "{out}");
}

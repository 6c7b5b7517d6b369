//! Issue 15 item 1, tool calling, on the real SmolLM2 model through a real server on a loopback
//! port: `tool_choice: required` makes even a 135M model emit a valid call (the grammar is
//! enforced while sampling), the official-shape client (async-openai) reads it and sends it
//! back with the tool's result for a final answer; streamed deltas add up to the same call as
//! the non-streamed reply; a named `tool_choice` picks its function; bad tool input is a 400
//! naming its `param`. The grammar of every format accepts that format's markup and the
//! format's parser reads it back.

use crate::common::{sse_events, Loopback};
use crate::real_model;

use async_openai::types::{
    ChatCompletionMessageToolCall, ChatCompletionRequestAssistantMessageArgs,
    ChatCompletionRequestMessage, ChatCompletionRequestToolMessageArgs,
    ChatCompletionRequestUserMessageArgs, ChatCompletionTool, ChatCompletionToolArgs,
    ChatCompletionToolChoiceOption, CreateChatCompletionRequestArgs, FinishReason,
    FunctionObjectArgs,
};
use reqwest::StatusCode;
use serde_json::{json, Value};

use ferry::engine::grammar::{GrammarSpec, GrammarState};
use ferry::engine::tool_calls::{constrain, ToolCallFormat, ToolCallStream, ToolSpec};
use ferry::server::ServerOptions;

fn weather_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    })
}

fn tools_json() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": weather_parameters()}},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "The local time in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ])
}

fn request(tool_choice: Value, stream: bool) -> Value {
    json!({
        "model": real_model::MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools_json(),
        "tool_choice": tool_choice,
        "parallel_tool_calls": false,
        "max_tokens": 120,
        "temperature": 0,
        "seed": 1,
        "stream": stream,
    })
}

async fn post(server: &Loopback, body: &Value) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("response");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

async fn chat(server: &Loopback, body: &Value) -> (StatusCode, Value) {
    let (status, text) = post(server, body).await;
    (status, serde_json::from_str(&text).expect("json body"))
}

/// Checks a `get_weather` call's arguments against [`weather_parameters`] by hand.
fn check_weather_arguments(arguments: &str) {
    let v: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {arguments:?}"));
    let obj = v.as_object().expect("an object");
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["city", "unit"], "{arguments}");
    assert!(obj["city"].is_string(), "{arguments}");
    assert!(
        ["celsius", "fahrenheit"].contains(&obj["unit"].as_str().unwrap_or("")),
        "{arguments}"
    );
}

#[tokio::test]
async fn required_round_trip_through_the_openai_client() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let client = async_openai::Client::with_config(
        async_openai::config::OpenAIConfig::new()
            .with_api_base(server.url("/v1"))
            .with_api_key("unused"),
    );
    let tools: Vec<ChatCompletionTool> = vec![ChatCompletionToolArgs::default()
        .function(
            FunctionObjectArgs::default()
                .name("get_weather")
                .description("The current weather in a city.")
                .parameters(weather_parameters())
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()];
    let user: ChatCompletionRequestMessage = ChatCompletionRequestUserMessageArgs::default()
        .content("What is the weather in Paris?")
        .build()
        .unwrap()
        .into();
    let first = CreateChatCompletionRequestArgs::default()
        .model(real_model::MODEL)
        .messages(vec![user.clone()])
        .tools(tools.clone())
        .tool_choice(ChatCompletionToolChoiceOption::Required)
        .parallel_tool_calls(false)
        .max_completion_tokens(120u32)
        .temperature(0.0)
        .build()
        .unwrap();
    let reply = client.chat().create(first).await.expect("first turn");
    let choice = &reply.choices[0];
    assert_eq!(choice.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(choice.message.content, None, "only a call: content is null");
    let calls: Vec<ChatCompletionMessageToolCall> =
        choice.message.tool_calls.clone().expect("tool_calls");
    assert_eq!(calls.len(), 1, "parallel_tool_calls false: one call");
    assert!(calls[0].id.starts_with("call_"), "{}", calls[0].id);
    assert_eq!(calls[0].function.name, "get_weather");
    check_weather_arguments(&calls[0].function.arguments);
    eprintln!("first turn: {:?}", calls[0].function);

    // The call and its result go back; the model answers in words.
    let assistant: ChatCompletionRequestMessage =
        ChatCompletionRequestAssistantMessageArgs::default()
            .tool_calls(calls.clone())
            .build()
            .unwrap()
            .into();
    let result: ChatCompletionRequestMessage = ChatCompletionRequestToolMessageArgs::default()
        .tool_call_id(calls[0].id.clone())
        .content(r#"{"temperature": 21, "sky": "sunny"}"#)
        .build()
        .unwrap()
        .into();
    let second = CreateChatCompletionRequestArgs::default()
        .model(real_model::MODEL)
        .messages(vec![user, assistant, result])
        .tools(tools)
        .tool_choice(ChatCompletionToolChoiceOption::None)
        .max_completion_tokens(40u32)
        .temperature(0.0)
        .build()
        .unwrap();
    let reply = client.chat().create(second).await.expect("second turn");
    let choice = &reply.choices[0];
    assert!(
        matches!(
            choice.finish_reason,
            Some(FinishReason::Stop | FinishReason::Length)
        ),
        "{:?}",
        choice.finish_reason
    );
    assert_eq!(
        choice.message.tool_calls, None,
        "tool_choice none parses nothing"
    );
    let answer = choice.message.content.clone().expect("an answer");
    eprintln!("second turn: {answer:?}");
    assert!(!answer.trim().is_empty(), "{answer:?}");
}

#[tokio::test]
async fn streamed_deltas_add_up_to_the_non_streamed_call() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let (status, whole) = chat(&server, &request(json!("required"), false)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        whole["choices"][0]["finish_reason"], "tool_calls",
        "{whole}"
    );
    let call = &message["tool_calls"][0]["function"];

    let (status, sse) = post(&server, &request(json!("required"), true)).await;
    assert_eq!(status, StatusCode::OK, "{sse}");
    let mut name = String::new();
    let mut arguments = String::new();
    let mut ids = Vec::new();
    let mut content = String::new();
    let mut finish = Value::Null;
    for event in sse_events(&sse) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).expect("chunk");
        let choice = &chunk["choices"][0];
        if let Some(text) = choice["delta"]["content"].as_str() {
            content.push_str(text);
        }
        if let Some(deltas) = choice["delta"]["tool_calls"].as_array() {
            for delta in deltas {
                assert_eq!(delta["index"], 0, "one call, index 0: {delta}");
                if let Some(id) = delta["id"].as_str() {
                    assert!(name.is_empty(), "the id and name come first, once: {sse}");
                    ids.push(id.to_owned());
                    name = delta["function"]["name"].as_str().expect("name").to_owned();
                    assert_eq!(delta["type"], "function");
                } else {
                    assert!(!name.is_empty(), "arguments after the name: {sse}");
                }
                arguments.push_str(delta["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(finish, "tool_calls", "{sse}");
    assert_eq!(ids.len(), 1, "{sse}");
    assert!(ids[0].starts_with("call_"));
    assert_eq!(content, "", "no markup leaks into content: {sse}");
    assert_eq!(name, call["name"].as_str().unwrap());
    assert_eq!(arguments, call["arguments"].as_str().unwrap(), "{sse}");
    check_weather_arguments(&arguments);
}

#[tokio::test]
async fn a_named_tool_choice_calls_that_function() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let (status, body) = chat(&server, &request(named, false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_time", "{body}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).expect("JSON");
    assert!(args["city"].is_string(), "{args}");
    // `auto`: whatever the model writes is read; the reply is well formed either way.
    let (status, body) = chat(&server, &request(json!("auto"), false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    eprintln!("auto: {}", choice["message"]);
    match choice["finish_reason"].as_str() {
        Some("tool_calls") => assert!(choice["message"]["tool_calls"].is_array(), "{body}"),
        _ => assert!(choice["message"]["content"].is_string(), "{body}"),
    }
}

#[tokio::test]
async fn bad_tool_input_is_a_400_naming_its_param() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let with = |tools: Value, choice: Value| {
        json!({
            "model": real_model::MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "tool_choice": choice,
        })
    };
    let cases = [
        (
            with(
                json!([{"type": "function", "function": {"description": "no name"}}]),
                Value::Null,
            ),
            "tools[0].function.name",
            "missing_required_parameter",
        ),
        (
            with(
                tools_json(),
                json!({"type": "function", "function": {"name": "get_stock_price"}}),
            ),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"model": real_model::MODEL, "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
            "tool_choice",
            "invalid_value",
        ),
        (
            with(
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]),
                Value::Null,
            ),
            "tools[0].function.parameters",
            "invalid_value",
        ),
        (
            with(
                json!([tools_json()[0], {"type": "function", "function": {"name": "g", "parameters": {"type": "integer", "minimum": 5, "maximum": 1}}}]),
                json!("required"),
            ),
            "tools[1].function.parameters",
            "invalid_value",
        ),
    ];
    for (body, param, code) in cases {
        let (status, reply) = chat(&server, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {reply}");
        assert_eq!(reply["error"]["param"], param, "{reply}");
        assert_eq!(reply["error"]["code"], code, "{reply}");
        assert_eq!(reply["error"]["type"], "invalid_request_error", "{reply}");
    }
}

/// For every format, the `required` grammar accepts two calls written in the format's markup
/// (fed as the real tokenizer splits them), allows EOS only at the end, and the format's parser
/// reads the calls back.
#[test]
fn each_format_grammar_accepts_its_markup_and_the_parser_reads_it_back() {
    let backend = real_model::backend();
    let tools: Vec<ToolSpec> = vec![
        ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: weather_parameters(),
        },
        ToolSpec {
            name: "ping".into(),
            description: None,
            parameters: json!({}),
        },
    ];
    let a = r#"{"city": "Paris", "unit": "celsius"}"#;
    let cases = [
        (
            ToolCallFormat::Hermes,
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {a}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"ping\", \"arguments\": {{}}}}\n</tool_call>"),
        ),
        (
            ToolCallFormat::Llama3Json,
            format!("{{\"name\": \"get_weather\", \"parameters\": {a}}}; {{\"name\": \"ping\", \"parameters\": {{}}}}"),
        ),
        (
            ToolCallFormat::Mistral,
            format!("[{{\"name\": \"get_weather\", \"arguments\": {a}}}, {{\"name\": \"ping\", \"arguments\": {{}}}}]"),
        ),
        (
            ToolCallFormat::Qwen3Coder,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>".to_owned(),
        ),
    ];
    for (format, text) in cases {
        let lark = constrain::lark(format, &tools, true);
        let grammar = backend
            .compile_grammar(real_model::MODEL, &GrammarSpec::Lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{format:?}: {e}\n{lark}"));
        let tokens = backend
            .tokenize(real_model::MODEL, &text, false)
            .expect("tokenize");
        let mut state = GrammarState::new(&grammar);
        let mut logits = vec![0.0f32; 49152];
        for (i, &t) in tokens.iter().enumerate() {
            logits.fill(0.0);
            state.mask(&mut logits).expect("mask");
            assert!(
                logits[t as usize].is_finite(),
                "{format:?}: token {i} ({t}) of {text:?} is allowed"
            );
            state.commit(t).expect("commit");
        }
        logits.fill(0.0);
        state.mask(&mut logits).expect("mask");
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        assert!(
            allowed >= 1,
            "{format:?}: something (EOS) is allowed at the end"
        );
        let parsed = ToolCallStream::parse(format, tools.clone().into(), &text);
        let names: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "ping"], "{format:?}: {parsed:?}");
        let args: Value = serde_json::from_str(&parsed.calls[0].arguments).expect("JSON");
        assert_eq!(
            args,
            json!({"city": "Paris", "unit": "celsius"}),
            "{format:?}"
        );
        assert_eq!(parsed.content, "", "{format:?}");
    }
}

/// The real templates that take tools are recognised (format, and that they render tools),
/// and render the definitions and a past call with its result as ferry passes them.
#[test]
fn real_templates_pick_their_format_and_render_tools_and_past_calls() {
    use ferry::engine::tool_calls::ToolSupport;
    use ferry::engine::ChatMessage;
    use ferry::model::tokenizer::chat_template::{ChatTemplate, TemplateContext};

    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let cases = [
        ("Qwen-Qwen3-0.6B.jinja", Some(ToolCallFormat::Hermes)),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            Some(ToolCallFormat::Llama3Json),
        ),
        (
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            Some(ToolCallFormat::Llama3Json),
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            Some(ToolCallFormat::Mistral),
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            Some(ToolCallFormat::Mistral),
        ),
        ("openai-gpt-oss-120b.jinja", Some(ToolCallFormat::Harmony)),
        ("google-gemma-2-2b-it.jinja", None),
        ("microsoft-Phi-3.5-mini-instruct.jinja", None),
    ];
    let tool = ToolSpec {
        name: "get_weather".into(),
        description: Some("The current weather in a city.".into()),
        parameters: weather_parameters(),
    };
    let tools = [tool.to_template_value()];
    let call = json!({"id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}});
    let messages = [
        ChatMessage {
            role: "user".into(),
            content: "What is the weather in Paris?".into(),
            ..Default::default()
        },
        ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![call]),
            ..Default::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: "{\"temperature\": 21}".into(),
            tool_call_id: Some("abcdefghi".into()),
            ..Default::default()
        },
    ];
    for (file, format) in cases {
        let source = std::fs::read_to_string(dir.join(file)).unwrap();
        let support = ToolSupport::from_template(Some(&source));
        let Some(format) = format else {
            assert!(!support.template_renders_tools, "{file}");
            assert_eq!(
                support.format,
                ToolCallFormat::Hermes,
                "{file}: the fallback"
            );
            continue;
        };
        assert_eq!(support.format, format, "{file}");
        assert!(support.template_renders_tools, "{file}");
        let rendered = ChatTemplate::new(&source)
            .unwrap()
            .render(&TemplateContext {
                messages: &messages,
                add_generation_prompt: true,
                bos_token: "<s>",
                eos_token: "</s>",
                unk_token: None,
                pad_token: None,
                tools: Some(&tools),
                variables: None,
            })
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            rendered.contains("The current weather in a city."),
            "{file}: the tool's definition is rendered:\n{rendered}"
        );
        assert!(
            rendered.contains("\"Paris\"") && rendered.contains("21"),
            "{file}: the past call and its result are rendered:\n{rendered}"
        );
    }
}

/// With `parallel_tool_calls` left at its default (true) the grammar allows more calls after the
/// first; every complete call is still valid.
#[tokio::test]
async fn parallel_calls_under_required_are_each_valid() {
    let server = Loopback::start(real_model::backend(), ServerOptions::default()).await;
    let mut body = request(json!("required"), false);
    body.as_object_mut().unwrap().remove("parallel_tool_calls");
    let (status, body) = chat(&server, &body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choice = &body["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    eprintln!(
        "parallel: {} call(s), finish {}",
        calls.len(),
        choice["finish_reason"]
    );
    assert!(!calls.is_empty(), "{body}");
    let complete = if choice["finish_reason"] == "tool_calls" {
        calls.len()
    } else {
        calls.len() - 1
    };
    for call in &calls[..complete] {
        let f = &call["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{e}: {call}"));
        assert!(args["city"].is_string(), "{call}");
    }
}

/// Issue 24 item 13: `tool_choice: auto` reads the calls real models write outside their
/// family's markup. SmolLM2 (Hermes, the fallback format) echoes a call put to it, so each form
/// comes from the real model: a ```` ```json ```` fenced object, a ```` ```xml ```` fence around
/// `<tool_call>`, and a bare object (forced by a `response_format` schema). Each is a
/// `tool_calls` answer whose content holds no markup, streamed deltas add up to the same call
/// with no fence in any content delta, and a fenced object naming a tool that is not offered
/// stays text.
#[tokio::test]
async fn auto_reads_fenced_and_bare_calls_the_real_model_writes() {
    // Its own engine: the shared one batches other tests' requests with these, and a prompt
    // chunk cut short by a shared step (<= 16 rows run row by row, for speculation's exactness)
    // can change a greedy reply, which would make the streamed and whole replies differ.
    let engine = real_model::engine_with(ferry::engine::EngineOptions::default());
    let server = Loopback::start(std::sync::Arc::new(engine), ServerOptions::default()).await;
    let echo = |text: &str| {
        json!({
            "model": real_model::MODEL,
            "messages": [{"role": "user",
                "content": format!("Repeat exactly this text and nothing else:\n{text}")}],
            "tools": tools_json(),
            "tool_choice": "auto",
            "max_tokens": 80,
            "temperature": 0,
            "seed": 1,
        })
    };
    let paris = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let bare = {
        let mut body = request(json!("auto"), false);
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "call",
            "schema": {"type": "object", "additionalProperties": false,
                "required": ["name", "arguments"],
                "properties": {"name": {"const": "get_weather"}, "arguments": {
                    "type": "object", "additionalProperties": false, "required": ["city"],
                    "properties": {"city": {"type": "string"}}}}}}});
        body
    };
    let cases = [
        ("fenced json", echo(&format!("```json\n{paris}\n```"))),
        (
            "fenced xml",
            echo(&format!("```xml\n<tool_call>\n{paris}\n</tool_call>\n```")),
        ),
        ("bare object", bare),
    ];
    for (form, body) in cases {
        let (status, whole) = chat(&server, &body).await;
        assert_eq!(status, StatusCode::OK, "{form}: {whole}");
        let choice = &whole["choices"][0];
        eprintln!("{form}: {}", choice["message"]);
        assert_eq!(choice["finish_reason"], "tool_calls", "{form}: {whole}");
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .expect("tool_calls");
        assert_eq!(calls.len(), 1, "{form}: {whole}");
        let function = &calls[0]["function"];
        assert_eq!(function["name"], "get_weather", "{form}: {whole}");
        let args: Value =
            serde_json::from_str(function["arguments"].as_str().expect("text")).expect("JSON");
        assert_eq!(args["city"], "Paris", "{form}: {whole}");
        let content = choice["message"]["content"].as_str().unwrap_or("");
        for markup in ["```", "<tool_call>", "\"name\""] {
            assert!(
                !content.contains(markup),
                "{form}: {markup} leaked: {whole}"
            );
        }

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (status, sse) = post(&server, &streamed).await;
        assert_eq!(status, StatusCode::OK, "{form}: {sse}");
        let (mut name, mut arguments, mut finish) = (String::new(), String::new(), Value::Null);
        let mut streamed_content = String::new();
        for event in sse_events(&sse).iter().filter(|e| *e != "[DONE]") {
            let chunk: Value = serde_json::from_str(event).expect("chunk");
            let choice = &chunk["choices"][0];
            if let Some(text) = choice["delta"]["content"].as_str() {
                streamed_content.push_str(text);
            }
            for delta in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                name.push_str(delta["function"]["name"].as_str().unwrap_or(""));
                arguments.push_str(delta["function"]["arguments"].as_str().unwrap_or(""));
            }
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
        assert_eq!(finish, "tool_calls", "{form}: {sse}");
        assert_eq!(name, "get_weather", "{form}: {sse}");
        assert_eq!(arguments, function["arguments"].as_str().unwrap(), "{form}");
        // The call's markup, whole or split across deltas, never reaches the text (prose
        // after the call may quote code: on an AVX2-only CPU the model wrote "`type` key").
        for markup in ["```", "<tool_call>", "\"name\""] {
            assert!(
                !streamed_content.contains(markup),
                "{form}: {markup} leaked into the stream: {sse}"
            );
        }
        assert_eq!(streamed_content, content, "{form}: {sse}");
    }

    // A fenced call of a tool nobody offered is the model showing JSON: it stays text.
    let unoffered = r#"{"name": "launch_rocket", "arguments": {"city": "Paris"}}"#;
    let (status, whole) = chat(&server, &echo(&format!("```json\n{unoffered}\n```"))).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{whole}");
    assert!(choice["message"]["tool_calls"].is_null(), "{whole}");
    let content = choice["message"]["content"].as_str().expect("content");
    assert!(
        content.starts_with(&format!("```json\n{unoffered}\n```")),
        "{whole}"
    );
}

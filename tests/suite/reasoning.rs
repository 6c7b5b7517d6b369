//! Issue 28 items 3 and 4, reasoning output, through a real server on a loopback port with the
//! real SmolLM2 model. SmolLM2 writes no think blocks of its own, so the server is configured
//! with a think template (`chat_template`, a ChatML one whose generation prompt opens
//! `<think>` as DeepSeek-R1's and QwQ's do, and closes it at once when `enable_thinking` is
//! false, as Qwen3's does) and a `response_format` grammar forces a reply with `</think>` in it.
//! The reply's reasoning comes back in `message.reasoning_content` / `delta.reasoning_content`,
//! the streamed deltas add up to the whole message, `usage` counts the reasoning tokens,
//! `enable_thinking: false` (through `chat_template_kwargs`) and `reasoning_format = "none"`
//! leave the text in `content`, and the openai SDK and LangChain read it. The real templates of
//! gpt-oss and Qwen3 render what the readers expect.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use crate::common::{run_python_client, sse_events, Loopback};
use crate::real_model;

use ferry::config::{ChatTemplateSource, DtypeChoice, ReasoningChoice};
use ferry::engine::reasoning::{ReasoningFormat, ReasoningParsing};
use ferry::engine::traits::TextCodec;
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::{Backend, ChatMessage};
use ferry::model::source::HubOptions;
use ferry::model::tokenizer::chat_template::{ChatTemplate, TemplateContext};
use ferry::runtime::load::load_for_serving;
use ferry::server::ServerOptions;

/// ChatML whose generation prompt opens a think block (closed at once without thinking); a past
/// assistant turn's `reasoning_content` is rendered in its block.
const THINK_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// What the grammar makes the model write: a JSON string with the block's end inside it.
const REASONING: &str = "Two and two make four.";
const ANSWER: &str = "The answer is 4.";

/// The real model served with [`THINK_TEMPLATE`] and `reasoning_format` (one engine each).
fn backend(format: ReasoningChoice) -> Arc<dyn Backend> {
    static AUTO: OnceLock<EngineHandle> = OnceLock::new();
    static NONE: OnceLock<EngineHandle> = OnceLock::new();
    let cell = match format {
        ReasoningChoice::Auto => &AUTO,
        ReasoningChoice::None => &NONE,
    };
    Arc::new(
        cell.get_or_init(|| {
            let mut config = real_model::model_config(DtypeChoice::Auto);
            config.chat_template = Some(ChatTemplateSource::Inline(THINK_TEMPLATE.into()));
            config.reasoning_format = format;
            let hub = HubOptions::from_env(|_| None);
            let loaded = load_for_serving(&config, &candle_core::Device::Cpu, &hub)
                .expect("the default model loads");
            let engine = EngineHandle::with_options([real_model::MODEL], EngineOptions::default());
            engine
                .model_ready(
                    real_model::MODEL,
                    loaded.runner,
                    loaded.codec as Arc<dyn TextCodec>,
                )
                .expect("engine starts");
            engine
        })
        .clone(),
    )
}

/// A request whose reply the grammar fixes: `"REASONING</think>ANSWER"` (a JSON string).
fn request(stream: bool, extra: Value) -> Value {
    let pattern = format!(
        "^{}</think>{}$",
        regex_escape(REASONING),
        regex_escape(ANSWER)
    );
    let mut body = json!({
        "model": real_model::MODEL,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "max_tokens": 60,
        "temperature": 0,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "forced", "schema": {"type": "string", "pattern": pattern}}},
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = ".+*?()[]{}|^$\\".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

async fn post(server: &Loopback, body: &Value) -> String {
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("response");
    assert_eq!(response.status(), 200, "{body}");
    response.text().await.expect("body")
}

/// The streamed reply added up: (reasoning, content, usage).
fn add_up(sse: &str) -> (String, String, Value) {
    let (mut reasoning, mut content, mut usage) = (String::new(), String::new(), Value::Null);
    for event in sse_events(sse) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).expect("chunk JSON");
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            if let Some(r) = delta["reasoning_content"].as_str() {
                reasoning.push_str(r);
            }
            if let Some(c) = delta["content"].as_str() {
                content.push_str(c);
            }
        }
    }
    (reasoning, content, usage)
}

#[tokio::test]
async fn reasoning_comes_apart_whole_and_streamed_with_its_tokens_counted() {
    let server = Loopback::start(backend(ReasoningChoice::Auto), ServerOptions::default()).await;
    let whole: Value =
        serde_json::from_str(&post(&server, &request(false, json!({}))).await).expect("JSON");
    let message = &whole["choices"][0]["message"];
    // The grammar's JSON string quotes stay on either side of the block's end.
    assert_eq!(
        message["reasoning_content"],
        format!("\"{REASONING}"),
        "{whole}"
    );
    assert_eq!(message["content"], format!("{ANSWER}\""), "{whole}");
    let usage = &whole["usage"];
    let reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("reasoning_tokens");
    let completion_tokens = usage["completion_tokens"].as_u64().expect("completion");
    assert!(
        reasoning_tokens > 0 && reasoning_tokens < completion_tokens,
        "{usage}"
    );

    let (reasoning, content, streamed_usage) =
        add_up(&post(&server, &request(true, json!({}))).await);
    assert_eq!(reasoning, message["reasoning_content"].as_str().unwrap());
    assert_eq!(content, message["content"].as_str().unwrap());
    assert_eq!(&streamed_usage, usage);
}

#[tokio::test]
async fn enable_thinking_false_and_reasoning_format_none_leave_the_text_in_content() {
    // `enable_thinking: false` closes the block in the prompt: the reply is all answer.
    let server = Loopback::start(backend(ReasoningChoice::Auto), ServerOptions::default()).await;
    let off = json!({"chat_template_kwargs": {"enable_thinking": false}});
    let whole: Value =
        serde_json::from_str(&post(&server, &request(false, off.clone())).await).expect("JSON");
    let message = &whole["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    let text = format!("\"{REASONING}</think>{ANSWER}\"");
    assert_eq!(message["content"], text, "{whole}");
    assert_eq!(
        whole["usage"]["completion_tokens_details"]["reasoning_tokens"], 0,
        "{whole}"
    );
    let (reasoning, content, _) = add_up(&post(&server, &request(true, off)).await);
    assert_eq!((reasoning.as_str(), content.as_str()), ("", text.as_str()));

    // `reasoning_format = "none"`: the block stays in the content, and no reasoning is counted.
    let server = Loopback::start(backend(ReasoningChoice::None), ServerOptions::default()).await;
    let whole: Value =
        serde_json::from_str(&post(&server, &request(false, json!({}))).await).expect("JSON");
    let message = &whole["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{whole}");
    assert_eq!(message["content"], text, "{whole}");
    assert!(
        whole["usage"].get("completion_tokens_details").is_none(),
        "{whole}"
    );
}

/// The openai SDK reads `reasoning_content` (an extra field of its models) whole and streamed,
/// and the tool calls of a think template's reply; LangChain's `ChatOpenAI` (which keeps only
/// OpenAI's own fields) gets the answer without the reasoning, the reasoning token count in
/// its usage metadata, and the tool calls.
#[tokio::test]
async fn the_openai_sdk_and_langchain_read_the_reasoning_and_the_calls() {
    let server = Loopback::start(backend(ReasoningChoice::Auto), ServerOptions::default()).await;
    let forced = request(false, json!({}));
    let script = format!(
        r#"
import json, os
from openai import OpenAI
from langchain_openai import ChatOpenAI

base = os.environ["FERRY_BASE_URL"]
client = OpenAI(base_url=base)
extra = {{"response_format": {response_format}}}
messages = [{{"role": "user", "content": "What is 2 + 2?"}}]
out = {{}}
r = client.chat.completions.create(model="{model}", messages=messages, max_tokens=60,
    temperature=0, **extra)
m = r.choices[0].message
out["reasoning"] = m.reasoning_content
out["content"] = m.content
out["reasoning_tokens"] = r.usage.completion_tokens_details.reasoning_tokens
parts = {{"reasoning": "", "content": ""}}
for chunk in client.chat.completions.create(model="{model}", messages=messages,
        max_tokens=60, temperature=0, stream=True, **extra):
    for choice in chunk.choices:
        d = choice.delta
        parts["reasoning"] += getattr(d, "reasoning_content", None) or ""
        parts["content"] += d.content or ""
out["streamed"] = parts
tools = [{{"type": "function", "function": {{"name": "add", "description": "Adds.",
    "parameters": {{"type": "object", "properties": {{"a": {{"type": "integer"}},
    "b": {{"type": "integer"}}}}, "required": ["a", "b"]}}}}}}]
named = {{"type": "function", "function": {{"name": "add"}}}}
off = {{"chat_template_kwargs": {{"enable_thinking": False}}}}
r = client.chat.completions.create(model="{model}", messages=messages, max_tokens=200,
    temperature=0, tools=tools, tool_choice=named, extra_body=off)
call = r.choices[0].message.tool_calls[0]
# The reply sent back with its reasoning continues the chat.
replay = {{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content}}
again = client.chat.completions.create(model="{model}", max_tokens=5, temperature=0,
    messages=messages + [replay, {{"role": "user", "content": "And 3 + 3?"}}])
bare = client.chat.completions.create(model="{model}", max_tokens=5, temperature=0,
    messages=messages + [{{"role": "assistant", "content": m.content}},
        {{"role": "user", "content": "And 3 + 3?"}}])
out["replayed_prompt_tokens"] = [again.usage.prompt_tokens, bare.usage.prompt_tokens]
out["sdk_call"] = [call.function.name, json.loads(call.function.arguments),
    r.choices[0].finish_reason]
llm = ChatOpenAI(model="{model}", base_url=base, temperature=0, max_tokens=60,
    extra_body=extra)
a = llm.invoke("What is 2 + 2?")
out["langchain"] = [a.content, a.usage_metadata["output_token_details"].get("reasoning")]
bound = ChatOpenAI(model="{model}", base_url=base, temperature=0, max_tokens=200,
    extra_body=off).bind_tools(tools, tool_choice="add")
a = bound.invoke("What is 2 + 2?")
out["langchain_call"] = [a.tool_calls[0]["name"], sorted(a.tool_calls[0]["args"])]
print(json.dumps(out))
"#,
        model = real_model::MODEL,
        response_format = forced["response_format"],
    );
    let printed = run_python_client(&script, &server.url("/v1")).await;
    let out: Value = serde_json::from_str(printed.trim()).expect("the script prints JSON");
    let reasoning = format!("\"{REASONING}");
    let answer = format!("{ANSWER}\"");
    assert_eq!(out["reasoning"], reasoning, "{out}");
    assert_eq!(out["content"], answer, "{out}");
    let reasoning_tokens = out["reasoning_tokens"].as_u64().expect("count");
    assert!(reasoning_tokens > 0, "{out}");
    assert_eq!(
        out["streamed"],
        json!({"reasoning": reasoning, "content": answer})
    );
    // The replayed reasoning reached the template: the prompt is longer by it.
    let replayed = &out["replayed_prompt_tokens"];
    assert!(
        replayed[0].as_u64().unwrap() > replayed[1].as_u64().unwrap() + 3,
        "{out}"
    );
    assert_eq!(out["sdk_call"][0], "add", "{out}");
    assert!(
        out["sdk_call"][1]["a"].is_i64() && out["sdk_call"][1]["b"].is_i64(),
        "{out}"
    );
    assert_eq!(out["sdk_call"][2], "tool_calls", "{out}");
    assert_eq!(out["langchain"], json!([answer, reasoning_tokens]), "{out}");
    assert_eq!(out["langchain_call"], json!(["add", ["a", "b"]]), "{out}");
}

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat_templates")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn render(template: &str, variables: Value) -> String {
    let messages = [ChatMessage {
        role: "user".into(),
        content: "What is 2 + 2?".into(),
        ..ChatMessage::default()
    }];
    ChatTemplate::new(template)
        .expect("the template compiles")
        .render(&TemplateContext {
            messages: &messages,
            add_generation_prompt: true,
            bos_token: "",
            eos_token: "",
            unk_token: None,
            pad_token: None,
            tools: None,
            variables: variables.as_object(),
        })
        .expect("the template renders")
}

/// gpt-oss's template takes `reasoning_effort` and leaves the reply to start with a header
/// (the harmony reader's first state); Qwen3's opens no block unless the model writes one and
/// closes one at once with `enable_thinking: false`, so its replies start outside.
#[test]
fn real_templates_render_what_the_readers_expect() {
    let gpt_oss = fixture("openai-gpt-oss-120b.jinja");
    assert_eq!(
        ReasoningFormat::from_template(Some(&gpt_oss)),
        Some(ReasoningFormat::Harmony)
    );
    let low = render(&gpt_oss, json!({"reasoning_effort": "low"}));
    assert!(low.contains("Reasoning: low\n"), "{low}");
    assert!(low.ends_with("<|start|>assistant"), "{low}");
    assert!(render(&gpt_oss, json!({})).contains("Reasoning: medium\n"));

    let qwen3 = fixture("Qwen-Qwen3-0.6B.jinja");
    assert_eq!(
        ReasoningFormat::from_template(Some(&qwen3)),
        Some(ReasoningFormat::Think)
    );
    for (variables, tail) in [
        (json!({}), "<|im_start|>assistant\n"),
        (
            json!({"enable_thinking": false}),
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
    ] {
        let prompt = render(&qwen3, variables);
        assert!(prompt.ends_with(tail), "{prompt:?}");
        let parsing = ReasoningParsing::for_prompt(ReasoningFormat::Think, &prompt);
        assert!(!parsing.starts_inside, "{prompt:?}");
    }
    let opened = render(THINK_TEMPLATE, json!({}));
    assert!(ReasoningParsing::for_prompt(ReasoningFormat::Think, &opened).starts_inside);
}

/// `/v1/responses` returns the reasoning as a `reasoning` item before the message, streamed as
/// `response.reasoning_text.delta` events, with the reasoning tokens in its usage.
#[tokio::test]
async fn responses_return_a_reasoning_item() {
    let server = Loopback::start(backend(ReasoningChoice::Auto), ServerOptions::default()).await;
    let chat = request(false, json!({}));
    let schema = &chat["response_format"]["json_schema"]["schema"];
    let body = |stream: bool| {
        json!({
            "model": real_model::MODEL,
            "input": "What is 2 + 2?",
            "max_output_tokens": 60,
            "temperature": 0,
            "stream": stream,
            "text": {"format": {"type": "json_schema", "name": "forced", "schema": schema}},
        })
    };
    let post = |body: Value| {
        let url = server.url("/v1/responses");
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .expect("response");
            assert_eq!(response.status(), 200);
            response.text().await.expect("body")
        }
    };
    let whole: Value = serde_json::from_str(&post(body(false)).await).expect("JSON");
    let output = whole["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{whole}");
    assert_eq!(output[0]["type"], "reasoning", "{whole}");
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(output[0]["content"][0]["text"], format!("\"{REASONING}"));
    assert_eq!(output[1]["type"], "message", "{whole}");
    assert_eq!(output[1]["content"][0]["text"], format!("{ANSWER}\""));
    let reasoning_tokens = whole["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("count");
    assert!(reasoning_tokens > 0, "{whole}");

    let sse = post(body(true)).await;
    // Named events: `event: NAME` then `data: {..}`.
    let events: Vec<Value> = sse
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).expect("event JSON"))
        .collect();
    let of = |kind: &str| -> String {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        of("response.reasoning_text.delta"),
        format!("\"{REASONING}")
    );
    assert_eq!(of("response.output_text.delta"), format!("{ANSWER}\""));
    let done = events.last().expect("events");
    assert_eq!(done["type"], "response.completed");
    assert_eq!(
        done["response"]["output"][0]["content"],
        output[0]["content"]
    );
    assert_eq!(
        done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
        reasoning_tokens
    );
}

/// Only an assistant message may carry `reasoning_content`, and it must be a string.
#[tokio::test]
async fn reasoning_content_in_the_history_is_checked() {
    let server = Loopback::start(backend(ReasoningChoice::Auto), ServerOptions::default()).await;
    for (messages, param) in [
        (
            json!([{"role": "user", "content": "hi", "reasoning_content": "x"}]),
            "messages[0].reasoning_content",
        ),
        (
            json!([{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo", "reasoning_content": 3}]),
            "messages[1].reasoning_content",
        ),
    ] {
        let response = reqwest::Client::new()
            .post(server.url("/v1/chat/completions"))
            .json(&json!({"model": real_model::MODEL, "messages": messages, "max_tokens": 1}))
            .send()
            .await
            .expect("response");
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
}

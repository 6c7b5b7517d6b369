//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template` or
//! `chat_template` in tokenizer_config.json), rendered with minijinja the way Hugging Face
//! transformers renders it with Jinja2.
//!
//! Like transformers' `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, a trailing
//! newline of the template dropped, variables `messages`, `tools` (the tool definitions when
//! the request offers some, else none) and `documents` (none),
//! `add_generation_prompt`, `bos_token`, `eos_token` (plus `unk_token`/`pad_token` when known),
//! and the helpers transformers' `_compile_jinja_template` adds: `raise_exception(msg)` (aborts
//! rendering with `msg`), `strftime_now(format)` (the local time through Python's `strftime`
//! codes, from a [`TemplateClock`]), a `tojson` filter that writes JSON as Python's `json.dumps`
//! does ([`super::template_json`]), loop controls (`break`, `continue`) and the
//! `{% generation %}` block of its `AssistantTracker` extension (rendered as its body). Python
//! string/dict methods (`.strip()`, `.startswith()`, `.items()`, ...) come from minijinja-contrib's
//! pycompat callback.

use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;

use super::template_json::tojson;
use crate::error::{ModelError, Result};

pub use ferry_chat::ChatMessage;

/// Name of the single template in the environment.
const NAME: &str = "chat";

/// Everything a chat template is rendered with.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateContext<'a> {
    /// The conversation.
    pub messages: &'a [ChatMessage],
    /// End with the header of an assistant turn, so the model writes the reply.
    pub add_generation_prompt: bool,
    /// The BOS token's text (`""` when the model has none, so templates can still concatenate it).
    pub bos_token: &'a str,
    /// The EOS token's text (`""` when unknown).
    pub eos_token: &'a str,
    /// The unknown token's text, when the model has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unk_token: Option<&'a str>,
    /// The padding token's text, when the model has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_token: Option<&'a str>,
    /// The offered tools (`{"type": "function", "function": {..}}` each), or none.
    pub tools: Option<&'a [serde_json::Value]>,
    /// More variables, as transformers' `apply_chat_template(**kwargs)` takes them (a request's
    /// `chat_template_kwargs`: `enable_thinking`, `reasoning_effort`, ...); they cannot replace
    /// the ones above (`ferry_chat::RESERVED_TEMPLATE_VARIABLES`: the server refuses them, and
    /// [`ChatTemplate::render`] drops them).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub variables: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The variable transformers always passes besides the context (`documents=None`), so
/// `{% if documents is not none %}` reads as it does under Jinja2.
#[derive(Serialize)]
struct Rendered<'a> {
    #[serde(flatten)]
    ctx: &'a TemplateContext<'a>,
    documents: Option<()>,
}

/// Where `strftime_now` reads the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TemplateClock {
    /// The machine's local time, as Python's `datetime.now()` (the default).
    #[default]
    Local,
    /// A fixed moment, for reproducible renders (tests, fixtures).
    Fixed(chrono::NaiveDateTime),
}

impl TemplateClock {
    fn now(self) -> chrono::NaiveDateTime {
        match self {
            Self::Local => chrono::Local::now().naive_local(),
            Self::Fixed(at) => at,
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source_len: usize,
    /// gpt-oss's harmony markup: its `reasoning_effort` takes three values ([`harmony_effort`]).
    harmony: bool,
}

/// The turn markup a template's source writes, as the start log names it: `chatml`
/// (`<|im_start|>`), `llama3` (`<|start_header_id|>`), `harmony` (gpt-oss's `<|channel|>`),
/// `gemma` (`<start_of_turn>`), `mistral` (`[INST]`), `phi3` (`<|user|>`), else `custom`.
pub fn markup_family(source: &str) -> &'static str {
    const FAMILIES: [(&str, &str); 6] = [
        ("<|im_start|>", "chatml"),
        ("<|start_header_id|>", "llama3"),
        ("<|channel|>", "harmony"),
        ("<start_of_turn>", "gemma"),
        ("[INST]", "mistral"),
        ("<|user|>", "phi3"),
    ];
    FAMILIES
        .iter()
        .find(|(marker, _)| source.contains(marker))
        .map_or("custom", |(_, family)| family)
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source_len)
            .finish()
    }
}

/// The error `raise_exception` raises, kept as the source of minijinja's error so the message
/// can be handed back verbatim.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

impl ChatTemplate {
    /// Compiles `source` with `strftime_now` on the local clock; a syntax error is a
    /// [`ModelError::Template`].
    pub fn new(source: &str) -> Result<Self> {
        Self::with_clock(source, TemplateClock::Local)
    }

    /// Compiles `source` with `strftime_now` reading `clock`.
    pub fn with_clock(source: &str, clock: TemplateClock) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String| {
            strftime(clock.now(), &format)
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, without_generation_tags(source))
            .map_err(|e| ModelError::Template(format!("cannot compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source_len: source.len(),
            harmony: markup_family(source) == "harmony",
        })
    }

    /// Renders the template. A `raise_exception(msg)` in the template gives
    /// `ModelError::Template(msg)`; other failures describe the minijinja error.
    pub fn render(&self, ctx: &TemplateContext<'_>) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::Template(describe(&e)))?;
        let mut vars = ctx.variables.map(std::borrow::Cow::Borrowed);
        if let Some(v) = vars.as_mut().filter(|v| {
            v.keys()
                .any(|k| ferry_chat::RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
        }) {
            v.to_mut()
                .retain(|k, _| !ferry_chat::RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()));
        }
        if let Some(v) = vars.as_mut().filter(|_| self.harmony) {
            let nearest = v
                .get("reasoning_effort")
                .and_then(|e| e.as_str())
                .and_then(harmony_effort);
            if let Some(nearest) = nearest {
                v.to_mut().insert("reasoning_effort".into(), nearest.into());
            }
        }
        let ctx = &TemplateContext {
            variables: vars.as_deref(),
            ..ctx.clone()
        };
        template
            .render(Value::from_serialize(Rendered {
                ctx,
                documents: None,
            }))
            .map_err(|e| match raised_message(&e) {
                Some(msg) => ModelError::Template(msg),
                None => ModelError::Template(format!("cannot render: {}", describe(&e))),
            })
    }
}

/// The `reasoning_effort` gpt-oss's harmony format takes for one of OpenAI's values it does not
/// know (its system message says `Reasoning: low`, `medium` or `high`): the nearest, `none` and
/// `minimal` to `low`, `xhigh` to `high`; `None` for the three it knows (and anything else, left
/// to the template).
fn harmony_effort(effort: &str) -> Option<&'static str> {
    match effort {
        "none" | "minimal" => Some("low"),
        "xhigh" => Some("high"),
        _ => None,
    }
}

/// `raise_exception(msg)`: stop rendering with `msg` as the error.
fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedByTemplate(msg)))
}

/// `strftime_now(format)`: `at` written with Python's `strftime` codes (`%Y-%m-%d`, `%d %b %Y`).
/// An unknown code is a template error rather than a panic.
fn strftime(at: chrono::NaiveDateTime, format: &str) -> std::result::Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format `{format}`"),
        ));
    }
    Ok(at.format_with_items(items.into_iter()).to_string())
}

/// `{% generation %}`/`{% endgeneration %}` (transformers' `AssistantTracker`, which marks the
/// assistant's tokens) become an always-true `if`, keeping their whitespace control.
fn without_generation_tags(source: &str) -> String {
    static TAG: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| {
        regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("static regex")
    });
    tag.replace_all(source, |c: &regex::Captures<'_>| {
        let body = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {body} {}%}}", &c[1], &c[3])
    })
    .into_owned()
}

/// The message of a `raise_exception` somewhere in `err`'s source chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(raised) = e.downcast_ref::<RaisedByTemplate>() {
            return Some(raised.0.clone());
        }
        cur = e.source();
    }
    None
}

/// One line for a minijinja error: kind, detail and template line.
fn describe(err: &Error) -> String {
    err.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_templates_name_their_markup() {
        let dir = ferry_testkit::repo_root().join("tests/fixtures/chat_templates");
        let cases = [
            ("Qwen-Qwen3-0.6B.jinja", "chatml"),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
            ("openai-gpt-oss-120b.jinja", "harmony"),
            ("google-gemma-3-it.jinja", "gemma"),
            ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
            ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3"),
        ];
        for (file, family) in cases {
            let source = std::fs::read_to_string(dir.join(file)).expect("fixture");
            assert_eq!(markup_family(&source), family, "{file}");
        }
        assert_eq!(markup_family("{{ messages }}"), "custom");
    }

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage {
                role: "system".into(),
                content: "  Be brief.  ".into(),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "user".into(),
                content: "Héllo \"you\"\n".into(),
                ..ChatMessage::default()
            },
        ]
    }

    fn render(src: &str, add_gen: bool) -> Result<String> {
        let m = msgs();
        ChatTemplate::new(src)?.render(&TemplateContext {
            messages: &m,
            add_generation_prompt: add_gen,
            bos_token: "<s>",
            eos_token: "</s>",
            unk_token: None,
            pad_token: None,
            tools: None,
            variables: None,
        })
    }

    #[test]
    fn request_variables_reach_the_template_but_never_replace_its_own() {
        let m = msgs();
        let src = "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}\
                   [{{ reasoning_effort | default('medium') }}]{{ bos_token }}{{ messages | length }}";
        let template = ChatTemplate::new(src).unwrap();
        let render = |variables: Option<&serde_json::Map<String, serde_json::Value>>| {
            template
                .render(&TemplateContext {
                    messages: &m,
                    add_generation_prompt: true,
                    bos_token: "<s>",
                    eos_token: "</s>",
                    unk_token: None,
                    pad_token: None,
                    tools: None,
                    variables,
                })
                .unwrap()
        };
        assert_eq!(render(None), "[medium]<s>2");
        let vars = serde_json::json!({
            "enable_thinking": false, "reasoning_effort": "low",
            "bos_token": "EVIL", "messages": []
        });
        assert_eq!(render(vars.as_object()), "<no-think>[low]<s>2");
    }

    #[test]
    fn a_harmony_template_gets_the_nearest_of_its_three_reasoning_efforts() {
        let m = msgs();
        let render = |src: &str, effort: &str| {
            let vars = serde_json::json!({ "reasoning_effort": effort });
            ChatTemplate::new(src)
                .unwrap()
                .render(&TemplateContext {
                    messages: &m,
                    add_generation_prompt: true,
                    bos_token: "",
                    eos_token: "",
                    unk_token: None,
                    pad_token: None,
                    tools: None,
                    variables: vars.as_object(),
                })
                .unwrap()
        };
        let harmony = "<|start|>system<|message|>Reasoning: {{ reasoning_effort }}<|end|>\
                       {{ '<|start|>assistant<|channel|>' }}";
        for (asked, given) in [
            ("none", "low"),
            ("minimal", "low"),
            ("low", "low"),
            ("medium", "medium"),
            ("high", "high"),
            ("xhigh", "high"),
        ] {
            let out = render(harmony, asked);
            assert!(
                out.contains(&format!("Reasoning: {given}<")),
                "{asked}: {out}"
            );
        }
        // Any other template gets the value as sent.
        assert_eq!(render("[{{ reasoning_effort }}]", "xhigh"), "[xhigh]");
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n    {{ m.role }}|\n{% endfor %}\n";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "<s>\n    system|\n    user|\n"
        );
    }

    #[test]
    fn pycompat_methods_and_loop_controls() {
        let src = "{% for m in messages %}{% if m.role.startswith('sys') %}[{{ m.content.strip() }}]{% continue %}{% endif %}{{ m.content.upper().rstrip() }}{% break %}{% endfor %}";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "[Be brief.]HÉLLO \"YOU\""
        );
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let src = "{{ messages[1] | tojson }}|{{ {'b': [1, 2.5, none, true], 'a': {}} | tojson(sort_keys=true) }}|{{ [1, [2]] | tojson(indent=2) }}";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "{\"role\": \"user\", \"content\": \"Héllo \\\"you\\\"\\n\"}|{\"a\": {}, \"b\": [1, 2.5, null, true]}|[\n  1,\n  [\n    2\n  ]\n]"
        );
    }

    #[test]
    fn generation_blocks_tools_and_documents_read_like_transformers() {
        let src = "{%- generation -%} [{{ messages[0].role }}] {%- endgeneration %}|{{ tools is none }}|{{ documents is none }}|{{ tools is not none }}";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "[system]|True|True|False"
        );
    }

    #[test]
    fn a_message_name_is_there_for_templates_that_use_it() {
        let mut m = msgs();
        m[1].name = Some("alice".into());
        let src = "{% for m in messages %}{{ m.role }}{% if m.name is defined %}({{ m.name }}){% endif %};{% endfor %}";
        let out = ChatTemplate::new(src)
            .unwrap()
            .render(&TemplateContext {
                messages: &m,
                add_generation_prompt: false,
                bos_token: "",
                eos_token: "",
                unk_token: None,
                pad_token: None,
                tools: None,
                variables: None,
            })
            .unwrap();
        assert_eq!(out, "system;user(alice);", "absent names stay undefined");
    }

    #[test]
    fn tools_and_tool_calls_are_there_for_templates_that_use_them() {
        let m = vec![ChatMessage {
            role: "assistant".into(),
            tool_calls: Some(vec![
                serde_json::json!({"function": {"name": "f", "arguments": {"a": 1}}}),
            ]),
            ..ChatMessage::default()
        }];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let src = "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{{ m.tool_call_id is defined }}{% endfor %}";
        let out = ChatTemplate::new(src)
            .unwrap()
            .render(&TemplateContext {
                messages: &m,
                add_generation_prompt: false,
                bos_token: "",
                eos_token: "",
                unk_token: None,
                pad_token: None,
                tools: Some(&tools),
                variables: None,
            })
            .unwrap();
        assert_eq!(out, "f;f{\"a\": 1}False");
    }

    #[test]
    fn strftime_now_with_a_bad_format_is_a_template_error() {
        match render("{{ strftime_now('%Q') }}", false) {
            Err(ModelError::Template(msg)) => assert!(msg.contains("strftime_now"), "{msg}"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    #[test]
    fn raise_exception_message_comes_back() {
        let src = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}";
        match render(src, true) {
            Err(ModelError::Template(msg)) => assert_eq!(msg, "System role not supported"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_are_template_errors() {
        match ChatTemplate::new("{% for m in messages %}") {
            Err(ModelError::Template(msg)) => assert!(msg.contains("cannot compile"), "{msg}"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }
}

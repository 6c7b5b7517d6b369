//! The real chat templates of Qwen3, Llama 3.1/3.2, Phi-3.5, Mistral Nemo / Small 3.2, gpt-oss and
//! Gemma 2/3 rendered by ferry, against Jinja2 set up as Hugging Face transformers sets it up
//! (tests/fixtures/chat_templates/renders.json, made by scripts/make-tokenizer-fixture-templates.py
//! with `strftime_now` on a fixed clock).

use crate::fixtures::messages;

use std::path::PathBuf;

use ferry::model::tokenizer::chat_template::{ChatTemplate, TemplateClock, TemplateContext};
use ferry::model::ModelError;
use serde_json::Value as Json;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

fn renders() -> Json {
    let text = std::fs::read_to_string(dir().join("renders.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn fixed_clock(fx: &Json) -> TemplateClock {
    let at =
        chrono::NaiveDateTime::parse_from_str(fx["clock"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S")
            .unwrap();
    TemplateClock::Fixed(at)
}

#[test]
fn real_templates_render_like_transformers() {
    let fx = renders();
    let clock = fixed_clock(&fx);
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 50, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(dir().join(name)).unwrap();
        let template = ChatTemplate::with_clock(&source, clock)
            .unwrap_or_else(|e| panic!("{name} does not compile: {e}"));
        let tokens = &case["tokens"];
        let text = |key: &str| tokens[key].as_str();
        let msgs = messages(case);
        let got = template.render(&TemplateContext {
            messages: &msgs,
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            bos_token: text("bos_token").unwrap_or(""),
            eos_token: text("eos_token").unwrap_or(""),
            unk_token: text("unk_token"),
            pad_token: text("pad_token"),
            tools: None,
            variables: None,
        });
        let ok = match (&got, case.get("rendered"), case.get("error")) {
            (Ok(out), Some(want), _) => out == want.as_str().unwrap(),
            (Err(ModelError::Template(msg)), None, Some(want)) => msg == want.as_str().unwrap(),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{name} ({} messages): got {got:?}\n  want {:?}",
                msgs.len(),
                case.get("rendered").or(case.get("error"))
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn strftime_now_reads_the_clock() {
    let at = chrono::NaiveDate::from_ymd_opt(2024, 7, 26)
        .and_then(|d| d.and_hms_opt(8, 5, 0))
        .unwrap();
    let template = ChatTemplate::with_clock(
        "{{ strftime_now('%d %b %Y|%Y-%m-%d %H:%M|%A') }}",
        TemplateClock::Fixed(at),
    )
    .unwrap();
    let ctx = TemplateContext {
        messages: &[],
        add_generation_prompt: false,
        bos_token: "",
        eos_token: "",
        unk_token: None,
        pad_token: None,
        tools: None,
        variables: None,
    };
    assert_eq!(
        template.render(&ctx).unwrap(),
        "26 Jul 2024|2024-07-26 08:05|Friday"
    );
    // The local clock gives this year, whatever it is.
    let local = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
    let year: i32 = local.render(&ctx).unwrap().parse().unwrap();
    assert!(year >= 2025, "{year}");
}

//! gpt-oss's harmony calls: a `commentary` message addressed to the function,
//! `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`. The
//! reply's channels, calls included, are read by [`crate::reasoning::harmony`] (the markers
//! are special tokens, so no text reader of this module's kind could see them); this file
//! writes a past call for the history and the grammar that forces one.

use crate::reasoning::harmony::{CALL, CHANNEL, CONSTRAIN, END, MESSAGE, START};

use super::ToolSpec;

/// How the gpt-oss template writes a past call.
pub fn render_call(name: &str, arguments: &str) -> String {
    format!(
        "{START}assistant to=functions.{name}{CHANNEL}commentary json{MESSAGE}{arguments}{CALL}"
    )
}

/// The Lark grammar of one call of `tools`, after an optional `analysis` message (gpt-oss
/// thinks before it calls). A call ends the reply (`<|call|>` is an end-of-generation token),
/// so `parallel_tool_calls` makes no difference. The markers are written as llguidance's
/// special-token references, so they match the tokens themselves, never text spelling them.
pub fn lark(tools: &[ToolSpec], args: impl Fn(&ToolSpec) -> String) -> String {
    let calls: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let header = serde_json::to_string(&format!("commentary to=functions.{} ", tool.name))
                .unwrap_or_default();
            format!(
                "call_{i}: {CHANNEL} {header} {CONSTRAIN} \"json\" {MESSAGE} {}",
                args(tool)
            )
        })
        .collect();
    let alternatives: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    let mut grammar = format!(
        "start: analysis? call\n\
         analysis: {CHANNEL} \"analysis\" {MESSAGE} ANALYSIS {END} {START} \"assistant\"\n\
         ANALYSIS: /(.|\\n)*/\n\
         call: {}\n",
        alternatives.join(" | ")
    );
    for rule in calls {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    grammar
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::grammar::{GrammarCompiler, GrammarSpec, GrammarState};
    use crate::reasoning::{ReasoningFormat, ReasoningParsing, ReplyReader};
    use crate::test_support::TestCodec;
    use crate::tool_calls::{constrain, ToolCallFormat};
    use crate::traits::TextCodec;

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"], "additionalProperties": false}),
            },
            ToolSpec {
                name: "ping".into(),
                description: None,
                parameters: json!({}),
            },
        ]
    }

    /// Whether the grammar lets the model write `tokens` (then end).
    fn accepts(state: &mut GrammarState, tokens: &[u32], vocab: usize) -> Result<(), usize> {
        let mut logits = vec![0.0f32; vocab];
        for (i, &t) in tokens.iter().enumerate() {
            logits.fill(0.0);
            state.mask(&mut logits).expect("mask");
            if !logits[t as usize].is_finite() {
                return Err(i);
            }
            state.commit(t).expect("commit");
        }
        Ok(())
    }

    #[test]
    fn the_grammar_forces_a_commentary_call_made_of_the_special_tokens() {
        let codec = TestCodec::harmony();
        let vocab = codec.vocab_size();
        let compiler = GrammarCompiler::new(&codec, vocab).expect("compiler");
        let lark = constrain::lark(ToolCallFormat::Harmony, &tools(), true);
        let grammar = compiler
            .compile(&GrammarSpec::Lark(lark.clone()))
            .unwrap_or_else(|e| panic!("{e}\n{lark}"));
        let call_token = codec.encode(CALL, false).expect("encode")[0];
        let harmony = Some(ReasoningParsing::for_prompt(ReasoningFormat::Harmony, ""));
        for (text, reasoning) in [
            (
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
                "",
            ),
            (
                "<|channel|>analysis<|message|>He wants the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
                "He wants the weather.",
            ),
        ] {
            let tokens = codec.encode(text, false).expect("encode");
            let mut state = GrammarState::new(&grammar);
            accepts(&mut state, &tokens, vocab).unwrap_or_else(|i| panic!("token {i} of {text:?}"));
            let mut logits = vec![0.0f32; vocab];
            state.mask(&mut logits).expect("mask");
            assert!(logits[call_token as usize].is_finite(), "<|call|> ends it");
            // The reply decodes with its markers (special tokens kept) and reads back.
            let decoded = codec.decode(&tokens, false).expect("decode");
            assert_eq!(decoded, text);
            let read = ReplyReader::parse(harmony, None, &decoded);
            assert_eq!(read.reasoning, reasoning);
            assert_eq!(read.output.calls.len(), 1, "{read:?}");
            assert_eq!(read.output.calls[0].name, "get_weather");
            assert_eq!(read.output.calls[0].arguments, "{\"city\": \"Paris\"}");
            assert_eq!(read.output.content, "");
        }
        // The markers spelled as text are not the tokens, and a final answer is no call.
        for text in [
            "<|channel|>final<|message|>It is sunny.",
            "channel commentary to=functions.get_weather",
        ] {
            let tokens = codec.encode(text, false).expect("encode");
            let mut state = GrammarState::new(&grammar);
            assert!(accepts(&mut state, &tokens, vocab).is_err(), "{text:?}");
        }
        let spelled: Vec<u32> = "<|channel|>".bytes().map(u32::from).collect();
        assert_eq!(
            accepts(&mut GrammarState::new(&grammar), &spelled, vocab),
            Err(0)
        );
    }

    #[test]
    fn a_past_call_is_written_as_the_template_writes_it() {
        assert_eq!(
            render_call("get_weather", "{\"city\":\"Oslo\"}"),
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}<|call|>"
        );
    }
}

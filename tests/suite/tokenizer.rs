//! Tokenizer and chat template against an independent reference: ids, decodes and chat renderings
//! that Hugging Face transformers produced for SmolLM2-135M-Instruct's GGUF
//! (tests/fixtures/tokenizer_smollm2.json, made by scripts/make-tokenizer-fixture.py).

use crate::fixtures::{self, ids, messages};
use crate::real_model;
use real_model::model_path;

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
use ferry::engine::ChatMessage;
use ferry::model::tokenizer::TextTokenizer;
use ferry::model::ModelError;
use serde_json::Value as Json;

fn crate_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gguf_tokenizer() -> TextTokenizer {
    let path = model_path();
    let mut file = File::open(&path).unwrap();
    let content = Content::read(&mut file).unwrap();
    TextTokenizer::from_gguf(&content).unwrap()
}

fn fixture() -> Json {
    fixtures::json("tokenizer_smollm2.json")
}

/// Every fixture string: ids, ids with special tokens, decode and decode-skipping-specials.
fn check_cases(tok: &TextTokenizer, fx: &Json) {
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() > 30);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(
            tok.encode(text, false).unwrap(),
            expected,
            "ids of {text:?}"
        );
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["ids_with_special_tokens"]),
            "ids with special tokens of {text:?}"
        );
        assert_eq!(
            tok.decode(&expected, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
        assert_eq!(
            tok.decode(&expected, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decode skipping special tokens of {text:?}"
        );
    }
}

fn check_chats(tok: &TextTokenizer, fx: &Json) {
    for chat in fx["chats"].as_array().unwrap() {
        let rendered = tok
            .apply_chat_template(
                &messages(chat),
                chat["add_generation_prompt"].as_bool().unwrap(),
            )
            .unwrap();
        assert_eq!(rendered, chat["rendered"].as_str().unwrap());
        assert_eq!(tok.encode(&rendered, false).unwrap(), ids(&chat["ids"]));
    }
}

#[test]
fn gguf_ids_and_decodes_match_reference() {
    check_cases(&gguf_tokenizer(), &fixture());
}

#[test]
fn gguf_follows_original_pre_tokenizer_where_hf_conversion_differs() {
    // Whitespace between digits: SmolLM2's tokenizer.json and llama.cpp split digits first.
    let tok = gguf_tokenizer();
    let fx = fixture();
    let disagreements = fx["hf_gguf_disagreements"].as_array().unwrap();
    assert!(!disagreements.is_empty());
    for d in disagreements {
        let text = d["text"].as_str().unwrap();
        let ours = tok.encode(text, false).unwrap();
        assert_eq!(ours, ids(&d["original_pre_tokenizer"]), "{text:?}");
        assert_ne!(ours, ids(&d["hf_gguf_conversion"]), "{text:?}");
    }
    assert_eq!(
        tok.encode(" 7 8  9", false).unwrap(),
        [216, 39, 216, 40, 256, 41]
    );
}

#[test]
fn gguf_special_tokens_and_vocab() {
    let tok = gguf_tokenizer();
    let fx = fixture();
    assert_eq!(
        tok.encode("The capital of France is", false).unwrap(),
        [504, 3575, 282, 4649, 314]
    );
    assert_eq!(
        tok.vocab_size(),
        fx["vocab_size"].as_u64().unwrap() as usize
    );
    assert_eq!(
        tok.bos_token_id(),
        Some(fx["bos_token_id"].as_u64().unwrap() as u32)
    );
    assert!(!tok.adds_bos());
    // The model's EOS (<|im_end|>) first, then the rest of llama.cpp's end-of-generation set for
    // this file (llama-cpp-python 0.3.36 reports {0, 2, 4}): <|endoftext|> and the FIM repo token
    // <reponame>.
    assert_eq!(tok.eos_token_ids(), [2, 0, 4]);
    assert_eq!(tok.token_text(2).as_deref(), Some("<|im_end|>"));
    assert!(tok.is_special(2) && !tok.is_special(504));
    assert_eq!(tok.token_text(216).as_deref(), Some(" "));
    assert_eq!(tok.token_text(u32::MAX), None);
    assert!(tok.token_bytes(u32::MAX).is_empty());
}

#[test]
fn token_bytes_concatenate_to_the_text() {
    // Byte-level tokens may hold part of a UTF-8 character (emoji, CJK): bytes must still add up.
    let tok = gguf_tokenizer();
    for case in fixture()["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let bytes: Vec<u8> = ids(&case["ids"])
            .into_iter()
            .flat_map(|id| tok.token_bytes(id))
            .collect();
        assert_eq!(bytes, text.as_bytes(), "{text:?}");
    }
}

#[test]
fn gguf_chat_template_matches_transformers() {
    let tok = gguf_tokenizer();
    assert!(tok.has_chat_template());
    check_chats(&tok, &fixture());
}

#[test]
fn raise_exception_in_template_is_a_template_error() {
    let mut tok = gguf_tokenizer();
    tok.set_chat_template(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.content }}{% endfor %}",
    )
    .unwrap();
    let msgs = [ChatMessage {
        role: "system".into(),
        content: "x".into(),
        ..Default::default()
    }];
    match tok.apply_chat_template(&msgs, true) {
        Err(ModelError::Template(msg)) => assert_eq!(
            msg,
            "Conversation roles must alternate user/assistant/user/assistant/..."
        ),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn hf_files_match_gguf() {
    let dir = crate_root().join("tests/fixtures/smollm2-hf-tokenizer");
    let hf = TextTokenizer::from_hf_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        None,
    )
    .unwrap();
    let gguf = gguf_tokenizer();
    let fx = fixture();
    check_cases(&hf, &fx);
    check_chats(&hf, &fx);
    assert_eq!(hf.vocab_size(), gguf.vocab_size());
    assert_eq!(hf.bos_token_id(), gguf.bos_token_id());
    assert_eq!(hf.eos_token_ids().first(), gguf.eos_token_ids().first());
    for id in [0u32, 2, 216, 504, 30000, 49151] {
        assert_eq!(hf.token_text(id), gguf.token_text(id), "token {id}");
        assert_eq!(hf.token_bytes(id), gguf.token_bytes(id), "token {id}");
    }
}

#[test]
fn model_without_template_is_a_clear_error() {
    let dir = crate_root().join("tests/fixtures/smollm2-hf-tokenizer");
    let tmp = tempfile::tempdir().unwrap();
    // tokenizer.json alone, away from chat_template.jinja.
    let json = tmp.path().join("tokenizer.json");
    std::fs::copy(dir.join("tokenizer.json"), &json).unwrap();
    let tok = TextTokenizer::from_hf_files(&json, None, None).unwrap();
    assert!(!tok.has_chat_template());
    match tok.apply_chat_template(&[], true) {
        Err(ModelError::Template(msg)) => assert!(msg.contains("no chat template"), "{msg}"),
        other => panic!("expected a template error, got {other:?}"),
    }
}

/// A hand-written Llama-style tokenizer: BOS from the config, EOS ids from generation_config.
#[test]
fn hf_files_config_bos_eos_and_template_list() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let json = write(
        "tokenizer.json",
        r#"{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[
          {"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
          {"id":4,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
        "normalizer":null,
        "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
        "post_processor":null,
        "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
        "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
          "vocab":{"a":0,"b":1,"ab":2,"<s>":3,"</s>":4,"Ġ":5},"merges":[["a","b"]]}}"#,
    );
    let config = write(
        "tokenizer_config.json",
        r#"{"add_bos_token":true,"bos_token":"<s>","eos_token":{"content":"</s>","special":true},
        "chat_template":[{"name":"tool_use","template":"TOOLS"},
                         {"name":"default","template":"{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}]}"#,
    );
    let generation = write("generation_config.json", r#"{"eos_token_id":[4,2]}"#);
    let tok = TextTokenizer::from_hf_files(&json, Some(&config), Some(&generation)).unwrap();
    assert!(tok.adds_bos());
    assert_eq!(tok.bos_token_id(), Some(3));
    assert_eq!(tok.eos_token_ids(), [4, 2]);
    assert_eq!(tok.encode("ab b", true).unwrap(), [3, 2, 5, 1]);
    assert_eq!(tok.encode("ab b", false).unwrap(), [2, 5, 1]);
    assert_eq!(tok.decode(&[3, 2, 5, 1, 4], true).unwrap(), "ab b");
    let msgs = [ChatMessage {
        role: "user".into(),
        content: "ab".into(),
        ..Default::default()
    }];
    assert_eq!(
        tok.apply_chat_template(&msgs, false).unwrap(),
        "<s>[user]ab</s>"
    );
}

fn tiny_gguf(model: &str, pre: &str) -> Content {
    let strings =
        |v: &[&str]| Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect());
    let metadata: HashMap<String, Value> = [
        ("tokenizer.ggml.model", Value::String(model.into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "<|eot_id|>", "Ġ"]),
        ),
        ("tokenizer.ggml.merges", strings(&["a b"])),
        (
            "tokenizer.ggml.token_type",
            Value::Array([1, 1, 1, 3, 1].into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(3)),
        ("tokenizer.ggml.eos_token_id", Value::U32(3)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Content {
        magic: VersionedMagic::GgufV3,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

#[test]
fn gguf_llama_bpe_adds_bos_by_default_and_unknown_pre_is_an_error() {
    let tok = TextTokenizer::from_gguf(&tiny_gguf("gpt2", "llama-bpe")).unwrap();
    assert!(tok.adds_bos());
    assert_eq!(tok.encode("ab<|eot_id|> b", true).unwrap(), [3, 2, 3, 4, 1]);
    assert_eq!(tok.eos_token_ids(), [3]);

    match TextTokenizer::from_gguf(&tiny_gguf("gpt2", "made-up-pre")) {
        Err(ModelError::Unsupported(msg)) => assert!(msg.contains("made-up-pre"), "{msg}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match TextTokenizer::from_gguf(&tiny_gguf("bert", "default")) {
        Err(ModelError::Unsupported(msg)) => assert!(msg.contains("bert"), "{msg}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // SentencePiece vocabularies ignore `tokenizer.ggml.pre`, as llama.cpp does.
    assert!(TextTokenizer::from_gguf(&tiny_gguf("llama", "made-up-pre")).is_ok());
}

/// The tokenizer a load builds (ferry's header, the vocabulary read in place from the mapped
/// file) gives the reference ids, decodes and chats too.
#[test]
fn gguf_read_in_place_matches_reference() {
    let files = ferry::model::source::ModelFiles::Gguf { path: model_path() };
    let checkpoint = ferry::model::checkpoint::Checkpoint::open(&files).unwrap();
    let tok = TextTokenizer::from_gguf_metadata(checkpoint.gguf_metadata().unwrap()).unwrap();
    let fx = fixture();
    check_cases(&tok, &fx);
    check_chats(&tok, &fx);
    let json = |t: &TextTokenizer| t.inner().to_string(false).unwrap();
    assert!(json(&tok) == json(&gguf_tokenizer()), "pipelines differ");
}

//! GGUF tokenizers against llama.cpp: the vocabulary-only GGUFs in tests/fixtures/tokenizer-llamacpp/
//! (a real SentencePiece vocabulary, Phi-3's, from llama.cpp's own test models; a Gemma-style
//! SentencePiece vocabulary and Qwen2-, Llama-3- and regex-probe byte-level BPE vocabularies
//! trained on corpus.txt) and the ids llama.cpp gave an awkward-strings list on each, per
//! metadata variant (scripts/make-tokenizer-fixture-llamacpp.py). Every id must be equal; the
//! only exceptions are listed in the fixture (`ids_original_regex`: `gpt-4o`/`tekken` strings
//! where llama.cpp's approximated regex cuts words differently from the model's own regex, which
//! ferry follows).

use crate::fixtures::ids;

use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value};
use ferry::model::tokenizer::TextTokenizer;
use serde_json::Value as Json;

/// gpt-oss's harmony markers, which llama.cpp turns into user-defined tokens (matched in text even
/// when special tokens are not parsed; `<|end|>` too when the vocabulary has `<|return|>` and
/// `<|call|>`). ferry keeps them control tokens, so chat content that spells them stays text (no
/// role injection); without special parsing ferry's ids differ from llama.cpp's there by design.
const HARMONY_MARKERS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The harmony markers of `text` that llama.cpp matches as user-defined tokens in `tok`'s vocabulary.
fn harmony_markers_in(tok: &TextTokenizer, text: &str) -> Vec<u32> {
    let id = |m: &str| tok.inner().token_to_id(m);
    let mut markers: Vec<&str> = HARMONY_MARKERS.to_vec();
    if id("<|return|>").is_some() && id("<|call|>").is_some() {
        markers.push("<|end|>");
    }
    markers
        .into_iter()
        .filter(|m| text.contains(m))
        .filter_map(id)
        .collect()
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer-llamacpp")
}

/// The fixture and the GGUF it was made from.
fn load(name: &str) -> (Json, Content) {
    let text = std::fs::read_to_string(dir().join(format!("{name}.json"))).unwrap();
    let fx: Json = serde_json::from_str(&text).unwrap();
    let mut file = File::open(dir().join(fx["gguf_file"].as_str().unwrap())).unwrap();
    let content = Content::read(&mut file).unwrap();
    (fx, content)
}

/// The variant's metadata changes, applied as the script applied them.
fn with_overrides(content: &Content, overrides: &Json) -> Content {
    let mut metadata = content.metadata.clone();
    for (key, value) in overrides.as_object().unwrap() {
        let value = match value {
            Json::Bool(b) => Value::Bool(*b),
            Json::String(s) => Value::String(s.clone()),
            other => panic!("override {key} = {other} is neither a string nor a boolean"),
        };
        metadata.insert(key.clone(), value);
    }
    assert!(
        content.tensor_infos.is_empty(),
        "vocabulary-only GGUFs have no tensors"
    );
    Content {
        magic: content.magic,
        metadata,
        tensor_infos: Default::default(),
        tensor_data_offset: content.tensor_data_offset,
    }
}

/// Text of the ids concatenated from each token's bytes (what streaming emits).
fn pieces(tok: &TextTokenizer, ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id)).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every case of every variant of fixture `name`; returns how many cases were compared.
fn check(name: &str) -> usize {
    let (fx, content) = load(name);
    let byte_level = fx["byte_level"].as_bool().unwrap();
    let mut failures = Vec::new();
    let mut compared = 0;
    for (variant, spec) in fx["variants"].as_object().unwrap() {
        let tok = TextTokenizer::from_gguf(&with_overrides(&content, &spec["overrides"]))
            .unwrap_or_else(|e| panic!("{name}/{variant}: {e}"));
        // Special tokens written in the text stay text (llama.cpp's parse_special = false).
        let mut plain = tok.inner().clone();
        plain.set_encode_special_tokens(true);
        let mut fail =
            |what: &str, text: &str, got: &dyn std::fmt::Debug, want: &dyn std::fmt::Debug| {
                failures.push(format!(
                    "{name}/{variant} {what} of {text:?}: got {got:?}, llama.cpp {want:?}"
                ))
            };

        let eog: BTreeSet<u32> = ids(&spec["eog"]).into_iter().collect();
        let ours: BTreeSet<u32> = tok.eos_token_ids().iter().copied().collect();
        if ours != eog {
            fail("end-of-generation ids", "", &ours, &eog);
        }

        for case in spec["cases"].as_array().unwrap() {
            compared += 1;
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let got = tok.encode(text, false).unwrap();
            if let Some(original) = case.get("ids_original_regex") {
                // A known llama.cpp regex approximation: ferry follows the model's regex.
                let original = ids(original);
                if got != original || original == want {
                    fail("ids (original regex)", text, &got, &original);
                }
                continue;
            }
            if got != want {
                fail("ids", text, &got, &want);
            }
            let with_special = tok.encode(text, true).unwrap();
            if with_special != ids(&case["ids_add_special"]) {
                fail(
                    "ids with BOS/EOS",
                    text,
                    &with_special,
                    &case["ids_add_special"],
                );
            }
            let plain_ids = plain
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap();
            let want_plain = ids(&case["ids_plain"]);
            let harmony = harmony_markers_in(&tok, text);
            if !harmony.is_empty() {
                // The markers stay text here, where llama.cpp makes them tokens.
                if plain_ids.iter().any(|id| harmony.contains(id))
                    || !want_plain.iter().any(|id| harmony.contains(id))
                {
                    fail(
                        "harmony markers without special parsing",
                        text,
                        &plain_ids,
                        &want_plain,
                    );
                }
            } else if plain_ids != want_plain {
                fail("ids without special parsing", text, &plain_ids, &want_plain);
            }
            if byte_level {
                // Byte-level BPE is lossless: decode and the token bytes give the text back.
                let decoded = tok.decode(&want, false).unwrap();
                if decoded != text {
                    fail("decode", text, &decoded, &text);
                }
                if pieces(&tok, &want) != text {
                    fail("token bytes", text, &pieces(&tok, &want), &text);
                }
            } else {
                for (ids_key, detok_key) in [("ids", "detok"), ("ids_plain", "detok_plain")] {
                    let decoded = tok.decode(&ids(&case[ids_key]), false).unwrap();
                    if decoded != case[detok_key].as_str().unwrap() {
                        fail(detok_key, text, &decoded, &case[detok_key]);
                    }
                }
                let got_pieces = pieces(&tok, &want);
                if got_pieces != case["pieces"].as_str().unwrap() {
                    fail("token bytes", text, &got_pieces, &case["pieces"]);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches with llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
    compared
}

#[test]
fn phi3_sentencepiece_vocab_matches_llama_cpp() {
    // Phi-3 as shipped (special tokens strip the whitespace after them) and as plain Llama 2.
    assert!(check("phi-3") >= 180);
}

#[test]
fn gemma_style_sentencepiece_vocab_matches_llama_cpp() {
    // No space prefix, user-defined whitespace tokens; then the same vocabulary with the prefix.
    assert!(check("spm-gemma") >= 180);
}

#[test]
fn qwen2_byte_level_vocab_matches_llama_cpp() {
    assert!(check("bpe-qwen2") >= 90);
}

#[test]
fn llama3_byte_level_vocab_matches_llama_cpp() {
    // llama-bpe (BOS, ignore_merges) and gpt-4o with gpt-oss's harmony tokens.
    assert!(check("bpe-llama3") >= 180);
}

#[test]
fn every_pre_tokenizer_cuts_words_like_llama_cpp() {
    // A vocabulary whose merges cross every kind of word boundary, under ten pre types.
    assert!(check("bpe-probe") >= 800);
}

#[test]
fn known_regex_differences_are_few_and_named() {
    let (fx, _) = load("bpe-probe");
    let mut seen = Vec::new();
    for (variant, spec) in fx["variants"].as_object().unwrap() {
        for case in spec["cases"].as_array().unwrap() {
            if case.get("ids_original_regex").is_some() {
                seen.push(format!("{variant}: {}", case["text"].as_str().unwrap()));
            }
        }
    }
    assert!(
        seen.iter()
            .all(|s| s.starts_with("gpt-4o:") || s.starts_with("tekken:")),
        "{seen:?}"
    );
    assert!(seen.len() <= 12, "{seen:?}");
}

/// A load builds the tokenizer from ferry's own header, the vocabulary and merges read in place
/// from the mapped file; the tests above build it from candle's map of values. Both must be the
/// same tokenizer (its whole serialized pipeline: vocabulary, merges, added tokens, pre-tokenizer,
/// post-processor, decoder) with the same special tokens, on every fixture vocabulary, and then
/// give llama.cpp's ids on the fixture's variant without metadata overrides.
#[test]
fn vocabularies_read_in_place_build_the_same_tokenizer() {
    use ferry::model::header::{map_file, GgufHeader, GgufMetadata};
    for name in ["phi-3", "spm-gemma", "bpe-qwen2", "bpe-llama3", "bpe-probe"] {
        let (fx, content) = load(name);
        let map = map_file(&dir().join(fx["gguf_file"].as_str().unwrap())).unwrap();
        let header = GgufHeader::parse(&map).unwrap();
        assert!(
            header.string_arrays.contains_key("tokenizer.ggml.tokens"),
            "{name}: the vocabulary stays in the file"
        );
        let in_place = TextTokenizer::from_gguf_metadata(GgufMetadata::new(&header, &map))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let from_map = TextTokenizer::from_gguf(&content).unwrap();
        let json = |t: &TextTokenizer| t.inner().to_string(false).unwrap();
        assert!(
            json(&in_place) == json(&from_map),
            "{name}: pipelines differ"
        );
        assert_eq!(in_place.eos_token_ids(), from_map.eos_token_ids(), "{name}");
        assert_eq!(in_place.bos_token_id(), from_map.bos_token_id(), "{name}");
        assert_eq!(in_place.adds_bos(), from_map.adds_bos(), "{name}");
        assert_eq!(
            in_place.chat_template_source(),
            from_map.chat_template_source(),
            "{name}"
        );
        let (variant, spec) = fx["variants"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, spec)| spec["overrides"].as_object().is_some_and(|o| o.is_empty()))
            .unwrap_or_else(|| panic!("{name}: a variant without overrides"));
        let mut compared = 0;
        for case in spec["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            if case.get("ids_original_regex").is_none() {
                assert_eq!(
                    in_place.encode(text, false).unwrap(),
                    ids(&case["ids"]),
                    "{name}/{variant}: {text:?}"
                );
                compared += 1;
            }
        }
        assert!(compared >= 80, "{name}/{variant}: {compared} cases");
    }
}

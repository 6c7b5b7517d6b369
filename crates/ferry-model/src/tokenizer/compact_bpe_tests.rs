//! [`CompactBpe`] against the crate's BPE model built from the same GGUF vocabulary the way
//! ferry built it before (owned strings, `BPE::builder`): every pre-token of a corpus in every
//! byte-level fixture (llama.cpp's Llama 3 and Qwen2 pre types, a probe vocabulary, the
//! default SmolLM2 model when fetched), and every line of it spelled as SentencePiece text in
//! the SentencePiece fixtures (Gemma, Phi-3), gives the same ids, texts and offsets, and the
//! two agree on every id, text and the serialized model.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::{
    Model, ModelWrapper, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer,
};

use super::*;
use crate::tokenizer::gguf_spm::merges_by_score;
use crate::tokenizer::pretokenizers::{for_gguf_pre, is_byte_level, spell_bytes};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tokens (spelled in the byte alphabet), merges and pre type of a byte-level GGUF.
fn read(path: &Path) -> (Vec<String>, Vec<String>, Option<String>) {
    let mut file = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut file).unwrap();
    let strings = |key: &str| -> Vec<String> {
        content.metadata[key]
            .to_vec()
            .unwrap()
            .iter()
            .map(|v| v.to_string().unwrap().clone())
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")
        .into_iter()
        .map(|t| {
            if is_byte_level(&t) {
                t
            } else {
                spell_bytes(&t)
            }
        })
        .collect();
    let pre = content
        .metadata
        .get("tokenizer.ggml.pre")
        .map(|v| v.to_string().unwrap().clone());
    (tokens, strings("tokenizer.ggml.merges"), pre)
}

/// The strings as the constructors take them.
fn borrowed(strings: &[String]) -> Vec<Cow<'_, str>> {
    strings.iter().map(|t| Cow::Borrowed(t.as_str())).collect()
}

/// The crate's vocabulary map of `tokens` (later duplicates win).
fn vocab_of(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect()
}

/// A byte-level model of `tokens` and `merges` (`"a b"`): this one, and the crate's as ferry
/// built it before [`CompactBpe`].
fn both(tokens: &[String], merges: &[String], ignore_merges: bool) -> (CompactBpe, BPE) {
    let compact = CompactBpe::new(&borrowed(tokens), &borrowed(merges), ignore_merges).unwrap();
    let pairs = merges
        .iter()
        .map(|m| {
            let (a, b) = m.split_once(' ').unwrap();
            (a.to_owned(), b.to_owned())
        })
        .collect();
    let reference = BPE::builder()
        .vocab_and_merges(vocab_of(tokens), pairs)
        .ignore_merges(ignore_merges)
        .build()
        .unwrap();
    (compact, reference)
}

/// The crate's SentencePiece model as ferry built it before [`CompactBpe`]: `merges` as id
/// triples, byte fallback, `unk` the unknown token's id.
fn crate_spm(tokens: &[String], merges: &[(u32, u32, u32)], unk: u32) -> BPE {
    let pairs = merges
        .iter()
        .map(|&(l, r, _)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect();
    BPE::builder()
        .vocab_and_merges(vocab_of(tokens), pairs)
        .byte_fallback(true)
        .unk_token(tokens[unk as usize].clone())
        .build()
        .unwrap()
}

/// Texts that reach the model: the tokenizer fixtures' corpus and some edge cases.
fn texts() -> Vec<String> {
    let corpus = repo().join("tests/fixtures/tokenizer-llamacpp/corpus.txt");
    let mut texts: Vec<String> = std::fs::read_to_string(corpus)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    texts.extend(
        [
            "",
            " ",
            "   leading and  double  spaces\t\ttabs\n\nnewlines\r\n",
            "Hello, world! It's 2026-12-07; 3.14159 × 10⁻³ ≈ π/1000.",
            "日本語のテキストと中文文本，한국어 텍스트",
            "emoji 🚢🌊👩‍👩‍👧 and combining é (e\u{301})",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "\u{0}\u{1}\u{7f} control \u{feff} bom",
            "fn main() { println!(\"{}\", x.iter().map(|y| y * 2).sum::<u64>()); }",
            "<|im_start|>user\nhi<|im_end|>",
        ]
        .map(str::to_owned),
    );
    texts
}

/// Compares the two models on `path`'s byte-level vocabulary.
fn same_as_the_crate(path: &Path) {
    let (tokens, merges, pre) = read(path);
    let (pre_tokenizer, defaults) = for_gguf_pre(pre.as_deref()).unwrap();
    let (compact, reference) = both(&tokens, &merges, defaults.ignore_merges);
    let name = path.display();

    let mut pieces = 0;
    for text in texts() {
        let mut pre_tokenized = PreTokenizedString::from(text.as_str());
        pre_tokenizer.pre_tokenize(&mut pre_tokenized).unwrap();
        let splits = pre_tokenized.get_splits(OffsetReferential::Original, OffsetType::Byte);
        for (piece, _, _) in splits {
            pieces += 1;
            assert_eq!(
                compact.tokenize(piece),
                reference.tokenize(piece).unwrap(),
                "{name}: pre-token {piece:?}"
            );
        }
    }
    assert!(pieces > 1000, "{name}: only {pieces} pre-tokens");
    same_tables(&name.to_string(), &tokens, &compact, &reference);
}

/// The two models agree on every id and text, the vocabulary, its size and the serialized model.
fn same_tables(name: &str, tokens: &[String], compact: &CompactBpe, reference: &BPE) {
    for (id, token) in tokens.iter().enumerate() {
        let id = id as u32;
        assert_eq!(
            compact.token(id),
            reference.id_to_token(id).as_deref(),
            "{name}: id {id}"
        );
        assert_eq!(
            compact.id(token),
            reference.token_to_id(token),
            "{name}: {token:?}"
        );
    }
    assert_eq!(compact.vocab(), reference.get_vocab(), "{name}: vocabulary");
    assert_eq!(
        compact.vocab_len(),
        reference.get_vocab_size(),
        "{name}: vocabulary size"
    );
    let json = |m: ModelWrapper| serde_json::to_string(&m).unwrap();
    assert!(
        json(compact.to_crate_bpe().unwrap().into()) == json(reference.clone().into()),
        "{name}: serialized models differ"
    );
}

/// Compares the two models on `path`'s SentencePiece vocabulary (merges by score, byte
/// fallback, the unknown token), over the corpus spelled as the normalizer leaves it.
fn same_as_the_crate_spm(path: &Path) {
    let mut file = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut file).unwrap();
    let meta = &content.metadata;
    let tokens: Vec<String> = meta["tokenizer.ggml.tokens"]
        .to_vec()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(id, v)| match v.to_string().unwrap().as_str() {
            "" => format!("[EMPTY_{id}]"),
            t => t.to_owned(),
        })
        .collect();
    let scores: Vec<f32> = meta["tokenizer.ggml.scores"]
        .to_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_f32().unwrap())
        .collect();
    let unk = meta
        .get("tokenizer.ggml.unknown_token_id")
        .map(|v| v.to_u32().unwrap())
        .unwrap_or(0);
    let spelled = borrowed(&tokens);
    let vocabulary = CompactBpe::vocabulary(&spelled).unwrap();
    let merges = merges_by_score(&spelled, &scores, |t| vocabulary.id(t));
    let compact = vocabulary.with_sentencepiece(&merges, Some(unk)).unwrap();
    let reference = crate_spm(&tokens, &merges, unk);
    let name = path.display();
    let space = "\u{2581}";
    for text in texts() {
        let spelled = format!("{space}{}", text.replace(' ', space));
        assert_eq!(
            compact.tokenize(&spelled),
            reference.tokenize(&spelled).unwrap(),
            "{name}: {spelled:?}"
        );
    }
    same_tables(&name.to_string(), &tokens, &compact, &reference);
}

#[test]
fn tokenizes_as_the_crates_bpe_on_every_sentencepiece_fixture() {
    let fixtures = repo().join("tests/fixtures/tokenizer-llamacpp");
    for name in ["spm-gemma.gguf", "ggml-vocab-phi-3.gguf"] {
        same_as_the_crate_spm(&fixtures.join(name));
    }
}

#[test]
fn tokenizes_as_the_crates_bpe_on_every_byte_level_fixture() {
    let fixtures = repo().join("tests/fixtures/tokenizer-llamacpp");
    for name in ["bpe-llama3.gguf", "bpe-qwen2.gguf", "bpe-probe.gguf"] {
        same_as_the_crate(&fixtures.join(name));
    }
    // The default model when `scripts/fetch-model.sh` has run (`scripts/test.sh` runs it).
    let default = repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if default.exists() {
        same_as_the_crate(&default);
    }
}

/// A vocabulary of `a`, `b`, `c` and some of their joins, with `merges` in rank order: this
/// model and the crate's.
fn small(merges: &[&str], ignore_merges: bool) -> (CompactBpe, BPE) {
    let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc", "aa", "aaa"]
        .map(str::to_owned)
        .to_vec();
    let merges: Vec<String> = merges.iter().map(|m| (*m).to_owned()).collect();
    both(&tokens, &merges, ignore_merges)
}

#[test]
fn ranks_ties_unknown_characters_and_whole_words_follow_the_crate() {
    let ids = |m: &CompactBpe, s: &str| m.tokenize(s).iter().map(|t| t.id).collect::<Vec<_>>();
    // `b c` ranks first: `a` + `bc`, then `a bc` is no merge, so two tokens.
    let bc_first = small(&["b c", "a b", "ab c"], false);
    assert_eq!(ids(&bc_first.0, "abc"), [0, 4]);
    // `a b` first: `ab` + `c`, then `ab c` = `abc`.
    let ab_first = small(&["a b", "b c", "ab c"], false);
    assert_eq!(ids(&ab_first.0, "abc"), [5]);
    // Ties go to the leftmost pair: `aaaa` is `aa` + `aa`.
    let pairs = small(&["a a", "aa a"], false);
    assert_eq!(ids(&pairs.0, "aaaa"), [6, 6]);
    // Characters outside the vocabulary are dropped, offsets count only what is kept.
    let dropped = pairs.0.tokenize("a?a");
    assert_eq!(
        dropped.iter().map(|t| t.offsets).collect::<Vec<_>>(),
        [(0, 2)]
    );
    // A whole word in the vocabulary skips the merges when `ignore_merges` is on.
    let whole = small(&["b c", "a b"], true);
    assert_eq!(ids(&whole.0, "abc"), [5]);
    for (compact, reference) in [&bc_first, &ab_first, &pairs, &whole] {
        for s in ["abc", "aaaa", "a?a", "cab", "bcabca", "aaaaaaa", ""] {
            assert_eq!(compact.tokenize(s), reference.tokenize(s).unwrap(), "{s:?}");
        }
    }
    // A merge whose result is not a token is an error naming it, as is one without a space.
    let tokens = [Cow::Borrowed("a"), Cow::Borrowed("b")];
    let error = CompactBpe::new(&tokens, &[Cow::Borrowed("a b")], false).unwrap_err();
    assert!(error.to_string().contains("`ab`"), "{error}");
    let error = CompactBpe::new(&tokens, &[Cow::Borrowed("ab")], false).unwrap_err();
    assert!(error.to_string().contains("is not `a b`"), "{error}");
}

#[test]
fn byte_fallback_and_the_unknown_token_follow_the_crate() {
    // `é` (C3 A9) has byte tokens, `ü` (C3 BC) does not: it is the unknown token, one per
    // character, added when a later character's own token is (so after `é`'s byte tokens).
    let tokens: Vec<String> = ["<unk>", "a", "b", "ab", "<0xC3>", "<0xA9>"]
        .map(str::to_owned)
        .to_vec();
    let spelled = borrowed(&tokens);
    let vocabulary = || CompactBpe::vocabulary(&spelled).unwrap();
    let compact = vocabulary()
        .with_sentencepiece(&[(1, 2, 3)], Some(0))
        .unwrap();
    let reference = crate_spm(&tokens, &[(1, 2, 3)], 0);
    let ids = |s: &str| compact.tokenize(s).iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids("aüéüb"), [1, 4, 5, 0, 0, 2]);
    assert_eq!(ids("abé"), [3, 4, 5]);
    for s in ["aüéüb", "abé", "üü", "éab", "ab", "", "ba", "aéb"] {
        assert_eq!(compact.tokenize(s), reference.tokenize(s).unwrap(), "{s:?}");
    }
    // A merge outside the vocabulary is refused.
    assert!(vocabulary().with_sentencepiece(&[(1, 2, 6)], None).is_err());
}

#[test]
fn a_long_text_leaves_no_large_buffers_behind() {
    let (compact, reference) = small(&["a b", "b c"], false);
    let long = "abc".repeat(100_000);
    assert_eq!(compact.tokenize(&long), reference.tokenize(&long).unwrap());
    SCRATCH.with_borrow(|word| {
        assert!(
            word.symbols.capacity() <= KEPT_SYMBOLS,
            "{}",
            word.symbols.capacity()
        );
        assert!(
            word.queue.capacity() <= KEPT_SYMBOLS,
            "{}",
            word.queue.capacity()
        );
    });
}

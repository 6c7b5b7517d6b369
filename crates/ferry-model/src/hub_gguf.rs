//! Choosing a GGUF model among a hub repository's files: `org/name:Q4_K_M` names a
//! quantization tag, matched in the file names as llama.cpp's `-hf` and Ollama's `hf.co/` do
//! (case-insensitive, as a whole tag: `Q4_K` does not match `Q4_K_M`); a split model
//! (`-00001-of-0000N.gguf`) is all its splits; vision projectors (`mmproj*`) are never the
//! model. Pure functions over the listing, so they are tested without a hub.

use super::{ModelError, Result};

/// The quantization llama.cpp picks when a GGUF repository is named without one.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// One GGUF model of a listing: its files (one, or every split in order).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    /// The name without a split suffix (`dir/model-Q4_K_M.gguf`).
    base: String,
    files: Vec<String>,
    /// `N` of `-0000k-of-0000N`, for a split model.
    split_count: Option<usize>,
}

/// The files to fetch for `quant` (or [`DEFAULT_QUANT`] / the only GGUF when `None`) from a
/// repository listing `files` (paths inside the repo): the model's first file first.
pub fn choose(repo: &str, files: &[String], quant: Option<&str>) -> Result<Vec<String>> {
    let candidates = candidates(files);
    if candidates.is_empty() {
        return Err(ModelError::Source(format!(
            "the hub repository {repo} has no config.json and no .gguf model file"
        )));
    }
    let available = || {
        candidates
            .iter()
            .map(|c| c.base.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let matching: Vec<&Candidate> = match quant {
        Some(tag) => candidates
            .iter()
            .filter(|c| has_tag(&c.base, tag))
            .collect(),
        None if candidates.len() == 1 => candidates.iter().collect(),
        None => candidates
            .iter()
            .filter(|c| has_tag(&c.base, DEFAULT_QUANT))
            .collect(),
    };
    let chosen = match matching.as_slice() {
        [one] => *one,
        [] => {
            return Err(ModelError::Source(match quant {
                Some(tag) => format!(
                    "the hub repository {repo} has no GGUF tagged {tag}; it has: {}",
                    available()
                ),
                None => format!(
                    "the hub repository {repo} holds several GGUF models and none is \
                     {DEFAULT_QUANT}; name one as {repo}:QUANT or {repo}/FILE.gguf (it has: {})",
                    available()
                ),
            }))
        }
        several => {
            return Err(ModelError::Source(format!(
                "{} GGUF models of {repo} match; name the file as {repo}/FILE.gguf: {}",
                several.len(),
                several
                    .iter()
                    .map(|c| c.base.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    };
    complete(repo, chosen)
}

/// The files of the model whose (first) file is `file`: every split when it is a split model.
pub fn with_splits(repo: &str, files: &[String], file: &str) -> Result<Vec<String>> {
    match candidates(files)
        .into_iter()
        .find(|c| c.files.first().map(String::as_str) == Some(file) || c.base == file)
    {
        Some(chosen) => complete(repo, &chosen),
        None if split_suffix(file).is_some() => Err(ModelError::Source(format!(
            "{file} is not the first split of a model in {repo}; name the -00001-of- file"
        ))),
        None => Ok(vec![file.to_string()]),
    }
}

/// A split model with every split present, or the error naming the missing ones.
fn complete(repo: &str, chosen: &Candidate) -> Result<Vec<String>> {
    if let Some(count) = chosen.split_count {
        if chosen.files.len() != count {
            return Err(ModelError::Source(format!(
                "{repo} has {} of the {count} splits of {}",
                chosen.files.len(),
                chosen.base
            )));
        }
    }
    Ok(chosen.files.clone())
}

/// The GGUF models of a listing, in name order.
fn candidates(files: &[String]) -> Vec<Candidate> {
    let mut models: Vec<Candidate> = Vec::new();
    let mut sorted: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f);
            !name.to_ascii_lowercase().starts_with("mmproj")
        })
        .collect();
    sorted.sort();
    for file in sorted {
        let (base, split_count) = match split_suffix(file) {
            Some((base, count)) => (base, Some(count)),
            None => (file.clone(), None),
        };
        match models.iter_mut().find(|m| m.base == base) {
            Some(model) => model.files.push(file.clone()),
            None => models.push(Candidate {
                base,
                files: vec![file.clone()],
                split_count,
            }),
        }
    }
    models
}

/// `(name without the split suffix, N)` for `PREFIX-0000k-of-0000N.gguf`.
fn split_suffix(file: &str) -> Option<(String, usize)> {
    let stem = file
        .strip_suffix(".gguf")
        .or_else(|| file.strip_suffix(".GGUF"))?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(count) && digits(index)) {
        return None;
    }
    Some((format!("{prefix}.gguf"), count.parse().ok()?))
}

/// Whether `name` carries `tag` as a whole tag: after the start or a character that is not a
/// letter or digit, and before `.`, `-`, `/` or the end (case-insensitive).
fn has_tag(name: &str, tag: &str) -> bool {
    let (name, tag) = (name.to_ascii_lowercase(), tag.to_ascii_lowercase());
    name.match_indices(&tag).any(|(at, _)| {
        let before = name[..at].chars().next_back();
        let after = name[at + tag.len()..].chars().next();
        before.is_none_or(|c| !c.is_ascii_alphanumeric())
            && after.is_none_or(|c| matches!(c, '.' | '-' | '/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_tag_picks_its_file_and_only_its_file() {
        let files = listing(&[
            "README.md",
            "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
            "Qwen2.5-0.5B-Instruct-Q4_K_S.gguf",
            "Qwen2.5-0.5B-Instruct-Q8_0.gguf",
            "mmproj-Qwen2.5-Q8_0.gguf",
        ]);
        let pick = |tag| choose("o/r", &files, tag);
        assert_eq!(
            pick(Some("q8_0")).unwrap(),
            ["Qwen2.5-0.5B-Instruct-Q8_0.gguf"]
        );
        assert_eq!(
            pick(None).unwrap(),
            ["Qwen2.5-0.5B-Instruct-Q4_K_M.gguf"],
            "llama.cpp's default"
        );
        let err = pick(Some("Q4_K")).unwrap_err().to_string();
        assert!(
            err.contains("no GGUF tagged Q4_K") && err.contains("Q4_K_S.gguf"),
            "{err}"
        );
    }

    #[test]
    fn a_split_model_is_all_its_splits() {
        let files = listing(&[
            "Q4_K_M/big-Q4_K_M-00002-of-00003.gguf",
            "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf",
            "Q4_K_M/big-Q4_K_M-00003-of-00003.gguf",
            "big-Q8_0.gguf",
        ]);
        assert_eq!(
            choose("o/r", &files, Some("Q4_K_M")).unwrap(),
            [
                "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf",
                "Q4_K_M/big-Q4_K_M-00002-of-00003.gguf",
                "Q4_K_M/big-Q4_K_M-00003-of-00003.gguf"
            ]
        );
        assert_eq!(
            with_splits("o/r", &files, "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf")
                .unwrap()
                .len(),
            3
        );
        assert_eq!(
            with_splits("o/r", &files, "big-Q8_0.gguf").unwrap(),
            ["big-Q8_0.gguf"]
        );
        assert!(with_splits("o/r", &files, "Q4_K_M/big-Q4_K_M-00002-of-00003.gguf").is_err());
        let missing = listing(&["m-Q4_0-00001-of-00002.gguf"]);
        let err = choose("o/r", &missing, Some("Q4_0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 of the 2 splits"), "{err}");
    }

    #[test]
    fn without_a_tag_several_models_and_no_default_is_an_error_listing_them() {
        let files = listing(&["m.Q8_0.gguf", "m.Q5_0.gguf"]);
        let err = choose("o/r", &files, None).unwrap_err().to_string();
        assert!(
            err.contains("o/r:QUANT") && err.contains("m.Q5_0.gguf"),
            "{err}"
        );
        assert_eq!(
            choose("o/r", &listing(&["only.gguf"]), None).unwrap(),
            ["only.gguf"]
        );
        assert!(choose("o/r", &listing(&["README.md"]), None).is_err());
    }
}

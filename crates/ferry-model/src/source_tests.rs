//! Tests for source parsing and hub-cache resolution on real files in temporary directories.

use super::*;

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(path, text).expect("write");
}

#[test]
fn parses_local_files_directories_and_hub_ids() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = tmp.path().join("m.gguf");
    write(&gguf, "x");
    assert_eq!(
        ModelSource::parse(gguf.to_str().unwrap()).unwrap(),
        ModelSource::GgufFile(gguf.clone())
    );

    let hf = tmp.path().join("hf");
    write(&hf.join("config.json"), "{}");
    assert_eq!(
        ModelSource::parse(hf.to_str().unwrap()).unwrap(),
        ModelSource::HfDir(hf.clone())
    );

    assert_eq!(
        ModelSource::parse("HuggingFaceTB/SmolLM2-135M-Instruct@v1.0").unwrap(),
        ModelSource::Hub {
            repo: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
            revision: "v1.0".into(),
            files: HubFiles::Auto,
        }
    );
    assert_eq!(
        ModelSource::parse("org/name").unwrap(),
        ModelSource::Hub {
            repo: "org/name".into(),
            revision: "main".into(),
            files: HubFiles::Auto,
        }
    );
    let hub = |repo: &str, revision: &str, files| ModelSource::Hub {
        repo: repo.into(),
        revision: revision.into(),
        files,
    };
    for (text, expected) in [
        (
            "org/Model-GGUF:Q4_K_M",
            hub("org/Model-GGUF", "main", HubFiles::Quant("Q4_K_M".into())),
        ),
        (
            "hf.co/org/Model-GGUF:q8_0@v2",
            hub("org/Model-GGUF", "v2", HubFiles::Quant("q8_0".into())),
        ),
        (
            "org/Model-GGUF/Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
            hub(
                "org/Model-GGUF",
                "main",
                HubFiles::File("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf".into()),
            ),
        ),
    ] {
        assert_eq!(ModelSource::parse(text).unwrap(), expected, "{text}");
    }
}

#[test]
fn rejects_what_is_not_a_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let text = tmp.path().join("notes.txt");
    write(&text, "x");
    for bad in [
        text.to_str().unwrap(),
        "models/missing.gguf",
        "a/b/c",
        "org/",
        "@x",
        "org/name@",
        "org/name:",
        "org/name:Q4/x",
        "org/name/file.txt",
        "org/name/../x.gguf",
    ] {
        let err = ModelSource::parse(bad).expect_err(bad);
        assert!(matches!(err, ModelError::Source(_)), "{bad}: {err}");
    }
    let err = ModelSource::parse("models/missing.gguf")
        .unwrap_err()
        .to_string();
    assert!(err.contains("fetch-model.sh"), "{err}");
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(ModelSource::parse(empty.to_str().unwrap()).is_err());
}

#[test]
fn hf_dir_with_shards_lists_them_in_order() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        write(&dir.join(name), "{}");
    }
    write(
        &dir.join("model.safetensors.index.json"),
        r#"{"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#,
    );
    write(&dir.join("model-00001-of-00002.safetensors"), "");
    write(&dir.join("model-00002-of-00002.safetensors"), "");
    let files = resolve(
        &ModelSource::HfDir(dir.to_path_buf()),
        &HubOptions::from_env(|_| None),
    )
    .unwrap();
    let ModelFiles::HfDir {
        weights,
        tokenizer_config,
        generation_config,
        ..
    } = files
    else {
        panic!("expected an HF dir");
    };
    assert_eq!(
        weights,
        vec![
            dir.join("model-00001-of-00002.safetensors"),
            dir.join("model-00002-of-00002.safetensors")
        ]
    );
    assert!(tokenizer_config.is_some());
    assert!(generation_config.is_none());

    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = resolve(
        &ModelSource::HfDir(dir.to_path_buf()),
        &HubOptions::from_env(|_| None),
    )
    .unwrap_err();
    assert!(err.to_string().contains("model-00002-of-00002"), "{err}");
}

/// Lays out `models--org--name` as huggingface_hub does: refs/main -> commit, snapshots/commit/*.
fn fake_cache(cache: &Path, files: &[&str]) -> PathBuf {
    let repo = cache.join("models--org--tiny");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    write(&repo.join("refs/main"), commit);
    let snapshot = repo.join("snapshots").join(commit);
    for file in files {
        write(&snapshot.join(file), "{}");
    }
    snapshot
}

fn offline(cache: &Path) -> HubOptions {
    let cache = cache.to_str().unwrap().to_string();
    HubOptions::from_env(move |key| match key {
        "HF_HUB_CACHE" => Some(cache.clone()),
        "HF_HUB_OFFLINE" => Some("1".to_string()),
        _ => None,
    })
}

#[test]
fn offline_hub_ids_resolve_from_the_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let snapshot = fake_cache(
        tmp.path(),
        &["config.json", "tokenizer.json", "model.safetensors"],
    );
    let source = ModelSource::parse("org/tiny").unwrap();
    let files = resolve(&source, &offline(tmp.path())).expect("resolves offline");
    assert_eq!(
        files,
        ModelFiles::HfDir {
            dir: snapshot.clone(),
            config: snapshot.join("config.json"),
            tokenizer: snapshot.join("tokenizer.json"),
            tokenizer_config: None,
            generation_config: None,
            weights: vec![snapshot.join("model.safetensors")],
        }
    );
    // A commit hash works as a revision without a ref.
    let by_commit =
        ModelSource::parse("org/tiny@0123456789abcdef0123456789abcdef01234567").unwrap();
    assert!(resolve(&by_commit, &offline(tmp.path())).is_ok());
}

#[test]
fn offline_missing_file_names_repo_and_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fake_cache(tmp.path(), &["config.json", "tokenizer.json"]);
    let err = resolve(
        &ModelSource::parse("org/tiny").unwrap(),
        &offline(tmp.path()),
    )
    .expect_err("weights are missing");
    let text = err.to_string();
    assert!(text.contains("org/tiny"), "{text}");
    assert!(text.contains("model.safetensors"), "{text}");
    assert!(text.contains(tmp.path().to_str().unwrap()), "{text}");
    assert!(text.contains("HF_HUB_OFFLINE"), "{text}");

    let err = resolve(
        &ModelSource::parse("org/absent").unwrap(),
        &offline(tmp.path()),
    )
    .unwrap_err();
    assert!(err.to_string().contains("org/absent"), "{err}");
}

#[test]
fn cache_dir_follows_hf_variables() {
    let opts = HubOptions::from_env(|k| (k == "HF_HOME").then(|| "/h".to_string()));
    assert_eq!(opts.cache_dir, PathBuf::from("/h/hub"));
    assert!(!opts.offline);
    let opts = HubOptions::from_env(|k| match k {
        "HF_HOME" => Some("/h".into()),
        "HF_HUB_CACHE" => Some("/c".into()),
        "HF_HUB_OFFLINE" => Some("true".into()),
        _ => None,
    });
    assert_eq!(opts.cache_dir, PathBuf::from("/c"));
    assert!(opts.offline);
}

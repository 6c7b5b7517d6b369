use super::*;

fn key(name: &str) -> ModelKey {
    ModelKey {
        path: format!("/models/{name}.gguf"),
        size: 1000,
        modified: 7,
    }
}

#[test]
fn the_counter_counts_rows_per_layer_and_expert_within_bounds() {
    let counter = RouteCounter::default();
    counter.record(1, 4, &[0, 3], &[2, 1]);
    counter.record(1, 4, &[3], &[5]);
    // An index past the layer's experts is not counted.
    counter.record(0, 4, &[1, 9], &[1, 1]);
    assert_eq!(counter.snapshot(), [vec![0, 1, 0, 0], vec![2, 0, 0, 6]]);
    assert_eq!(total(&counter.snapshot()), 9);
    counter.record(MAX_LAYERS, 4, &[0], &[1]);
    counter.record(2, MAX_EXPERTS + 1, &[0], &[1]);
    assert_eq!(
        counter.snapshot().len(),
        2,
        "out-of-bound layers are not kept"
    );
    let taken = counter.take();
    assert_eq!(total(&taken), 9);
    assert_eq!(total(&counter.snapshot()), 0);
    counter.give_back(&taken);
    assert_eq!(counter.snapshot(), taken);
}

#[test]
fn counts_round_trip_and_merge_per_model() {
    let dir = tempfile::tempdir().unwrap();
    let cache = RouteCache::at(dir.path().join("ferry").join("expert-routes.json"));
    assert_eq!(cache.load(&key("a")), Ok(None), "no file: no counts");
    cache
        .merge(&key("a"), &[vec![1, 2], vec![0, 0, 3]])
        .unwrap();
    cache.merge(&key("a"), &[vec![1, 0, 4]]).unwrap();
    cache.merge(&key("b"), &[vec![9]]).unwrap();
    assert_eq!(
        cache.load(&key("a")),
        Ok(Some(vec![vec![2, 2, 4], vec![0, 0, 3]]))
    );
    assert_eq!(cache.load(&key("b")), Ok(Some(vec![vec![9]])));
    // Another size or time of the same path is another file.
    let replaced = ModelKey {
        size: 1001,
        ..key("a")
    };
    assert_eq!(cache.load(&replaced), Ok(None));
    // All-zero counts write nothing.
    let empty = RouteCache::at(dir.path().join("none.json"));
    empty.merge(&key("a"), &[vec![0, 0]]).unwrap();
    assert!(!empty.path().exists());
}

#[test]
fn the_file_keeps_the_most_recent_models_only() {
    let dir = tempfile::tempdir().unwrap();
    let cache = RouteCache::at(dir.path().join("expert-routes.json"));
    for i in 0..MAX_MODELS + 3 {
        cache.merge(&key(&i.to_string()), &[vec![1]]).unwrap();
    }
    // Writing to the oldest kept one makes it the newest.
    cache.merge(&key("3"), &[vec![1]]).unwrap();
    cache.merge(&key("new"), &[vec![1]]).unwrap();
    for gone in ["0", "1", "2", "4"] {
        assert_eq!(cache.load(&key(gone)), Ok(None), "{gone}");
    }
    assert_eq!(cache.load(&key("3")), Ok(Some(vec![vec![2]])));
    assert_eq!(cache.load(&key("new")), Ok(Some(vec![vec![1]])));
    let text = std::fs::read_to_string(cache.path()).unwrap();
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(file["entries"].as_array().unwrap().len(), MAX_MODELS);
}

#[test]
fn a_corrupt_or_foreign_file_is_no_counts_and_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let cache = RouteCache::at(dir.path().join("expert-routes.json"));
    for bad in [
        "{not json".to_string(),
        r#"{"version": 99, "entries": []}"#.to_string(),
        r#"{"rates": [1, 2]}"#.to_string(),
        format!(
            r#"{{"version": 1, "entries": [{{"key": {{"path": "/x", "size": 1, "modified": 1}}, "counts": [[{}]]}}]}}"#,
            vec!["0"; MAX_EXPERTS + 1].join(",")
        ),
    ] {
        std::fs::write(cache.path(), &bad).unwrap();
        let err = cache.load(&key("a")).unwrap_err();
        assert!(err.contains("expert-routes.json"), "{err}");
        cache.merge(&key("a"), &[vec![0, 5]]).unwrap();
        assert_eq!(cache.load(&key("a")), Ok(Some(vec![vec![0, 5]])), "{bad}");
    }
}

#[test]
fn a_model_file_is_keyed_by_path_size_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, b"1234").unwrap();
    let files = ModelFiles::Gguf { path: path.clone() };
    let k = ModelKey::of(&files).expect("a readable file");
    assert_eq!(k.size, 4);
    assert!(k.path.ends_with("m.gguf") && k.modified > 0, "{k:?}");
    std::fs::write(&path, b"12345").unwrap();
    assert_ne!(ModelKey::of(&files), Some(k));
    let missing = ModelFiles::Gguf {
        path: dir.path().join("gone.gguf"),
    };
    assert_eq!(ModelKey::of(&missing), None);
}

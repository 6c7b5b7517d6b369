//! GGUF models from more places than one local file: the default model split in three as
//! llama.cpp's gguf-split writes it (`-00001-of-00003.gguf`, `split.*` keys, metadata in the
//! first file), loaded as one model; and a GGUF repository in an offline Hugging Face cache,
//! picked by quantization tag (`org/name:Q4_1`), by file, or by llama.cpp's default. Each
//! greedy-decodes exactly the tokens of the original file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{self, Value};
use ferry::config::DtypeChoice;
use ferry::engine::{
    Backend, EngineHandle, GenerationEvent, GenerationParams, GenerationRequest, TextCodec,
};
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;

use crate::real_model::{model_config, model_path, MODEL};

/// Writes the default model as `count` splits named `prefix-0000k-of-0000N.gguf` in `dir`;
/// returns their paths.
fn write_splits(dir: &Path, prefix: &str, count: usize) -> Vec<PathBuf> {
    let mut file = std::fs::File::open(model_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let per_split = names.len().div_ceil(count);
    let mut paths = Vec::new();
    for (index, chunk) in names.chunks(per_split).enumerate() {
        let tensors: Vec<(&str, candle_core::quantized::QTensor)> = chunk
            .iter()
            .map(|name| {
                let tensor = content
                    .tensor(&mut file, name, &candle_core::Device::Cpu)
                    .unwrap();
                (name.as_str(), tensor)
            })
            .collect();
        let split_keys = [
            ("split.no", Value::U16(index as u16)),
            ("split.count", Value::U16(count as u16)),
            ("split.tensors.count", Value::I32(names.len() as i32)),
        ];
        let mut metadata: Vec<(&str, &Value)> = split_keys.iter().map(|(k, v)| (*k, v)).collect();
        if index == 0 {
            metadata.extend(content.metadata.iter().map(|(k, v)| (k.as_str(), v)));
        }
        let refs: Vec<(&str, &candle_core::quantized::QTensor)> =
            tensors.iter().map(|(n, t)| (*n, t)).collect();
        let path = dir.join(format!("{prefix}-{:05}-of-{count:05}.gguf", index + 1));
        let mut out = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut out, &metadata, &refs).unwrap();
        paths.push(path);
    }
    assert_eq!(paths.len(), count);
    paths
}

/// Loads `source` (through `hub`) and greedy-decodes 12 tokens of a fixed prompt.
fn greedy_tokens(source: &str, hub: &HubOptions) -> Result<Vec<u32>, String> {
    let mut config = model_config(DtypeChoice::Auto);
    config.source = source.to_string();
    let loaded =
        load_for_serving(&config, &candle_core::Device::Cpu, hub).map_err(|e| e.to_string())?;
    let engine = EngineHandle::new([MODEL]);
    engine
        .model_ready(MODEL, loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .unwrap();
    let prompt = engine
        .tokenize(MODEL, "The three primary colors are", true)
        .unwrap();
    let mut request = GenerationRequest {
        cache_partition: None,
        model: MODEL.to_string(),
        prompt,
        params: GenerationParams::default(),
    };
    request.params.max_tokens = 12;
    request.params.sampling.temperature = 0.0;
    request.params.ignore_eos = true;
    let mut events = engine.submit(request).unwrap();
    let mut tokens = Vec::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Token(token) => tokens.push(token.token_id),
            GenerationEvent::Finished { .. } => return Ok(tokens),
            GenerationEvent::Failed(err) => return Err(err.to_string()),
        }
    }
    Err("no Finished event".into())
}

fn no_hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

#[test]
fn a_split_gguf_loads_as_one_model() {
    let expected = greedy_tokens(model_path().to_str().unwrap(), &no_hub()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let splits = write_splits(tmp.path(), "smol-Q4_1", 3);
    let tokens = greedy_tokens(splits[0].to_str().unwrap(), &no_hub()).unwrap();
    assert_eq!(tokens, expected, "the splits decode as the whole file");

    let err = greedy_tokens(splits[1].to_str().unwrap(), &no_hub()).unwrap_err();
    assert!(err.contains("pass the first split"), "{err}");
    std::fs::remove_file(&splits[2]).unwrap();
    let err = greedy_tokens(splits[0].to_str().unwrap(), &no_hub()).unwrap_err();
    assert!(
        err.contains("split 3 of 3") && err.contains("is missing"),
        "{err}"
    );
}

/// An offline HF cache holding `org/smol-GGUF` at one commit, laid out as hf-hub lays it
/// (`models--org--smol-GGUF/{refs/main,snapshots/COMMIT/...}`): the default model as a Q4_1
/// file, the same model split in two under a folder, and decoys.
fn gguf_repo_cache(root: &Path) -> HubOptions {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = root.join("models--org--smol-GGUF");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(snapshot.join("split")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    std::fs::copy(model_path(), snapshot.join("smol-Q4_1.gguf")).unwrap();
    write_splits(&snapshot.join("split"), "smol-Q4_K_M", 2);
    std::fs::write(snapshot.join("README.md"), "decoy").unwrap();
    std::fs::write(snapshot.join("mmproj-smol-Q4_K_M.gguf"), "not a model").unwrap();
    let cache = root.to_str().unwrap().to_string();
    HubOptions::from_env(move |key| match key {
        "HF_HUB_CACHE" => Some(cache.clone()),
        "HF_HUB_OFFLINE" => Some("1".to_string()),
        _ => None,
    })
}

#[test]
fn a_gguf_repository_in_the_hub_cache_is_served_by_tag_or_file() {
    let expected = greedy_tokens(model_path().to_str().unwrap(), &no_hub()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hub = gguf_repo_cache(tmp.path());
    for source in [
        "org/smol-GGUF:Q4_1",
        "hf.co/org/smol-GGUF:q4_1",
        "org/smol-GGUF/smol-Q4_1.gguf",
        // No tag: llama.cpp's default, Q4_K_M (here: the split copy, by its name).
        "org/smol-GGUF",
        "org/smol-GGUF:Q4_K_M",
        "org/smol-GGUF/split/smol-Q4_K_M-00001-of-00002.gguf",
    ] {
        let tokens = greedy_tokens(source, &hub).unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(tokens, expected, "{source}");
    }
    let err = greedy_tokens("org/smol-GGUF:Q8_0", &hub).unwrap_err();
    assert!(
        err.contains("no GGUF tagged Q8_0") && err.contains("smol-Q4_1.gguf"),
        "the error lists what there is: {err}"
    );
    let err = greedy_tokens("org/absent-GGUF:Q4_1", &hub).unwrap_err();
    assert!(
        err.contains("org/absent-GGUF") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}

/// A hub on a loopback port serving `files` (path in the repo -> bytes) of `org/smol-GGUF` at
/// one commit, as hf-hub's client reads a hub: the repository's listing at
/// `/api/models/{repo}/revision/{rev}`, each file at `/{repo}/resolve/{rev}/{path}` with the
/// `x-repo-commit`, `etag` and `Content-Range` headers it asks a `Range: bytes=0-0` request for,
/// then the bytes from the range's start. Counts the file downloads (ranges past 0-0).
struct FakeHub {
    base: String,
    downloads: Arc<std::sync::Mutex<Vec<String>>>,
}

const HUB_COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

impl FakeHub {
    async fn start(files: Vec<(String, Vec<u8>)>) -> Self {
        use axum::extract::{Path as UrlPath, State};
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::{IntoResponse, Response};
        use axum::routing::get;

        type Shared = (
            Arc<Vec<(String, Vec<u8>)>>,
            Arc<std::sync::Mutex<Vec<String>>>,
        );
        async fn listing(State((files, _)): State<Shared>) -> Response {
            let siblings: Vec<serde_json::Value> = files
                .iter()
                .map(|(name, _)| serde_json::json!({"rfilename": name}))
                .collect();
            axum::Json(serde_json::json!({"siblings": siblings, "sha": HUB_COMMIT})).into_response()
        }
        async fn resolve(
            State((files, downloads)): State<Shared>,
            UrlPath((_rev, path)): UrlPath<(String, String)>,
            headers: HeaderMap,
        ) -> Response {
            let Some((_, bytes)) = files.iter().find(|(name, _)| *name == path) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            let range = headers
                .get("range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("bytes=0-");
            let spec = range.trim_start_matches("bytes=");
            let (start, end) = spec.split_once('-').unwrap_or((spec, ""));
            let start: usize = start.parse().unwrap_or(0);
            let end: usize = end
                .parse()
                .map_or(bytes.len() - 1, |e: usize| e.min(bytes.len() - 1));
            if range != "bytes=0-0" {
                downloads.lock().unwrap().push(path.clone());
            }
            let etag = format!("\"{:016x}{:08x}\"", bytes.len(), path.len());
            (
                StatusCode::PARTIAL_CONTENT,
                [
                    ("x-repo-commit", HUB_COMMIT.to_string()),
                    ("etag", etag),
                    (
                        "content-range",
                        format!("bytes {start}-{end}/{}", bytes.len()),
                    ),
                ],
                bytes[start..=end].to_vec(),
            )
                .into_response()
        }

        let downloads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/api/models/org/smol-GGUF/revision/{rev}", get(listing))
            .route("/org/smol-GGUF/resolve/{rev}/{*path}", get(resolve))
            .with_state((Arc::new(files), downloads.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, downloads }
    }

    /// Hub options that reach this hub, with an empty cache at `cache`.
    fn options(&self, cache: &Path) -> HubOptions {
        let (endpoint, cache) = (self.base.clone(), cache.to_str().unwrap().to_string());
        HubOptions::from_env(move |key| match key {
            "HF_ENDPOINT" => Some(endpoint.clone()),
            "HF_HUB_CACHE" => Some(cache.clone()),
            _ => None,
        })
    }
}

/// Online: the listing comes from the hub's API, the chosen GGUF (both splits of a split one)
/// is downloaded into the cache as hf-hub lays it out, and it decodes as the original file;
/// a second load finds it in the cache and downloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_repository_is_fetched_from_a_hub() {
    let expected = tokio::task::spawn_blocking(|| {
        greedy_tokens(model_path().to_str().unwrap(), &no_hub()).unwrap()
    })
    .await
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let splits = write_splits(tmp.path(), "smol-Q4_K_M", 2);
    let mut files: Vec<(String, Vec<u8>)> = splits
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            (format!("split/{name}"), std::fs::read(p).unwrap())
        })
        .collect();
    files.push(("README.md".into(), b"decoy".to_vec()));
    files.push(("smol-Q8_0.gguf".into(), b"not fetched".to_vec()));
    let hub = FakeHub::start(files).await;
    let options = hub.options(&tmp.path().join("cache"));

    for (source, fetched) in [("org/smol-GGUF:Q4_K_M", 2), ("org/smol-GGUF", 0)] {
        let options = options.clone();
        let tokens = tokio::task::spawn_blocking(move || greedy_tokens(source, &options))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(tokens, expected, "{source}");
        let mut downloads = std::mem::take(&mut *hub.downloads.lock().unwrap());
        downloads.sort();
        assert_eq!(downloads.len(), fetched, "{source}: {downloads:?}");
        if fetched > 0 {
            assert_eq!(
                downloads,
                [
                    "split/smol-Q4_K_M-00001-of-00002.gguf",
                    "split/smol-Q4_K_M-00002-of-00002.gguf"
                ]
            );
        }
    }
    let options = options.clone();
    let err = tokio::task::spawn_blocking(move || greedy_tokens("org/smol-GGUF:IQ4_XS", &options))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("no GGUF tagged IQ4_XS") && err.contains("smol-Q8_0.gguf"),
        "{err}"
    );
}

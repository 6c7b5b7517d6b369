//! Models without a chat template chat with one of ferry's built-in ones, and the
//! `chat_template` setting replaces any model's: real `ferry serve` processes on the default
//! SmolLM2 GGUF and on a copy of it written here without `tokenizer.chat_template`. The prompt a
//! chat was rendered to shows in `usage.prompt_tokens`, compared with `/tokenize` of the text
//! the template must have produced.

use crate::real_model;
use crate::serve_process::{free_port, ServeProcess};

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::QTensor;
use candle_core::Device;
use serde_json::{json, Value};

use ferry::model::tokenizer::TextTokenizer;

const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Writes the default model to `dir` without its chat template; returns the copy's path.
fn copy_without_template(dir: &Path) -> PathBuf {
    let source = real_model::model_path();
    let mut reader = File::open(&source).unwrap();
    let content = Content::read(&mut reader).unwrap();
    assert!(
        content.metadata.contains_key(TEMPLATE_KEY),
        "the original has one"
    );
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(key, _)| key.as_str() != TEMPLATE_KEY)
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(&str, QTensor)> = names
        .iter()
        .map(|name| {
            let tensor = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
            (name.as_str(), tensor)
        })
        .collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let path = dir.join("smollm2-no-template.gguf");
    let mut out = File::create(&path).unwrap();
    gguf_file::write(&mut out, &metadata, &tensor_refs).unwrap();
    path
}

/// `ferry serve ARGS` with its log written to `log`.
async fn serve(args: &[&str], log: &Path) -> ServeProcess {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let log = File::create(log).unwrap();
    ServeProcess::start_with(&args, |command| {
        command.stderr(log);
    })
    .await
}

async fn post(server: &ServeProcess, path: &str, body: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .json(&body)
        .send()
        .await
        .expect("response");
    let status = response.status();
    let body: Value = response.json().await.expect("json");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// `usage.prompt_tokens` of a one-token chat of `messages` with `model`.
async fn chat_prompt_tokens(server: &ServeProcess, model: &str, messages: Value) -> u64 {
    let reply = post(
        server,
        "/v1/chat/completions",
        json!({"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}),
    )
    .await;
    reply["usage"]["prompt_tokens"].as_u64().expect("usage")
}

/// The number of tokens `/tokenize` gives `text` (special tokens parsed).
async fn token_count(server: &ServeProcess, model: &str, text: &str, bos: bool) -> u64 {
    let reply = post(
        server,
        "/tokenize",
        json!({"model": model, "prompt": text, "add_special_tokens": bos}),
    )
    .await;
    reply["count"].as_u64().unwrap()
}

fn messages() -> Value {
    json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])
}

#[tokio::test]
async fn a_gguf_without_a_template_chats_with_the_builtin_chatml() {
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_without_template(dir.path());
    let log = dir.path().join("serve.log");
    let server = serve(
        &["--model", copy.to_str().unwrap(), "--served-name", "bare"],
        &log,
    )
    .await;

    // ChatML's blocks (BOS first only if the model adds one to prompts, which /tokenize's
    // add_special_tokens does likewise).
    let chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
                  <|im_start|>assistant\n";
    let expected = token_count(&server, "bare", chatml, true).await;
    assert_eq!(
        chat_prompt_tokens(&server, "bare", messages()).await,
        expected
    );

    let log = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("built-in")).collect();
    assert_eq!(warnings.len(), 1, "one warning at load:\n{log}");
    assert!(
        warnings[0].contains("WARN") && warnings[0].contains("built-in chatml template"),
        "{}",
        warnings[0]
    );
}

#[tokio::test]
async fn the_chat_template_setting_replaces_the_models_own_inline_or_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let inline = "{% for m in messages %}INLINE-MARK {{ m.role }}: {{ m.content }};{% endfor %}";
    std::fs::write(
        dir.path().join("marked.jinja"),
        "{% for m in messages %}<|im_start|>FILE-MARK {{ m.content }}<|im_end|>{% endfor %}\n",
    )
    .unwrap();
    let model = real_model::model_path();
    let config = dir.path().join("ferry.toml");
    std::fs::write(
        &config,
        format!(
            "[[models]]\nname = \"inline\"\nsource = {source:?}\nchat_template = {inline:?}\nmax_context = 512\n\n\
             [[models]]\nname = \"file\"\nsource = {source:?}\nchat_template = \"marked.jinja\"\nmax_context = 512\n",
            source = model.display().to_string(),
        ),
    )
    .unwrap();

    // `ferry config` shows both, from the file (the relative path rebased on its folder), and
    // a flag for every model.
    let shown = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("chat_template"))
        .collect();
    let file_path = dir.path().join("marked.jinja");
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("INLINE-MARK") && lines[0].ends_with("# file"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(&format!("{:?}", file_path.display().to_string())),
        "{}",
        lines[1]
    );
    let flagged = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["config", "--chat-template", "x.jinja"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&flagged.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("chat_template = \"x.jinja\"")
                && l.ends_with("# flag --chat-template")),
        "{text}"
    );

    let log = dir.path().join("serve.log");
    let server = serve(&["--config", config.to_str().unwrap()], &log).await;
    let user = json!([{"role": "user", "content": "Hi there"}]);
    let own = {
        let mut reader = File::open(&model).unwrap();
        let tok = TextTokenizer::from_gguf(&Content::read(&mut reader).unwrap()).unwrap();
        let messages = vec![ferry::engine::ChatMessage {
            role: "user".into(),
            content: "Hi there".into(),
            ..Default::default()
        }];
        tok.encode_chat(&messages, true, false).unwrap().len() as u64
    };
    for (name, rendered) in [
        ("inline", "INLINE-MARK user: Hi there;"),
        ("file", "<|im_start|>FILE-MARK Hi there<|im_end|>"),
    ] {
        let expected = token_count(&server, name, rendered, false).await;
        let got = chat_prompt_tokens(&server, name, user.clone()).await;
        assert_eq!(got, expected, "{name}");
        assert_ne!(got, own, "{name}: not the model's own template");
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("built-in"), "{log}");
    assert_eq!(
        log.matches("chat template from the chat_template setting")
            .count(),
        2,
        "{log}"
    );
}

#[test]
fn a_chat_template_file_that_is_not_there_fails_the_load_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let missing = "/nonexistent/ferry-chat.jinja";
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("serve")
        .arg("--model")
        .arg(real_model::model_path())
        .args(["--chat-template", missing, "--device", "cpu", "--port"])
        .arg(free_port().to_string())
        .env_remove("FERRY_PORT")
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ferry serve kept running with a chat_template file that is not there");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success());
    assert!(stderr.contains(missing), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

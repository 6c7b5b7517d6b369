//! A real OpenAI client (async-openai 0.28) against the router on a loopback port.

use super::*;
use async_openai::config::OpenAIConfig;
use async_openai::types::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
    CreateCompletionRequestArgs, FinishReason, Role,
};
use async_openai::Client;
use futures::StreamExt;

async fn serve() -> (Client<OpenAIConfig>, ferry::server::ShutdownTrigger) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, signal) = ferry::server::shutdown_channel();
    let backend = TestBackend::new() as Arc<dyn Backend>;
    tokio::spawn(ferry::server::run(
        backend,
        ServerOptions::default(),
        listener,
        signal,
    ));
    let config = OpenAIConfig::new()
        .with_api_base(format!("http://{addr}/v1"))
        .with_api_key("x");
    (Client::with_config(config), stop)
}

#[tokio::test]
async fn chat_and_completions_parse() {
    let (client, _stop) = serve().await;
    let message = ChatCompletionRequestUserMessageArgs::default()
        .content("Hi")
        .build()
        .unwrap();
    let request = CreateChatCompletionRequestArgs::default()
        .model(READY)
        .messages([message.into()])
        .max_completion_tokens(4u32)
        .temperature(0.0f32)
        .build()
        .unwrap();
    let response = client.chat().create(request.clone()).await.unwrap();
    assert_eq!(response.object, "chat.completion");
    assert_eq!(response.choices[0].message.role, Role::Assistant);
    assert_eq!(
        response.choices[0].message.content.as_deref(),
        Some("Hello, world!")
    );
    assert_eq!(
        response.choices[0].finish_reason,
        Some(FinishReason::Length)
    );
    assert_eq!(response.usage.unwrap().completion_tokens, 4);

    let mut stream = client.chat().create_stream(request).await.unwrap();
    let mut text = String::new();
    let mut finishes = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        for choice in chunk.choices {
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
            finishes += usize::from(choice.finish_reason.is_some());
        }
    }
    assert_eq!((text.as_str(), finishes), ("Hello, world!", 1));

    let request = CreateCompletionRequestArgs::default()
        .model(READY)
        .prompt("Once")
        .max_tokens(2u32)
        .logprobs(1u8)
        .build()
        .unwrap();
    let response = client.completions().create(request.clone()).await.unwrap();
    assert_eq!(response.choices[0].text, "Hello,");
    let logprobs = response.choices[0].logprobs.as_ref().unwrap();
    assert_eq!(logprobs.tokens, ["Hello", ","]);
    assert_eq!(response.usage.unwrap().prompt_tokens, 5);

    let mut stream = client.completions().create_stream(request).await.unwrap();
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        for choice in chunk.unwrap().choices {
            text.push_str(&choice.text);
        }
    }
    assert_eq!(text, "Hello,");
}

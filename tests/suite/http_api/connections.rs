//! Connection handling and the stop sequence of `ferry::server::run`, on a real loopback port
//! with raw TCP clients: header-read and idle timeouts, the connection cap (idle connections and
//! ones trickling a request body make room), a declared body over the limit, shutdown not waiting
//! for connections without a request, the shutdown deadline's error event and 503, and a second
//! stop request ending the server at once. Where a timeout is the subject, tokio's time is paused
//! (it jumps to the next timer whenever every task waits), so no test sleeps through one.

use super::*;

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

fn options() -> ServerOptions {
    ServerOptions {
        header_read_timeout: HEADER_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        ..ServerOptions::default()
    }
}

async fn start(options: ServerOptions) -> (Arc<TestBackend>, Loopback) {
    let backend = TestBackend::new();
    let server = Loopback::start(backend.clone() as Arc<dyn Backend>, options).await;
    (backend, server)
}

const HEALTH: &str = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// A streamed completion that stays in flight until its client goes away.
fn stuck_stream_request() -> String {
    let body = json!({"model": STUCK, "prompt": "x", "max_tokens": 8, "stream": true}).to_string();
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// How many of `streams` the server closes within 200 ms each.
async fn closed_by_the_server(streams: &mut [tokio::net::TcpStream]) -> usize {
    let mut closed = 0;
    for stream in streams {
        let read = tokio::time::timeout(Duration::from_millis(200), read_until_closed(stream));
        if read.await.is_ok() {
            closed += 1;
        }
    }
    closed
}

/// Opens a connection, sends `request`, and returns it once the response head arrived.
async fn in_flight(server: &Loopback, request: &str) -> (tokio::net::TcpStream, String) {
    let mut stream = server.connect().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_response_head(&mut stream).await;
    (stream, head)
}

/// Reads from `stream` until a response head has arrived; returns what was read.
async fn read_response_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the response head");
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(start_paused = true)]
async fn a_half_sent_header_is_closed_after_the_header_read_timeout() {
    let (_, server) = start(options()).await;
    let mut idle = server.connect().await;
    let mut half = server.connect().await;
    half.write_all(b"GET /health HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    let sent = Instant::now();
    let answer = read_until_closed(&mut half).await;
    let waited = sent.elapsed();
    assert!(answer.is_empty(), "no answer to half a request: {answer:?}");
    assert!(
        waited >= HEADER_TIMEOUT && waited < IDLE_TIMEOUT,
        "closed after {waited:?}"
    );
    // The connection that sent nothing is under the (longer) idle timeout: still served.
    idle.write_all(HEALTH.as_bytes()).await.unwrap();
    let answer = String::from_utf8(read_until_closed(&mut idle).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let (_, server) = start(options()).await;
    let mut idle = server.connect().await;
    let opened = Instant::now();
    assert!(read_until_closed(&mut idle).await.is_empty());
    let waited = opened.elapsed();
    assert!(
        waited >= IDLE_TIMEOUT && waited < IDLE_TIMEOUT + Duration::from_secs(1),
        "closed after {waited:?}"
    );
    // A keep-alive connection is idle again after its response: the same timeout applies.
    let mut kept = server.connect().await;
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answered = read_until_closed(&mut kept).await;
    assert!(String::from_utf8_lossy(&answered).starts_with("HTTP/1.1 200"));
    assert!(opened.elapsed() >= 2 * IDLE_TIMEOUT);
}

#[tokio::test]
async fn cap_plus_ten_idle_connections_leave_health_answering() {
    const CAP: usize = 4;
    let (_, server) = start(ServerOptions {
        max_connections: CAP,
        ..options()
    })
    .await;
    let mut flood = Vec::new();
    for _ in 0..CAP + 10 {
        flood.push(server.connect().await);
    }
    let reply = reqwest::get(server.url("/health")).await.expect("answered");
    assert_eq!(reply.status(), 200);
    // The oldest idle connections were closed to make room, so no more than the cap are open.
    let closed = closed_by_the_server(&mut flood).await;
    assert!(
        closed >= 11,
        "only {closed} of the idle connections were closed"
    );
}

/// A completion request head declaring a `length`-byte body, and the first few bytes of it.
fn trickled_body_start(length: usize) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n{{\"model\""
    )
}

#[tokio::test]
async fn connections_trickling_their_bodies_make_room_at_the_cap() {
    const CAP: usize = 4;
    let (_, server) = start(ServerOptions {
        max_connections: CAP,
        ..options()
    })
    .await;
    // More slow-body connections than the cap, each a request in flight waiting for its body.
    let mut flood = Vec::new();
    for _ in 0..CAP + 4 {
        let mut stream = server.connect().await;
        stream
            .write_all(trickled_body_start(1000).as_bytes())
            .await
            .unwrap();
        flood.push(stream);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for probe in 0..3 {
        let reply = reqwest::get(server.url("/health")).await.expect("answered");
        assert_eq!(reply.status(), 200, "probe {probe}");
    }
    let closed = closed_by_the_server(&mut flood).await;
    assert!(closed >= 4, "only {closed} of the slow bodies were closed");
}

#[tokio::test]
async fn a_declared_body_over_the_limit_gets_413_without_waiting_for_it() {
    let (_, server) = start(ServerOptions {
        body_limit: 1024,
        ..options()
    })
    .await;
    let mut stream = server.connect().await;
    stream
        .write_all(trickled_body_start(4096).as_bytes())
        .await
        .unwrap();
    // The body never comes; the answer must not wait for body_read_timeout (60 s).
    let answer = tokio::time::timeout(Duration::from_secs(10), read_response_head(&mut stream))
        .await
        .expect("answered at once");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn at_the_cap_with_every_connection_busy_new_ones_get_503_at_once() {
    let (backend, server) = start(ServerOptions {
        max_connections: 2,
        ..options()
    })
    .await;
    let (_a, head_a) = in_flight(&server, &stuck_stream_request()).await;
    let (_b, head_b) = in_flight(&server, &stuck_stream_request()).await;
    assert!(head_a.starts_with("HTTP/1.1 200") && head_b.starts_with("HTTP/1.1 200"));
    let answer = raw_exchange(server.addr, HEALTH).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_connections");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("server.max_connections"));
    assert!(
        !backend.cancelled.load(Ordering::SeqCst),
        "the busy ones go on"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_does_not_wait_for_connections_without_a_complete_request() {
    let (_, server) = start(ServerOptions {
        shutdown_timeout: Duration::from_secs(30),
        ..options()
    })
    .await;
    let mut idle = server.connect().await;
    let mut half = server.connect().await;
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: lo")
        .await
        .unwrap();
    // Let the server see both connections and the bytes before stopping.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let stopped_at = Instant::now();
    server.stop.stop();
    assert!(read_until_closed(&mut idle).await.is_empty());
    assert!(read_until_closed(&mut half).await.is_empty());
    let report = server.stopped().await;
    assert!(
        stopped_at.elapsed() < Duration::from_secs(1),
        "waited {:?}",
        stopped_at.elapsed()
    );
    assert_eq!(report, ferry::server::ServeReport::default());
}

#[tokio::test(start_paused = true)]
async fn at_the_shutdown_deadline_streams_get_an_error_event_and_the_others_503() {
    let (backend, server) = start(ServerOptions {
        shutdown_timeout: Duration::from_millis(500),
        ..options()
    })
    .await;
    let (mut stream, head) = in_flight(&server, &stuck_stream_request()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let client = reqwest::Client::new();
    let whole = tokio::spawn({
        let url = server.url("/v1/completions");
        async move {
            client
                .post(url)
                .json(&json!({"model": STUCK, "prompt": "x", "max_tokens": 8}))
                .send()
                .await
        }
    });
    // The non-streamed request is in flight before the stop.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.submitted.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "never submitted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.stop.stop();
    // No new connections once stopping.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(server.addr).await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rest = String::from_utf8_lossy(&read_until_closed(&mut stream).await).into_owned();
    assert!(rest.contains("\"code\":\"shutting_down\""), "{rest}");
    // The error event is the last JSON event, then [DONE] (chunked framing around them).
    let error_at = rest.rfind("data: {\"error\"").expect("an error event");
    let done_at = rest.rfind("data: [DONE]").expect("[DONE]");
    assert!(error_at < done_at && !rest[error_at..done_at].contains("\"text\""));
    let reply = whole.await.unwrap().expect("an answer");
    assert_eq!(reply.status(), 503);
    let v: Value = reply.json().await.unwrap();
    assert_eq!(v["error"]["code"], "shutting_down");
    let report = server.stopped().await;
    assert_eq!(report.cut_short, 2);
    assert!(!report.forced);
}

#[tokio::test(start_paused = true)]
async fn a_second_stop_request_ends_the_server_at_once() {
    let (_, server) = start(ServerOptions {
        shutdown_timeout: Duration::from_secs(3600),
        ..options()
    })
    .await;
    let (_stream, _) = in_flight(&server, &stuck_stream_request()).await;
    server.stop.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !server.served.is_finished(),
        "the first stop waits for the stream"
    );
    let second = std::time::Instant::now();
    server.stop.stop();
    let report = tokio::time::timeout(Duration::from_secs(5), server.stopped())
        .await
        .expect("stopped at once");
    assert!(second.elapsed() < Duration::from_secs(5));
    assert_eq!(
        report,
        ferry::server::ServeReport {
            cut_short: 1,
            forced: true
        }
    );
}

//! Serving a router on a TCP listener: the accept loop, one task per connection (HTTP/1.1 with
//! keep-alive, through hyper), the connection limits of [`super::connections`], and the stop
//! sequence of [`super::shutdown`].
//!
//! The stop sequence: the first stop request closes the listener (new connections are
//! refused), closes every connection without a request in flight and lets the others finish
//! within `shutdown_timeout`. At the deadline the handlers end their generations with an error
//! (see [`Lifecycle`]); they get [`DEADLINE_FLUSH`] to write it, then whatever is left is
//! dropped. A second stop request ends everything at once. [`ServeReport`] says how many
//! requests were cut short.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower_service::Service;

use super::connections::{
    BodyGuard, Command, Connection, IdleTimeouts, Registration, Registry, RequestGuard,
};
use super::error::ApiError;
use super::limits;
use super::shutdown::{Lifecycle, Phase, ShutdownSignal};
use super::ServerOptions;

/// After the shutdown deadline, how long handlers get to send their final error event.
pub const DEADLINE_FLUSH: Duration = Duration::from_secs(2);

/// Most refused connections being answered at once; beyond it they are closed unanswered.
const MAX_REFUSING: usize = 64;

/// How long a refused connection is read (and its bytes discarded) after its 503, so closing
/// it does not reset the connection before the client read the answer.
const REFUSE_LINGER: Duration = Duration::from_secs(1);

/// How the server stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// Requests still in flight at the shutdown deadline or at a second stop request: their
    /// clients got an error instead of a complete answer.
    pub cut_short: usize,
    /// A second stop request ended the server without waiting.
    pub forced: bool,
}

/// Serves `router` on `listener` until `shutdown` asks it to stop (see the module docs), with
/// the connection limits and timeouts of `options`. `lifecycle` must be the one the router's
/// handlers watch ([`super::app_with_lifecycle`]).
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    options: &ServerOptions,
    lifecycle: Lifecycle,
    mut shutdown: ShutdownSignal,
) -> io::Result<ServeReport> {
    let max_connections = limits::connection_cap(options.max_connections);
    let timeouts = IdleTimeouts {
        header_read: options.header_read_timeout,
        idle: options.idle_timeout,
    };
    let registry = Arc::new(Registry::default());
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let refusal = refusal_bytes();
    let mut tasks = JoinSet::new();
    let accept_errors = AcceptErrorLog::default();
    tracing::debug!(max_connections, ?timeouts, "accepting connections");
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    match registry.admit(max_connections) {
                        Some(registration) => {
                            tasks.spawn(drive(stream, registration, router.clone(), timeouts));
                        }
                        None => refuse(stream, &refusing, &refusal, &mut tasks),
                    }
                }
                Err(err) => accept_errors.pause_after(err).await,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = shutdown.reached(1) => break,
        }
    }
    drop(listener);
    lifecycle.enter(Phase::Draining);
    registry.drain_all();
    tracing::info!(
        open = registry.len(),
        in_flight = registry.in_flight(),
        "shutting down: no new connections; finishing the requests in flight (up to {:?})",
        options.shutdown_timeout
    );
    let finished = tokio::select! {
        () = registry.emptied() => true,
        () = tokio::time::sleep(options.shutdown_timeout) => false,
        () = shutdown.reached(2) => return Ok(forced(&registry)),
    };
    if finished {
        return Ok(ServeReport::default());
    }
    let cut_short = registry.in_flight();
    tracing::warn!(
        cut_short,
        "shutdown timeout ({:?}) reached: ending the requests still in flight with an error",
        options.shutdown_timeout
    );
    lifecycle.enter(Phase::Deadline);
    tokio::select! {
        () = registry.emptied() => {}
        () = tokio::time::sleep(DEADLINE_FLUSH) => {}
        () = shutdown.reached(2) => {}
    }
    // Dropping `tasks` closes whatever is left.
    Ok(ServeReport {
        cut_short,
        forced: false,
    })
}

fn forced(registry: &Registry) -> ServeReport {
    let cut_short = registry.in_flight();
    tracing::warn!(cut_short, "second stop request: stopping now");
    ServeReport {
        cut_short,
        forced: true,
    }
}

/// Serves one connection until it ends, its idle timeout fires, or the registry closes it.
async fn drive(
    stream: TcpStream,
    registration: Registration,
    router: Router,
    timeouts: IdleTimeouts,
) {
    let connection = Arc::clone(&registration.connection);
    let io = TokioIo::new(Watched {
        stream,
        connection: Arc::clone(&connection),
    });
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let guard = connection.request_started();
        let receiving = (!request.body().is_end_stream()).then(|| connection.body_started());
        let request = request.map(|body| Receiving {
            body,
            guard: receiving,
        });
        let mut router = router.clone();
        async move {
            let response = router.call(request).await?;
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Tracked {
                    body,
                    _guard: guard,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true).header_read_timeout(None);
    let http = builder.serve_connection(io, service);
    tokio::pin!(http);
    let connection = &registration.connection;
    let mut draining = false;
    loop {
        let (command, deadline) = connection.status(timeouts);
        match command {
            Command::Close => return,
            Command::Drain if !draining => {
                http.as_mut().graceful_shutdown();
                draining = true;
            }
            _ => {}
        }
        let expired = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = http.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "connection ended with an error");
                }
                return;
            }
            () = expired => {
                // Re-checked: a request may have started at the same instant.
                if connection.status(timeouts).1.is_some_and(|at| at <= tokio::time::Instant::now()) {
                    tracing::debug!("closing a connection: idle or header-read timeout");
                    return;
                }
            }
            () = connection.changed() => {}
        }
    }
}

/// A TCP stream that tells its [`Connection`] when bytes arrive.
struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.connection.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A request body that tells its [`Connection`] when it has arrived (at its end, on an error,
/// or when the request is dropped unread).
struct Receiving {
    body: Incoming,
    guard: Option<BodyGuard>,
}

impl http_body::Body for Receiving {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A response body that keeps its request in flight until it is dropped.
struct Tracked {
    body: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a connection over the limit, as raw HTTP/1.1 bytes.
fn refusal_bytes() -> Arc<[u8]> {
    let body = ApiError::too_many_connections().to_json();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        super::error::OVERLOADED_RETRY_AFTER_SECS,
        body.len()
    );
    Arc::from([head.as_bytes(), body.as_bytes()].concat())
}

/// Answers a connection over the limit with 503 and closes it, without reading its request
/// (reading what the client sends for a moment so the close does not reset the answer).
fn refuse(
    stream: TcpStream,
    refusing: &Arc<Semaphore>,
    refusal: &Arc<[u8]>,
    tasks: &mut JoinSet<()>,
) {
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    let refused = REFUSED.fetch_add(1, Ordering::Relaxed);
    if refused.is_power_of_two() {
        tracing::warn!(
            refused = refused + 1,
            "connection limit reached and every connection is busy: refusing new connections with 503"
        );
    }
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return;
    };
    let refusal = Arc::clone(refusal);
    tasks.spawn(async move {
        let mut stream = stream;
        let _permit = permit;
        if stream.write_all(&refusal).await.is_err() || stream.shutdown().await.is_err() {
            return;
        }
        let mut sink = [0u8; 4096];
        let drain = async {
            let mut read = 0usize;
            while read < 64 * 1024 {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        };
        let _ = tokio::time::timeout(REFUSE_LINGER, drain).await;
    });
}

/// Logs accept errors (at most one line per second) and pauses briefly after one: an error such
/// as "too many open files" repeats at once otherwise.
#[derive(Default)]
struct AcceptErrorLog {
    last: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl AcceptErrorLog {
    async fn pause_after(&self, err: io::Error) {
        {
            let now = tokio::time::Instant::now();
            let mut last = self
                .last
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1)) {
                tracing::warn!(error = %err, "accept error");
                *last = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

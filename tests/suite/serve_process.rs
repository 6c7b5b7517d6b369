//! A real `ferry serve` process for the tests that are about the process itself: its resident
//! memory, its exit code, its signals. Started on a free loopback port, waited for (bounded)
//! until `/health` answers 200, killed when dropped so a failing test leaves nothing behind.

#![allow(dead_code)]

use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `ferry serve`.
pub struct ServeProcess {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl ServeProcess {
    /// Runs `ferry serve ARGS --port PORT --device cpu` (stderr discarded) and waits until it is
    /// healthy.
    pub async fn start(args: &[OsString]) -> Self {
        Self::start_with(args, |_| {}).await
    }

    /// [`Self::start`] with the command adjusted by `adjust` first (environment, stderr).
    pub async fn start_with(args: &[OsString], adjust: impl FnOnce(&mut Command)) -> Self {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ferry"));
        command
            .arg("serve")
            .args(args)
            .args(["--port", &port.to_string(), "--device", "cpu"])
            .env("RUST_LOG", "info")
            .env_remove("FERRY_PORT")
            .stderr(Stdio::null());
        adjust(&mut command);
        let child = command.spawn().expect("spawns");
        let mut server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        server.wait_healthy(Duration::from_secs(120)).await;
        server
    }

    async fn wait_healthy(&mut self, within: Duration) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + within;
        loop {
            assert!(Instant::now() < deadline, "server never became healthy");
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("the server exited before it was healthy: {status}");
            }
            if let Ok(r) = client.get(format!("{}/health", self.base)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Resident memory of the process in bytes (Linux /proc).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kib * 1024
    }

    /// One sample of the metrics page (0 when absent): the sum over its label sets.
    pub async fn metric(&self, name: &str) -> f64 {
        let page = reqwest::Client::new()
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("text");
        page.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(['{', ' ']))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                return exit;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

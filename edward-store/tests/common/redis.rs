//! Helpers of the Redis test binaries: the shared test server's URL, fresh
//! key prefixes, key counting, and private servers a test can SIGKILL.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edward_core::testkit::unique;
use edward_store::{RedisBackend, RedisOptions};

/// The Redis URL the tests use. Tests never skip: without it they fail and
/// say how to get one.
pub fn redis_url() -> String {
    match std::env::var("EDWARD_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "EDWARD_TEST_REDIS_URL is not set: run scripts/test.sh, or start Redis with \
             `scripts/redis.sh start` and export EDWARD_TEST_REDIS_URL=<the URL it prints>"
        ),
    }
}

/// A fresh key prefix, so tests never see each other's keys.
pub fn fresh_prefix() -> String {
    format!("{}:", unique("t"))
}

/// A backend on the shared test server under a fresh prefix.
pub async fn backend() -> RedisBackend {
    backend_with(RedisOptions::default().prefix(fresh_prefix())).await
}

/// A backend on the shared test server with `options`.
pub async fn backend_with(options: RedisOptions) -> RedisBackend {
    RedisBackend::connect_with(&redis_url(), options)
        .await
        .expect("connect to EDWARD_TEST_REDIS_URL")
}

/// A raw connection to `url` for inspecting and planting keys.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Every key under `prefix` (SCAN: tests only).
pub async fn keys_under(url: &str, prefix: &str) -> Vec<String> {
    let mut conn = raw(url).await;
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        out.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    out.sort();
    out
}

/// A private `redis-server` on a free port, killed on drop. Tests that must
/// kill Redis use one (the binary comes from `scripts/redis.sh`).
pub struct PrivateRedis {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

impl PrivateRedis {
    /// Start one (no persistence) with `extra` server arguments.
    pub fn start(extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(unique("edward-redis"));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut server = PrivateRedis {
            port: free_port(),
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed: run scripts/redis.sh start (or scripts/test.sh)");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("private redis-server on port {} did not start", self.port);
    }

    /// SIGKILL the server (its data is gone: no persistence).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again, empty, on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

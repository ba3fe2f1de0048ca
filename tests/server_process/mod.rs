//! Spawning `examples/server` as a process (shared by the process tests).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

pub fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = dir
        .join("examples")
        .join(format!("server{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first: `cargo build --example server` (`cargo test` and scripts/test.sh build it)",
        bin.display()
    );
    bin
}

pub struct Server {
    child: Child,
    pub base: String,
    pub second_line: String,
    _lines: Lines<BufReader<ChildStdout>>,
}

pub async fn start(dir: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(example_binary())
        .args(["--bind", "127.0.0.1:0"])
        .arg("--db")
        .arg(dir.join("edward.db"))
        .arg("--dir")
        .arg(dir.join("sandboxes"))
        .args(extra)
        .env_remove("EDWARD_MODEL")
        .env_remove("EDWARD_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn examples/server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the server prints within 30 s")
            .expect("read stdout")
            .expect("a line")
    };
    let first = next().await;
    let base = first
        .strip_prefix("Edward server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    let second_line = next().await;
    Server {
        child,
        base,
        second_line,
        _lines: lines,
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Long-poll the run's events until `run_finished`; returns them all.
    pub async fn follow(&self, http: &reqwest::Client, key: &str, id: &str) -> Vec<Value> {
        let mut all: Vec<Value> = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let after = all.last().map_or(0, |e| e["seq"].as_u64().unwrap());
                let batch: Vec<Value> = http
                    .get(self.url(&format!("/v1/runs/{id}/events?after={after}&wait=5s")))
                    .bearer_auth(key)
                    .header("accept", "application/json")
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                all.extend(batch);
                if all.last().is_some_and(|e| e["type"] == "run_finished") {
                    break;
                }
            }
        })
        .await
        .expect("the run finishes within 60 s");
        all
    }

    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("pid").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("graceful shutdown within 20 s")
            .expect("wait")
    }
}

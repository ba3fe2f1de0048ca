//! `examples/server` as a process: its CLI contract (`--bind`, `--api-key`,
//! `--db`, the printed development key, `401` without a key), a run over
//! HTTP, and a graceful shutdown + restart on the same SQLite file.
//!
//! The example binary is built by `cargo test` (all targets); when running
//! this file alone run `cargo build --example server` first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

fn example_binary() -> PathBuf {
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

struct Server {
    child: Child,
    base: String,
    second_line: String,
    _lines: Lines<BufReader<ChildStdout>>,
}

async fn start(dir: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(example_binary())
        .args(["--bind", "127.0.0.1:0", "--workers", "2"])
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
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Long-poll the run's events until `run_finished`; returns them all.
    async fn follow(&self, http: &reqwest::Client, key: &str, id: &str) -> Vec<Value> {
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

    async fn terminate(mut self) -> std::process::ExitStatus {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_keys_serve_runs_and_nothing_else_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        dir.path(),
        &["--api-key", "alice:sk-alice", "--api-key", "bob:sk-bob"],
    )
    .await;
    assert!(
        !s.second_line.contains("development API key"),
        "no key is generated when keys are given: {:?}",
        s.second_line
    );
    let http = reqwest::Client::new();
    for key in [None, Some("sk-wrong")] {
        let mut req = http.get(s.url("/v1/runs"));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let page = http.get(s.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("Edward"));

    let res = http
        .post(s.url("/v1/runs"))
        .bearer_auth("sk-alice")
        .json(&json!({ "chat_id": "c1", "prompt": "build a todo app" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let events = s.follow(&http, "sk-alice", &id).await;
    assert_eq!(events.last().unwrap()["payload"]["status"], "completed");
    let files: Value = http
        .get(s.url(&format!("/v1/runs/{id}/files")))
        .bearer_auth("sk-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(files["files"].as_array().unwrap().len() >= 3, "{files}");
    let res = http
        .get(s.url(&format!("/v1/runs/{id}")))
        .bearer_auth("sk-bob")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404, "bob cannot see alice's run");

    // SIGTERM: a graceful exit; the SQLite file keeps the run for the next start.
    assert!(s.terminate().await.success());
    let s = start(dir.path(), &["--api-key", "alice:sk-alice"]).await;
    let run: Value = http
        .get(s.url(&format!("/v1/runs/{id}")))
        .bearer_auth("sk-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "completed");
    assert!(s.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_a_development_key_is_printed_and_works() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &[]).await;
    let key = s
        .second_line
        .strip_prefix("development API key (user `dev`): ")
        .unwrap_or_else(|| panic!("unexpected second line {:?}", s.second_line))
        .to_string();
    assert!(key.len() >= 32);
    let http = reqwest::Client::new();
    let res = http
        .get(s.url("/v1/runs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        http.get(s.url("/v1/runs")).send().await.unwrap().status(),
        401
    );
    assert!(s.terminate().await.success());
}

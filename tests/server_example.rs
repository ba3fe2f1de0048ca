//! `examples/server` as a process: its CLI contract (`--bind`, `--api-key`,
//! `--db`, the printed development key, `401` without a key), a run over
//! HTTP, and a graceful shutdown + restart on the same SQLite file.
//!
//! The example binary is built by `cargo test` (all targets); when running
//! this file alone run `cargo build --example server` first.

mod server_process;

use serde_json::{Value, json};
use server_process::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_keys_serve_runs_and_nothing_else_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        dir.path(),
        &[
            "--workers",
            "2",
            "--api-key",
            "alice:sk-alice",
            "--api-key",
            "bob:sk-bob",
        ],
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
    let s = start(
        dir.path(),
        &["--workers", "2", "--api-key", "alice:sk-alice"],
    )
    .await;
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

//! Several `examples/server` processes on one Postgres: admission across
//! processes admits exactly the limit under 1,000 concurrent submits, and a
//! run worked on in one process streams to a client of another.
//!
//! Needs `EDWARD_TEST_DATABASE_URL` (scripts/test.sh starts Postgres) and
//! the example built with the `postgres` feature (`cargo test --all-features`
//! builds it).
#![cfg(feature = "postgres")]

mod server_process;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use server_process::{Server, start};

/// The tests share one database and its queue: a worker started by one test
/// would claim the other's runs, so they take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn database_url() -> String {
    std::env::var("EDWARD_TEST_DATABASE_URL").expect(
        "EDWARD_TEST_DATABASE_URL is not set: run scripts/test.sh (it starts Postgres), \
         or scripts/pg.sh start and export the URL it prints",
    )
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid_like())
}

fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}

async fn start_pg(dir: &std::path::Path, user: &str, key: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--database-url".to_string(),
        database_url(),
        "--api-key".to_string(),
        format!("{user}:{key}"),
        "--rate-limit".to_string(),
        "0".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start(dir, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_submits_across_three_processes_admit_exactly_the_limit() {
    const LIMIT: usize = 37;
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let user = unique("user");
    let key = unique("key");
    let limit = LIMIT.to_string();
    let extra = [
        "--workers",
        "0",
        "--limit-user",
        &limit,
        "--limit-global",
        "100000",
        "--limit-chat",
        "100000",
    ];
    let servers = [
        start_pg(dir.path(), &user, &key, &extra).await,
        start_pg(dir.path(), &user, &key, &extra).await,
        start_pg(dir.path(), &user, &key, &extra).await,
    ];
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let results: Vec<(u16, Value)> = futures::stream::iter(0..1000)
        .map(|i| {
            let url = servers[i % 3].url("/v1/runs");
            let http = http.clone();
            let key = key.clone();
            async move {
                let res = http
                    .post(url)
                    .bearer_auth(key)
                    .json(&json!({ "chat_id": format!("chat-{i}"), "prompt": "p" }))
                    .send()
                    .await
                    .expect("submit");
                let status = res.status().as_u16();
                (status, res.json().await.expect("JSON"))
            }
        })
        .buffer_unordered(1000)
        .collect()
        .await;
    let admitted: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b)
        .collect();
    let refused = results
        .iter()
        .filter(|(s, b)| *s == 429 && b["error"]["limit"] == "user")
        .count();
    assert_eq!(
        admitted.len(),
        LIMIT,
        "exactly the per-user limit is admitted"
    );
    assert_eq!(
        refused,
        1000 - LIMIT,
        "every other submit is a 429 naming the limit"
    );
    // Clean up: cancel them (queued runs finish at once), through any process.
    for (i, run) in admitted.iter().enumerate() {
        let id = run["run_id"].as_str().unwrap();
        let res = http
            .post(servers[i % 3].url(&format!("/v1/runs/{id}/cancel")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert!(res.status() == 202 || res.status() == 200);
    }
    for s in servers {
        assert!(s.terminate().await.success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_from_a_worker_in_one_process_stream_to_a_client_of_another() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let user = unique("user");
    let key = unique("key");
    let worker = start_pg(dir.path(), &user, &key, &["--workers", "2"]).await;
    let api_only = start_pg(dir.path(), &user, &key, &["--workers", "0"]).await;
    let http = reqwest::Client::new();
    let res = http
        .post(api_only.url("/v1/runs"))
        .bearer_auth(&key)
        .json(&json!({ "chat_id": unique("chat"), "prompt": "build a todo app" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();

    // SSE from the API-only process; only the other one has a worker.
    let res = http
        .get(api_only.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.bytes_stream();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    })
    .await
    .expect("the stream ends within 60 s");
    let ids: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "gap-free, no duplicates"
    );
    assert!(text.contains("event: run_started"));
    assert!(text.contains("event: run_finished"));
    let run: Value = http
        .get(worker.url(&format!("/v1/runs/{id}")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "completed");
    assert_eq!(run["last_seq"], ids.len() as u64);
    // Files are read through the sandbox directory both processes share here.
    let files: Value = http
        .get(api_only.url(&format!("/v1/runs/{id}/files")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(files["files"].as_array().unwrap().len() >= 3);
    assert!(worker.terminate().await.success());
    assert!(api_only.terminate().await.success());
}

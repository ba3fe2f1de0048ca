//! Webhooks against a local receiver over real sockets: signed, retried
//! (the receiver fails twice), one record per attempt, private targets refused.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use bytes::Bytes;
use common::{ALICE, Opts, TestServer};
use edward_http::{HttpConfig, WebhookConfig, sign_webhook};
use tokio::sync::mpsc;

const SECRET_B64: &str = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Received {
    headers: HeaderMap,
    body: Bytes,
    answered: StatusCode,
}

/// A receiver answering 500 to its first `failures` requests, then 204.
async fn receiver(failures: u32) -> (String, mpsc::UnboundedReceiver<Received>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicU32::new(0));
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let (tx, seen) = (tx.clone(), seen.clone());
            async move {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let answered = if n < failures {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::NO_CONTENT
                };
                let _ = tx.send(Received {
                    headers,
                    body,
                    answered,
                });
                answered
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_finished_is_signed_and_retried_until_delivered() {
    let (url, mut rx) = receiver(2).await;
    let hook = WebhookConfig::new(&url, &format!("whsec_{SECRET_B64}"))
        .unwrap()
        .allow_private(true)
        .retries(5, Duration::from_millis(50));
    let s = TestServer::start(Opts {
        http: HttpConfig::default().rate_limit(None).webhook(hook),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "build a todo app").await;
    let run = s.wait_finished(id).await;
    let secret = base64::engine::general_purpose::STANDARD
        .decode(SECRET_B64)
        .unwrap();

    let mut got = Vec::new();
    while got.len() < 3 {
        let r = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("a delivery attempt within 20 s")
            .unwrap();
        got.push(r);
    }
    let expected_id = format!("{id}_{}", run.last_seq);
    for r in &got {
        let h = |k: &str| r.headers[k].to_str().unwrap().to_string();
        assert_eq!(
            h("webhook-id"),
            expected_id,
            "the seq is the id, the same on retries"
        );
        let ts: i64 = h("webhook-timestamp").parse().unwrap();
        assert_eq!(
            h("webhook-signature"),
            sign_webhook(&secret, &expected_id, ts, &r.body)
        );
        let event: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(event["type"], "run_finished");
        assert_eq!(event["seq"], run.last_seq);
        assert_eq!(event["run_id"], id.to_string());
    }
    assert_eq!(
        got.iter().map(|r| r.answered.as_u16()).collect::<Vec<_>>(),
        vec![500, 500, 204]
    );
    // Records: one per attempt, the last delivered.
    let records = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let r = s.api.webhook_deliveries(Some(id));
            if r.len() == 3 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("three records");
    assert_eq!(
        records.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        records.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![Some(500), Some(500), Some(204)]
    );
    assert!(!records[0].delivered && !records[1].delivered && records[2].delivered);
    assert!(records.iter().all(|r| r.webhook_id == expected_id));
    // No further attempt once delivered.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_can_be_delivered_in_seq_order() {
    let (url, mut rx) = receiver(0).await;
    let hook = WebhookConfig::new(&url, "plain-secret")
        .unwrap()
        .allow_private(true)
        .all_events(true);
    let s = TestServer::start(Opts {
        http: HttpConfig::default().rate_limit(None).webhook(hook),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "build a todo app").await;
    let run = s.wait_finished(id).await;
    let mut seqs = Vec::new();
    while seqs.len() < run.last_seq as usize {
        let r = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap()
            .unwrap();
        let event: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        seqs.push(event["seq"].as_u64().unwrap());
    }
    assert_eq!(seqs, (1..=run.last_seq).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_targets_are_refused_unless_allowed() {
    let (url, mut rx) = receiver(0).await;
    let hook = WebhookConfig::new(&url, "secret").unwrap();
    let s = TestServer::start(Opts {
        http: HttpConfig::default().rate_limit(None).webhook(hook),
        ..Opts::default()
    })
    .await;
    let id = s.submit(ALICE, "build a todo app").await;
    s.wait_finished(id).await;
    let records = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = s.api.webhook_deliveries(Some(id));
            if !r.is_empty() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a record of the refusal");
    assert_eq!(records.len(), 1, "a refusal is not retried");
    assert!(!records[0].delivered);
    assert!(
        records[0]
            .error
            .as_deref()
            .unwrap()
            .contains("non-public address")
    );
    assert!(
        rx.try_recv().is_err(),
        "nothing reached the loopback receiver"
    );
}

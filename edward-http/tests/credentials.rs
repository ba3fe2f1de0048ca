//! `/v1/credentials` over real sockets: a user sets a provider key, sees it
//! masked, a run uses it against a local fake OpenAI-compatible provider
//! that checks the key it receives, deleting it makes the next run fail
//! with a clear reason; another user never sees it (404), and no answer
//! echoes the key.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::{ALICE, BOB, Opts, TestServer, expect_error, unique};
use edward_core::CredentialStore;
use edward_core::engine::WorkerConfig;
use edward_core::memory::MemoryCredentialStore;
use edward_core::providers::RetryPolicy;
use edward_core::registry::{KeyPolicy, MasterKeys, ProviderConfig, ProviderRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const ALICE_PROVIDER_KEY: &str = "sk-alice-provider-PLAINTEXT-93be17";

const ANSWER: &str = "<edward_sandbox project=\"p\">\n<file path=\"a.txt\">\nhi\n</file>\n</edward_sandbox>\n<edward_done/>";

/// A fake OpenAI-compatible provider accepting only `key`; records every
/// key it receives.
async fn provider(key: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .fallback(
            |State((key, seen)): State<(&'static str, Arc<Mutex<Vec<String>>>)>,
             req: Request| async move {
                let got = req
                    .headers()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or("")
                    .to_string();
                seen.lock().unwrap().push(got.clone());
                if got != key {
                    return Response::builder()
                        .status(401)
                        .header("content-type", "application/json")
                        .body(Body::from(
                            json!({"error":{"message":"Incorrect API key","code":"invalid_api_key"}})
                                .to_string(),
                        ))
                        .unwrap();
                }
                let data = |v: Value| format!("data: {v}\n\n");
                let body = data(json!({"choices":[{"index":0,"delta":{"content":ANSWER},"finish_reason":null}]}))
                    + &data(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}))
                    + &data(json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5}}))
                    + "data: [DONE]\n\n";
                Response::builder()
                    .status(200)
                    .header("content-type", "text/event-stream")
                    .body(Body::from(body))
                    .unwrap()
            },
        )
        .with_state((key, seen.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

fn registry(base_url: &str) -> Arc<ProviderRegistry> {
    Arc::new(
        ProviderRegistry::builder()
            .provider(
                ProviderConfig::openai()
                    .base_url(base_url)
                    .model("gpt-4o-mini")
                    .retry(RetryPolicy::none())
                    .keys(KeyPolicy::UserOnly),
            )
            .default_model("openai:gpt-4o-mini")
            .credentials(
                Arc::new(MemoryCredentialStore::new()) as Arc<dyn CredentialStore>,
                MasterKeys::new("k1", [7; 32]),
            )
            .build()
            .unwrap(),
    )
}

fn worker(s: &TestServer) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let engine = s.engine.clone();
    let cfg = WorkerConfig::new(stop.clone()).with_concurrency(2);
    (
        stop,
        tokio::spawn(async move { engine.worker(cfg).await.expect("worker") }),
    )
}

async fn finished(s: &TestServer, id: edward_core::RunId, key: &str) -> Value {
    let mut sse = s.sse(id, key, "", None).await;
    let events = tokio::time::timeout(Duration::from_secs(30), sse.collect_events())
        .await
        .expect("the run finishes");
    for f in &events {
        assert!(
            !f.data.as_deref().unwrap_or("").contains(ALICE_PROVIDER_KEY),
            "no event carries the key"
        );
    }
    events.last().expect("events").json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_list_use_and_delete_a_credential() {
    let (base_url, seen) = provider(ALICE_PROVIDER_KEY).await;
    let s = TestServer::start(Opts {
        worker: false,
        registry: Some(registry(&base_url)),
        ..Opts::default()
    })
    .await;

    // Set: the answer shows the key masked, never in full.
    let res = s
        .client
        .put(s.url("/v1/credentials/openai/mine"))
        .bearer_auth(ALICE)
        .json(&json!({ "key": ALICE_PROVIDER_KEY }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert!(!text.contains(ALICE_PROVIDER_KEY), "{text}");
    let view: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(view["provider"], "openai");
    assert_eq!(view["name"], "mine");
    assert_eq!(view["masked_key"], "…be17");
    assert_eq!(view["is_default"], true);

    // List: the caller's only, masked.
    let res = s.get("/v1/credentials", ALICE).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert!(!text.contains(ALICE_PROVIDER_KEY));
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["credentials"].as_array().unwrap().len(), 1);
    assert_eq!(list["credentials"][0]["masked_key"], "…be17");
    let bob: Value = s
        .get("/v1/credentials", BOB)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        bob["credentials"].as_array().unwrap().is_empty(),
        "another user's credential is invisible"
    );
    let res = s
        .client
        .delete(s.url("/v1/credentials/openai/mine"))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;

    // A run uses it: the fake provider sees exactly that key.
    let id = s.submit(ALICE, "build it").await;
    let (stop, w) = worker(&s);
    let last = finished(&s, id, ALICE).await;
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["payload"]["status"], "completed", "{last}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [ALICE_PROVIDER_KEY],
        "the provider got the user's key"
    );
    stop.cancel();
    w.await.unwrap();

    // A run queued with it, then the credential deleted: the run fails and
    // says why.
    let queued = s.submit(ALICE, "build it again").await;
    let res = s
        .client
        .delete(s.url("/v1/credentials/openai/mine"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let list: Value = s
        .get("/v1/credentials", ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(list["credentials"].as_array().unwrap().is_empty());
    let (stop, w) = worker(&s);
    let last = finished(&s, queued, ALICE).await;
    assert_eq!(last["payload"]["status"], "failed", "{last}");
    let reason = last["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("credential") && reason.contains("not found"),
        "a clear reason: {reason}"
    );
    stop.cancel();
    w.await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1, "no call without a key");

    // A new run now has no credential: refused at submit, naming the field.
    let res = s
        .post("/v1/runs", ALICE)
        .json(&json!({ "chat_id": unique("chat"), "prompt": "p" }))
        .send()
        .await
        .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert_eq!(body["error"]["field"], "credential", "{body}");
    // Deleting again is 404.
    let res = s
        .client
        .delete(s.url("/v1/credentials/openai/mine"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    expect_error(res, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credential_requests_never_echo_the_key() {
    let (base_url, _) = provider(ALICE_PROVIDER_KEY).await;
    let s = TestServer::start(Opts {
        worker: false,
        registry: Some(registry(&base_url)),
        ..Opts::default()
    })
    .await;
    let put = |path: &str, body: Value| {
        s.client
            .put(s.url(path))
            .bearer_auth(ALICE)
            .json(&body)
            .send()
    };
    // Unknown provider.
    let res = put(
        "/v1/credentials/nope/mine",
        json!({ "key": ALICE_PROVIDER_KEY }),
    )
    .await
    .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert_eq!(body["error"]["field"], "provider");
    assert!(!body.to_string().contains(ALICE_PROVIDER_KEY));
    // The key where a boolean belongs: the error names the field only.
    let res = put(
        "/v1/credentials/openai/mine",
        json!({ "key": "x", "default": ALICE_PROVIDER_KEY }),
    )
    .await
    .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert!(!body.to_string().contains(ALICE_PROVIDER_KEY), "{body}");
    // Empty key, bad name.
    let res = put("/v1/credentials/openai/mine", json!({ "key": " " }))
        .await
        .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert_eq!(body["error"]["field"], "key");
    let res = put("/v1/credentials/openai/a%20b", json!({ "key": "k" }))
        .await
        .unwrap();
    let body = expect_error(res, 422, "validation_failed").await;
    assert_eq!(body["error"]["field"], "name");
    // No key, no access.
    let res = s.client.get(s.url("/v1/credentials")).send().await.unwrap();
    expect_error(res, 401, "unauthorized").await;
    // The routes are documented.
    let doc: Value = s
        .client
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/v1/credentials"]["get"].is_object());
    assert!(doc["paths"]["/v1/credentials/{provider}/{name}"]["put"].is_object());
    assert!(doc["paths"]["/v1/credentials/{provider}/{name}"]["delete"].is_object());
    assert!(doc["components"]["schemas"]["CredentialView"].is_object());
}

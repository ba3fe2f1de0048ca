//! The provider registry and users' own keys, end to end: real engine runs
//! on a SQLite file against local fake OpenAI-compatible servers (axum, real
//! HTTP) that check the key each request carries.
//!
//! Covers: two users with different keys running concurrently; key rotation;
//! a wrong master key (typed decryption error, run failed); a revoked
//! credential and a provider rejecting the key (401) ending the run with a
//! non-retryable reason; model/provider mismatch, unknown model and unknown
//! provider at submit; a resumed run keeping the credential it started with;
//! and a grep of everything a run leaves behind (database file bytes, events,
//! logs, errors, `Debug`) for the plaintext keys.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use edward::SqliteStore;
use edward::core::engine::RouteError;
use edward::core::engine::{Engine, RunRequest, SubmitError, WorkerConfig};
use edward::core::providers::ApiKey;
use edward::core::providers::RetryPolicy;
use edward::core::registry::{
    KeyPolicy, MasterKeys, NewCredential, ProviderConfig, ProviderRegistry,
};
use edward::core::{CredentialStore, RunEvent, RunId, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ALICE_KEY: &str = "sk-alice-PLAINTEXT-7f3a9c1e5b2d";
const BOB_KEY: &str = "sk-bob-PLAINTEXT-4e8d2a6c0f1b";
const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];

const ANSWER: &str = "<edward_sandbox project=\"p\">\n<file path=\"a.txt\">\nhi\n</file>\n</edward_sandbox>\n<edward_done/>";

fn data(v: serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

fn openai_body() -> String {
    let mut s =
        data(json!({"choices":[{"index":0,"delta":{"content":ANSWER},"finish_reason":null}]}));
    s += &data(json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}));
    s += &data(json!({"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20}}));
    s + "data: [DONE]\n\n"
}

/// A fake OpenAI-compatible provider accepting only `keys`. It records the
/// key of every request; a wrong key gets a 401 that echoes the key (as
/// real providers partly do), so scrubbing is tested too. With `gate`,
/// requests wait until `gate_count` of them are in flight (proves
/// concurrency); with `hang_first`, the first request never gets an answer.
#[derive(Clone)]
struct KeyServer {
    base_url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

#[derive(Default)]
struct ServerState {
    keys: Vec<String>,
    seen: Arc<Mutex<Vec<String>>>,
    gate: Option<Arc<tokio::sync::Barrier>>,
    hang_first: bool,
}

impl KeyServer {
    async fn start(keys: &[&str], gate: Option<usize>, hang_first: bool) -> KeyServer {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(ServerState {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            seen: seen.clone(),
            gate: gate.map(|n| Arc::new(tokio::sync::Barrier::new(n))),
            hang_first,
        });
        let app = Router::new().fallback(handle).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KeyServer {
            base_url: format!("http://{addr}"),
            seen,
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn handle(State(state): State<Arc<ServerState>>, req: Request) -> Response {
    let key = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    let n = {
        let mut seen = state.seen.lock().unwrap();
        seen.push(key.clone());
        seen.len()
    };
    if state.hang_first && n == 1 {
        std::future::pending::<()>().await;
    }
    if !state.keys.contains(&key) {
        let body = json!({"error":{"message":format!("Incorrect API key provided: {key}"),"type":"invalid_request_error","code":"invalid_api_key"}});
        return Response::builder()
            .status(401)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
    }
    if let Some(gate) = &state.gate {
        let _ = tokio::time::timeout(Duration::from_secs(20), gate.wait()).await;
    }
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from(openai_body()))
        .unwrap()
}

/// Everything logged while the tests run (all levels).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
            .with_writer(move || LogWriter(writer.clone()))
            .try_init();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);
impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Setup {
    engine: Engine,
    registry: Arc<ProviderRegistry>,
    store: SqliteStore,
    dir: tempfile::TempDir,
}

/// `openai` (users' keys only) at `openai_url`, `local` (operator's key)
/// at `local_url`, `anthropic` (operator's key) — all on one SQLite file.
async fn setup(openai_url: &str, local_url: &str, keys: MasterKeys) -> Setup {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("edward.db"))
        .await
        .unwrap();
    let registry = Arc::new(registry_on(&store, openai_url, local_url, keys));
    let sandboxes = Arc::new(LocalSandboxProvider::new(dir.path().join("sandboxes")));
    let engine = Engine::builder()
        .backend(store.backend())
        .sandbox_provider(sandboxes as Arc<dyn SandboxProvider>)
        .registry(Shared(registry.clone()))
        .build()
        .unwrap();
    Setup {
        engine,
        registry,
        store,
        dir,
    }
}

fn registry_on(
    store: &SqliteStore,
    openai_url: &str,
    local_url: &str,
    keys: MasterKeys,
) -> ProviderRegistry {
    ProviderRegistry::builder()
        .provider(
            ProviderConfig::openai()
                .base_url(openai_url)
                .model("gpt-4o-mini")
                .retry(RetryPolicy::none())
                .keys(KeyPolicy::UserOnly),
        )
        .provider(
            ProviderConfig::openai_compatible("local", local_url)
                .model_priced(
                    "qwen2.5-coder",
                    edward::core::pricing::ModelPrice {
                        input_per_mtok: 0.0,
                        output_per_mtok: 0.0,
                    },
                )
                .retry(RetryPolicy::none())
                .operator_key("sk-operator-local-key-000000"),
        )
        .provider(
            ProviderConfig::anthropic()
                .base_url(local_url)
                .model("claude-sonnet-4")
                .operator_key("sk-operator-anthropic-000000"),
        )
        .default_model("openai:gpt-4o-mini")
        .credentials(Arc::new(store.clone()) as Arc<dyn CredentialStore>, keys)
        .build()
        .unwrap()
}

/// The registry shared between the engine and the test (to add credentials).
struct Shared(Arc<ProviderRegistry>);

#[async_trait::async_trait]
impl edward::core::engine::ModelResolver for Shared {
    fn check_model(&self, m: Option<&str>) -> Result<(String, String), RouteError> {
        self.0.check_model(m)
    }
    async fn route(
        &self,
        user: &str,
        m: Option<&str>,
        c: Option<&str>,
    ) -> Result<edward::core::engine::ModelRoute, RouteError> {
        self.0.route(user, m, c).await
    }
    async fn client(
        &self,
        user: &str,
        r: &edward::core::engine::ModelRoute,
    ) -> Result<Arc<dyn edward::core::ModelClient>, RouteError> {
        self.0.client(user, r).await
    }
    fn prices(&self) -> Vec<(String, edward::core::pricing::ModelPrice)> {
        self.0.prices()
    }
}

fn cred(user: &str, name: &str, key: &str) -> NewCredential {
    NewCredential {
        user_id: user.into(),
        provider: "openai".into(),
        name: name.into(),
        key: ApiKey::new(key),
        base_url: None,
        is_default: true,
    }
}

fn worker(
    engine: &Engine,
    cfg: impl FnOnce(WorkerConfig) -> WorkerConfig,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let shutdown = CancellationToken::new();
    let engine = engine.clone();
    let cfg = cfg(WorkerConfig::new(shutdown.clone()).with_concurrency(4));
    let h = tokio::spawn(async move { engine.worker(cfg).await.unwrap() });
    (shutdown, h)
}

async fn collect(engine: &Engine, id: RunId) -> Vec<RunEvent> {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut s = engine.raw_events(id, 0);
        let mut out = Vec::new();
        while let Some(e) = s.next().await {
            out.push(e.unwrap());
        }
        out
    })
    .await
    .expect("run finishes within 60 s")
}

fn terminal(events: &[RunEvent]) -> serde_json::Value {
    let last = events.last().expect("events");
    assert_eq!(last.kind, "run_finished");
    last.payload.clone()
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_users_run_concurrently_with_their_own_keys_and_no_key_leaks() {
    let openai = KeyServer::start(&[ALICE_KEY, BOB_KEY], Some(2), false).await;
    let local = KeyServer::start(&[], None, false).await;
    let s = setup(&openai.base_url, &local.base_url, MasterKeys::new("k1", K1)).await;
    s.registry
        .put_credential(cred("alice", "mine", ALICE_KEY))
        .await
        .unwrap();
    s.registry
        .put_credential(cred("bob", "mine", BOB_KEY))
        .await
        .unwrap();
    let (stop, w) = worker(&s.engine, |c| c);
    let a = s
        .engine
        .submit(RunRequest::new("alice", "ca", "build it"))
        .await
        .unwrap();
    let b = s
        .engine
        .submit(RunRequest::new("bob", "cb", "build it").with_model("openai:gpt-4o-mini"))
        .await
        .unwrap();
    let (ea, eb) = tokio::join!(collect(&s.engine, a), collect(&s.engine, b));
    for events in [&ea, &eb] {
        let t = terminal(events);
        assert_eq!(t["status"], "completed", "{t}");
        let started = events.iter().find(|e| e.kind == "run_started").unwrap();
        assert_eq!(started.payload["provider"], "openai");
        assert_eq!(started.payload["model"], "openai:gpt-4o-mini");
    }
    let mut seen = openai.seen();
    seen.sort();
    assert_eq!(seen, vec![ALICE_KEY.to_string(), BOB_KEY.to_string()]);

    // The stored request records the route, with the credential's id only.
    let run = s.engine.get(a).await.unwrap().unwrap();
    assert_eq!(run.request["route"]["provider"], "openai");
    assert_eq!(run.request["route"]["credential"]["source"], "user");

    // A provider rejecting a key (401) ends the run, not retried, no key shown.
    s.registry
        .put_credential(cred("carol", "bad", "sk-carol-PLAINTEXT-wrongwrongwrong"))
        .await
        .unwrap();
    let c = s
        .engine
        .submit(RunRequest::new("carol", "cc", "build it"))
        .await
        .unwrap();
    let ec = collect(&s.engine, c).await;
    let t = terminal(&ec);
    assert_eq!(t["status"], "failed");
    let reason = t["reason"].as_str().unwrap();
    assert!(
        reason.contains("rejected the credentials (401)"),
        "{reason}"
    );

    stop.cancel();
    w.await.unwrap();

    // Grep everything the runs left behind for the plaintext keys.
    let mut everything: Vec<u8> = Vec::new();
    for e in ea.iter().chain(&eb).chain(&ec) {
        everything.extend(serde_json::to_vec(e).unwrap());
    }
    for id in [a, b, c] {
        let run = s.engine.get(id).await.unwrap().unwrap();
        everything.extend(serde_json::to_vec(&run.request).unwrap());
        everything.extend(format!("{run:?}").into_bytes());
    }
    everything.extend(format!("{:?} {:?}", s.engine, s.registry).into_bytes());
    for c in s.store.list_credentials("alice").await.unwrap() {
        everything.extend(format!("{c:?}").into_bytes());
    }
    everything.extend(format!("{:?}", cred("alice", "x", ALICE_KEY)).into_bytes());
    everything.extend(logs().lock().unwrap().iter());
    let alice_cred = s
        .registry
        .credentials()
        .unwrap()
        .list_masked("alice")
        .await
        .unwrap();
    let store = s.store.clone();
    drop(s.engine);
    store.close().await;
    for entry in std::fs::read_dir(s.dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            everything.extend(std::fs::read(&p).unwrap());
        }
    }
    assert!(everything.len() > 10_000, "the grep covers real data");
    assert!(
        contains(&everything, "gpt-4o-mini"),
        "the grep can find things"
    );
    assert!(contains(&everything, "run submitted"), "logs were captured");
    assert!(
        contains(&everything, &alice_cred[0].id.to_string()),
        "the stored route (credential id) was grepped"
    );
    assert_eq!(
        alice_cred[0].masked_key,
        format!("…{}", &ALICE_KEY[ALICE_KEY.len() - 4..])
    );
    for key in [
        ALICE_KEY,
        BOB_KEY,
        "sk-carol-PLAINTEXT-wrongwrongwrong",
        "PLAINTEXT",
    ] {
        assert!(!contains(&everything, key), "plaintext `{key}` leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_rejects_unknown_and_mismatched_models_and_credentials() {
    let openai = KeyServer::start(&[ALICE_KEY], None, false).await;
    let s = setup(
        &openai.base_url,
        &openai.base_url,
        MasterKeys::new("k1", K1),
    )
    .await;
    s.registry
        .put_credential(cred("alice", "mine", ALICE_KEY))
        .await
        .unwrap();
    let invalid = |r: Result<RunId, SubmitError>| match r {
        Err(SubmitError::Invalid { field, reason }) => (field, reason),
        other => panic!("expected Invalid, got {other:?}"),
    };
    let req = |m: &str| RunRequest::new("alice", "c", "p").with_model(m);
    let (f, r) = invalid(s.engine.submit(req("anthropic:gpt-4o-mini")).await);
    assert_eq!(f, "model");
    assert!(
        r.contains("does not belong to provider `anthropic`") && r.contains("openai"),
        "{r}"
    );
    let (f, r) = invalid(s.engine.submit(req("openai:gpt-9-ultra")).await);
    assert_eq!(f, "model");
    assert!(r.contains("unknown model `gpt-9-ultra`"), "{r}");
    let (f, r) = invalid(s.engine.submit(req("nope:x")).await);
    assert_eq!(f, "model");
    assert!(r.contains("unknown provider `nope`"), "{r}");
    let (f, _) = invalid(s.engine.submit(req("gpt-4o-mini:")).await);
    assert_eq!(f, "model");
    // Validation alone (no I/O) says the same.
    assert!(s.engine.validate(&req("anthropic:gpt-4o-mini")).is_err());
    // Credentials: a missing one, none at all, one where only the operator's key is used.
    let (f, r) = invalid(
        s.engine
            .submit(req("openai:gpt-4o-mini").with_credential("nope"))
            .await,
    );
    assert_eq!(
        (f.as_str(), r.contains("not found")),
        ("credential", true),
        "{r}"
    );
    let (f, r) = invalid(s.engine.submit(RunRequest::new("dave", "c", "p")).await);
    assert_eq!(f, "credential");
    assert!(r.contains("no credential for provider `openai`"), "{r}");
    let (f, _) = invalid(
        s.engine
            .submit(req("local:qwen2.5-coder").with_credential("mine"))
            .await,
    );
    assert_eq!(f, "credential");
    // A bare model name offered by one provider resolves to it.
    let id = s
        .engine
        .submit(RunRequest::new("eve", "c", "p").with_model("qwen2.5-coder"))
        .await
        .unwrap();
    let run = s.engine.get(id).await.unwrap().unwrap();
    assert_eq!(run.request["model"], "local:qwen2.5-coder");
    assert_eq!(run.request["route"]["credential"]["source"], "operator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_wrong_master_key_and_revocation() {
    let openai = KeyServer::start(&[ALICE_KEY, BOB_KEY], None, false).await;
    // Alice's key is stored under k1.
    let s = setup(
        &openai.base_url,
        &openai.base_url,
        MasterKeys::new("k1", K1),
    )
    .await;
    let old = s
        .registry
        .put_credential(cred("alice", "mine", ALICE_KEY))
        .await
        .unwrap();
    assert_eq!(old.key_id, "k1");

    // Rotate to k2: new secrets use k2, the old one still decrypts.
    let rotated = registry_on(
        &s.store,
        &openai.base_url,
        &openai.base_url,
        MasterKeys::new("k1", K1).rotate_to("k2", K2),
    );
    let new = rotated
        .put_credential(cred("bob", "mine", BOB_KEY))
        .await
        .unwrap();
    assert_eq!(new.key_id, "k2");
    let vault = rotated.credentials().unwrap();
    let stored_old = s
        .store
        .get_credential("alice", old.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored_old.key_id, "k1");
    assert_eq!(vault.decrypt(&stored_old).unwrap(), ApiKey::new(ALICE_KEY));
    // Re-encrypting moves it to k2; it still decrypts.
    assert_eq!(vault.reencrypt_user("alice").await.unwrap(), 1);
    let moved = s
        .store
        .get_credential("alice", old.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved.key_id, "k2");
    assert_eq!(vault.decrypt(&moved).unwrap(), ApiKey::new(ALICE_KEY));
    assert!(matches!(
        MasterKeys::new("k1", K1)
            .rotate_to("k3", [3; 32])
            .current_id(),
        "k3"
    ));

    // A wrong master key under the same id: typed decryption error, and a
    // run with it fails with a clear reason naming the key id, not the key.
    let wrong = registry_on(
        &s.store,
        &openai.base_url,
        &openai.base_url,
        MasterKeys::new("k2", [0x99; 32]),
    );
    match wrong.credentials().unwrap().decrypt(&moved) {
        Err(RouteError::Decryption { key_id }) => assert_eq!(key_id, "k2"),
        other => panic!("expected Decryption, got {other:?}"),
    }
    let missing_key = registry_on(
        &s.store,
        &openai.base_url,
        &openai.base_url,
        MasterKeys::new("k9", K1),
    );
    assert!(matches!(
        missing_key.credentials().unwrap().decrypt(&moved),
        Err(RouteError::UnknownMasterKey { .. })
    ));
    let engine = Engine::builder()
        .backend(s.store.backend())
        .sandbox_provider(
            Arc::new(LocalSandboxProvider::new(s.dir.path().join("sb2")))
                as Arc<dyn SandboxProvider>,
        )
        .registry(wrong)
        .build()
        .unwrap();
    let (stop, w) = worker(&engine, |c| c);
    let id = engine
        .submit(RunRequest::new("alice", "c2", "p"))
        .await
        .unwrap();
    let t = terminal(&collect(&engine, id).await);
    assert_eq!(t["status"], "failed");
    let reason = t["reason"].as_str().unwrap();
    assert!(
        reason.contains("could not decrypt") && reason.contains("`k2`"),
        "{reason}"
    );
    assert!(!reason.contains(ALICE_KEY));

    // Revoked after submit: the run ends failed, saying so.
    let id = s
        .engine
        .submit(RunRequest::new("bob", "c3", "p"))
        .await
        .unwrap();
    s.store.revoke_credential("bob", new.id).await.unwrap();
    let (stop3, w3) = worker(&s.engine, |c| c);
    let t = terminal(&collect(&s.engine, id).await);
    assert_eq!(t["status"], "failed");
    assert!(t["reason"].as_str().unwrap().contains("was revoked"), "{t}");

    // A run cancelled while between workers, whose credential is gone by
    // the time a worker claims it, ends `cancelled` (the cancel is honoured
    // before the route is resolved), not `failed`. No worker runs while it
    // is set up, so none can claim it early.
    for (st, h) in [(stop, w), (stop3, w3)] {
        st.cancel();
        h.await.unwrap();
    }
    let carol = s
        .registry
        .put_credential(cred("carol", "mine", BOB_KEY))
        .await
        .unwrap();
    let id = s
        .engine
        .submit(RunRequest::new("carol", "c4", "p"))
        .await
        .unwrap();
    s.store.revoke_credential("carol", carol.id).await.unwrap();
    {
        use edward::core::RunStore;
        // A worker started it, then died; the cancel was recorded since.
        s.store.start_run(id, edward::spi::Fence(1)).await.unwrap();
        s.store
            .request_cancel(id, edward::EngineEvent::CancelRequested {}.into_new_event())
            .await
            .unwrap();
    }
    let (stop4, w4) = worker(&s.engine, |c| c);
    let t = terminal(&collect(&s.engine, id).await);
    assert_eq!(t["status"], "cancelled", "{t}");
    stop4.cancel();
    w4.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_run_keeps_its_credential() {
    const NEW_KEY: &str = "sk-alice-second-key-99999999";
    // The first request hangs (its worker then dies); later ones answer.
    let openai = KeyServer::start(&[ALICE_KEY, NEW_KEY], None, true).await;
    let url = openai.base_url.clone();
    let s = setup(&url, &url, MasterKeys::new("k1", K1)).await;
    s.registry
        .put_credential(cred("alice", "first", ALICE_KEY))
        .await
        .unwrap();
    let id = s
        .engine
        .submit(RunRequest::new("alice", "c", "p"))
        .await
        .unwrap();
    let (stop, w) = worker(&s.engine, |c| c.with_lease(Duration::from_millis(500)));
    // Wait until the first attempt's request reached the provider.
    tokio::time::timeout(Duration::from_secs(30), async {
        while openai.seen().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("first request arrives");
    // Meanwhile the user adds a new default key; then the worker process dies.
    s.registry
        .put_credential(cred("alice", "second", NEW_KEY))
        .await
        .unwrap();
    w.abort();
    let _ = w.await;
    stop.cancel();
    s.store.close().await;

    // Another process takes over: a fresh store, registry and engine on the same file.
    let store = SqliteStore::open(s.dir.path().join("edward.db"))
        .await
        .unwrap();
    let engine = Engine::builder()
        .backend(store.backend())
        .sandbox_provider(
            Arc::new(LocalSandboxProvider::new(s.dir.path().join("sandboxes")))
                as Arc<dyn SandboxProvider>,
        )
        .registry(registry_on(&store, &url, &url, MasterKeys::new("k1", K1)))
        .build()
        .unwrap();
    let (stop, w) = worker(&engine, |c| c.with_lease(Duration::from_millis(500)));
    let events = collect(&engine, id).await;
    assert_eq!(terminal(&events)["status"], "completed");
    assert!(
        events.iter().any(|e| e.kind == "run_resumed"),
        "the run was resumed"
    );
    // Every attempt (the hung one, any the first worker re-claimed under
    // load, and the resumed one) used the key the run started with.
    let seen = openai.seen();
    assert!(seen.len() >= 2, "{} requests", seen.len());
    assert!(
        seen.iter().all(|k| k == ALICE_KEY),
        "a resumed attempt changed key"
    );
    // A new run uses the new default.
    let id2 = engine
        .submit(RunRequest::new("alice", "c2", "p"))
        .await
        .unwrap();
    assert_eq!(
        terminal(&collect(&engine, id2).await)["status"],
        "completed"
    );
    assert_eq!(openai.seen().last().map(String::as_str), Some(NEW_KEY));
    stop.cancel();
    w.await.unwrap();
}

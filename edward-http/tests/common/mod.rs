//! A real server on a loopback socket, an HTTP client and a raw SSE reader.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use edward_core::AdmissionLimits;
use edward_core::engine::{Backend, Engine, EngineConfig, WorkerConfig};
use edward_core::memory::MemoryBackends;
use edward_core::scripted::ScriptedModel;
use edward_core::{RunId, SandboxProvider};
use edward_http::{Api, ApiKeys, HttpConfig};
use edward_sandbox::LocalSandboxProvider;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ALICE: &str = "sk-alice-test-key";
pub const BOB: &str = "sk-bob-test-key";

/// What a [`TestServer`] runs with.
pub struct Opts {
    pub model: ScriptedModel,
    pub http: HttpConfig,
    pub limits: AdmissionLimits,
    pub worker: bool,
    /// The engine's configuration (chats, builds, double-texting).
    pub engine: EngineConfig,
    /// Route runs through this registry and serve its credential routes.
    #[cfg(feature = "registry")]
    pub registry: Option<Arc<edward_core::registry::ProviderRegistry>>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            model: ScriptedModel::demo().with_delay(Duration::ZERO),
            http: HttpConfig::default().rate_limit(None),
            limits: AdmissionLimits {
                global: 1000,
                per_user: 1000,
                per_chat: 1,
            },
            worker: true,
            engine: EngineConfig::default(),
            #[cfg(feature = "registry")]
            registry: None,
        }
    }
}

pub struct TestServer {
    pub base: String,
    pub api: Api,
    pub engine: Engine,
    /// The engine's in-memory store, queue and notifier.
    pub mem: MemoryBackends,
    pub provider: Arc<LocalSandboxProvider>,
    pub dir: tempfile::TempDir,
    pub client: reqwest::Client,
    worker: Option<(CancellationToken, JoinHandle<()>)>,
    server: JoinHandle<std::io::Result<()>>,
    stop: CancellationToken,
}

impl TestServer {
    pub async fn start(opts: Opts) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let provider = Arc::new(LocalSandboxProvider::new(dir.path().join("sandboxes")));
        let mem = MemoryBackends::new();
        #[allow(unused_mut)]
        let mut builder = Engine::builder()
            .backend(Backend::new(
                mem.store.clone(),
                mem.queue.clone(),
                mem.notifier.clone(),
            ))
            .sandbox_provider(provider.clone() as Arc<dyn SandboxProvider>)
            .model_client(Arc::new(opts.model))
            .admission_limits(opts.limits)
            .config(opts.engine);
        #[cfg(feature = "registry")]
        if let Some(r) = &opts.registry {
            builder = builder.registry(r.clone());
        }
        let engine = builder.build().expect("engine builds");
        let mut keys = ApiKeys::new();
        keys.insert("alice", ALICE);
        keys.insert("bob", BOB);
        #[allow(unused_mut)]
        let mut api = Api::new(engine.clone(), keys, opts.http);
        #[cfg(feature = "registry")]
        if let Some(r) = opts.registry {
            api = api.with_registry(r);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = CancellationToken::new();
        let server = tokio::spawn({
            let api = api.clone();
            let stop = stop.clone();
            async move {
                api.serve(listener, async move { stop.cancelled().await })
                    .await
            }
        });
        let worker = opts.worker.then(|| {
            let token = CancellationToken::new();
            let cfg = WorkerConfig::new(token.clone()).with_concurrency(8);
            let engine = engine.clone();
            (
                token,
                tokio::spawn(async move { engine.worker(cfg).await.expect("worker config") }),
            )
        });
        TestServer {
            base,
            api,
            engine,
            mem,
            provider,
            dir,
            client: reqwest::Client::new(),
            worker,
            server,
            stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn get(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.client.get(self.url(path)).bearer_auth(key)
    }

    pub fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.client.post(self.url(path)).bearer_auth(key)
    }

    /// Submit a run for `key` in a fresh chat; returns its id.
    pub async fn submit(&self, key: &str, prompt: &str) -> RunId {
        self.submit_in(key, &unique("chat"), prompt).await
    }

    /// Submit a run for `key` in `chat`; returns its id.
    pub async fn submit_in(&self, key: &str, chat: &str, prompt: &str) -> RunId {
        let res = self
            .post("/v1/runs", key)
            .json(&serde_json::json!({ "chat_id": chat, "prompt": prompt }))
            .send()
            .await
            .expect("submit");
        assert_eq!(res.status(), 201, "submit: {:?}", res.text().await);
        let body: Value = res.json().await.expect("json");
        body["run_id"]
            .as_str()
            .expect("run_id")
            .parse()
            .expect("uuid")
    }

    /// Open the SSE stream of `id` with extra headers/query.
    pub async fn sse(
        &self,
        id: RunId,
        key: &str,
        query: &str,
        last_event_id: Option<u64>,
    ) -> SseReader {
        let mut req = self
            .get(&format!("/v1/runs/{id}/events{query}"), key)
            .header("accept", "text/event-stream");
        if let Some(seq) = last_event_id {
            req = req.header("last-event-id", seq.to_string());
        }
        let res = req.send().await.expect("sse connect");
        assert_eq!(res.status(), 200, "sse status");
        assert_eq!(
            res.headers()["content-type"].to_str().unwrap_or(""),
            "text/event-stream"
        );
        SseReader::new(res.bytes_stream().boxed())
    }

    /// Wait (bounded) for the run to be terminal, through the engine.
    pub async fn wait_finished(&self, id: RunId) -> edward_core::Run {
        let mut events = self.engine.raw_events(id, 0);
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(e) = events.next().await {
                if e.expect("event").is_terminal() {
                    break;
                }
            }
        })
        .await
        .expect("run finishes within 30 s");
        self.engine.get(id).await.expect("get").expect("run")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some((token, _)) = &self.worker {
            token.cancel();
        }
        self.server.abort();
    }
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", RunId::new())
}

/// One SSE block: fields up to a blank line.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub retry: Option<u64>,
    pub comments: Vec<String>,
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().expect("data")).expect("data is JSON")
    }
    pub fn seq(&self) -> Option<u64> {
        self.id.as_deref().map(|s| s.parse().expect("numeric id"))
    }
}

/// A hand-written SSE parser over the raw response bytes (comments and
/// `retry:` included), so tests see exactly what goes over the wire.
pub struct SseReader {
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    buf: String,
}

impl SseReader {
    pub fn new(body: BoxStream<'static, reqwest::Result<Bytes>>) -> Self {
        SseReader {
            body,
            buf: String::new(),
        }
    }

    /// The next block, or `None` when the server closed the stream.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Some(parse_block(&block));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self
                    .buf
                    .push_str(std::str::from_utf8(&chunk).expect("utf-8 stream")),
                Some(Err(e)) => panic!("stream error: {e}"),
                None => {
                    assert!(
                        self.buf.trim().is_empty(),
                        "stream ended mid-frame: {:?}",
                        self.buf
                    );
                    return None;
                }
            }
        }
    }

    /// The next frame within `d`.
    pub async fn next_within(&mut self, d: Duration) -> Option<Frame> {
        tokio::time::timeout(d, self.next_frame())
            .await
            .expect("a frame within the timeout")
    }

    /// Every event frame (with an id) until the stream ends.
    pub async fn collect_events(&mut self) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(f) = self.next_within(Duration::from_secs(30)).await {
            if f.id.is_some() {
                out.push(f);
            }
        }
        out
    }
}

fn parse_block(block: &str) -> Frame {
    let mut f = Frame::default();
    for line in block.lines() {
        if let Some(c) = line.strip_prefix(':') {
            f.comments.push(c.trim().to_string());
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => f.id = Some(value.to_string()),
            "event" => f.event = Some(value.to_string()),
            "data" => {
                let d = f.data.get_or_insert_with(String::new);
                if !d.is_empty() {
                    d.push('\n');
                }
                d.push_str(value);
            }
            "retry" => f.retry = Some(value.parse().expect("numeric retry")),
            "" => {}
            other => panic!("unknown SSE field {other:?}"),
        }
    }
    f
}

/// Assert an error response: status, JSON `error.code`, and return the body.
pub async fn expect_error(res: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(res.status().as_u16(), status, "status for {code}");
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(
        ct.starts_with("application/json"),
        "JSON error body, got {ct:?}"
    );
    let body: Value = res.json().await.expect("error JSON");
    assert_eq!(body["error"]["code"], code, "code in {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    body
}

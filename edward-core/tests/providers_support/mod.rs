//! Shared by the provider tests: a scripted HTTP server on 127.0.0.1 that
//! replays fixture files in the provider's wire format (optionally in tiny
//! raw chunks, with pauses, cuts and hangs), records every request, and a
//! suite of failure scenarios every provider runs.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use edward_core::providers::{RetryPolicy, Timeouts};
use edward_core::{
    AttemptFailure, FinishReason, Message, ModelCall, ModelChunk, ModelClient, ModelError,
    ModelObserver, ModelRequest, Role, Usage,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// One piece of a response body.
#[derive(Debug, Clone)]
pub enum Piece {
    /// Write these bytes (one chunked-encoding frame).
    Bytes(Bytes),
    /// Pause.
    Sleep(Duration),
    /// Abort the connection (the client sees an incomplete body).
    Cut,
    /// Never send anything more.
    Hang,
}

/// One scripted response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay_headers: Option<Duration>,
    pub body: Vec<Piece>,
}

impl Reply {
    /// 200 `text/event-stream` with `body` in one piece.
    pub fn sse(body: impl Into<Bytes>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            delay_headers: None,
            body: vec![Piece::Bytes(body.into())],
        }
    }

    /// 200 SSE with `body` split into raw pieces of 1, 2, 3, 1, 2, 3 … bytes
    /// (boundaries land inside lines and inside UTF-8 characters).
    pub fn sse_tiny(body: &[u8]) -> Self {
        let mut r = Self::sse(Bytes::new());
        r.body.clear();
        let mut i = 0;
        let mut n = 1;
        while i < body.len() {
            let end = (i + n).min(body.len());
            r.body
                .push(Piece::Bytes(Bytes::copy_from_slice(&body[i..end])));
            i = end;
            n = n % 3 + 1;
        }
        r
    }

    /// 200 `application/json`: a complete, non-streaming reply.
    pub fn json(body: impl Into<Bytes>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            delay_headers: None,
            body: vec![Piece::Bytes(body.into())],
        }
    }

    /// An error status with a JSON body.
    pub fn error(status: u16, body: impl Into<Bytes>) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            delay_headers: None,
            body: vec![Piece::Bytes(body.into())],
        }
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Append body pieces.
    pub fn then(mut self, piece: Piece) -> Self {
        self.body.push(piece);
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub at: Instant,
}

#[derive(Default)]
struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// Answer with this reply until `window` after the first request.
    gate: Mutex<Option<Gate>>,
}

struct Gate {
    reply: Reply,
    window: Duration,
    opened_at: Option<Instant>,
}

/// The scripted server.
pub struct TestServer {
    pub base_url: String,
    shared: Arc<Shared>,
}

impl TestServer {
    /// Start on 127.0.0.1:0 with these replies, served in order.
    pub async fn start(replies: Vec<Reply>) -> Self {
        let shared = Arc::new(Shared::default());
        shared.replies.lock().unwrap().extend(replies);
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TestServer {
            base_url: format!("http://{addr}"),
            shared,
        }
    }

    /// Like [`TestServer::start`], but every request that arrives less than
    /// `window` after the first one gets `reject` (an upstream that is rate
    /// limited for a while); later ones get `replies` in order.
    pub async fn start_gated(reject: Reply, window: Duration, replies: Vec<Reply>) -> Self {
        let server = Self::start(replies).await;
        *server.shared.gate.lock().unwrap() = Some(Gate {
            reply: reject,
            window,
            opened_at: None,
        });
        server
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    shared.requests.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        at: Instant::now(),
    });
    let gated = shared.gate.lock().unwrap().as_mut().and_then(|g| {
        let first = *g.opened_at.get_or_insert_with(Instant::now);
        (first.elapsed() < g.window).then(|| g.reply.clone())
    });
    let reply = gated.or_else(|| shared.replies.lock().unwrap().pop_front());
    let Some(reply) = reply else {
        return Response::builder()
            .status(599)
            .body(Body::from("test server: no reply scripted"))
            .unwrap();
    };
    if let Some(d) = reply.delay_headers {
        tokio::time::sleep(d).await;
    }
    let pieces = reply.body;
    let stream = futures::stream::unfold(pieces.into_iter(), |mut it| async move {
        loop {
            match it.next()? {
                Piece::Bytes(b) => {
                    // Give the client a chance to read each frame on its own.
                    tokio::task::yield_now().await;
                    return Some((Ok::<Bytes, std::io::Error>(b), it));
                }
                Piece::Sleep(d) => tokio::time::sleep(d).await,
                Piece::Cut => {
                    return Some((Err(std::io::Error::other("cut by test")), it));
                }
                Piece::Hang => futures::future::pending::<()>().await,
            }
        }
    });
    let mut builder = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
    for (k, v) in reply.headers {
        builder = builder.header(k, v);
    }
    builder.body(Body::from_stream(stream)).unwrap()
}

// ---------------------------------------------------------------- fixtures

/// Bytes of `tests/fixtures/<provider>/<name>`.
pub fn fixture(provider: &str, name: &str) -> Vec<u8> {
    // This module is shared by edward-core's tests and the root crate's.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path: PathBuf = [root.join("tests"), root.join("edward-core/tests")]
        .into_iter()
        .map(|dir| dir.join("fixtures").join(provider).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| root.join("tests/fixtures").join(provider).join(name));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The answer the `gateway_usage.sse` and `nonstream.json` fixtures carry
/// (an Edward protocol answer: one file, then done).
pub const GATEWAY_ANSWER: &str = "I'll write the greeting.\n<edward_sandbox project=\"hello\">\n<file path=\"hello.txt\">\nhéllo through a gateway ✓\n</file>\n</edward_sandbox>\n<edward_done/>";

/// What the `gateway_*_after_upstream_failure.sse` fixtures stream before
/// the gateway ends the message as if it had finished: cut inside a file.
pub const GATEWAY_CUT: &str = "Writing the big file.\n<edward_sandbox project=\"big\">\n<file path=\"big.txt\">\nline 1 of 100\nline 2 of 100\nline 3 of 100\nline 4 o";

/// The text every `text.sse` fixture streams.
pub const FIXTURE_TEXT: &str =
    "Hello! Here is <edward_file path=\"a.txt\">héllo — ✓ 🦀</edward_file>";

// ---------------------------------------------------------------- collecting

/// Everything a stream produced.
#[derive(Debug, Default)]
pub struct Collected {
    pub text: String,
    pub thinking: String,
    pub usage: Vec<Usage>,
    pub finish: Vec<FinishReason>,
    pub error: Option<ModelError>,
    /// Chunk order as letters: T text, H thinking, U usage, F finish.
    pub order: String,
}

/// Drain a stream.
pub async fn collect(mut stream: edward_core::ModelStream) -> Collected {
    let mut c = Collected::default();
    while let Some(item) = stream.next().await {
        match item {
            Ok(ModelChunk::Text(t)) => {
                c.text.push_str(&t);
                c.order.push('T');
            }
            Ok(ModelChunk::Thinking(t)) => {
                c.thinking.push_str(&t);
                c.order.push('H');
            }
            Ok(ModelChunk::Usage(u)) => {
                c.usage.push(u);
                c.order.push('U');
            }
            Ok(ModelChunk::Finish(f)) => {
                c.finish.push(f);
                c.order.push('F');
            }
            Err(e) => {
                assert!(c.error.is_none(), "two errors in one stream");
                c.error = Some(e);
            }
        }
    }
    c
}

/// Stream `request` and drain it; a failure to open is returned as the error.
pub async fn run(client: &dyn ModelClient, request: ModelRequest) -> Collected {
    match client.stream(request, CancellationToken::new()).await {
        Ok(s) => collect(s).await,
        Err(e) => Collected {
            error: Some(e),
            ..Default::default()
        },
    }
}

/// A small request.
pub fn request(model: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        system: "You are Edward.".into(),
        messages: vec![
            Message {
                role: Role::User,
                content: "Write a.txt".into(),
            },
            Message {
                role: Role::Assistant,
                content: "Sure.".into(),
            },
            Message {
                role: Role::User,
                content: "Go on".into(),
            },
        ],
        max_output_tokens: Some(256),
        temperature: Some(0.2),
    }
}

// ---------------------------------------------------------------- the suite

/// The test key; asserted never to appear in errors.
pub const KEY: &str = "sk-test-Zq9fXv7Lr2-super-secret";

/// How a provider's client is made and where its fixtures are.
pub struct ProviderUnderTest {
    /// Fixture directory name.
    pub name: &'static str,
    /// Model name used in requests.
    pub model: &'static str,
    /// The header that must carry the key.
    pub key_header: &'static str,
    /// (input, output) tokens `text.sse` reports.
    pub usage: (u64, u64),
    /// Build a client against `base_url`.
    pub make: fn(base_url: &str, retry: RetryPolicy, timeouts: Timeouts) -> Arc<dyn ModelClient>,
}

/// Fast retries for tests.
pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        max_retry_after: Duration::from_secs(5),
        ..RetryPolicy::default()
    }
}

/// Short timeouts for tests.
pub fn short_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        // Generous enough for a loaded CI machine, short enough for the suite.
        first_byte: Duration::from_millis(800),
        idle: Duration::from_millis(800),
    }
}

impl ProviderUnderTest {
    fn client(&self, server: &TestServer) -> Arc<dyn ModelClient> {
        (self.make)(&server.base_url, fast_retry(), Timeouts::default())
    }

    fn fixture(&self, name: &str) -> Vec<u8> {
        fixture(self.name, name)
    }

    /// Assert an error never shows the key.
    pub fn assert_no_key(&self, e: &ModelError) {
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(KEY), "key leaked in {shown}");
        assert!(!shown.contains("super-secret"), "key leaked in {shown}");
    }

    /// text.sse: text, exact usage, Stop; Usage then Finish last; one request with the key header.
    pub async fn text_usage_finish(&self) {
        let server = TestServer::start(vec![Reply::sse(self.fixture("text.sse"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        assert_eq!(
            c.usage,
            vec![Usage {
                input_tokens: self.usage.0,
                output_tokens: self.usage.1,
                estimated: false
            }]
        );
        assert_eq!(c.finish, vec![FinishReason::Stop]);
        assert!(c.order.ends_with("UF"), "{}", c.order);
        let reqs = server.requests();
        assert_eq!(reqs.len(), 1);
        let auth = reqs[0].headers.get(self.key_header).expect("key header");
        assert!(auth.to_str().unwrap().contains(KEY));
    }

    /// The same fixture in 1–3 byte raw chunks gives the same result.
    pub async fn tiny_chunks(&self) {
        let body = self.fixture("text.sse");
        let server = TestServer::start(vec![Reply::sse_tiny(&body)]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        assert_eq!(c.finish, vec![FinishReason::Stop]);
        assert_eq!(c.usage.len(), 1);
    }

    /// 429 with `Retry-After: 1`, then success: two attempts, ≥ 1 s apart.
    pub async fn retry_after_honoured(&self, body_429: Vec<u8>) {
        let server = TestServer::start(vec![
            Reply::error(429, body_429).header("retry-after", "1"),
            Reply::sse(self.fixture("text.sse")),
        ])
        .await;
        let start = Instant::now();
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        let reqs = server.requests();
        assert_eq!(reqs.len(), 2);
        let gap = reqs[1].at - reqs[0].at;
        assert!(gap >= Duration::from_millis(950), "gap {gap:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    /// 500 then 503 then success: three attempts.
    pub async fn server_errors_retried(&self) {
        let server = TestServer::start(vec![
            Reply::error(500, "oops"),
            Reply::error(503, "{}"),
            Reply::sse(self.fixture("text.sse")),
        ])
        .await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        assert_eq!(server.requests().len(), 3);
    }

    /// Four 5xx: gives up after `max_attempts` with `Overloaded`.
    pub async fn retries_exhausted(&self, status: u16) {
        let server = TestServer::start(vec![Reply::error(status, "{}"); 5]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert!(
            matches!(c.error, Some(ModelError::Overloaded { status: s, .. }) if s == status),
            "{:?}",
            c.error
        );
        assert_eq!(server.requests().len(), 4);
    }

    /// 401 → Auth, no retry, no key in the error.
    pub async fn unauthorized(&self, status: u16) {
        let server = TestServer::start(vec![
            Reply::error(status, self.fixture("error_401.json")),
            Reply::sse(self.fixture("text.sse")),
        ])
        .await;
        let c = run(&*self.client(&server), request(self.model)).await;
        let e = c.error.expect("error");
        assert_eq!(e, ModelError::Auth { status });
        self.assert_no_key(&e);
        assert_eq!(server.requests().len(), 1);
    }

    /// 400 → BadRequest with the provider's message, no retry.
    pub async fn bad_request(&self, expected_message: &str) {
        let server =
            TestServer::start(vec![Reply::error(400, self.fixture("error_400.json"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        match c.error {
            Some(ModelError::BadRequest { ref message }) => {
                assert!(message.contains(expected_message), "{message}")
            }
            ref other => panic!("{other:?}"),
        }
        assert_eq!(server.requests().len(), 1);
    }

    /// A provider that echoes the key in its error message: scrubbed.
    pub async fn key_echo_scrubbed(&self) {
        let body = format!(
            r#"{{"error":{{"message":"bad key {KEY} given","type":"invalid_request_error"}}}}"#
        );
        let server = TestServer::start(vec![Reply::error(400, body)]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        let e = c.error.expect("error");
        self.assert_no_key(&e);
        assert!(e.to_string().contains("[redacted]"), "{e}");
    }

    /// Context-length error → ContextTooLong.
    pub async fn context_too_long(&self) {
        let server =
            TestServer::start(vec![Reply::error(400, self.fixture("error_context.json"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert!(
            matches!(c.error, Some(ModelError::ContextTooLong { .. })),
            "{:?}",
            c.error
        );
    }

    /// Connection cut after some chunks: the text so far, then StreamInterrupted; no retry.
    pub async fn cut_after_output(&self) {
        let body = self.fixture("text.sse");
        // Cut in the middle of the stream, after "Hello" was sent.
        let cut = find(&body, b"Here is").expect("fixture has 'Here is'");
        // Let the first bytes reach the client before the cut (else it is a
        // cut before the first byte, which is retried).
        let reply = Reply::sse(body[..cut].to_vec())
            .then(Piece::Sleep(Duration::from_millis(100)))
            .then(Piece::Cut);
        let server = TestServer::start(vec![reply, Reply::sse(body.clone())]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert!(c.text.starts_with("Hello"), "{:?}", c.text);
        assert!(
            matches!(c.error, Some(ModelError::StreamInterrupted { .. })),
            "{:?}",
            c.error
        );
        assert!(c.finish.is_empty());
        assert_eq!(server.requests().len(), 1);
        // What was streamed still counts: input and the streamed output.
        assert_eq!(c.usage.len(), 1, "{}", c.order);
        assert!(c.usage[0].input_tokens > 0, "{:?}", c.usage);
        assert!(c.usage[0].output_tokens > 0, "{:?}", c.usage);
        assert!(c.order.ends_with('U'), "{}", c.order);
    }

    /// A clean EOF before the provider's end: StreamInterrupted too.
    pub async fn eof_before_end(&self) {
        let body = self.fixture("text.sse");
        let cut = find(&body, b"Here is").expect("fixture has 'Here is'");
        // Cut at an event boundary: back up to the last blank line.
        let boundary = event_boundary_before(&body, cut);
        let server = TestServer::start(vec![Reply::sse(body[..boundary].to_vec())]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert!(
            matches!(c.error, Some(ModelError::StreamInterrupted { .. })),
            "{:?}",
            c.error
        );
    }

    /// Headers never come: first-byte timeout (retried, then reported).
    pub async fn first_byte_timeout_headers(&self) {
        let mut slow = Reply::sse(self.fixture("text.sse"));
        slow.delay_headers = Some(Duration::from_secs(5));
        let server = TestServer::start(vec![slow.clone(), slow]).await;
        let mut retry = fast_retry();
        retry.max_attempts = 2;
        let client = (self.make)(&server.base_url, retry, short_timeouts());
        let start = Instant::now();
        let c = run(&*client, request(self.model)).await;
        assert_eq!(
            c.error,
            Some(ModelError::Timeout {
                phase: "first_byte",
                after: short_timeouts().first_byte
            })
        );
        assert_eq!(server.requests().len(), 2);
        assert!(start.elapsed() < Duration::from_millis(4500));
    }

    /// Headers come but the body stays silent: first-byte timeout as well.
    pub async fn first_byte_timeout_body(&self) {
        let mut r = Reply::sse(Bytes::new());
        r.body = vec![Piece::Hang];
        let server = TestServer::start(vec![r]).await;
        let client = (self.make)(&server.base_url, RetryPolicy::none(), short_timeouts());
        let c = run(&*client, request(self.model)).await;
        assert!(
            matches!(
                c.error,
                Some(ModelError::Timeout {
                    phase: "first_byte",
                    ..
                })
            ),
            "{:?}",
            c.error
        );
    }

    /// Output, then silence: the text so far, then an idle timeout.
    pub async fn idle_timeout(&self) {
        let body = self.fixture("text.sse");
        let cut = find(&body, b"Here is").expect("fixture");
        let boundary = event_boundary_before(&body, cut);
        let reply = Reply::sse(body[..boundary].to_vec()).then(Piece::Hang);
        let server = TestServer::start(vec![reply]).await;
        let client = (self.make)(&server.base_url, RetryPolicy::none(), short_timeouts());
        let c = run(&*client, request(self.model)).await;
        assert_eq!(c.text, "Hello");
        assert_eq!(
            c.error,
            Some(ModelError::Timeout {
                phase: "idle",
                after: short_timeouts().idle
            })
        );
    }

    /// Cancel while the stream is open and silent: `Cancelled` at once.
    pub async fn cancel_mid_stream(&self) {
        let body = self.fixture("text.sse");
        let cut = find(&body, b"Here is").expect("fixture");
        let boundary = event_boundary_before(&body, cut);
        let reply = Reply::sse(body[..boundary].to_vec()).then(Piece::Hang);
        let server = TestServer::start(vec![reply]).await;
        let client = self.client(&server);
        let cancel = CancellationToken::new();
        let mut stream = client
            .stream(request(self.model), cancel.clone())
            .await
            .expect("open");
        let mut text = String::new();
        while !text.contains("Hello") {
            match stream.next().await {
                Some(Ok(ModelChunk::Text(t))) => text.push_str(&t),
                Some(Ok(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        cancel.cancel();
        let start = Instant::now();
        let next = stream.next().await;
        assert!(matches!(next, Some(Err(ModelError::Cancelled))), "{next:?}");
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(stream.next().await.is_none());
    }

    /// Cancel during a long `Retry-After` wait: `Cancelled` at once, no second attempt.
    pub async fn cancel_during_backoff(&self, body_429: Vec<u8>) {
        let server =
            TestServer::start(vec![Reply::error(429, body_429).header("retry-after", "4")]).await;
        let client = self.client(&server);
        let cancel = CancellationToken::new();
        let c2 = cancel.clone();
        let start = Instant::now();
        let task = tokio::spawn(async move { client.stream(request("m"), c2).await.map(|_| ()) });
        // Cancel once the first attempt has been answered.
        while server.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
        let r = task.await.unwrap();
        assert_eq!(r, Err(ModelError::Cancelled));
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(server.requests().len(), 1);
    }

    /// An error object in the stream after some text: that text, then a typed error.
    pub async fn error_mid_stream(&self, expected: fn(&ModelError) -> bool) {
        let server = TestServer::start(vec![Reply::sse(self.fixture("error_midstream.sse"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.text, "Partial");
        let e = c.error.expect("error");
        assert!(expected(&e), "{e:?}");
        assert!(c.finish.is_empty());
    }

    /// A malformed JSON line: the text before it, then a typed Transport error.
    pub async fn malformed_line(&self) {
        let server = TestServer::start(vec![Reply::sse(self.fixture("malformed.sse"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.text, "Before");
        match c.error {
            Some(ModelError::Transport { ref message }) => {
                assert!(message.contains("malformed"), "{message}")
            }
            ref other => panic!("{other:?}"),
        }
    }

    /// Nothing listens: Transport after every attempt.
    pub async fn connection_refused(&self) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = (self.make)(&format!("http://{addr}"), fast_retry(), short_timeouts());
        let c = run(&*client, request(self.model)).await;
        let e = c.error.expect("error");
        assert!(matches!(e, ModelError::Transport { .. }), "{e:?}");
        self.assert_no_key(&e);
    }

    /// A finish-reason fixture.
    pub async fn finish_reason(&self, fixture: &str, expected: FinishReason, text: &str) {
        let server = TestServer::start(vec![Reply::sse(self.fixture(fixture))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, text);
        assert_eq!(c.finish, vec![expected]);
        assert_eq!(c.usage.len(), 1);
    }

    /// The thinking fixture: thinking first, then text.
    pub async fn thinking(&self, thinking: &str) {
        let server = TestServer::start(vec![Reply::sse(self.fixture("thinking.sse"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.thinking, thinking);
        assert_eq!(c.text, "Answer");
        assert!(c.order.starts_with('H'), "{}", c.order);
        assert_eq!(c.finish, vec![FinishReason::Stop]);
    }
}

/// Records every failed attempt a client reports.
#[derive(Default)]
pub struct Attempts(pub Mutex<Vec<AttemptFailure>>);

impl ModelObserver for Attempts {
    fn attempt_failed(&self, failure: &AttemptFailure) {
        self.0.lock().unwrap().push(failure.clone());
    }
}

impl Attempts {
    /// What was reported so far.
    pub fn all(&self) -> Vec<AttemptFailure> {
        self.0.lock().unwrap().clone()
    }
}

/// Stream `request` with an observer (and an optional deadline) and drain it.
pub async fn run_observed(
    client: &dyn ModelClient,
    request: ModelRequest,
    deadline: Option<Duration>,
) -> (Collected, Vec<AttemptFailure>) {
    let seen = Arc::new(Attempts::default());
    let call = ModelCall {
        deadline: deadline.map(|d| tokio::time::Instant::now() + d),
        observer: Some(seen.clone()),
    };
    let c = match client
        .stream_call(request, CancellationToken::new(), call)
        .await
    {
        Ok(s) => collect(s).await,
        Err(e) => Collected {
            error: Some(e),
            ..Default::default()
        },
    };
    (c, seen.all())
}

/// Fast retries with a rate-limit window for tests.
pub fn windowed_retry(window: Duration) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 100,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(80),
        rate_limit_window: window,
        error_window: window,
        ..RetryPolicy::default()
    }
}

impl ProviderUnderTest {
    /// A gateway's stream (ids rewritten, no empty first chunk, input `0`
    /// early and the real count later): the answer, the real usage, Stop.
    pub async fn gateway_usage(&self) {
        let server = TestServer::start(vec![Reply::sse(self.fixture("gateway_usage.sse"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, GATEWAY_ANSWER);
        assert_eq!(
            c.usage,
            vec![Usage {
                input_tokens: 1312,
                output_tokens: 41,
                estimated: false
            }]
        );
        assert_eq!(c.finish, vec![FinishReason::Stop]);
    }

    /// A server that ignored `stream: true` and answered `application/json`:
    /// the complete reply is the answer, as one chunk, with its usage.
    pub async fn json_instead_of_sse(&self, thinking: &str) {
        let server = TestServer::start(vec![Reply::json(self.fixture("nonstream.json"))]).await;
        let c = run(&*self.client(&server), request(self.model)).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, GATEWAY_ANSWER);
        assert_eq!(c.thinking, thinking);
        assert_eq!(
            c.usage,
            vec![Usage {
                input_tokens: 1312,
                output_tokens: 41,
                estimated: false
            }]
        );
        assert_eq!(c.finish, vec![FinishReason::Stop]);
        assert_eq!(server.requests().len(), 1);
    }

    /// A 200 that is neither an event stream nor the provider's JSON: an
    /// error naming what came back.
    pub async fn unexpected_reply_is_named(&self) {
        let mut html = Reply::json("<html><body>502 Bad Gateway (nginx)</body></html>");
        html.headers = vec![("content-type".into(), "text/html; charset=utf-8".into())];
        let json = Reply::json(r#"{"status":"ok","detail":"queued"}"#);
        let server = TestServer::start(vec![html, json]).await;
        let client = (self.make)(&server.base_url, RetryPolicy::none(), Timeouts::default());
        for expected in ["text/html", "application/json"] {
            let c = run(&*client, request(self.model)).await;
            match &c.error {
                Some(ModelError::Transport { message }) => {
                    assert!(message.contains(expected), "{message}");
                    assert!(message.contains("neither an event stream"), "{message}");
                }
                other => panic!("{other:?}"),
            }
            assert!(c.text.is_empty());
        }
    }

    /// Three 429s without `Retry-After`, then success: the observer hears
    /// three failures, each with the status, the provider's message and the
    /// delay before the next attempt.
    pub async fn retries_are_reported(&self, message: &str) {
        let mut replies = vec![Reply::error(429, self.fixture("error_429.json")); 3];
        replies.push(Reply::sse(self.fixture("text.sse")));
        let server = TestServer::start(replies).await;
        let (c, seen) = run_observed(&*self.client(&server), request(self.model), None).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (i, f) in seen.iter().enumerate() {
            assert_eq!(f.attempt, i as u32 + 1);
            assert_eq!(f.status, Some(429));
            assert!(
                f.message.as_deref().unwrap_or("").contains(message),
                "{f:?}"
            );
            assert!(matches!(f.error, ModelError::RateLimited { .. }), "{f:?}");
            assert!(f.retry_in.is_some(), "{f:?}");
        }
        assert_eq!(server.requests().len(), 4);
    }

    /// An upstream rate limited for a while (429 without `Retry-After` until
    /// `busy` after the first request), then fine: retried within the
    /// window until it succeeds. (The real-world case is 5 s against the
    /// default 60 s window; scaled down here.)
    pub async fn rate_limit_window_outlasts_the_upstream(&self) {
        let busy = Duration::from_millis(500);
        let server = TestServer::start_gated(
            Reply::error(429, self.fixture("error_429.json")),
            busy,
            vec![Reply::sse(self.fixture("text.sse"))],
        )
        .await;
        let client = (self.make)(
            &server.base_url,
            windowed_retry(Duration::from_secs(10)),
            Timeouts::default(),
        );
        let (c, seen) = run_observed(&*client, request(self.model), None).await;
        assert_eq!(c.error, None);
        assert_eq!(c.text, FIXTURE_TEXT);
        let reqs = server.requests();
        assert!(reqs.len() >= 3, "{}", reqs.len());
        assert!(reqs[reqs.len() - 1].at - reqs[0].at >= busy);
        assert_eq!(seen.len(), reqs.len() - 1);
        assert!(seen.iter().all(|f| f.retry_in.is_some()));
    }

    /// A window shorter than the upstream's limit: gives up once the next
    /// wait would pass it; the last report says no retry follows.
    pub async fn rate_limit_window_ends_the_retries(&self) {
        let server = TestServer::start_gated(
            Reply::error(429, self.fixture("error_429.json")),
            Duration::from_secs(30),
            vec![],
        )
        .await;
        let client = (self.make)(
            &server.base_url,
            windowed_retry(Duration::from_millis(300)),
            Timeouts::default(),
        );
        let start = Instant::now();
        let (c, seen) = run_observed(&*client, request(self.model), None).await;
        assert!(
            matches!(c.error, Some(ModelError::RateLimited { .. })),
            "{:?}",
            c.error
        );
        assert!(start.elapsed() < Duration::from_secs(3));
        let last = seen.last().expect("reports");
        assert_eq!(last.retry_in, None);
        assert_eq!(seen.len(), server.requests().len());
    }

    /// The caller's deadline bounds the retries: a `Retry-After` that ends
    /// past it is not waited for.
    pub async fn deadline_bounds_the_retries(&self) {
        let server = TestServer::start(vec![
            Reply::error(429, self.fixture("error_429.json")).header("retry-after", "2"),
            Reply::sse(self.fixture("text.sse")),
        ])
        .await;
        let start = Instant::now();
        let (c, seen) = run_observed(
            &*self.client(&server),
            request(self.model),
            Some(Duration::from_millis(500)),
        )
        .await;
        assert!(
            matches!(c.error, Some(ModelError::RateLimited { .. })),
            "{:?}",
            c.error
        );
        assert!(start.elapsed() < Duration::from_millis(1500));
        assert_eq!(server.requests().len(), 1);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].retry_in, None);
    }
}

/// The end of the last complete event (blank line, LF or CRLF) before `pos`.
pub fn event_boundary_before(body: &[u8], pos: usize) -> usize {
    (0..pos)
        .rev()
        .find_map(|i| {
            let rest = &body[i..pos];
            if rest.starts_with(b"\n\n") {
                Some(i + 2)
            } else if rest.starts_with(b"\n\r\n") {
                Some(i + 3)
            } else {
                None
            }
        })
        .expect("an event before")
}

/// Position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One `#[tokio::test]` per `test_name => scenario(args)` line, running that
/// scenario of the [`ProviderUnderTest`] `$p`.
#[allow(unused_macros)]
macro_rules! provider_tests {
    ($p:ident; $($name:ident => $scenario:ident($($arg:expr),* $(,)?)),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                $p.$scenario($($arg),*).await;
            }
        )*
    };
}

/// The scenarios every provider runs under the same test name and with no
/// provider-specific argument (the 429 bodies are `<provider>/error_429.json`).
#[allow(unused_macros)]
macro_rules! common_provider_tests {
    ($p:ident) => {
        provider_tests! { $p;
            text_usage_and_finish => text_usage_finish(),
            retry_after_429_is_honoured =>
                retry_after_honoured(fixture($p.name, "error_429.json")),
            server_errors_are_retried => server_errors_retried(),
            key_echoed_by_provider_is_scrubbed => key_echo_scrubbed(),
            connection_cut_after_output => cut_after_output(),
            first_byte_timeout_waiting_for_headers => first_byte_timeout_headers(),
            first_byte_timeout_waiting_for_body => first_byte_timeout_body(),
            idle_timeout_between_chunks => idle_timeout(),
            cancel_during_stream => cancel_mid_stream(),
            cancel_during_retry_backoff =>
                cancel_during_backoff(fixture($p.name, "error_429.json")),
            malformed_line_is_a_typed_error => malformed_line(),
            connection_refused_is_transport => connection_refused(),
            unexpected_reply_is_named => unexpected_reply_is_named(),
            rate_limit_window_outlasts_the_upstream => rate_limit_window_outlasts_the_upstream(),
            rate_limit_window_ends_the_retries => rate_limit_window_ends_the_retries(),
            deadline_bounds_the_retries => deadline_bounds_the_retries(),
        }
    };
}

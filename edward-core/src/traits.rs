//! The traits the engine is generic over. Each has the fewest methods that let
//! every real backend be efficient: batch event append, batch file write,
//! lease-based claim with a fencing token.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::chat::*;
use crate::error::{AdmitError, InfraError, ModelError, QueueError, SandboxError, StoreError};
use crate::types::*;

// ---------------------------------------------------------------- RunStore

/// Durable record of runs, their events, checkpoints and side effects.
///
/// Every mutating call after admission carries the caller's [`Fence`]; a store
/// rejects it with [`StoreError::StaleFence`] when a newer fence started the
/// run, checked in the same statement/transaction as the write.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Check `limits` against the active (queued or running) runs and, if
    /// admitted, insert the run `queued` with `first_event` as seq 1 — all
    /// atomically, so concurrent submits can never exceed a limit.
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError>;

    /// The run, if it exists.
    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError>;

    /// A worker holding a lease with `fence` takes the run: sets its fence
    /// (must be ≥ the stored one, else `StaleFence`) and status `running`
    /// (from `queued` or `running`; a terminal run gives `Finished`).
    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError>;

    /// Append `events` in order, in one transaction, assigning gap-free seqs
    /// after the current last one. Returns the persisted events.
    /// Fails with `Finished` after the terminal event, `StaleFence` for an old fence.
    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError>;

    /// Set the terminal `status` and append `events` (whose last must be
    /// `run_finished`) in one transaction. `fence` of `None` is the
    /// out-of-band path (cancel of a queued run, reaper), which succeeds
    /// regardless of fence but still never after another terminal event.
    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError>;

    /// Up to `limit` events with seq > `after_seq`, in order.
    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError>;

    /// Replace the run's checkpoint.
    async fn save_checkpoint(
        &self,
        run_id: RunId,
        fence: Fence,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError>;

    /// The newest checkpoint.
    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError>;

    /// Record that a side effect is starting. Returns the record after the
    /// call: a new one (`attempts == 1`), or the existing one — `Completed`
    /// (reuse its result, do not redo) or `Started` with `attempts` bumped
    /// (the effect was interrupted; redo only if safe).
    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError>;

    /// Record a side effect's result.
    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError>;

    /// Record a cancel request durably and idempotently. The first call on an
    /// active run sets `cancel_requested_at` and appends `event` (the
    /// engine's `cancel_requested`) with the next seq, in one transaction;
    /// later calls, and calls on a terminal run, change nothing. Returns the
    /// run after the call. `NotFound` for an unknown id.
    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError>;

    /// Runs in `status`, oldest first (used by reapers and operators).
    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError>;

    /// Whether runs outlive the process. The engine builder refuses a store
    /// and a queue of different durability (a durable store with an
    /// in-memory queue loses queued runs on restart). Default: durable.
    fn durability(&self) -> Durability {
        Durability::Durable
    }

    /// One page of `user_id`'s runs matching `filter`, newest first (ids are
    /// time-ordered UUID v7s, so this is id order): at most `limit` runs
    /// whose id is below `before` (the last id of the previous page) when
    /// given. Used to list a caller's runs (e.g. `GET /v1/runs`).
    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError>;

    // ------------------------------------------------------------ chats

    /// Write the run's chat messages of `turn`, in one transaction checked
    /// against `fence`: delete the run's messages of turns `>= turn`, then
    /// insert `messages` as turn `turn` with indexes 0, 1, …. A replayed
    /// turn therefore replaces (never duplicates) what an earlier attempt
    /// wrote, and `put_messages(run, fence, n, vec![])` drops the messages of
    /// turns a resumed run superseded. The messages belong to the run's user
    /// and chat. `NotFound` for an unknown run, `StaleFence` for an old fence.
    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError>;

    /// The newest `limit` messages of `user_id`'s chat `chat_id`, oldest
    /// first, in `(run_id, turn, index)` order; only messages of runs whose
    /// id is below `before_run` when given (a run's own history excludes
    /// itself and later runs).
    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError>;

    /// Create build `number` of the run (`queued`) with `command`, or return
    /// the existing one unchanged (idempotent across replays).
    /// `StaleFence` for an old fence.
    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<BuildJob, StoreError>;

    /// Compare-and-set claim: `queued → building`, or take over a `building`
    /// job claimed under an older fence (that attempt died). Returns the
    /// claimed job, or `None` when it is finished, or already claimed under
    /// this or a newer fence — of concurrent claimers exactly one wins.
    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError>;

    /// `building → succeeded | failed` with the result, only for the claim
    /// made under `fence` (else `BuildConflict`).
    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError>;

    /// The run's build jobs, by number.
    async fn builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError>;
}

/// Which of a user's runs [`RunStore::list_user_runs`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunFilter {
    /// Only runs of this chat.
    pub chat_id: Option<String>,
    /// Only runs in this status.
    pub status: Option<RunStatus>,
}

impl RunFilter {
    /// Every run of the user.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs of `chat_id`.
    pub fn chat(mut self, chat_id: impl Into<String>) -> Self {
        self.chat_id = Some(chat_id.into());
        self
    }

    /// Only runs in `status`.
    pub fn status(mut self, status: RunStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Whether `run` passes the filter (the user is checked separately).
    pub fn matches(&self, run: &Run) -> bool {
        self.chat_id.as_ref().is_none_or(|c| *c == run.chat_id)
            && self.status.is_none_or(|s| s == run.status)
    }
}

// ---------------------------------------------------------------- RunQueue

/// Work queue of run ids with leases.
#[async_trait]
pub trait RunQueue: Send + Sync + 'static {
    /// Make `run_id` claimable (now). Enqueuing an already queued id is a no-op.
    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError>;

    /// Claim the oldest claimable job — including one whose lease expired —
    /// for `owner` for `lease_for`. The returned fence is greater than any
    /// fence previously issued for that run.
    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError>;

    /// Claim up to `max` claimable jobs at once, oldest first, each as
    /// [`RunQueue::claim`] would; fewer (or none) when fewer are claimable.
    /// The default claims one at a time; a store that can claim several in
    /// one round trip overrides it. If a later claim fails after earlier ones
    /// succeeded, the ones held are returned (the error is dropped).
    async fn claim_many(
        &self,
        owner: &str,
        lease_for: Duration,
        max: usize,
    ) -> Result<Vec<Lease>, QueueError> {
        let mut leases = Vec::new();
        while leases.len() < max {
            match self.claim(owner, lease_for).await {
                Ok(Some(lease)) => leases.push(lease),
                Ok(None) => break,
                Err(e) if leases.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(leases)
    }

    /// Extend a held lease. `LeaseLost` if it expired and was taken, or acked.
    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError>;

    /// The job is done: remove it. `LeaseLost` if not held.
    async fn ack(&self, lease: &Lease) -> Result<(), QueueError>;

    /// The attempt failed: reschedule with backoff, or dead-letter once
    /// `policy.max_attempts` is reached. `LeaseLost` if not held.
    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError>;

    /// Dead-lettered jobs, newest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError>;

    /// Whether jobs outlive the process (see [`RunStore::durability`]).
    /// Default: durable.
    fn durability(&self) -> Durability {
        Durability::Durable
    }
}

// ---------------------------------------------------------------- Sandbox

/// What to provision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The `project` attribute of `<edward_sandbox>`, if any.
    pub project: Option<String>,
    /// The `base` attribute (template/image hint), if any.
    pub base: Option<String>,
}

/// One whole file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileWrite {
    /// Where, relative to the workspace root.
    pub path: SandboxPath,
    /// The complete new content.
    pub content: Bytes,
}

/// An entry of [`Sandbox::list_files`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// A command to execute: argv only, never a shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory relative to the workspace root (`None` = root).
    pub cwd: Option<SandboxPath>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Kill the process (and its children) after this long.
    pub timeout: Duration,
    /// Keep at most this many bytes of stdout and of stderr each.
    pub output_cap: usize,
}

/// The outcome of [`Sandbox::exec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// Exit code; `None` when killed by a signal (timeout, cancel).
    pub exit_code: Option<i32>,
    /// Captured stdout (lossy UTF-8), at most `output_cap` bytes.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), at most `output_cap` bytes.
    pub stderr: String,
    /// Stdout bytes beyond the cap that were discarded.
    pub stdout_truncated: u64,
    /// Stderr bytes beyond the cap that were discarded.
    pub stderr_truncated: u64,
    /// Killed because the timeout passed.
    pub timed_out: bool,
    /// Wall time.
    pub duration_ms: u64,
}

/// Whether a sandbox confines the commands it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Isolation {
    /// Commands run with the host user's rights: they can read and write
    /// whatever that user can. Running model-written code is code execution
    /// on the host.
    None {
        /// Why (e.g. `bubblewrap not found`).
        reason: String,
    },
    /// Commands are confined (a jail, a container): they see the workspace
    /// and read-only system files, nothing they start outlives them.
    Isolated {
        /// How (`bubblewrap`, `docker`).
        mechanism: String,
    },
}

impl Isolation {
    /// True for [`Isolation::Isolated`].
    pub fn is_isolated(&self) -> bool {
        matches!(self, Isolation::Isolated { .. })
    }
}

/// A provisioned sandbox.
#[async_trait]
pub trait Sandbox: Send + Sync + 'static {
    /// Its key.
    fn key(&self) -> &SandboxKey;

    /// Whether commands run confined. Default: not isolated.
    fn isolation(&self) -> Isolation {
        Isolation::None {
            reason: "this sandbox does not isolate commands".into(),
        }
    }

    /// Where it lives, for humans (a directory, a container id).
    fn location(&self) -> String;

    /// Write whole files as one batch; each becomes visible whole (temp + rename).
    async fn write_files(&self, files: Vec<FileWrite>) -> Result<(), SandboxError>;

    /// Read one file.
    async fn read_file(&self, path: &SandboxPath) -> Result<Bytes, SandboxError>;

    /// All regular files under the workspace, sorted by path.
    async fn list_files(&self) -> Result<Vec<FileEntry>, SandboxError>;

    /// Run a command; the process and its children are killed on timeout or
    /// when `cancel` fires (then `Err(Cancelled)`).
    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
    ) -> Result<ExecOutput, SandboxError>;
}

/// Creates sandboxes; idempotent per key (a second provision reattaches).
#[async_trait]
pub trait SandboxProvider: Send + Sync + 'static {
    /// Provision or reattach.
    async fn provision(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError>;

    /// Reattach an existing sandbox without ever creating one: `None` when
    /// there is none for `key` (never provisioned, or destroyed).
    async fn attach(&self, key: &SandboxKey) -> Result<Option<Arc<dyn Sandbox>>, SandboxError>;

    /// Remove the sandbox and everything in it. Destroying a missing one is Ok.
    async fn destroy(&self, key: &SandboxKey) -> Result<(), SandboxError>;
}

// ---------------------------------------------------------------- WriteBuffer

/// Debounce policy of the flush scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushPolicy {
    /// Flush this long after the last write …
    pub debounce: Duration,
    /// … but never later than this after the first pending write.
    pub max_wait: Duration,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy {
            debounce: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
        }
    }
}

/// A whole file waiting to be flushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingFile {
    /// Where.
    pub path: SandboxPath,
    /// The whole content (a later put of the same path replaces it).
    pub content: Bytes,
}

/// Pending file bytes per sandbox plus a due-time index for the flush
/// scheduler (never a scan of all sandboxes).
#[async_trait]
pub trait WriteBuffer: Send + Sync + 'static {
    /// Add files (replacing pending ones at the same path) and set the
    /// sandbox's due time to `min(first_pending + max_wait, now + debounce)`.
    async fn put(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError>;

    /// Sandboxes whose due time is ≤ `now`, earliest first, at most `limit`.
    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<SandboxKey>, InfraError>;

    /// Atomically remove and return everything pending for `key` (and its
    /// index entry). A failed flush puts the files back with [`WriteBuffer::put_back`].
    async fn take(&self, key: &SandboxKey) -> Result<Vec<PendingFile>, InfraError>;

    /// Put back files a failed flush took: like [`WriteBuffer::put`], except
    /// that a path written since the take keeps its newer content.
    async fn put_back(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError>;
}

// ---------------------------------------------------------------- Notifier

/// Wakes tailers when new events exist and delivers cancel signals.
/// Notifications are hints: receivers re-read the store, so a lost one only
/// delays (the periodic backstop catches it), never loses data.
#[async_trait]
pub trait Notifier: Send + Sync + 'static {
    /// Events up to `last_seq` exist for `run_id`.
    async fn notify_events(&self, run_id: RunId, last_seq: u64) -> Result<(), InfraError>;

    /// A stream of `last_seq` hints for `run_id`.
    async fn subscribe_events(&self, run_id: RunId) -> Result<BoxStream<'static, u64>, InfraError>;

    /// Ask whoever runs `run_id` to cancel it.
    async fn notify_cancel(&self, run_id: RunId) -> Result<(), InfraError>;

    /// All cancel requests from now on.
    async fn subscribe_cancels(&self) -> Result<BoxStream<'static, RunId>, InfraError>;
}

// ---------------------------------------------------------------- Lock

/// A held lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockGuard {
    /// Lock name.
    pub name: String,
    /// Holder.
    pub owner: String,
    /// Unique per acquisition; release/renew compare it.
    pub token: String,
    /// Fencing token: greater than the fence of every earlier acquisition
    /// of any lock by the same backend, so a downstream system can refuse
    /// a holder whose lease lapsed during a pause (it presents an older fence).
    #[serde(default)]
    pub fence: u64,
}

/// Owner-checked lease lock with renewal.
#[async_trait]
pub trait Lock: Send + Sync + 'static {
    /// Take `name` for `ttl` if free (or expired). `None` if held by someone else.
    async fn try_acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, InfraError>;

    /// Extend; `false` if the guard no longer holds the lock.
    async fn renew(&self, guard: &LockGuard, ttl: Duration) -> Result<bool, InfraError>;

    /// Release; `false` if the guard no longer held it (nothing is released then).
    async fn release(&self, guard: &LockGuard) -> Result<bool, InfraError>;
}

// ---------------------------------------------------------------- Model

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user (and tool results fed back).
    User,
    /// The model.
    Assistant,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who.
    pub role: Role,
    /// Text.
    pub content: String,
}

/// A completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// Model name as the provider knows it.
    pub model: String,
    /// System prompt.
    pub system: String,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Output cap.
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
}

/// Token usage of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// True when counted by Edward rather than reported by the provider.
    pub estimated: bool,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Natural stop.
    Stop,
    /// Output token cap.
    Length,
    /// Safety filter.
    ContentFilter,
    /// Anything else the provider said.
    Other(String),
}

/// One item of a model stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChunk {
    /// Output text (fed to the parser).
    Text(String),
    /// Provider-native reasoning text (recorded as thinking, not parsed).
    Thinking(String),
    /// Usage, usually once near the end.
    Usage(Usage),
    /// The stream's end reason.
    Finish(FinishReason),
}

/// A streaming completion.
pub type ModelStream = BoxStream<'static, Result<ModelChunk, ModelError>>;

/// Streams completions. Implementations race `cancel` against connect and
/// every read, and retry only before the first byte.
#[async_trait]
pub trait ModelClient: Send + Sync + 'static {
    /// Provider name for events and logs (`scripted`, `openai`, …).
    fn provider(&self) -> &str;

    /// Start streaming.
    async fn stream(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError>;

    /// Estimated input tokens of `request`, for the engine's pre-call checks
    /// (budget and context window). Default: bytes / 4 over system prompt and
    /// messages; providers with a tokenizer override it.
    fn estimate_input_tokens(&self, request: &ModelRequest) -> u64 {
        crate::pricing::estimate_tokens(&request.system)
            + request
                .messages
                .iter()
                .map(|m| crate::pricing::estimate_tokens(&m.content))
                .sum::<u64>()
    }

    /// The context window (input + output tokens) of `model`, when known.
    /// The engine refuses a turn whose estimated input cannot fit.
    fn context_window(&self, model: &str) -> Option<u64> {
        let _ = model;
        None
    }

    /// Whether [`ModelClient::stream`] already retries retryable failures
    /// before the first byte. The engine then does not retry on top of it
    /// (retries would otherwise multiply).
    fn retries_internally(&self) -> bool {
        false
    }

    /// [`ModelClient::stream`] with what the engine knows about the call:
    /// the latest moment a retry may still start (the run's deadline) and an
    /// observer told about every failed attempt, so retries inside the
    /// client are visible as `model_retry` events. The default ignores
    /// `call` and calls `stream`; the HTTP providers honour both.
    async fn stream_call(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
        call: ModelCall,
    ) -> Result<ModelStream, ModelError> {
        let _ = call;
        self.stream(request, cancel).await
    }
}

/// One failed attempt of a model call, as reported to a [`ModelObserver`].
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFailure {
    /// 1-based attempt that failed.
    pub attempt: u32,
    /// The HTTP status, when the provider answered with one.
    pub status: Option<u16>,
    /// The provider's own error message (scrubbed of the key), when it sent one.
    pub message: Option<String>,
    /// The typed error of this attempt.
    pub error: ModelError,
    /// `Some(delay)`: the call is retried after `delay`. `None`: this was the
    /// last attempt (fatal error, attempts or retry window used up, or a
    /// retry would pass the call's deadline) and `error` ends the call.
    pub retry_in: Option<Duration>,
}

/// Told about every failed attempt of a model call (see
/// [`ModelClient::stream_call`]). Called synchronously from the client's
/// retry loop: implementations only record or forward.
pub trait ModelObserver: Send + Sync {
    /// An attempt failed.
    fn attempt_failed(&self, failure: &AttemptFailure);
}

/// What the caller tells a model client about one call.
#[derive(Clone, Default)]
pub struct ModelCall {
    /// No retry is started when its delay would end after this instant (the
    /// run's deadline budget bounds the client's retry window).
    pub deadline: Option<tokio::time::Instant>,
    /// Told about every failed attempt.
    pub observer: Option<Arc<dyn ModelObserver>>,
}

impl std::fmt::Debug for ModelCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCall")
            .field("deadline", &self.deadline)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl ModelCall {
    /// Report `failure` to the observer, if any.
    pub fn report(&self, failure: &AttemptFailure) {
        if let Some(o) = &self.observer {
            o.attempt_failed(failure);
        }
    }
}

// ---------------------------------------------------------------- WebSearch

/// One search hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchResult {
    /// Title.
    pub title: String,
    /// URL.
    pub url: String,
    /// Snippet (capped).
    pub snippet: String,
}

/// Web search tool.
#[async_trait]
pub trait WebSearch: Send + Sync + 'static {
    /// Search; `max_results` is already clamped to 1..=8.
    async fn search(
        &self,
        query: &str,
        max_results: u8,
        cancel: CancellationToken,
    ) -> Result<Vec<SearchResult>, InfraError>;
}

// ---------------------------------------------------------------- CredentialStore

/// One stored provider credential of a user: the key **encrypted** (an AEAD
/// ciphertext and its nonce) under the operator's master key `key_id`, so
/// stores never see a plaintext key. Encryption and decryption happen in
/// `edward_core::registry::CredentialVault`; stores only keep the bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCredential {
    /// Stable id (kept when the same `(user_id, provider, name)` is put again).
    pub id: uuid::Uuid,
    /// The owner.
    pub user_id: String,
    /// The registry provider name (`openai`, `anthropic`, `local`, …).
    pub provider: String,
    /// The user's name for it (unique per user and provider).
    pub name: String,
    /// An optional base URL override (used only where the provider allows it).
    pub base_url: Option<String>,
    /// Which master key encrypted it.
    pub key_id: String,
    /// The AEAD nonce.
    pub nonce: Vec<u8>,
    /// The encrypted key (with the AEAD tag).
    pub ciphertext: Vec<u8>,
    /// Whether it is the user's default for `provider`.
    pub is_default: bool,
    /// When it was first stored.
    pub created_at: DateTime<Utc>,
    /// When it was revoked; a revoked credential is kept but never used.
    pub revoked_at: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("id", &self.id)
            .field("user_id", &self.user_id)
            .field("provider", &self.provider)
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("key_id", &self.key_id)
            .field("ciphertext_len", &self.ciphertext.len())
            .field("is_default", &self.is_default)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

/// Users' provider credentials, stored encrypted (see [`StoredCredential`]).
///
/// Every call is scoped by `user_id`: one user can never read, revoke or
/// delete another's credential, whatever id it passes.
#[async_trait]
pub trait CredentialStore: Send + Sync + 'static {
    /// Insert `cred`, or replace the credential with the same
    /// `(user_id, provider, name)` (keeping its `id` and `created_at`, and
    /// clearing `revoked_at`). When `cred.is_default`, every other credential
    /// of the user for that provider stops being the default, atomically.
    /// Returns the stored credential (with the id actually kept).
    async fn put_credential(&self, cred: StoredCredential) -> Result<StoredCredential, StoreError>;

    /// The credential `id` of `user_id` (revoked ones included), if any.
    async fn get_credential(
        &self,
        user_id: &str,
        id: uuid::Uuid,
    ) -> Result<Option<StoredCredential>, StoreError>;

    /// The credential of `user_id` for `provider` named `name`, or, when
    /// `name` is `None`, the user's non-revoked default for `provider`.
    async fn find_credential(
        &self,
        user_id: &str,
        provider: &str,
        name: Option<&str>,
    ) -> Result<Option<StoredCredential>, StoreError>;

    /// All credentials of `user_id` (revoked ones included), by provider then name.
    async fn list_credentials(&self, user_id: &str) -> Result<Vec<StoredCredential>, StoreError>;

    /// Mark the credential revoked (and not the default). `false` when
    /// `user_id` has no such credential.
    async fn revoke_credential(&self, user_id: &str, id: uuid::Uuid) -> Result<bool, StoreError>;

    /// Delete the credential. `false` when `user_id` has no such credential.
    async fn delete_credential(&self, user_id: &str, id: uuid::Uuid) -> Result<bool, StoreError>;
}

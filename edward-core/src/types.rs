//! Domain types shared by the engine and every adapter.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A run's identifier (a UUID v7, so ids sort by creation time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(pub Uuid);

impl RunId {
    /// A new, time-ordered id.
    pub fn new() -> Self {
        RunId(Uuid::now_v7())
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for RunId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(RunId)
    }
}

/// A monotonically increasing token issued with every queue lease.
///
/// A store accepts writes for a run only from the holder of the newest fence,
/// so a worker whose lease was taken over can no longer write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Lifecycle state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Admitted and waiting for a worker.
    Queued,
    /// Claimed by a worker.
    Running,
    /// Finished: the model said done (or the loop ended normally).
    Completed,
    /// Finished with an error.
    Failed,
    /// Finished because someone cancelled it.
    Cancelled,
}

impl RunStatus {
    /// Whether this status is final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// Whether the run counts against admission limits.
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }

    /// The snake_case name (as stored).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "queued" => RunStatus::Queued,
            "running" => RunStatus::Running,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            other => return Err(format!("unknown run status `{other}`")),
        })
    }
}

/// What a store needs to insert a new run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRun {
    /// The run's id (chosen by the caller so retries of a submit are idempotent).
    pub id: RunId,
    /// The user who owns the run.
    pub user_id: String,
    /// The chat (conversation) the run belongs to.
    pub chat_id: String,
    /// The validated request, stored as JSON so stores need not know its shape.
    pub request: serde_json::Value,
    /// The first event (`run_queued`), appended with seq 1 in the same transaction.
    pub first_event: NewEvent,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Its id.
    pub id: RunId,
    /// The owning user.
    pub user_id: String,
    /// The chat.
    pub chat_id: String,
    /// Current status.
    pub status: RunStatus,
    /// The request as submitted (JSON of the engine's `RunRequest`).
    pub request: serde_json::Value,
    /// The newest fence a worker started this run with (0 = never started).
    pub fence: Fence,
    /// The seq of the newest event (0 = none).
    pub last_seq: u64,
    /// When it was admitted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it reached a terminal status.
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it finished (the terminal event's reason), once finished.
    pub terminal_reason: Option<String>,
    /// When a cancel was first requested ([`crate::RunStore::request_cancel`]);
    /// every worker honours it within its status-check period.
    #[serde(default)]
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

/// An event to append; the store assigns `seq` and `at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    /// The event type (`run_queued`, `text_delta`, `command_finished`, …).
    pub kind: String,
    /// Type-specific fields.
    pub payload: serde_json::Value,
}

impl NewEvent {
    /// An event of `kind` with `payload`.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        NewEvent {
            kind: kind.into(),
            payload,
        }
    }
}

/// A persisted run event: the product's public record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// The run.
    pub run_id: RunId,
    /// 1, 2, 3 … gap-free per run.
    pub seq: u64,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// When it was persisted.
    pub at: DateTime<Utc>,
    /// Type-specific fields.
    pub payload: serde_json::Value,
}

impl RunEvent {
    /// Whether this is the run's terminal event.
    pub fn is_terminal(&self) -> bool {
        self.kind == RUN_FINISHED
    }
}

/// The kind of the single terminal event of every run.
pub const RUN_FINISHED: &str = "run_finished";

/// A turn-scoped checkpoint the engine writes after each turn; opaque to stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The number of turns fully completed.
    pub turn: u32,
    /// Engine state needed to continue (history summary, budgets used, …).
    pub state: serde_json::Value,
}

/// The state of a side-effect record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectState {
    /// Begun; not known to have completed.
    Started,
    /// Completed; `result` holds the outcome.
    Completed,
}

/// A side effect (file write, install, command, search) keyed by an
/// idempotency key `(run_id, key)` where key encodes turn, index and kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    /// The idempotency key, e.g. `t3/2/command`.
    pub key: String,
    /// Started or completed.
    pub state: EffectState,
    /// What was asked (JSON).
    pub request: serde_json::Value,
    /// The outcome, once completed.
    pub result: Option<serde_json::Value>,
    /// How many times it was begun (more than 1 means it was re-done after a crash).
    pub attempts: u32,
}

/// Limits on concurrently active (queued or running) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionLimits {
    /// Across all users.
    pub global: u32,
    /// Per user.
    pub per_user: u32,
    /// Per chat.
    pub per_chat: u32,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            global: 100,
            per_user: 2,
            per_chat: 1,
        }
    }
}

/// A queue lease on one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The run.
    pub run_id: RunId,
    /// The worker holding it.
    pub owner: String,
    /// Monotonic per run across claims; see [`Fence`].
    pub fence: Fence,
    /// 1 for the first claim, then +1 on every claim (retries and take-overs).
    pub attempt: u32,
    /// When the lease lapses unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// A job that ran out of attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The run.
    pub run_id: RunId,
    /// Attempts made.
    pub attempts: u32,
    /// The last error recorded.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub at: DateTime<Utc>,
}

/// What [`crate::RunQueue::retry`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryOutcome {
    /// Rescheduled to become claimable at this time.
    Scheduled {
        /// When.
        at: DateTime<Utc>,
    },
    /// Out of attempts: moved to the dead-letter set.
    DeadLettered,
}

/// Backoff policy for queue retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts before dead-lettering (claims count as attempts).
    pub max_attempts: u32,
    /// Delay after the first failure.
    pub base_delay_ms: u64,
    /// Cap on the delay.
    pub max_delay_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay_ms: 500,
            max_delay_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// Exponential delay before attempt `attempt + 1` (no jitter; adapters may add it).
    pub fn delay_after(&self, attempt: u32) -> std::time::Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let ms = self
            .base_delay_ms
            .saturating_mul(1u64 << exp)
            .min(self.max_delay_ms);
        std::time::Duration::from_millis(ms)
    }
}

/// Identifies a sandbox; provisioning is idempotent per key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxKey(pub String);

impl fmt::Display for SandboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated path relative to a sandbox's workspace root: normalised,
/// never absolute, never escaping the root (PROTOCOL.md §4).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath(String);

impl SandboxPath {
    /// Validate and normalise `raw`.
    pub fn new(raw: &str) -> Result<Self, crate::SandboxError> {
        crate::path::normalize(raw)
            .map(SandboxPath)
            .map_err(|reason| crate::SandboxError::InvalidPath {
                path: raw.chars().take(256).collect(),
                reason,
            })
    }

    /// The normalised relative path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = crate::SandboxError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        SandboxPath::new(&value)
    }
}

impl From<SandboxPath> for String {
    fn from(value: SandboxPath) -> Self {
        value.0
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a backend's data outlives the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Lost when the process exits (the in-memory adapters).
    InProcess,
    /// Kept across restarts and shared between processes (SQLite, Postgres, Redis).
    Durable,
}

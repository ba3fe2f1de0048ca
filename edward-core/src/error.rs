//! Error types at the trait boundaries. Each says what failed and whether a
//! retry can help ([`StoreError::is_retryable`] and friends), so retry policy
//! lives in one place.

use std::time::Duration;

use crate::types::{Fence, RunId, RunStatus};

/// A rejection by admission control: the limit that was hit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdmissionError {
    /// Too many active runs in total.
    #[error("too many active runs (global limit {limit})")]
    GlobalLimit {
        /// The limit.
        limit: u32,
    },
    /// Too many active runs for this user.
    #[error("too many active runs for this user (limit {limit})")]
    UserLimit {
        /// The limit.
        limit: u32,
    },
    /// Too many active runs in this chat.
    #[error("too many active runs in this chat (limit {limit})")]
    ChatLimit {
        /// The limit.
        limit: u32,
    },
}

/// Errors of [`crate::RunStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No run with this id.
    #[error("run {run_id} not found")]
    NotFound {
        /// The id.
        run_id: RunId,
    },
    /// A run with this id already exists (admit is idempotent only through `get_run`).
    #[error("run {run_id} already exists")]
    AlreadyExists {
        /// The id.
        run_id: RunId,
    },
    /// The caller's fence is older than the run's: another worker owns it now.
    #[error("run {run_id}: fence {given} is stale (current {current})")]
    StaleFence {
        /// The run.
        run_id: RunId,
        /// The caller's fence.
        given: Fence,
        /// The run's newest fence.
        current: Fence,
    },
    /// A status change that the current status does not allow.
    #[error("run {run_id}: cannot go from {from} to {to}")]
    InvalidTransition {
        /// The run.
        run_id: RunId,
        /// Its current status.
        from: RunStatus,
        /// The requested status.
        to: RunStatus,
    },
    /// The run is already terminal; nothing more may be appended.
    #[error("run {run_id} is already finished")]
    Finished {
        /// The run.
        run_id: RunId,
    },
    /// A build job is missing or not in a status that allows the change
    /// (e.g. finishing a build this fence did not claim).
    #[error("run {run_id}: build {number} is {status}, cannot {action}")]
    BuildConflict {
        /// The run.
        run_id: RunId,
        /// The build number.
        number: u32,
        /// Its status (`missing` when there is no such build).
        status: String,
        /// What was attempted (`finish`).
        action: &'static str,
    },
    /// Stored data could not be decoded.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The backend failed (connection, I/O, serialization conflict …).
    #[error("store backend error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// Whether retrying the same call can succeed.
        retryable: bool,
    },
}

impl StoreError {
    /// Whether retrying the same call can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Backend {
                retryable: true,
                ..
            }
        )
    }

    /// A backend error that retrying can fix.
    pub fn transient(message: impl Into<String>) -> Self {
        StoreError::Backend {
            message: message.into(),
            retryable: true,
        }
    }

    /// A backend error that retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        StoreError::Backend {
            message: message.into(),
            retryable: false,
        }
    }
}

/// Errors of [`crate::RunStore::admit`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// A limit was hit.
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Errors of [`crate::RunQueue`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The lease is no longer held by this owner/fence (expired and taken over, or acked).
    #[error("lease on run {run_id} lost (fence {fence})")]
    LeaseLost {
        /// The run.
        run_id: RunId,
        /// The fence the caller held.
        fence: Fence,
    },
    /// The backend failed.
    #[error("queue backend error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// Whether retrying can help.
        retryable: bool,
    },
}

impl QueueError {
    /// Whether retrying the same call can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            QueueError::Backend {
                retryable: true,
                ..
            }
        )
    }
}

/// Errors of [`crate::Sandbox`] and [`crate::SandboxProvider`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// A path was refused (escapes the workspace, absolute, malformed, symlink escape).
    #[error("invalid sandbox path `{path}`: {reason}")]
    InvalidPath {
        /// The offending path (truncated).
        path: String,
        /// Why.
        reason: String,
    },
    /// No such file.
    #[error("file not found: {path}")]
    NotFound {
        /// The path.
        path: String,
    },
    /// The command is not on the allowlist.
    #[error("command `{command}` is not allowed")]
    CommandNotAllowed {
        /// The program.
        command: String,
    },
    /// The program could not be started.
    #[error("could not start `{command}`: {message}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        message: String,
    },
    /// The operation was cancelled.
    #[error("sandbox operation cancelled")]
    Cancelled,
    /// The sandbox is gone (destroyed, container removed).
    #[error("sandbox {key} is gone")]
    Gone {
        /// Its key.
        key: String,
    },
    /// I/O or backend failure.
    #[error("sandbox backend error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// Whether retrying can help.
        retryable: bool,
    },
}

impl SandboxError {
    /// Whether retrying the same call can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SandboxError::Backend {
                retryable: true,
                ..
            }
        )
    }
}

/// Errors of [`crate::ModelClient`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// 401/403: the key is missing or wrong. Never contains the key.
    #[error("model provider rejected the credentials ({status})")]
    Auth {
        /// HTTP status.
        status: u16,
    },
    /// 400 and similar: the provider's message.
    #[error("model provider rejected the request: {message}")]
    BadRequest {
        /// The provider's message.
        message: String,
    },
    /// The prompt does not fit the model's context window.
    #[error("context too long: {message}")]
    ContextTooLong {
        /// The provider's message.
        message: String,
    },
    /// 429.
    #[error("rate limited by the model provider")]
    RateLimited {
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 5xx / 529.
    #[error("model provider overloaded or failing ({status})")]
    Overloaded {
        /// HTTP status.
        status: u16,
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// Output blocked by the provider's safety system.
    #[error("content filtered by the provider: {message}")]
    ContentFiltered {
        /// Details.
        message: String,
    },
    /// Connect, first-byte or idle timeout.
    #[error("model {phase} timeout after {after:?}")]
    Timeout {
        /// `connect`, `first_byte` or `idle`.
        phase: &'static str,
        /// The configured limit.
        after: Duration,
    },
    /// The stream broke after output had started; what was received stays recorded.
    #[error("model stream interrupted: {message}")]
    StreamInterrupted {
        /// Why.
        message: String,
    },
    /// Anything else on the wire (connection refused, TLS, malformed frames).
    #[error("model transport error: {message}")]
    Transport {
        /// Why.
        message: String,
    },
    /// No such model configured.
    #[error("unknown model `{model}`")]
    UnknownModel {
        /// The name asked for.
        model: String,
    },
    /// The call was cancelled.
    #[error("model call cancelled")]
    Cancelled,
}

impl ModelError {
    /// Whether retrying the call (before any output) can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ModelError::RateLimited { .. }
                | ModelError::Overloaded { .. }
                | ModelError::Transport { .. }
                | ModelError::Timeout { .. }
        )
    }
}

/// Errors of the small infrastructure traits ([`crate::WriteBuffer`],
/// [`crate::Notifier`], [`crate::Lock`], [`crate::WebSearch`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InfraError {
    /// Not configured (e.g. web search without an API key).
    #[error("{what} is not configured")]
    NotConfigured {
        /// What.
        what: String,
    },
    /// Cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The backend failed.
    #[error("{message}")]
    Backend {
        /// What failed.
        message: String,
        /// Whether retrying can help.
        retryable: bool,
    },
}

impl InfraError {
    /// Whether retrying can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            InfraError::Backend {
                retryable: true,
                ..
            }
        )
    }
}

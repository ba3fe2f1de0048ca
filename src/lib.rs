//! Edward: run coding-agent runs inside your own Rust service.
//!
//! A model streams text in a small tag protocol; Edward parses it as it
//! arrives, writes files into a sandbox, installs packages, runs commands,
//! loops for more turns within budgets, and records every step as a durable,
//! numbered event that clients can tail and replay.
//!
//! Start with [`Engine::builder`]: everything but the sandbox provider has a
//! default ([`Backend::memory`], the scripted demo model). Submit a
//! [`RunRequest`], run a [`worker`](Engine::worker), and follow the run with
//! [`Engine::events`] (a named, `Unpin` [`EventStream`] of [`TypedEvent`]s).
//! The README's example below is compiled and run as a test.
//!
//! # Layout
//! - The top level: what an application that embeds Edward uses.
//! - [`providers`] (features `openai`, `anthropic`, `gemini`, `tavily`): HTTP model clients.
//! - [`spi`]: what you need to *implement* a backend, sandbox or model client.
//! - [`parser`]: the streaming tag-protocol parser on its own.
//!
//! # Features
//! Each adapter compiles only when asked for: `local` (the local sandbox),
//! `sqlite`, `postgres`, `http`, and the providers. `--no-default-features`
//! builds the engine with in-memory backends only (no sqlx, no reqwest).
#![deny(missing_docs)]

/// Chats: messages, build jobs, framework detection and context assembly.
pub use edward_core::chat::{
    BuildJob, BuildStatus, ChatMessage, MessageRole, TurnEffects, chat_sandbox_key,
};
pub use edward_core::engine::context::{ContextStats, ProjectSnapshot, assemble_context};
pub use edward_core::engine::framework::{Detection, Framework, detect_framework};
pub use edward_core::engine::{
    Backend, BudgetKind, Budgets, BuildConfig, BuildError, CancelOutcome, ChatConfig,
    CommandPolicy, DoubleTexting, Engine, EngineBuilder, EngineConfig, EngineEvent, EventStream,
    EventStreamError, FilesError, MixedDurability, PackageManager, RawEventStream, RunRequest,
    SubmitError, ToolRun, TypedEvent, WorkerConfig,
};
pub use edward_core::pricing::{ModelPrice, PriceTable};
pub use edward_core::scripted::ScriptedModel;
pub use edward_core::{
    AdmissionError, AdmissionLimits, Durability, FileEntry, ModelError, Run, RunEvent, RunId,
    RunStatus, SandboxError, StoreError, Usage,
};

/// The local sandbox: a directory plus child processes (feature `local`).
#[cfg(feature = "local")]
pub use edward_sandbox::{LocalSandbox, LocalSandboxConfig, LocalSandboxProvider};

/// The embedded durable store and queue (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub use edward_store::SqliteStore;

/// Postgres store, queue, notifier and lock (feature `postgres`).
#[cfg(feature = "postgres")]
pub use edward_store::{PgLock, PgNotifier, PgOptions, PgQueue, PgStore};

/// Options and errors of the durable stores.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use edward_store::{ConnectError, StoreOptions};

/// Re-exported because Edward's signatures mention them: a user needs only
/// `edward` and `tokio`.
pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use futures::stream::BoxStream;
pub use tokio_util::sync::CancellationToken;

/// HTTP model clients and web search (features `openai`, `anthropic`,
/// `gemini`, `tavily`); [`providers::from_env`] reads `EDWARD_MODEL`.
#[cfg(any(
    feature = "openai",
    feature = "anthropic",
    feature = "gemini",
    feature = "tavily"
))]
pub use edward_core::providers;

/// What a registry routes runs with, and why routing fails.
pub use edward_core::engine::{CredentialChoice, ModelResolver, ModelRoute, RouteError};
/// Models per run: the provider registry and users' encrypted keys
/// (features `openai`, `anthropic`, `gemini`; see docs/PROVIDERS.md).
#[cfg(any(feature = "openai", feature = "anthropic", feature = "gemini"))]
pub use edward_core::registry;

/// The streaming tag-protocol parser (no I/O, no async).
pub use edward_parser as parser;

/// What implementors of backends, sandboxes and model clients need: the
/// traits and the records they exchange. Applications rarely touch these.
pub mod spi {
    /// Chat records as stores exchange them.
    pub use edward_core::chat::{BuildResult, CommandNote, FileNote, InstallNote, NewMessage};
    pub use edward_core::memory;
    pub use edward_core::{
        AdmitError, Checkpoint, DeadLetter, EffectRecord, EffectState, ExecOutput, ExecRequest,
        Fence, FileWrite, FinishReason, FlushPolicy, InfraError, Lease, Lock, LockGuard, Message,
        ModelChunk, ModelClient, ModelRequest, ModelStream, NewEvent, NewRun, Notifier,
        PendingFile, QueueError, RUN_FINISHED, RetryOutcome, RetryPolicy, Role, RunFilter,
        RunQueue, RunStore, Sandbox, SandboxKey, SandboxPath, SandboxProvider, SandboxSpec,
        SearchResult, WebSearch, WriteBuffer,
    };
    /// Users' provider credentials (ciphertext only) and their store.
    pub use edward_core::{CredentialStore, StoredCredential};
    /// Stream constructors (`stream::iter`, `stream::unfold`, …) for building a
    /// [`ModelStream`] or a notifier's `BoxStream`.
    pub use futures::stream;
}

/// The workspace crates whole, for what the top level does not name.
/// Items reached only through these are less stable than the top level.
#[doc(hidden)]
pub use edward_core as core;
#[doc(hidden)]
#[cfg(feature = "http")]
pub use edward_http as http;
#[doc(hidden)]
#[cfg(feature = "local")]
pub use edward_sandbox as sandbox;
#[doc(hidden)]
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use edward_store as store;

#[cfg(all(doctest, feature = "local"))]
#[doc = include_str!("../README.md")]
mod readme {}

#[cfg(all(doctest, feature = "local"))]
#[doc = include_str!("../docs/EXTENDING.md")]
mod extending {}

//! The run engine: admission, worker, agent loop, budgets, event pipeline,
//! flush scheduler, install queue.
//!
//! Build an [`Engine`] with [`Engine::builder`]; in-memory adapters are the
//! defaults for everything except the sandbox provider (required) and the
//! model (default: the scripted demo, [`crate::scripted::ScriptedModel::demo`]).
//!
//! ```no_run
//! # async fn demo(provider: std::sync::Arc<dyn edward_core::SandboxProvider>) -> Result<(), Box<dyn std::error::Error>> {
//! use edward_core::engine::{Engine, RunRequest, WorkerConfig};
//!
//! let engine = Engine::builder().sandbox_provider(provider).build()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let worker = tokio::spawn({
//!     let engine = engine.clone();
//!     let cfg = WorkerConfig::new(shutdown.clone());
//!     async move { engine.worker(cfg).await }
//! });
//! let id = engine.submit(RunRequest::new("user", "chat", "build a todo app")).await?;
//! let mut events = engine.events(id, 0);
//! while let Some(e) = events.next().await {
//!     println!("{}", serde_json::to_string(&e?)?);
//! }
//! shutdown.cancel();
//! worker.await??;
//! # Ok(()) }
//! ```
//!
//! **Architecture invariant:** every terminal path of a run goes through one
//! function that calls `RunStore::finish_run`, so a run has exactly one
//! terminal event and it is its last.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

mod backend;
mod budget;
mod chat_run;
mod config;
pub mod context;
mod counting;
mod effects;
mod events;
pub mod framework;
mod gate;
mod outcome;
mod prompt;
mod retention;
mod routing;
mod run;
mod sink;
mod stream;
mod tail;
mod worker;

pub use backend::{Backend, MixedDurability};
pub use budget::{BudgetKind, Budgets, InvalidBudget};
pub use config::{
    BuildConfig, ChatConfig, CommandPolicy, DoubleTexting, EngineConfig, MAX_ID_BYTES,
    MAX_PROMPT_BYTES, PackageManager, RunRequest,
};
pub use config::{PreparedCommand, ScriptPolicy, git_config_hazard};
pub use events::{EngineEvent, ToolRun};
pub use routing::{CredentialChoice, ModelResolver, ModelRoute, RouteError};
pub use stream::{EventStream, EventStreamError, RawEventStream, TypedEvent};
pub use worker::WorkerConfig;

/// Engine internals exposed for tests and tooling. **Unstable:** not covered
/// by semver; names and shapes change without notice.
pub mod unstable {
    pub use super::budget::BudgetState;
    pub use super::outcome::{StopReason, TurnFacts, TurnOutcome, decide_turn_outcome};
    pub use super::prompt::{NUDGE_MESSAGE, SYSTEM_PROMPT, ToolResult, continuation_message};
}

use crate::RunFilter;
use crate::pricing::PriceTable;
use crate::scripted::ScriptedModel;
use crate::{
    AdmissionError, AdmissionLimits, AdmitError, FileEntry, ModelClient, NewRun, Notifier,
    QueueError, Run, RunId, RunQueue, RunStatus, RunStore, SandboxError, SandboxKey, SandboxPath,
    SandboxProvider, StoreError, WebSearch, WriteBuffer,
};

/// Why a submit was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// A request field is invalid.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The field (`prompt`, `user_id`, `budgets.max_turns`, …).
        field: String,
        /// Why.
        reason: String,
    },
    /// Admission control refused it.
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    /// The chat already has an active run and the double-texting policy is
    /// [`DoubleTexting::Reject`]: submit again after it ends, cancel it, or
    /// use `enqueue`/`interrupt`.
    #[error("chat `{chat_id}` already has an active run ({active_run})")]
    ChatBusy {
        /// The chat.
        chat_id: String,
        /// Its active run.
        active_run: RunId,
    },
    /// The store failed.
    #[error("could not admit the run")]
    Store(#[source] StoreError),
    /// The run was admitted but could not be queued; it was finished `failed`.
    #[error("the run was admitted but could not be queued")]
    Queue(#[source] QueueError),
}

impl SubmitError {
    fn invalid(field: &str, reason: impl Into<String>) -> Self {
        SubmitError::Invalid {
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// Whether submitting the same request again can succeed: limits free up
    /// as runs finish, and store or queue outages pass; invalid requests never do.
    pub fn is_retryable(&self) -> bool {
        match self {
            SubmitError::Invalid { .. } => false,
            SubmitError::Rejected(_) | SubmitError::ChatBusy { .. } => true,
            SubmitError::Store(e) => e.is_retryable(),
            SubmitError::Queue(e) => e.is_retryable(),
        }
    }
}

/// Why the builder could not build, or a worker could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No sandbox provider was given (there is no in-memory default).
    #[error("a sandbox provider is required (e.g. `LocalSandboxProvider::new(dir)`)")]
    MissingSandboxProvider,
    /// The backend's store and queue differ in durability.
    #[error(transparent)]
    MixedDurability(#[from] MixedDurability),
    /// A setting is out of range.
    #[error("invalid `{field}`: {reason}")]
    InvalidSetting {
        /// The setting (`budgets.max_turns`, `config.effect_channel`, `worker.lease`, …).
        field: String,
        /// Why.
        reason: String,
    },
}

impl BuildError {
    fn invalid(field: &str, reason: impl Into<String>) -> Self {
        BuildError::InvalidSetting {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

/// What [`Engine::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The run was queued and is now finished `cancelled`.
    Cancelled,
    /// The run is running; the request is recorded (event `cancel_requested`)
    /// and its worker ends it within its status-check period, sooner when
    /// the notifier reaches it.
    Requested,
    /// The run had already finished.
    AlreadyFinished,
}

/// Why a files call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FilesError {
    /// No run with this id.
    #[error("run {run_id} not found")]
    RunNotFound {
        /// The id.
        run_id: RunId,
    },
    /// The run has no sandbox (it never wrote a file, or it was destroyed).
    #[error("run {run_id} has no sandbox")]
    NoSandbox {
        /// The id.
        run_id: RunId,
    },
    /// The store failed.
    #[error("could not read the run")]
    Store(#[source] StoreError),
    /// The sandbox failed (a missing file is `SandboxError::NotFound`, an
    /// invalid path `SandboxError::InvalidPath`).
    #[error("sandbox operation failed")]
    Sandbox(#[source] SandboxError),
}

impl FilesError {
    /// Whether retrying can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            FilesError::Store(e) => e.is_retryable(),
            FilesError::Sandbox(e) => e.is_retryable(),
            FilesError::RunNotFound { .. } | FilesError::NoSandbox { .. } => false,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) queue: Arc<dyn RunQueue>,
    pub(crate) sandboxes: Arc<dyn SandboxProvider>,
    pub(crate) model: Arc<dyn ModelClient>,
    pub(crate) write_buffer: Arc<dyn WriteBuffer>,
    pub(crate) notifier: Arc<dyn Notifier>,
    pub(crate) web_search: Arc<dyn WebSearch>,
    pub(crate) limits: AdmissionLimits,
    pub(crate) budgets: Budgets,
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) prices: PriceTable,
    pub(crate) default_model: String,
    pub(crate) known_models: BTreeSet<String>,
    pub(crate) wake: tokio::sync::Notify,
    /// Per-run model routing (issue 17); `None` = always `model`.
    pub(crate) resolver: Option<Arc<dyn ModelResolver>>,
    /// Events appended through `store` (see [`Engine::events_appended`]).
    pub(crate) events_appended: Arc<std::sync::atomic::AtomicU64>,
}

/// The run engine: one handle to submit, watch, cancel and inspect runs and
/// to run workers. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.inner.model.provider())
            .field("default_model", &self.inner.default_model)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

/// Builds an [`Engine`]. Everything but the sandbox provider has a default:
/// [`Backend::memory`], the scripted demo model, an in-memory write buffer.
#[derive(Default)]
#[must_use]
pub struct EngineBuilder {
    backend: Option<Backend>,
    sandboxes: Option<Arc<dyn SandboxProvider>>,
    model: Option<Arc<dyn ModelClient>>,
    write_buffer: Option<Arc<dyn WriteBuffer>>,
    web_search: Option<Arc<dyn WebSearch>>,
    limits: AdmissionLimits,
    budgets: Budgets,
    config: EngineConfig,
    prices: Option<PriceTable>,
    default_model: Option<String>,
    known_models: BTreeSet<String>,
    resolver: Option<Arc<dyn ModelResolver>>,
}

impl EngineBuilder {
    /// Where runs live: store, queue and notifier (default [`Backend::memory`]).
    pub fn backend(mut self, backend: impl Into<Backend>) -> Self {
        self.backend = Some(backend.into());
        self
    }
    /// The sandbox provider (required).
    pub fn sandbox_provider(mut self, p: Arc<dyn SandboxProvider>) -> Self {
        self.sandboxes = Some(p);
        self
    }
    /// The model client that streams completions (default: the scripted demo).
    pub fn model_client(mut self, m: Arc<dyn ModelClient>) -> Self {
        self.model = Some(m);
        self
    }
    /// The write buffer behind the flush scheduler (default: in memory).
    pub fn write_buffer(mut self, w: Arc<dyn WriteBuffer>) -> Self {
        self.write_buffer = Some(w);
        self
    }
    /// Web search (default: not configured; searches report an error to the model).
    pub fn web_search(mut self, w: Arc<dyn WebSearch>) -> Self {
        self.web_search = Some(w);
        self
    }
    /// Admission limits on active runs (default: 100 global, 2 per user, 1 per chat).
    pub fn admission_limits(mut self, l: AdmissionLimits) -> Self {
        self.limits = l;
        self
    }
    /// Default budgets (a request may override them; see [`Budgets`]).
    pub fn budgets(mut self, b: Budgets) -> Self {
        self.budgets = b;
        self
    }
    /// Engine tuning.
    pub fn config(mut self, c: EngineConfig) -> Self {
        self.config = c;
        self
    }
    /// Token prices (default: [`PriceTable::builtin`]).
    pub fn prices(mut self, p: PriceTable) -> Self {
        self.prices = Some(p);
        self
    }
    /// The model name used when a request names none (default `scripted`);
    /// it is also a known model.
    pub fn default_model(mut self, name: impl Into<String>) -> Self {
        self.default_model = Some(name.into());
        self
    }
    /// Add model names requests may ask for.
    pub fn known_models<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.known_models.extend(names.into_iter().map(Into::into));
        self
    }

    /// Route each run to a provider, model and credential through a
    /// registry (`edward_core::registry::ProviderRegistry`): requests name
    /// `provider:model`, checked at submit against the registry's
    /// allow-list; the choice is recorded with the run and reused on resume.
    /// The registry's prices are added to the price table. Replaces
    /// [`EngineBuilder::model_client`] and [`EngineBuilder::known_models`]
    /// for routing.
    pub fn registry(mut self, r: impl ModelResolver) -> Self {
        self.resolver = Some(Arc::new(r));
        self
    }

    /// Build the engine, validating every setting.
    pub fn build(self) -> Result<Engine, BuildError> {
        let sandboxes = self.sandboxes.ok_or(BuildError::MissingSandboxProvider)?;
        let backend = self.backend.unwrap_or_default();
        backend.durability()?;
        self.budgets
            .validate()
            .map_err(|e| BuildError::invalid(e.field, e.reason))?;
        validate_config(&self.config)?;
        for (field, v) in [
            ("limits.global", self.limits.global),
            ("limits.per_user", self.limits.per_user),
            ("limits.per_chat", self.limits.per_chat),
        ] {
            if v == 0 {
                return Err(BuildError::invalid(field, "must be at least 1"));
            }
        }
        let default_model = self.default_model.unwrap_or_else(|| "scripted".to_string());
        let mut known_models = self.known_models;
        known_models.insert(default_model.clone());
        let mut prices = self.prices.unwrap_or_else(PriceTable::builtin);
        for (name, price) in self.resolver.iter().flat_map(|r| r.prices()) {
            prices.set(&name, price);
        }
        let events_appended = Arc::new(std::sync::atomic::AtomicU64::new(0));
        Ok(Engine {
            inner: Arc::new(Inner {
                store: Arc::new(counting::CountingStore::new(
                    backend.store().clone(),
                    events_appended.clone(),
                )),
                events_appended,
                queue: backend.queue().clone(),
                notifier: backend.notifier().clone(),
                sandboxes,
                model: self
                    .model
                    .unwrap_or_else(|| Arc::new(ScriptedModel::demo())),
                write_buffer: self
                    .write_buffer
                    .unwrap_or_else(|| Arc::new(crate::memory::MemoryWriteBuffer::new())),
                web_search: self
                    .web_search
                    .unwrap_or_else(|| Arc::new(crate::memory::NoWebSearch)),
                limits: self.limits,
                budgets: self.budgets,
                config: Arc::new(self.config),
                prices,
                default_model,
                known_models,
                wake: tokio::sync::Notify::new(),
                resolver: self.resolver,
            }),
        })
    }
}

/// Range checks of [`EngineConfig`]: a zero channel would panic every turn,
/// zero durations would busy-loop.
fn validate_config(c: &EngineConfig) -> Result<(), BuildError> {
    let positive = |field: &str, d: Duration| {
        if d.is_zero() {
            Err(BuildError::invalid(field, "must be greater than zero"))
        } else {
            Ok(())
        }
    };
    if c.effect_channel == 0 {
        return Err(BuildError::invalid(
            "config.effect_channel",
            "must be at least 1",
        ));
    }
    if c.coalesce_bytes == 0 {
        return Err(BuildError::invalid(
            "config.coalesce_bytes",
            "must be at least 1",
        ));
    }
    if c.model_attempts == 0 {
        return Err(BuildError::invalid(
            "config.model_attempts",
            "must be at least 1",
        ));
    }
    if c.max_output_tokens_per_call == 0 {
        return Err(BuildError::invalid(
            "config.max_output_tokens_per_call",
            "must be at least 1",
        ));
    }
    positive("config.flush_poll", c.flush_poll)?;
    positive("config.tail_backstop", c.tail_backstop)?;
    positive("config.commands.timeout", c.commands.timeout)?;
    positive(
        "config.commands.install_timeout",
        c.commands.install_timeout,
    )?;
    if c.flush.max_wait < c.flush.debounce {
        return Err(BuildError::invalid(
            "config.flush.max_wait",
            "must not be shorter than config.flush.debounce",
        ));
    }
    Ok(())
}

impl Engine {
    /// A builder with in-memory defaults.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The store this engine writes to.
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.inner.store
    }

    /// Events this engine (any clone of it) has appended to its store since
    /// it was built: admissions, run events, attempt records, cancel requests
    /// and terminal events. A process-local counter for metrics (e.g. the
    /// HTTP server's `edward_events_appended_total`).
    pub fn events_appended(&self) -> u64 {
        self.inner
            .events_appended
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The default model name.
    pub fn default_model(&self) -> &str {
        &self.inner.default_model
    }

    /// The sandbox key of a run: its chat's
    /// ([`chat_sandbox_key`](crate::chat::chat_sandbox_key) of its user and
    /// chat), shared by every run of the chat.
    pub fn sandbox_key(run: &Run) -> SandboxKey {
        crate::chat::chat_sandbox_key(&run.user_id, &run.chat_id)
    }

    /// Validate every field of `req`.
    pub fn validate(&self, req: &RunRequest) -> Result<(), SubmitError> {
        let id = |(f, r): (&str, String)| SubmitError::invalid(f, r);
        config::check_id("user_id", &req.user_id).map_err(id)?;
        config::check_id("chat_id", &req.chat_id).map_err(id)?;
        if req.prompt.trim().is_empty() {
            return Err(SubmitError::invalid("prompt", "must not be empty"));
        }
        if req.prompt.len() > MAX_PROMPT_BYTES {
            return Err(SubmitError::invalid(
                "prompt",
                format!(
                    "{} bytes is more than the {MAX_PROMPT_BYTES}-byte limit",
                    req.prompt.len()
                ),
            ));
        }
        if let Some(resolver) = &self.inner.resolver {
            resolver
                .check_model(req.model.as_deref())
                .map_err(routing::route_to_submit)?;
        } else if let Some(m) = &req.model {
            if !self.inner.known_models.contains(m) {
                return Err(SubmitError::invalid(
                    "model",
                    format!(
                        "unknown model `{}` (known: {})",
                        m.chars().take(64).collect::<String>(),
                        self.inner
                            .known_models
                            .iter()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        let budgets = req.budgets.unwrap_or(self.inner.budgets);
        if let Some(b) = &req.budgets {
            b.validate()
                .map_err(|e| SubmitError::invalid(e.field, e.reason))?;
        }
        if budgets.max_cost_usd > 0.0 {
            let model = req.model.as_deref().unwrap_or(&self.inner.default_model);
            if model != "scripted" && self.inner.prices.get(model).is_none() {
                return Err(SubmitError::invalid(
                    "budgets.max_cost_usd",
                    format!(
                        "model `{}` has no price, so a cost budget cannot be enforced: add its \
                         price (`EngineBuilder::prices`) or set `max_cost_usd` to 0",
                        model.chars().take(64).collect::<String>()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Validate, admit atomically against the limits, and queue a run.
    pub async fn submit(&self, mut req: RunRequest) -> Result<RunId, SubmitError> {
        let route = self.route_request(&mut req).await?;
        self.validate(&req)?;
        let id = RunId::new();
        let model = req
            .model
            .clone()
            .unwrap_or_else(|| self.inner.default_model.clone());
        let first_event = EngineEvent::RunQueued {
            model,
            prompt_bytes: req.prompt.len(),
        }
        .into_new_event();
        let request = serde_json::to_value(&req)
            .map_err(|e| SubmitError::invalid("request", e.to_string()))?;
        let request = routing::record_route(request, route);
        let new_run = NewRun {
            id,
            user_id: req.user_id.clone(),
            chat_id: req.chat_id.clone(),
            request,
            first_event,
        };
        let policy = req
            .double_texting
            .unwrap_or(self.inner.config.chat.double_texting);
        let mut limits = self.inner.limits;
        if policy != DoubleTexting::Reject {
            // The chat's runs wait for each other instead (see `run_waiting`).
            limits.per_chat = u32::MAX;
        }
        match self.inner.store.admit(new_run, limits).await {
            Ok(_) => {}
            Err(AdmitError::Rejected(AdmissionError::ChatLimit { limit })) => {
                return Err(self.chat_busy(&req, limit).await);
            }
            Err(AdmitError::Rejected(e)) => return Err(SubmitError::Rejected(e)),
            Err(AdmitError::Store(e)) => return Err(SubmitError::Store(e)),
        }
        if policy == DoubleTexting::Interrupt {
            self.interrupt_chat(&req, id).await;
        }
        let _ = self.inner.notifier.notify_events(id, 1).await;
        if let Err(e) = self.inner.queue.enqueue(id).await {
            let _ = run::finish_run(
                &*self.inner.store,
                &*self.inner.notifier,
                id,
                None,
                RunStatus::Failed,
                &format!("error: could not queue: {e}"),
                run::Summary::default(),
            )
            .await;
            return Err(SubmitError::Queue(e));
        }
        self.inner.wake.notify_waiters();
        tracing::info!(run_id = %id, "run submitted");
        Ok(id)
    }

    /// The typed rejection of a submit to a busy chat, naming its active run.
    async fn chat_busy(&self, req: &RunRequest, limit: u32) -> SubmitError {
        for status in [RunStatus::Running, RunStatus::Queued] {
            if let Ok(runs) = self
                .inner
                .store
                .list_user_runs(
                    &req.user_id,
                    &RunFilter::new().chat(req.chat_id.clone()).status(status),
                    None,
                    1,
                )
                .await
            {
                if let Some(active) = runs.first() {
                    return SubmitError::ChatBusy {
                        chat_id: req.chat_id.clone(),
                        active_run: active.id,
                    };
                }
            }
        }
        // It ended in between: the limit is all there is to say.
        SubmitError::Rejected(AdmissionError::ChatLimit { limit })
    }

    /// Cancel the chat's runs older than `new_run` (policy `interrupt`).
    /// Every submit cancels only older runs, so of concurrent interrupting
    /// submits the newest run survives.
    async fn interrupt_chat(&self, req: &RunRequest, new_run: RunId) {
        for status in [RunStatus::Running, RunStatus::Queued] {
            let mut before = Some(new_run);
            loop {
                let page = match self
                    .inner
                    .store
                    .list_user_runs(
                        &req.user_id,
                        &RunFilter::new().chat(req.chat_id.clone()).status(status),
                        before,
                        100,
                    )
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e, "interrupt: could not list the chat's runs");
                        break;
                    }
                };
                for run in &page {
                    if let Err(e) = self.cancel(run.id).await {
                        tracing::warn!(run_id = %run.id, error = %e, "interrupt: cancel failed");
                    }
                }
                match page.last() {
                    Some(last) if page.len() == 100 => before = Some(last.id),
                    _ => break,
                }
            }
        }
    }

    /// The chat's messages (prompts, and each turn's reply with its side
    /// effects), oldest first: the newest `limit`.
    pub async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        limit: usize,
    ) -> Result<Vec<crate::chat::ChatMessage>, StoreError> {
        self.inner
            .store
            .chat_messages(user_id, chat_id, None, limit)
            .await
    }

    /// One page of the chat's runs, newest first (see
    /// [`RunStore::list_user_runs`]).
    pub async fn chat_runs(
        &self,
        user_id: &str,
        chat_id: &str,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        self.inner
            .store
            .list_user_runs(
                user_id,
                &RunFilter::new().chat(chat_id.to_string()),
                before,
                limit,
            )
            .await
    }

    /// The build jobs of a run, by number.
    pub async fn builds(&self, run_id: RunId) -> Result<Vec<crate::chat::BuildJob>, StoreError> {
        self.inner.store.builds(run_id).await
    }

    /// The run, if it exists.
    pub async fn get(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.inner.store.get_run(run_id).await
    }

    /// The run's events with seq > `after_seq`, decoded: replayed from the
    /// store, then live until (and including) the terminal event. No gaps, no
    /// duplicates. Live events wake the stream through the notifier; when the
    /// writer is another process whose notifier does not reach this one (the
    /// in-memory notifier on a shared SQLite file), they arrive on the
    /// store re-read every [`EngineConfig::tail_backstop`] (1 s by default).
    pub fn events(&self, run_id: RunId, after_seq: u64) -> EventStream {
        EventStream::new(self.raw_events(run_id, after_seq))
    }

    /// Like [`Engine::events`], but the stored events as they are (JSON
    /// payloads), including types this version does not know.
    pub fn raw_events(&self, run_id: RunId, after_seq: u64) -> RawEventStream {
        RawEventStream::new(tail::tail(
            self.inner.store.clone(),
            self.inner.notifier.clone(),
            run_id,
            after_seq,
            self.inner.config.tail_backstop,
        ))
    }

    /// Cancel a run. The request is recorded durably first (event
    /// `cancel_requested`, once however often this is called). A queued run
    /// is then finished `cancelled` at once; a running one is signalled
    /// through the notifier, and every worker also sees the recorded request
    /// within its status-check period (and on claiming the run), so a lost
    /// signal only delays the cancel, never loses it.
    pub async fn cancel(&self, run_id: RunId) -> Result<CancelOutcome, StoreError> {
        let run = self
            .inner
            .store
            .get_run(run_id)
            .await?
            .ok_or(StoreError::NotFound { run_id })?;
        if run.status.is_terminal() {
            return Ok(CancelOutcome::AlreadyFinished);
        }
        let run = self
            .inner
            .store
            .request_cancel(run_id, EngineEvent::CancelRequested {}.into_new_event())
            .await?;
        let _ = self
            .inner
            .notifier
            .notify_events(run_id, run.last_seq)
            .await;
        match run.status {
            s if s.is_terminal() => Ok(CancelOutcome::AlreadyFinished),
            RunStatus::Queued => {
                match run::finish_run(
                    &*self.inner.store,
                    &*self.inner.notifier,
                    run_id,
                    None,
                    RunStatus::Cancelled,
                    "cancelled",
                    run::Summary::default(),
                )
                .await
                {
                    Ok(_) => {
                        // If a worker claimed it meanwhile, tell it too.
                        let _ = self.inner.notifier.notify_cancel(run_id).await;
                        Ok(CancelOutcome::Cancelled)
                    }
                    Err(StoreError::Finished { .. }) => Ok(CancelOutcome::AlreadyFinished),
                    Err(e) => Err(e),
                }
            }
            _ => {
                if let Err(e) = self.inner.notifier.notify_cancel(run_id).await {
                    tracing::warn!(%run_id, error = %e, "cancel notification failed; the status check will see the request");
                }
                Ok(CancelOutcome::Requested)
            }
        }
    }

    /// The files of a run's sandbox, sorted by path. Never creates a sandbox:
    /// `NoSandbox` when the run has none (yet, or any more).
    pub async fn files(&self, run_id: RunId) -> Result<Vec<FileEntry>, FilesError> {
        let sandbox = self.attach(run_id).await?;
        sandbox.list_files().await.map_err(FilesError::Sandbox)
    }

    /// One file of a run's sandbox. `path` is validated like a model path.
    pub async fn read_file(&self, run_id: RunId, path: &str) -> Result<Bytes, FilesError> {
        let path = SandboxPath::new(path).map_err(FilesError::Sandbox)?;
        let sandbox = self.attach(run_id).await?;
        sandbox.read_file(&path).await.map_err(FilesError::Sandbox)
    }

    /// Destroy a run's sandbox and everything in it (idempotent). The run's
    /// record and events stay.
    pub async fn destroy_sandbox(&self, run_id: RunId) -> Result<(), FilesError> {
        let run = self.run_exists(run_id).await?;
        self.inner
            .sandboxes
            .destroy(&Self::sandbox_key(&run))
            .await
            .map_err(FilesError::Sandbox)
    }

    async fn run_exists(&self, run_id: RunId) -> Result<Run, FilesError> {
        self.inner
            .store
            .get_run(run_id)
            .await
            .map_err(FilesError::Store)?
            .ok_or(FilesError::RunNotFound { run_id })
    }

    async fn attach(&self, run_id: RunId) -> Result<Arc<dyn crate::Sandbox>, FilesError> {
        let run = self.run_exists(run_id).await?;
        self.inner
            .sandboxes
            .attach(&Self::sandbox_key(&run))
            .await
            .map_err(FilesError::Sandbox)?
            .ok_or(FilesError::NoSandbox { run_id })
    }

    /// Run a worker until `cfg.shutdown` fires. Fails at once, doing
    /// nothing, when `cfg` is out of range.
    pub async fn worker(&self, cfg: WorkerConfig) -> Result<(), BuildError> {
        cfg.validate()?;
        worker::run_worker(self.inner.clone(), cfg).await;
        Ok(())
    }
}

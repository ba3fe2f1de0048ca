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
//! use futures::StreamExt;
//!
//! let engine = Engine::builder().sandbox_provider(provider).build()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let worker = tokio::spawn({
//!     let engine = engine.clone();
//!     let cfg = WorkerConfig::new(shutdown.clone());
//!     async move { engine.worker(cfg).await }
//! });
//! let id = engine.submit(RunRequest::new("user", "chat", "build a todo app")).await?;
//! let mut events = Box::pin(engine.events(id, 0));
//! while let Some(e) = events.next().await {
//!     println!("{}", serde_json::to_string(&e?)?);
//! }
//! shutdown.cancel();
//! worker.await?;
//! # Ok(()) }
//! ```
//!
//! **Architecture invariant:** every terminal path of a run goes through one
//! function that calls `RunStore::finish_run`, so a run has exactly one
//! terminal event and it is its last.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::Stream;

mod budget;
mod config;
mod effects;
mod events;
mod outcome;
mod prompt;
mod run;
mod sink;
mod tail;
mod worker;

pub use budget::{BudgetKind, BudgetState, Budgets};
pub use config::{
    CommandPolicy, EngineConfig, Limits, MAX_ID_BYTES, MAX_PROMPT_BYTES, PackageManager, RunRequest,
};
pub use config::{PreparedCommand, ScriptPolicy, git_config_hazard};
pub use events::{EngineEvent, ToolRun};
pub use outcome::{StopReason, TurnFacts, TurnOutcome, decide_turn_outcome};
pub use prompt::{NUDGE_MESSAGE, SYSTEM_PROMPT, ToolResult, bounded, continuation_message};
pub use worker::WorkerConfig;

use crate::memory::MemoryBackends;
use crate::pricing::PriceTable;
use crate::scripted::ScriptedModel;
use crate::{
    AdmissionError, AdmitError, ModelClient, NewRun, Notifier, QueueError, Run, RunEvent, RunId,
    RunQueue, RunStatus, RunStore, SandboxProvider, StoreError, WebSearch, WriteBuffer,
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
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run was admitted but could not be queued; it was finished `failed`.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl SubmitError {
    fn invalid(field: &str, reason: impl Into<String>) -> Self {
        SubmitError::Invalid {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

/// Why the builder could not build.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No sandbox provider was given (there is no in-memory default).
    #[error("a sandbox provider is required")]
    MissingSandboxProvider,
    /// The default budgets are out of range.
    #[error("invalid `{field}`: {reason}")]
    InvalidBudgets {
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
}

/// What [`Engine::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelOutcome {
    /// The run was queued and is now finished `cancelled`.
    Cancelled,
    /// The run is running; its worker was signalled.
    Requested,
    /// The run had already finished.
    AlreadyFinished,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) queue: Arc<dyn RunQueue>,
    pub(crate) sandboxes: Arc<dyn SandboxProvider>,
    pub(crate) model: Arc<dyn ModelClient>,
    pub(crate) write_buffer: Arc<dyn WriteBuffer>,
    pub(crate) notifier: Arc<dyn Notifier>,
    pub(crate) web_search: Arc<dyn WebSearch>,
    pub(crate) limits: Limits,
    pub(crate) budgets: Budgets,
    pub(crate) config: Arc<EngineConfig>,
    pub(crate) prices: PriceTable,
    pub(crate) default_model: String,
    pub(crate) known_models: BTreeSet<String>,
    pub(crate) wake: tokio::sync::Notify,
}

/// The run engine. Cheap to clone; all clones share state.
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

/// Builds an [`Engine`].
#[derive(Default)]
pub struct EngineBuilder {
    store: Option<Arc<dyn RunStore>>,
    queue: Option<Arc<dyn RunQueue>>,
    sandboxes: Option<Arc<dyn SandboxProvider>>,
    model: Option<Arc<dyn ModelClient>>,
    write_buffer: Option<Arc<dyn WriteBuffer>>,
    notifier: Option<Arc<dyn Notifier>>,
    web_search: Option<Arc<dyn WebSearch>>,
    limits: Limits,
    budgets: Budgets,
    config: EngineConfig,
    prices: Option<PriceTable>,
    default_model: Option<String>,
    known_models: BTreeSet<String>,
}

impl EngineBuilder {
    /// The run store (default: in memory).
    pub fn store(mut self, s: Arc<dyn RunStore>) -> Self {
        self.store = Some(s);
        self
    }
    /// The run queue (default: in memory).
    pub fn queue(mut self, q: Arc<dyn RunQueue>) -> Self {
        self.queue = Some(q);
        self
    }
    /// The sandbox provider (required).
    pub fn sandbox_provider(mut self, p: Arc<dyn SandboxProvider>) -> Self {
        self.sandboxes = Some(p);
        self
    }
    /// The model client (default: the scripted demo).
    pub fn model(mut self, m: Arc<dyn ModelClient>) -> Self {
        self.model = Some(m);
        self
    }
    /// The write buffer (default: in memory).
    pub fn write_buffer(mut self, w: Arc<dyn WriteBuffer>) -> Self {
        self.write_buffer = Some(w);
        self
    }
    /// The notifier (default: in memory).
    pub fn notifier(mut self, n: Arc<dyn Notifier>) -> Self {
        self.notifier = Some(n);
        self
    }
    /// Web search (default: not configured; searches report an error to the model).
    pub fn web_search(mut self, w: Arc<dyn WebSearch>) -> Self {
        self.web_search = Some(w);
        self
    }
    /// Admission limits.
    pub fn limits(mut self, l: Limits) -> Self {
        self.limits = l;
        self
    }
    /// Default budgets (a request may override them).
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
    /// The model used when a request names none (default `scripted`); it is
    /// also a known model.
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

    /// Build the engine.
    pub fn build(self) -> Result<Engine, BuildError> {
        let sandboxes = self.sandboxes.ok_or(BuildError::MissingSandboxProvider)?;
        self.budgets
            .validate()
            .map_err(|(field, reason)| BuildError::InvalidBudgets {
                field: field.to_string(),
                reason,
            })?;
        let mem = MemoryBackends::new();
        let default_model = self.default_model.unwrap_or_else(|| "scripted".to_string());
        let mut known_models = self.known_models;
        known_models.insert(default_model.clone());
        Ok(Engine {
            inner: Arc::new(Inner {
                store: self.store.unwrap_or(mem.store),
                queue: self.queue.unwrap_or(mem.queue),
                sandboxes,
                model: self
                    .model
                    .unwrap_or_else(|| Arc::new(ScriptedModel::demo())),
                write_buffer: self.write_buffer.unwrap_or(mem.write_buffer),
                notifier: self.notifier.unwrap_or(mem.notifier),
                web_search: self.web_search.unwrap_or(mem.web_search),
                limits: self.limits,
                budgets: self.budgets,
                config: Arc::new(self.config),
                prices: self.prices.unwrap_or_else(PriceTable::builtin),
                default_model,
                known_models,
                wake: tokio::sync::Notify::new(),
            }),
        })
    }
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

    /// The default model name.
    pub fn default_model(&self) -> &str {
        &self.inner.default_model
    }

    /// The sandbox key of a run (`run-{id}`).
    pub fn sandbox_key(run_id: RunId) -> crate::SandboxKey {
        crate::SandboxKey(format!("run-{run_id}"))
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
        if let Some(m) = &req.model {
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
        if let Some(b) = &req.budgets {
            b.validate().map_err(id)?;
        }
        Ok(())
    }

    /// Validate, admit atomically against the limits, and queue a run.
    pub async fn submit(&self, req: RunRequest) -> Result<RunId, SubmitError> {
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
        let new_run = NewRun {
            id,
            user_id: req.user_id.clone(),
            chat_id: req.chat_id.clone(),
            request,
            first_event,
        };
        match self
            .inner
            .store
            .admit(new_run, self.inner.limits.into())
            .await
        {
            Ok(_) => {}
            Err(AdmitError::Rejected(e)) => return Err(SubmitError::Rejected(e)),
            Err(AdmitError::Store(e)) => return Err(SubmitError::Store(e)),
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

    /// The run, if it exists.
    pub async fn get(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.inner.store.get_run(run_id).await
    }

    /// The run's events with seq > `after_seq`: replayed from the store,
    /// then live until (and including) the terminal event. No gaps, no duplicates.
    pub fn events(
        &self,
        run_id: RunId,
        after_seq: u64,
    ) -> impl Stream<Item = Result<RunEvent, StoreError>> + Send + 'static {
        tail::tail(
            self.inner.store.clone(),
            self.inner.notifier.clone(),
            run_id,
            after_seq,
            self.inner.config.tail_backstop,
        )
    }

    /// Cancel a run. A queued run is finished `cancelled` at once; a running
    /// one is signalled through the notifier (its worker ends it with
    /// `run_finished{status: cancelled}`), and if it has not finished after
    /// `EngineConfig::cancel_grace` it is finished `cancelled` out of band.
    pub async fn cancel(&self, run_id: RunId) -> Result<CancelOutcome, StoreError> {
        let run = self
            .inner
            .store
            .get_run(run_id)
            .await?
            .ok_or(StoreError::NotFound { run_id })?;
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
                    tracing::warn!(%run_id, error = %e, "cancel notification failed");
                }
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(inner.config.cancel_grace).await;
                    if let Ok(Some(r)) = inner.store.get_run(run_id).await {
                        if !r.status.is_terminal() {
                            tracing::warn!(%run_id, "worker did not end the cancelled run; forcing");
                            let _ = run::finish_run(
                                &*inner.store,
                                &*inner.notifier,
                                run_id,
                                None,
                                RunStatus::Cancelled,
                                "cancelled",
                                run::Summary::default(),
                            )
                            .await;
                        }
                    }
                });
                Ok(CancelOutcome::Requested)
            }
        }
    }

    /// Run a worker until `cfg.shutdown` fires.
    pub async fn worker(&self, cfg: WorkerConfig) {
        worker::run_worker(self.inner.clone(), cfg).await
    }
}

//! One run on one worker: start or resume, the turn loop, and the single
//! terminal function.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod chat;

pub(crate) use chat::DEFER_POLICY;
use chat::wait_for_chat;

use super::Inner;
use super::budget::{BudgetKind, BudgetState, Budgets};
use super::config::RunRequest;
use super::effects::{
    EffectCtx, EffectError, EffectItem, EffectReport, FlushRegistry, FlushTarget, SandboxSlot,
};
use super::events::{DeltaRef, EngineEvent};
use super::gate::Gates;
use super::outcome::{TurnFacts, TurnOutcome, decide_turn_outcome};
use super::prompt::{BoundedText, NUDGE_MESSAGE, SYSTEM_PROMPT, continuation_message};
use super::sink::{LogError, LogTuning, RunLog};
use crate::parser::{EventRef, Parser};
use crate::{
    AttemptFailure, Checkpoint, Fence, Lease, Message, ModelCall, ModelChunk, ModelError,
    ModelObserver, ModelRequest, NewEvent, Notifier, Role, RunId, RunStatus, RunStore, StoreError,
    Usage,
};

/// Why a run's token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// Someone cancelled the run.
    Cancelled,
    /// The wall-clock budget ran out.
    Deadline,
    /// The lease or fence is lost, or the run was finished elsewhere: write nothing.
    Lost,
    /// The worker is shutting down: abandon without writing (another worker resumes).
    Shutdown,
    /// The run reached a terminal status elsewhere (forced cancel, reaper):
    /// write nothing, but the job is done (ack).
    FinishedElsewhere,
}

/// The per-run token plus the first reason it fired.
pub(crate) struct RunControl {
    pub(crate) token: CancellationToken,
    cause: OnceLock<StopCause>,
    /// The run task's gated futures (see [`Gates`]).
    pub(crate) gates: Gates,
}

impl RunControl {
    pub(crate) fn new() -> Self {
        RunControl {
            token: CancellationToken::new(),
            cause: OnceLock::new(),
            gates: Gates::default(),
        }
    }

    pub(crate) fn stop(&self, cause: StopCause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }

    pub(crate) fn cause(&self) -> Option<StopCause> {
        self.cause.get().copied()
    }
}

/// Turn-scoped state saved in every checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunState {
    messages: Vec<Message>,
    budget: BudgetState,
    previous_was_nudge: bool,
    started_at: DateTime<Utc>,
    /// The last seq written when this checkpoint was taken.
    last_seq: u64,
    /// Attempts that ended early, by cause.
    #[serde(default)]
    attempts: AttemptCounts,
    /// The system prompt with this chat's project section (assembled once,
    /// at the first start); `None` for checkpoints from before chats.
    #[serde(default)]
    system: Option<String>,
    /// Whether any turn of the run wrote a file (a build follows only then).
    #[serde(default)]
    files_changed: bool,
    /// Build jobs run so far.
    #[serde(default)]
    builds: u32,
    /// The autofix turn, once one was granted after a failed build.
    #[serde(default)]
    autofix_turn: Option<u32>,
}

/// How a run attempt ended on this worker.
#[derive(Debug)]
pub(crate) enum AttemptEnd {
    /// The terminal event is written (or the run was already finished): ack.
    Finished,
    /// Lost the run or shutting down: do not ack; the lease lapses.
    Abandoned,
    /// A transient infrastructure failure: retry via the queue.
    Retry(String),
    /// A permanent failure (a non-retryable store error): finish the run
    /// `failed` rather than retrying what cannot succeed.
    Fail(String),
    /// Not yet: an earlier run of the chat is active. Reschedule the job
    /// without counting a failure.
    Defer(String),
}

/// Attempts of a run that ended early, by cause (saved in the checkpoint).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
struct AttemptCounts {
    /// Attempts that failed on transient infrastructure and were retried.
    infra: u32,
    /// Claims before the first start that were deferred because an earlier
    /// run of the chat was active (they are not abnormal).
    deferred: u32,
}

/// Terminal summary fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    pub turns: u32,
    pub usage: Usage,
    pub cost_usd: f64,
    pub tool_calls: u32,
    pub duration_ms: u64,
}

/// THE terminal path: every way a run ends (done, budget, failure, cancel of
/// a running or a queued run) goes through here. Appends `run_finished` as
/// the last event together with the terminal status, then sends a hint.
pub(crate) async fn finish_run(
    store: &dyn RunStore,
    notifier: &dyn Notifier,
    run_id: RunId,
    fence: Option<Fence>,
    status: RunStatus,
    reason: &str,
    summary: Summary,
) -> Result<u64, StoreError> {
    let event: NewEvent = EngineEvent::RunFinished {
        status,
        reason: reason.to_string(),
        turns: summary.turns,
        usage: summary.usage,
        cost_usd: summary.cost_usd,
        tool_calls: summary.tool_calls,
        duration_ms: summary.duration_ms,
    }
    .into();
    let written = store
        .finish_run(run_id, fence, status, reason, vec![event])
        .await?;
    let last = written.last().map(|e| e.seq).unwrap_or(0);
    let _ = notifier.notify_events(run_id, last).await;
    tracing::info!(%run_id, %status, reason, "run finished");
    Ok(last)
}

/// Errors inside a turn.
enum TurnError {
    Stopped,
    Model(ModelError),
    Effect(EffectError),
    Log(LogError),
}

impl From<EffectError> for TurnError {
    fn from(e: EffectError) -> Self {
        match e {
            EffectError::Stopped => TurnError::Stopped,
            e => TurnError::Effect(e),
        }
    }
}

impl From<LogError> for TurnError {
    fn from(e: LogError) -> Self {
        TurnError::Log(e)
    }
}

struct TurnReport {
    /// What the conversation keeps of the turn's output (bounded).
    output_view: String,
    /// Bytes of output, parsed text plus provider reasoning.
    output_bytes: u64,
    usage: Option<Usage>,
    done: bool,
    effects: EffectReport,
    /// The budget whose cap cut the stream mid-turn (output tokens or cost).
    budget_cut: Option<BudgetKind>,
    /// The turn produced more than `max_turn_output_bytes`: it was cut.
    output_cap_hit: bool,
}

/// What the stream side of a turn reports.
struct Streamed {
    output: BoundedText,
    thinking_bytes: usize,
    usage: Option<Usage>,
    done: bool,
    budget_hit: bool,
    cap_hit: bool,
}

/// Execute (or resume) a claimed run until it ends on this worker.
pub(crate) async fn execute(
    inner: Arc<Inner>,
    lease: Lease,
    worker_id: String,
    control: Arc<RunControl>,
    registry: FlushRegistry,
    max_infra: u32,
) -> AttemptEnd {
    let run_id = lease.run_id;
    let span = tracing::info_span!("run", run_id = %run_id, attempt = lease.attempt);
    async move {
        let started_before = match wait_for_chat(&inner, &lease, &control).await {
            Ok(s) => s,
            Err(end) => return end,
        };
        let run = match inner.store.start_run(run_id, lease.fence).await {
            Ok(r) => r,
            Err(StoreError::Finished { .. }) => return AttemptEnd::Finished,
            Err(StoreError::NotFound { .. }) => return AttemptEnd::Finished,
            Err(StoreError::StaleFence { .. }) => return AttemptEnd::Abandoned,
            Err(e) if e.is_retryable() => return AttemptEnd::Retry(e.to_string()),
            Err(e) => {
                // The run cannot even start (e.g. corrupt): end it failed out of band.
                let _ = finish_run(
                    &*inner.store,
                    &*inner.notifier,
                    run_id,
                    None,
                    RunStatus::Failed,
                    &format!("error: {e}"),
                    Summary::default(),
                )
                .await;
                return AttemptEnd::Finished;
            }
        };
        let lost = CancellationToken::new();
        let (log, writer) = RunLog::new(
            inner.store.clone(),
            inner.notifier.clone(),
            run_id,
            lease.fence,
            LogTuning {
                window: inner.config.coalesce_window,
                max_bytes: inner.config.coalesce_bytes,
            },
            run.last_seq,
            lost.clone(),
        );
        let ctx = RunCtx {
            inner: inner.clone(),
            run_id,
            fence: lease.fence,
            control: control.clone(),
            log: log.clone(),
            registry,
            lost: lost.clone(),
            turns_started: std::sync::atomic::AtomicU32::new(0),
            max_infra,
            interrupted: std::sync::Mutex::new(Interrupted::default()),
            client: std::sync::OnceLock::new(),
            worker: worker_id.clone(),
            started_before,
        };
        let driven = async {
            let end = match ctx.drive(run, &lease, &worker_id).await {
                AttemptEnd::Fail(msg) => {
                    // Through the single terminal path; if even that fails,
                    // the queue's retry (and its dead-letter) takes over.
                    match ctx
                        .finish(
                            RunStatus::Failed,
                            &format!("error: {msg}"),
                            &BudgetState::default(),
                            Utc::now(),
                        )
                        .await
                    {
                        AttemptEnd::Fail(m) => AttemptEnd::Retry(m),
                        end => end,
                    }
                }
                end => end,
            };
            log.close().await;
            end
        };
        // The writer is part of this future: dropping the run drops it too,
        // so an aborted worker writes nothing more. Gated: it is polled when
        // it has work, not on every chunk the run streams.
        let (end, ()) = tokio::join!(driven, control.gates.gate(writer));
        end
    }
    .instrument(span)
    .await
}

struct RunCtx {
    inner: Arc<Inner>,
    run_id: RunId,
    fence: Fence,
    control: Arc<RunControl>,
    log: RunLog,
    registry: FlushRegistry,
    lost: CancellationToken,
    /// The newest turn whose `turn_started` this attempt emitted: a turn cut
    /// short (cancel, budget, error) still counts in `run_finished.turns`.
    turns_started: std::sync::atomic::AtomicU32,
    /// Attempts that may fail on infrastructure before the run fails.
    max_infra: u32,
    /// What a model call that did not end normally left behind.
    interrupted: std::sync::Mutex<Interrupted>,
    /// This run's client when a registry routes runs (set once in `drive`).
    client: std::sync::OnceLock<Arc<dyn crate::ModelClient>>,
    /// The worker running this attempt.
    worker: String,
    /// Whether a worker started the run before this attempt (`None`:
    /// unknown; then events after `run_queued` say so).
    started_before: Option<bool>,
}

/// What a model call that did not end normally left behind: the usage of a
/// stream that had reached the model, and how the attempts went.
#[derive(Debug, Default)]
struct Interrupted {
    usage: Option<Usage>,
    attempts: u32,
    provider_message: Option<String>,
}

/// Forwards a client's failed attempts to the engine (see [`ModelObserver`]).
struct AttemptTap(mpsc::UnboundedSender<AttemptFailure>);

impl ModelObserver for AttemptTap {
    fn attempt_failed(&self, failure: &AttemptFailure) {
        let _ = self.0.send(failure.clone());
    }
}

impl RunCtx {
    fn model_client(&self) -> &Arc<dyn crate::ModelClient> {
        self.client.get().unwrap_or(&self.inner.model)
    }

    async fn drive(&self, run: crate::Run, lease: &Lease, worker_id: &str) -> AttemptEnd {
        let request: RunRequest = match serde_json::from_value(run.request.clone()) {
            Ok(r) => r,
            Err(e) => {
                return self
                    .finish(
                        RunStatus::Failed,
                        &format!("error: stored request is unreadable: {e}"),
                        &BudgetState::default(),
                        Utc::now(),
                    )
                    .await;
            }
        };
        let model = request
            .model
            .clone()
            .unwrap_or_else(|| self.inner.default_model.clone());
        // The engine's budgets are ceilings: a request may only lower them.
        let budgets = request
            .budgets
            .map_or(self.inner.budgets, |b| b.capped_by(&self.inner.budgets));
        if run.cancel_requested_at.is_some() {
            // Cancelled before this worker claimed it (or while it was
            // between workers): the first stop check ends it `cancelled`.
            self.control.stop(StopCause::Cancelled);
        }
        match super::routing::client_for_run(&self.inner, &run, &request).await {
            Ok(client) => {
                if let Some(client) = client {
                    let _ = self.client.set(client);
                }
            }
            // A cancelled run ends `cancelled`, whatever its route says.
            Err(_) if self.control.cause() == Some(StopCause::Cancelled) => {
                return self
                    .finish(
                        RunStatus::Cancelled,
                        "cancelled",
                        &BudgetState::default(),
                        Utc::now(),
                    )
                    .await;
            }
            Err(f) if f.retryable => return AttemptEnd::Retry(f.reason),
            Err(f) => {
                return self
                    .finish(
                        RunStatus::Failed,
                        &f.reason,
                        &BudgetState::default(),
                        Utc::now(),
                    )
                    .await;
            }
        }

        // Start fresh or resume from the checkpoint.
        let checkpoint = match self.inner.store.load_checkpoint(self.run_id).await {
            Ok(c) => c,
            Err(e) => return self.store_error(e),
        };
        // A checkpoint that cannot be read fails the run: starting over at
        // turn 1 would silently reset its budgets.
        let restored: Option<(u32, RunState)> = match checkpoint {
            None => None,
            Some(c) => match serde_json::from_value::<RunState>(c.state) {
                Ok(st) => Some((c.turn, st)),
                Err(e) => {
                    return self
                        .finish(
                            RunStatus::Failed,
                            &format!(
                                "error: the checkpoint after turn {} is unreadable ({e}); \
                                 not restarting with fresh budgets",
                                c.turn
                            ),
                            &BudgetState::default(),
                            Utc::now(),
                        )
                        .await;
                }
            },
        };
        // Discard file writes a previous attempt left pending: the turn is replayed.
        let key = crate::chat::chat_sandbox_key(&run.user_id, &run.chat_id);
        let _ = self.inner.write_buffer.take(&key).await;

        // `run_waiting` and `cancel_requested` may precede the first start.
        let previous_attempt = self.started_before.unwrap_or(run.last_seq > 1);
        let resumed_from_checkpoint = restored.is_some();
        let mut state = match restored {
            Some((turn, st)) => {
                self.log
                    .emit(EngineEvent::RunResumed {
                        worker: worker_id.to_string(),
                        attempt: lease.attempt,
                        fence: self.fence.0,
                        from_turn: turn,
                    })
                    .await;
                if run.last_seq > st.last_seq {
                    self.log
                        .emit(EngineEvent::TurnRestarted {
                            turn: turn + 1,
                            superseded_after_seq: st.last_seq,
                        })
                        .await;
                }
                st
            }
            None => {
                if previous_attempt {
                    self.log
                        .emit(EngineEvent::RunResumed {
                            worker: worker_id.to_string(),
                            attempt: lease.attempt,
                            fence: self.fence.0,
                            from_turn: 0,
                        })
                        .await;
                    self.log
                        .emit(EngineEvent::TurnRestarted {
                            turn: 1,
                            superseded_after_seq: 1,
                        })
                        .await;
                } else {
                    self.log
                        .emit(EngineEvent::RunStarted {
                            worker: worker_id.to_string(),
                            attempt: lease.attempt,
                            fence: self.fence.0,
                            model: model.clone(),
                            provider: self.model_client().provider().to_string(),
                        })
                        .await;
                }
                RunState {
                    messages: vec![Message {
                        role: Role::User,
                        content: request.prompt.clone(),
                    }],
                    budget: BudgetState::default(),
                    previous_was_nudge: false,
                    started_at: Utc::now(),
                    last_seq: 0,
                    attempts: AttemptCounts::default(),
                    system: None,
                    files_changed: false,
                    builds: 0,
                    autofix_turn: None,
                }
            }
        };

        if resumed_from_checkpoint {
            // Messages of turns this attempt replays are superseded.
            if let Err(e) = self
                .inner
                .store
                .put_messages(self.run_id, self.fence, state.budget.turns + 1, Vec::new())
                .await
            {
                return self.store_error(e);
            }
        } else {
            if !previous_attempt {
                // Earlier claims were deferred behind the chat's other runs.
                state.attempts.deferred = lease.attempt.saturating_sub(1);
            }
            if let Err(end) = self
                .prepare_context(&run, &request, &model, &budgets, &key, &mut state)
                .await
            {
                return end;
            }
        }
        if !resumed_from_checkpoint {
            // Checkpoint 0: fixes the start time (the deadline spans resumes)
            // and the seq before turn 1 (for `turn_restarted`).
            match self.log.flush().await {
                Ok(seq) => state.last_seq = seq,
                Err(LogError::Lost(_)) => return AttemptEnd::Abandoned,
                Err(LogError::Failed(m)) => return AttemptEnd::Retry(m),
            }
            let cp = Checkpoint {
                turn: 0,
                state: serde_json::to_value(&state).unwrap_or_default(),
            };
            if let Err(e) = self
                .inner
                .store
                .save_checkpoint(self.run_id, self.fence, cp)
                .await
            {
                return self.store_error(e);
            }
        }

        // The deadline is measured from the first start, across resumes.
        let elapsed = (Utc::now() - state.started_at).to_std().unwrap_or_default();
        let remaining = budgets.deadline().saturating_sub(elapsed);
        let watch = {
            let control = self.control.clone();
            let lost = self.lost.clone();
            async move {
                tokio::select! {
                    _ = tokio::time::sleep(remaining) => control.stop(StopCause::Deadline),
                    _ = lost.cancelled() => control.stop(StopCause::Lost),
                }
                std::future::pending::<()>().await
            }
        };
        let slot = Arc::new(SandboxSlot::new(
            self.inner.sandboxes.clone(),
            key,
            self.log.clone(),
        ));
        let target = Arc::new(FlushTarget::new(
            (self.run_id, self.fence),
            slot.clone(),
            self.inner.store.clone(),
            self.inner.write_buffer.clone(),
            self.log.clone(),
            self.control.token.clone(),
            self.inner.config.flush,
        ));
        let _registered = self.registry.register(target.clone());

        // A run whose attempts keep dying (worker crash, model panic) is
        // not re-claimed forever.
        let abnormal = self.abnormal_attempts(lease, &state);
        if abnormal >= self.inner.config.max_abnormal_attempts {
            return AttemptEnd::Fail(format!(
                "{abnormal} earlier attempts ended abnormally (worker crash, panic or lost \
                 lease); giving up"
            ));
        }
        let end = tokio::select! {
            end = self.turns(&model, &budgets, &mut state, &target) => end,
            // Gated: a timer and a token, polled when one of them fires.
            () = self.control.gates.gate(watch) => AttemptEnd::Abandoned,
        };
        let end = match end {
            AttemptEnd::Retry(msg) => self.count_retry(&mut state, msg).await,
            end => end,
        };
        // Every terminal path (and a retry, which replays the turn) leaves
        // nothing pending in the write buffer. An abandoned run's key now
        // belongs to whoever resumes it, which discards it at start.
        if !matches!(end, AttemptEnd::Abandoned) {
            target.discard_pending().await;
        }
        end
    }

    fn store_error(&self, e: StoreError) -> AttemptEnd {
        match e {
            StoreError::StaleFence { .. } => AttemptEnd::Abandoned,
            // Finished elsewhere (cancel of a just-claimed run, reaper): the job is done.
            StoreError::Finished { .. } => AttemptEnd::Finished,
            e if e.is_retryable() => AttemptEnd::Retry(e.to_string()),
            e => AttemptEnd::Fail(format!("store: {e}")),
        }
    }

    /// After a retryable failure: count it (in the checkpoint) and give up
    /// once `max_infra` attempts failed that way.
    async fn count_retry(&self, state: &mut RunState, msg: String) -> AttemptEnd {
        state.attempts.infra += 1;
        let cp = Checkpoint {
            turn: state.budget.turns,
            state: serde_json::to_value(&*state).unwrap_or_default(),
        };
        // Best effort: the store may be what is failing.
        if let Err(e) = self
            .inner
            .store
            .save_checkpoint(self.run_id, self.fence, cp)
            .await
        {
            tracing::warn!(error = %e, "could not record the failed attempt");
        }
        if state.attempts.infra >= self.max_infra {
            return AttemptEnd::Fail(format!(
                "gave up after {} attempts failed on infrastructure; last: {msg}",
                state.attempts.infra
            ));
        }
        AttemptEnd::Retry(msg)
    }

    /// The run's earlier attempts that ended abnormally (a crash, a panic,
    /// a lost lease): claims that neither finished nor recorded a retry.
    fn abnormal_attempts(&self, lease: &Lease, state: &RunState) -> u32 {
        lease
            .attempt
            .saturating_sub(1)
            .saturating_sub(state.attempts.infra)
            .saturating_sub(state.attempts.deferred)
    }

    async fn turns(
        &self,
        model: &str,
        budgets: &Budgets,
        state: &mut RunState,
        target: &Arc<FlushTarget>,
    ) -> AttemptEnd {
        let price = &self.inner.prices;
        loop {
            if let Some(end) = self.check_stopped(state).await {
                return end;
            }
            let turn = state.budget.turns + 1;
            state.budget.elapsed_ms = elapsed_ms(state.started_at);
            if let Some(kind) = state.budget.exhausted(budgets) {
                return self.finish_budget(kind, state).await;
            }
            if turn > budgets.max_turns {
                return self.finish_budget(BudgetKind::Turns, state).await;
            }
            let mut request = ModelRequest {
                model: model.to_string(),
                system: state
                    .system
                    .clone()
                    .unwrap_or_else(|| SYSTEM_PROMPT.to_string()),
                messages: state.messages.clone(),
                max_output_tokens: None,
                temperature: None,
            };
            // Estimated once per turn (a tokenizer pass over the history).
            let est_input = self.model_client().estimate_input_tokens(&request);
            let (remaining_out, out_binding) = output_allowance(
                budgets,
                &state.budget,
                self.inner.prices.get(model),
                est_input,
            );
            if remaining_out == 0 {
                return self.finish_budget(out_binding, state).await;
            }
            request.max_output_tokens = Some(
                remaining_out.min(u64::from(self.inner.config.max_output_tokens_per_call)) as u32,
            );
            // Pre-call checks: the estimated input must fit the model's
            // context window and the remaining budgets.
            if let Some(window) = self.model_client().context_window(model) {
                if est_input >= window {
                    return self
                        .finish(
                            RunStatus::Failed,
                            &format!(
                                "error: context too long: the next request needs about \
                                 {est_input} input tokens, the model's context window is {window}"
                            ),
                            &state.budget,
                            state.started_at,
                        )
                        .await;
                }
            }
            if state.budget.input_tokens + est_input > budgets.max_input_tokens {
                return self.finish_budget(BudgetKind::InputTokens, state).await;
            }
            let est_cost = price.cost(
                model,
                &Usage {
                    input_tokens: est_input,
                    output_tokens: 0,
                    estimated: true,
                },
            );
            if budgets.max_cost_usd > 0.0 && state.budget.cost_usd + est_cost > budgets.max_cost_usd
            {
                return self.finish_budget(BudgetKind::Cost, state).await;
            }
            self.log
                .emit(EngineEvent::TurnStarted {
                    turn,
                    estimated_input_tokens: est_input,
                })
                .await;
            self.turns_started
                .fetch_max(turn, std::sync::atomic::Ordering::Relaxed);

            let outcome = self
                .turn(turn, request, est_input, state, budgets, target)
                .instrument(tracing::info_span!("turn", turn))
                .await;
            // A turn that did not end normally still used what reached the model.
            let interrupted = std::mem::take(
                &mut *self
                    .interrupted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            if let (Err(_), Some(u)) = (&outcome, interrupted.usage) {
                state.budget.add_usage(&u, price.cost(model, &u));
            }
            let report = match outcome {
                Ok(r) => r,
                Err(TurnError::Stopped) => {
                    return self
                        .check_stopped(state)
                        .await
                        .unwrap_or(AttemptEnd::Abandoned);
                }
                Err(TurnError::Model(e)) => {
                    return self
                        .finish(
                            RunStatus::Failed,
                            &model_failure_reason(&e, &interrupted),
                            &state.budget,
                            state.started_at,
                        )
                        .await;
                }
                Err(TurnError::Effect(EffectError::Store(e))) => return self.store_error(e),
                Err(TurnError::Effect(e)) => {
                    return self
                        .finish(
                            RunStatus::Failed,
                            &format!("error: {e}"),
                            &state.budget,
                            state.started_at,
                        )
                        .await;
                }
                Err(TurnError::Log(LogError::Lost(_))) => return AttemptEnd::Abandoned,
                Err(TurnError::Log(LogError::Failed(m))) => return AttemptEnd::Retry(m),
            };

            // Account the turn.
            let usage = report.usage.unwrap_or(Usage {
                input_tokens: est_input,
                output_tokens: estimate_bytes_tokens(report.output_bytes as usize),
                estimated: true,
            });
            let cost = price.cost(model, &usage);
            state.budget.turns = turn;
            state.budget.tool_calls += report.effects.tool_calls;
            state.budget.add_usage(&usage, cost);
            match report.budget_cut {
                Some(BudgetKind::Cost) => {
                    state.budget.cost_usd = state.budget.cost_usd.max(budgets.max_cost_usd)
                }
                Some(_) => {
                    state.budget.output_tokens =
                        state.budget.output_tokens.max(budgets.max_output_tokens)
                }
                None => {}
            }
            state.budget.elapsed_ms = elapsed_ms(state.started_at);

            let mut files: Vec<(String, u64)> = report.effects.reused_files.clone();
            let mut file_failures = Vec::new();
            for (path, bytes, err) in target.drain_written() {
                match err {
                    None => files.push((path, bytes)),
                    Some(e) => file_failures.push((path, e)),
                }
            }
            let mut results = report.effects.results;
            for (path, e) in file_failures {
                results.push(super::prompt::ToolResult {
                    index: u32::MAX,
                    title: format!("file {path}: write failed"),
                    exit_code: None,
                    body: e,
                });
            }
            let facts = TurnFacts {
                turn,
                done: report.done,
                files_written: files.len() as u32,
                tool_results: results.len() as u32,
                skipped_turn_limit: report.effects.skipped_turn_limit,
                skipped_run_limit: report.effects.skipped_run_limit,
                previous_was_nudge: state.previous_was_nudge,
            };
            for (kind, used, limit) in state.budget.new_warnings(budgets) {
                self.log
                    .emit(EngineEvent::BudgetWarning {
                        budget: kind.as_str().into(),
                        used,
                        limit,
                    })
                    .await;
            }
            if report.output_cap_hit {
                return self
                    .finish(
                        RunStatus::Failed,
                        &format!(
                            "error: turn {turn} produced more than {} bytes of output \
                             (max_turn_output_bytes); the stream was cut",
                            self.inner.config.max_turn_output_bytes
                        ),
                        &state.budget,
                        state.started_at,
                    )
                    .await;
            }
            let outcome = decide_turn_outcome(&facts, &state.budget, budgets);
            self.log
                .emit(EngineEvent::TurnFinished {
                    turn,
                    usage,
                    files_written: facts.files_written,
                    tool_calls: report.effects.tool_calls,
                    done: report.done,
                    outcome: outcome.name().into(),
                })
                .await;
            tracing::debug!(turn, ?outcome, "turn finished");
            if !files.is_empty() {
                state.files_changed = true;
            }
            let mut notes = report.effects.notes.clone();
            notes.files = files
                .iter()
                .map(|(path, bytes)| crate::chat::FileNote {
                    path: path.clone(),
                    bytes: *bytes,
                })
                .collect();
            let finish_reason = match &outcome {
                TurnOutcome::Complete => Some("done".to_string()),
                TurnOutcome::Stop(reason) => Some(reason.reason()),
                TurnOutcome::Continue | TurnOutcome::Nudge => None,
            };
            // The autofix turn is the last one, whatever it says.
            let last = finish_reason.is_some() || state.autofix_turn == Some(turn);
            let mut build = chat::BuildEnd {
                failed: false,
                autofix: None,
            };
            if last {
                build = match self.build(turn, budgets, state, target, &mut notes).await {
                    Ok(b) => b,
                    Err(end) => return end,
                };
            }
            // The chat's message of this turn, before its checkpoint or
            // terminal event (a replay of the turn replaces it).
            let reply = super::chat_run::visible_text(&report.output_view);
            if let Err(e) = self
                .inner
                .store
                .put_messages(
                    self.run_id,
                    self.fence,
                    turn,
                    vec![crate::chat::NewMessage::assistant(reply, notes)],
                )
                .await
            {
                return self.store_error(e);
            }
            if last && build.autofix.is_none() {
                let reason = if build.failed {
                    "build_failed".to_string()
                } else {
                    finish_reason.unwrap_or_else(|| "done".to_string())
                };
                return self
                    .finish(
                        RunStatus::Completed,
                        &reason,
                        &state.budget,
                        state.started_at,
                    )
                    .await;
            }
            state.messages.push(Message {
                role: Role::Assistant,
                content: report.output_view.clone(),
            });
            let next = if let Some(prompt) = build.autofix {
                state.autofix_turn = Some(turn + 1);
                prompt
            } else if outcome == TurnOutcome::Nudge {
                NUDGE_MESSAGE.to_string()
            } else {
                continuation_message(turn, &files, &results, self.inner.config.result_cap)
            };
            state.messages.push(Message {
                role: Role::User,
                content: next,
            });
            state.previous_was_nudge = outcome == TurnOutcome::Nudge;
            // Checkpoint: the turn's events are persisted first.
            match self.log.flush().await {
                Ok(seq) => state.last_seq = seq,
                Err(LogError::Lost(_)) => return AttemptEnd::Abandoned,
                Err(LogError::Failed(m)) => return AttemptEnd::Retry(m),
            }
            let cp = Checkpoint {
                turn,
                state: serde_json::to_value(&*state).unwrap_or_default(),
            };
            if let Err(e) = self
                .inner
                .store
                .save_checkpoint(self.run_id, self.fence, cp)
                .await
            {
                return self.store_error(e);
            }
        }
    }

    /// If the run token fired, end accordingly.
    async fn check_stopped(&self, state: &RunState) -> Option<AttemptEnd> {
        let cause = self.control.cause()?;
        Some(match cause {
            StopCause::Cancelled => {
                self.finish(
                    RunStatus::Cancelled,
                    "cancelled",
                    &state.budget,
                    state.started_at,
                )
                .await
            }
            StopCause::Deadline => self.finish_budget(BudgetKind::Deadline, state).await,
            StopCause::Lost | StopCause::Shutdown => AttemptEnd::Abandoned,
            StopCause::FinishedElsewhere => AttemptEnd::Finished,
        })
    }

    async fn finish_budget(&self, kind: BudgetKind, state: &RunState) -> AttemptEnd {
        self.finish(
            RunStatus::Completed,
            &kind.exhausted_reason(),
            &state.budget,
            state.started_at,
        )
        .await
    }

    /// Flush the log, then write the terminal event via [`finish_run`].
    async fn finish(
        &self,
        status: RunStatus,
        reason: &str,
        budget: &BudgetState,
        started_at: DateTime<Utc>,
    ) -> AttemptEnd {
        if self.control.cause() == Some(StopCause::FinishedElsewhere) {
            return AttemptEnd::Finished;
        }
        match self.log.flush().await {
            Ok(_) => {}
            Err(LogError::Lost(_)) => return AttemptEnd::Abandoned,
            Err(LogError::Failed(m)) => {
                tracing::error!(error = %m, "event log failed before finish");
            }
        }
        match self.control.cause() {
            Some(StopCause::Lost | StopCause::Shutdown) => return AttemptEnd::Abandoned,
            Some(StopCause::FinishedElsewhere) => return AttemptEnd::Finished,
            _ => {}
        }
        let summary = Summary {
            turns: budget.turns.max(
                self.turns_started
                    .load(std::sync::atomic::Ordering::Relaxed),
            ),
            usage: budget.usage(),
            cost_usd: budget.cost_usd,
            tool_calls: budget.tool_calls,
            duration_ms: elapsed_ms(started_at),
        };
        match finish_run(
            &*self.inner.store,
            &*self.inner.notifier,
            self.run_id,
            Some(self.fence),
            status,
            reason,
            summary,
        )
        .await
        {
            Ok(_) => AttemptEnd::Finished,
            Err(StoreError::Finished { .. }) => AttemptEnd::Finished,
            Err(e) => self.store_error(e),
        }
    }

    /// One model call: stream, parse, hand side effects to the handler.
    async fn turn(
        &self,
        turn: u32,
        request: ModelRequest,
        est_input: u64,
        state: &RunState,
        budgets: &Budgets,
        target: &Arc<FlushTarget>,
    ) -> Result<TurnReport, TurnError> {
        let token = self.control.token.clone();
        let (tx, rx) = mpsc::channel(self.inner.config.effect_channel);
        let effects = EffectCtx {
            run_id: self.run_id,
            fence: self.fence,
            turn,
            store: self.inner.store.clone(),
            target: target.clone(),
            web: self.inner.web_search.clone(),
            config: self.inner.config.clone(),
            log: self.log.clone(),
            cancel: token.clone(),
            run_tool_calls: state.budget.tool_calls,
            max_per_turn: budgets.max_tool_calls_per_turn,
            max_per_run: budgets.max_tool_calls_per_run,
        };
        let (out_budget, binding) = output_allowance(
            budgets,
            &state.budget,
            self.inner.prices.get(&request.model),
            est_input,
        );
        // Retries inside the model client never start past the run's deadline.
        let left = budgets
            .deadline()
            .saturating_sub((Utc::now() - state.started_at).to_std().unwrap_or_default());
        let deadline = tokio::time::Instant::now() + left;
        let stream_side = self.stream(turn, request, tx, out_budget, est_input, deadline);
        // Gated: the handler is polled when an item arrives (or its own
        // work wakes it), not on every chunk the stream side handles.
        let effect_side = self.control.gates.gate(effects.handle(rx));
        let (streamed, effected) = tokio::join!(stream_side, effect_side);
        // A handler failure explains a stream that stopped early, so it wins.
        let effects_report = effected?;
        let streamed = streamed?;
        let budget_cut = streamed.budget_hit.then_some(binding);
        // Turn end: everything pending goes to the sandbox now.
        target.flush().await?;
        Ok(TurnReport {
            output_view: streamed.output.view(),
            output_bytes: (streamed.output.len() + streamed.thinking_bytes) as u64,
            usage: streamed.usage,
            done: streamed.done,
            effects: effects_report,
            budget_cut,
            output_cap_hit: streamed.cap_hit,
        })
    }

    /// Open the model stream (retrying before output) and parse it.
    async fn stream(
        &self,
        turn: u32,
        request: ModelRequest,
        tx: mpsc::Sender<EffectItem>,
        out_budget: u64,
        est_input: u64,
        deadline: tokio::time::Instant,
    ) -> Result<Streamed, TurnError> {
        let token = self.control.token.clone();
        let (tap, mut failures) = mpsc::unbounded_channel();
        let call = ModelCall {
            deadline: Some(deadline),
            observer: Some(Arc::new(AttemptTap(tap))),
        };
        // A client that retries internally (the HTTP providers) is not
        // retried again here, or attempts would multiply.
        let max_attempts = if self.model_client().retries_internally() {
            1
        } else {
            self.inner.config.model_attempts
        };
        let mut attempt = 0;
        let mut stream = loop {
            attempt += 1;
            let open = token.run_until_cancelled(self.model_client().stream_call(
                request.clone(),
                token.clone(),
                call.clone(),
            ));
            tokio::pin!(open);
            // The client's own retries become `model_retry` events as they happen.
            let opened = loop {
                tokio::select! {
                    biased;
                    Some(f) = failures.recv() => self.attempt_failed(turn, &f).await,
                    r = &mut open => break r,
                }
            };
            while let Ok(f) = failures.try_recv() {
                self.attempt_failed(turn, &f).await;
            }
            {
                let mut i = self
                    .interrupted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                i.attempts = i.attempts.max(attempt);
            }
            match opened {
                None => return Err(TurnError::Stopped),
                Some(Ok(s)) => {
                    // The retries before it are history: a later failure of
                    // this stream is not quoted as theirs.
                    *self
                        .interrupted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Interrupted::default();
                    break s;
                }
                Some(Err(ModelError::Cancelled)) => return Err(TurnError::Stopped),
                Some(Err(e)) if e.is_retryable() && attempt < max_attempts => {
                    let delay = match &e {
                        ModelError::RateLimited {
                            retry_after: Some(d),
                        }
                        | ModelError::Overloaded {
                            retry_after: Some(d),
                            ..
                        } => (*d).min(Duration::from_secs(30)),
                        _ => Duration::from_millis(500 * (1 << attempt.min(6))),
                    };
                    self.log
                        .emit(EngineEvent::ModelRetry {
                            turn,
                            attempt,
                            error: e.to_string(),
                            delay_ms: delay.as_millis() as u64,
                            status: None,
                            message: None,
                        })
                        .await;
                    if token
                        .run_until_cancelled(tokio::time::sleep(delay))
                        .await
                        .is_none()
                    {
                        return Err(TurnError::Stopped);
                    }
                }
                Some(Err(e)) => return Err(TurnError::Model(e)),
            }
        };

        let mut parser = Parser::new();
        let mut parsed = Vec::new();
        let mut output = BoundedText::new(self.inner.config.output_view_cap);
        let mut thinking_bytes = 0usize;
        let mut cap_hit = false;
        let max_bytes = self.inner.config.max_turn_output_bytes;
        let mut usage = None;
        let mut file = OpenFile::default();
        let log = Some(&self.log);
        let max_file_bytes = self.inner.config.max_file_bytes;
        let mut done = false;
        let mut budget_hit = false;
        let mut finish: Option<crate::FinishReason> = None;
        let mut ended = false;
        // One wait on the token for the whole stream, polled only when the
        // token fires: checking it before every chunk would take the
        // token's mutex (and register and drop a waiter) per chunk.
        let mut stopped = self.control.gates.gate(token.cancelled());
        let read = async {
            loop {
                let produced = output.len() + thinking_bytes;
                if estimate_bytes_tokens(produced) >= out_budget && produced > 0 {
                    budget_hit = true;
                    break;
                }
                if produced > max_bytes {
                    cap_hit = true;
                    break;
                }
                // Cancellation first, as `run_until_cancelled` would.
                let next = tokio::select! {
                    biased;
                    () = &mut stopped => return Err(TurnError::Stopped),
                    n = stream.next() => n,
                };
                match next {
                    None => {
                        ended = true;
                        break;
                    }
                    Some(Ok(ModelChunk::Text(t))) => {
                        output.push_str(&t);
                        parser.feed_with(&t, |e| {
                            file.step(e, max_file_bytes, None, &mut done, &mut parsed, log)
                        });
                        self.dispatch(&mut parsed, &tx).await?;
                        // Deltas queued without an `emit` spent no cooperative
                        // budget: a model whose stream is always ready must
                        // still let the worker thread run other tasks.
                        tokio::task::coop::consume_budget().await;
                    }
                    Some(Ok(ModelChunk::Thinking(t))) => {
                        // Provider reasoning is output too: it counts against
                        // the output-token cut and the per-turn byte bound.
                        thinking_bytes += t.len();
                        self.log
                            .emit(EngineEvent::ThinkingDelta { content: t })
                            .await;
                    }
                    Some(Ok(ModelChunk::Usage(u))) => usage = Some(u),
                    Some(Ok(ModelChunk::Finish(f))) => finish = Some(f),
                    Some(Err(ModelError::Cancelled)) => return Err(TurnError::Stopped),
                    Some(Err(e)) => return Err(TurnError::Model(e)),
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = read {
            // The call reached the model: its input and the streamed output count.
            let u = usage.unwrap_or(Usage {
                input_tokens: est_input,
                output_tokens: estimate_bytes_tokens(output.len() + thinking_bytes),
                estimated: true,
            });
            self.interrupted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .usage = Some(u);
            return Err(e);
        }
        if ended {
            self.log
                .emit(EngineEvent::ModelFinished {
                    turn,
                    finish_reason: finish.as_ref().map(finish_reason_name),
                    usage_reported: usage.is_some_and(|u| !u.estimated),
                    open_scope: file.file.as_ref().map(|(path, _)| format!("file {path}")),
                })
                .await;
        }
        // Why the stream ended, for a file it cut off.
        let end = if budget_hit {
            "output_budget".to_string()
        } else if cap_hit {
            "turn_output_cap".to_string()
        } else {
            finish
                .as_ref()
                .map_or_else(|| "stream_ended".to_string(), finish_reason_name)
        };
        parser
            .finish_with(|e| file.step(e, max_file_bytes, Some(&end), &mut done, &mut parsed, log));
        self.dispatch(&mut parsed, &tx).await?;
        Ok(Streamed {
            output,
            thinking_bytes,
            usage,
            done,
            budget_hit,
            cap_hit,
        })
    }

    /// One failed attempt the model client reported: a `model_retry` event
    /// when it retries, and the facts the terminal reason quotes.
    async fn attempt_failed(&self, turn: u32, f: &AttemptFailure) {
        {
            let mut i = self
                .interrupted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            i.attempts = i.attempts.max(f.attempt);
            if f.message.is_some() {
                i.provider_message = f.message.clone();
            }
        }
        if let Some(delay) = f.retry_in {
            self.log
                .emit(EngineEvent::ModelRetry {
                    turn,
                    attempt: f.attempt,
                    error: f.error.to_string(),
                    delay_ms: delay.as_millis() as u64,
                    status: f.status,
                    message: f.message.clone(),
                })
                .await;
        }
    }

    /// Log the run events and hand over the side-effect work that
    /// [`OpenFile::step`] made of the parser's events, in stream order.
    async fn dispatch(
        &self,
        parsed: &mut Vec<Parsed>,
        tx: &mpsc::Sender<EffectItem>,
    ) -> Result<(), TurnError> {
        for step in parsed.drain(..) {
            let item = match step {
                Parsed::Log(event) => {
                    self.log.emit(event).await;
                    continue;
                }
                Parsed::Effect(item) => item,
            };
            // Bounded: parsing only waits when the handler is far behind.
            tokio::select! {
                r = tx.send(item) => {
                    if r.is_err() {
                        // The handler stopped (error or cancel); its result says why.
                        return Err(TurnError::Stopped);
                    }
                }
                _ = self.control.token.cancelled() => return Err(TurnError::Stopped),
            }
        }
        Ok(())
    }
}

/// Output tokens the next call may produce, and the budget that bounds them:
/// what is left of the output-token budget, or — for a priced model under a
/// cost budget — the tokens the remaining money buys after the estimated
/// input, whichever is smaller. The request asks the provider for at most
/// this, and the stream is cut when the streamed estimate reaches it.
fn output_allowance(
    budgets: &Budgets,
    used: &BudgetState,
    price: Option<crate::pricing::ModelPrice>,
    estimated_input: u64,
) -> (u64, BudgetKind) {
    let by_tokens = budgets.max_output_tokens.saturating_sub(used.output_tokens);
    let Some(price) = price.filter(|p| budgets.max_cost_usd > 0.0 && p.output_per_mtok > 0.0)
    else {
        return (by_tokens, BudgetKind::OutputTokens);
    };
    let input_cost = estimated_input as f64 * price.input_per_mtok / 1_000_000.0;
    let left = (budgets.max_cost_usd - used.cost_usd - input_cost).max(0.0);
    let by_cost = (left * 1_000_000.0 / price.output_per_mtok).floor() as u64;
    if by_cost < by_tokens {
        (by_cost, BudgetKind::Cost)
    } else {
        (by_tokens, BudgetKind::OutputTokens)
    }
}

/// The file being streamed, and whether the parser closed it implicitly
/// (no `</file>`: the stream ended or another tag cut it off).
#[derive(Default)]
struct OpenFile {
    file: Option<(String, String)>,
    unclosed: bool,
    /// Bytes of the open file received so far.
    bytes: usize,
    /// Over `max_file_bytes`: its content is no longer kept or recorded.
    too_big: bool,
}

/// What one parser event asks of the turn, in stream order.
enum Parsed {
    /// A run event to log.
    Log(EngineEvent),
    /// Side-effect work for the handler.
    Effect(EffectItem),
}

impl OpenFile {
    /// Turn one parser event into run events and side-effect work while the
    /// parser lends it (`Parser::feed_with`): file bytes go from the model's
    /// chunk straight into the open file's buffer, with no owned parser
    /// event in between. `unclosed_reason` is why the stream ended, when
    /// this is its end: a file the end closes is truncated. Mid-stream
    /// (`</edward_sandbox>` before `</file>`) the model closed it itself, and
    /// it is written.
    ///
    /// With `log`, a content delta that nothing of this chunk precedes in
    /// `out` is queued into the log at once, borrowed ([`RunLog::push_delta`]):
    /// no owned event per chunk. Anything after an item still in `out` waits
    /// its turn there, so the order of events and side effects is the
    /// stream's.
    fn step(
        &mut self,
        ev: EventRef<'_>,
        max_file_bytes: usize,
        unclosed_reason: Option<&str>,
        done: &mut bool,
        out: &mut Vec<Parsed>,
        log: Option<&RunLog>,
    ) {
        let delta = |d: DeltaRef<'_>, out: &mut Vec<Parsed>| {
            if !(out.is_empty() && log.is_some_and(|log| log.push_delta(d))) {
                out.push(Parsed::Log(d.to_event()));
            }
        };
        let step = match ev {
            EventRef::Text { content } => return delta(DeltaRef::Text(content), out),
            EventRef::ThinkingContent { content } => {
                return delta(DeltaRef::Thinking(content), out);
            }
            EventRef::ThinkingStart | EventRef::ThinkingEnd => return,
            EventRef::SandboxStart { project, base } => {
                Parsed::Effect(EffectItem::Sandbox(crate::SandboxSpec {
                    project: project.map(str::to_owned),
                    base: base.map(str::to_owned),
                }))
            }
            EventRef::SandboxEnd | EventRef::InstallStart | EventRef::InstallEnd => return,
            EventRef::FileStart { path } => {
                self.file = Some((path.to_owned(), String::new()));
                self.unclosed = false;
                self.bytes = 0;
                self.too_big = false;
                return;
            }
            EventRef::FileContent { content }
                if self.file.is_some() && {
                    self.bytes += content.len();
                    self.too_big || self.bytes > max_file_bytes
                } =>
            {
                // Too large: drop what was gathered, keep nothing more.
                if !self.too_big {
                    self.too_big = true;
                    if let Some((_, buf)) = self.file.as_mut() {
                        *buf = String::new();
                    }
                }
                return;
            }
            EventRef::FileContent { content } => {
                return match self.file.as_mut() {
                    Some((path, buf)) => {
                        buf.push_str(content);
                        delta(DeltaRef::File { path, content }, out)
                    }
                    None => delta(DeltaRef::Text(content), out),
                };
            }
            EventRef::FileEnd => {
                let unclosed = std::mem::take(&mut self.unclosed);
                let too_big = std::mem::take(&mut self.too_big);
                let bytes = std::mem::take(&mut self.bytes) as u64;
                let Some((path, content)) = self.file.take() else {
                    return;
                };
                Parsed::Effect(if too_big {
                    EffectItem::TruncatedFile {
                        path,
                        bytes,
                        reason: "file_too_large".into(),
                    }
                } else if let (true, Some(reason)) = (unclosed, unclosed_reason) {
                    // Cut off: never replaces a complete file.
                    EffectItem::TruncatedFile {
                        path,
                        bytes: content.len() as u64,
                        reason: reason.to_string(),
                    }
                } else {
                    EffectItem::File { path, content }
                })
            }
            EventRef::InstallContent {
                dependencies,
                framework,
            } => Parsed::Effect(EffectItem::Install {
                dependencies: dependencies.to_vec(),
                framework: framework.map(str::to_owned),
            }),
            EventRef::Command { command, args } => Parsed::Effect(EffectItem::Command {
                command: command.to_owned(),
                args: args.to_vec(),
            }),
            EventRef::WebSearch { query, max_results } => Parsed::Effect(EffectItem::WebSearch {
                query: query.to_owned(),
                max_results,
            }),
            EventRef::Done => {
                *done = true;
                return;
            }
            EventRef::Error {
                code,
                message,
                severity,
                skipped_bytes,
            } => {
                if code == crate::parser::ErrorCode::UnclosedFile {
                    self.unclosed = true;
                }
                Parsed::Log(EngineEvent::ParseError {
                    code: code.as_str().into(),
                    message: message.to_owned(),
                    severity: severity.as_str().into(),
                    skipped_bytes,
                })
            }
        };
        out.push(step);
    }
}

/// The token estimate of `bytes` bytes of output (as [`estimate_tokens`]).
fn estimate_bytes_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(crate::pricing::BYTES_PER_TOKEN_ESTIMATE)
}

/// `error: model: <error>`, plus the attempt count when the call was tried
/// more than once and the provider's own message when the error does not
/// already quote it.
fn model_failure_reason(e: &ModelError, call: &Interrupted) -> String {
    let mut reason = format!("error: model: {e}");
    if call.attempts > 1 {
        reason.push_str(&format!(" after {} attempts", call.attempts));
    }
    if let Some(m) = &call.provider_message {
        if !reason.contains(m.as_str()) {
            reason.push_str(&format!(" (provider said: {m})"));
        }
    }
    reason
}

fn finish_reason_name(f: &crate::FinishReason) -> String {
    match f {
        crate::FinishReason::Stop => "stop".into(),
        crate::FinishReason::Length => "length".into(),
        crate::FinishReason::ContentFilter => "content_filter".into(),
        crate::FinishReason::Other(o) => o.clone(),
    }
}

fn elapsed_ms(since: DateTime<Utc>) -> u64 {
    (Utc::now() - since).num_milliseconds().max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The effect items [`OpenFile::step`] makes of `input` fed in `n`-char
    /// chunks, the stream ending for `reason`.
    fn items(input: &str, n: usize, max_file_bytes: usize, reason: &str) -> Vec<String> {
        let (mut parser, mut open, mut done, mut out) =
            (Parser::new(), OpenFile::default(), false, Vec::new());
        let chars: Vec<char> = input.chars().collect();
        for piece in chars.chunks(n) {
            let piece: String = piece.iter().collect();
            parser.feed_with(&piece, |e| {
                open.step(e, max_file_bytes, None, &mut done, &mut out, None)
            });
        }
        parser
            .finish_with(|e| open.step(e, max_file_bytes, Some(reason), &mut done, &mut out, None));
        out.iter()
            .filter_map(|p| match p {
                Parsed::Effect(item) => Some(format!("{item:?}")),
                Parsed::Log(_) => None,
            })
            .collect()
    }

    #[test]
    fn file_bytes_reach_the_effect_whole_at_every_chunking() {
        let input = "<edward_sandbox><file path=\"a.ts\">\nlet x = 1 < 2;\n</file>\
                     <file path=\"big.ts\">0123456789abcdef</file>\
                     <file path=\"b.ts\">kept</edward_sandbox>\
                     <edward_sandbox><file path=\"c.ts\">cut off";
        let expected = items(input, usize::MAX, 15, "stream_ended");
        assert_eq!(
            expected,
            [
                r#"Sandbox(SandboxSpec { project: None, base: None })"#,
                r#"File { path: "a.ts", content: "let x = 1 < 2;\n" }"#,
                r#"TruncatedFile { path: "big.ts", bytes: 16, reason: "file_too_large" }"#,
                // closed by the model's own `</edward_sandbox>`: written
                r#"File { path: "b.ts", content: "kept" }"#,
                r#"Sandbox(SandboxSpec { project: None, base: None })"#,
                r#"TruncatedFile { path: "c.ts", bytes: 7, reason: "stream_ended" }"#,
            ]
        );
        for n in [1, 2, 3, 7, 16] {
            assert_eq!(
                items(input, n, 15, "stream_ended"),
                expected,
                "chunks of {n}"
            );
        }
    }
}

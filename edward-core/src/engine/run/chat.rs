//! The chat steps of a run: waiting for the chat's earlier runs, assembling
//! the context at the first start, and the build job (with its one autofix
//! turn) after the last turn.

use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{AttemptEnd, RunControl, RunCtx, RunState, StopCause};
use crate::chat::{BuildResult, BuildStatus, CommandNote, NewMessage, TurnEffects};
use crate::engine::Inner;
use crate::engine::budget::Budgets;
use crate::engine::chat_run;
use crate::engine::config::RunRequest;
use crate::engine::context::{ContextInput, assemble_context};
use crate::engine::effects::{EffectError, FlushTarget, NOTE_OUTPUT_CAP};
use crate::engine::events::EngineEvent;
use crate::engine::framework::{build_script, detect_framework};
use crate::engine::prompt::{SYSTEM_PROMPT, bounded};
use crate::engine::tail;
use crate::{ExecRequest, Lease, SandboxError, SandboxKey, SandboxPath, StoreError};

/// How a run's claim is rescheduled while an earlier run of its chat is
/// active: soon, and never dead-lettered for waiting.
pub(crate) const DEFER_POLICY: crate::RetryPolicy = crate::RetryPolicy {
    max_attempts: u32::MAX,
    base_delay_ms: 100,
    max_delay_ms: 1_000,
};

/// How long a claimed run waits (holding its worker slot) for an earlier
/// run of its chat before its claim is deferred instead: long enough that a
/// successor usually starts the moment its predecessor ends, short enough
/// that waiting runs cannot keep a worker's slots from runs that can go.
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// Before a run starts: wait (up to [`WAIT_SLICE`]) while an earlier run of
/// its chat is active, recording `run_waiting` once per run waited for.
/// `Err(Defer)` if one is still active then, `Err(Abandoned)` if the worker
/// is shutting down or lost the lease; `Ok(started_before)` to go on, which
/// says whether a worker started the run before (`None`: unknown).
pub(crate) async fn wait_for_chat(
    inner: &Inner,
    lease: &Lease,
    control: &RunControl,
) -> Result<Option<bool>, AttemptEnd> {
    let give_up = tokio::time::Instant::now() + WAIT_SLICE;
    loop {
        let run = match inner.store.get_run(lease.run_id).await {
            Ok(Some(run)) => run,
            // Start handles missing and failing stores uniformly.
            Ok(None) | Err(_) => return Ok(None),
        };
        let started_before = Some(run.fence.0 > 0);
        if run.status != crate::RunStatus::Queued {
            return Ok(started_before); // never behind anyone since
        }
        let behind = match chat_run::blocked_by(&*inner.store, &run).await {
            Ok(Some(other)) => other,
            Ok(None) => return Ok(started_before),
            Err(e) if e.is_retryable() => return Err(AttemptEnd::Retry(e.to_string())),
            Err(_) => return Ok(started_before),
        };
        note_waiting(inner, &run, lease, behind).await;
        let other_last = match inner.store.get_run(behind).await {
            Ok(Some(o)) if !o.status.is_terminal() => o.last_seq,
            Ok(_) => continue,
            Err(e) => return Err(AttemptEnd::Retry(e.to_string())),
        };
        let mut events = tail::tail(
            inner.store.clone(),
            inner.notifier.clone(),
            behind,
            other_last,
            inner.config.tail_backstop,
        );
        let ended = async {
            while let Some(e) = events.next().await {
                match e {
                    Ok(e) if e.is_terminal() => return,
                    Ok(_) => {}
                    Err(_) => return, // re-check from the top
                }
            }
        };
        tokio::select! {
            () = ended => {}
            () = tokio::time::sleep_until(give_up) => {
                return Err(AttemptEnd::Defer(format!(
                    "waiting for run {behind} of the same chat"
                )));
            }
            () = control.token.cancelled() => {
                return match control.cause() {
                    // A cancelled run starts and ends `cancelled` at once.
                    Some(StopCause::Cancelled) => Ok(started_before),
                    Some(StopCause::FinishedElsewhere) => Err(AttemptEnd::Finished),
                    _ => Err(AttemptEnd::Abandoned),
                };
            }
        }
    }
}

/// Append `run_waiting` unless the run's last event already says it waits
/// for `behind`.
async fn note_waiting(inner: &Inner, run: &crate::Run, lease: &Lease, behind: crate::RunId) {
    let behind = behind.to_string();
    let already = inner
        .store
        .events_after(run.id, run.last_seq.saturating_sub(1), 1)
        .await
        .ok()
        .and_then(|e| e.into_iter().next())
        .is_some_and(|e| {
            e.kind == "run_waiting"
                && e.payload.get("behind").and_then(|b| b.as_str()) == Some(behind.as_str())
        });
    if already {
        return;
    }
    let event = EngineEvent::RunWaiting { behind }.into_new_event();
    if let Ok(written) = inner
        .store
        .append_events(run.id, lease.fence, vec![event])
        .await
    {
        if let Some(last) = written.last() {
            let _ = inner.notifier.notify_events(run.id, last.seq).await;
        }
    }
}

/// How the build after the last turn went.
pub(super) struct BuildEnd {
    /// The (last) build failed.
    pub failed: bool,
    /// The prompt of the autofix turn to run, if one is granted.
    pub autofix: Option<String>,
}

impl RunCtx {
    /// The first start of a run: read the chat's history and workspace,
    /// detect the framework, assemble the context into `state`, and record
    /// the prompt as the chat's message of turn 0.
    pub(super) async fn prepare_context(
        &self,
        run: &crate::Run,
        request: &RunRequest,
        model: &str,
        budgets: &Budgets,
        key: &SandboxKey,
        state: &mut RunState,
    ) -> Result<(), AttemptEnd> {
        let cfg = &self.inner.config.chat;
        let history = self
            .inner
            .store
            .chat_messages(
                &run.user_id,
                &run.chat_id,
                Some(self.run_id),
                cfg.history_limit,
            )
            .await
            .map_err(|e| self.store_error(e))?;
        let workspace = async {
            let sandbox = self.inner.sandboxes.attach(key).await?;
            chat_run::gather(sandbox, &history, cfg).await
        };
        let gathered = match self.control.token.run_until_cancelled(workspace).await {
            None => return Err(self.stopped(state).await),
            Some(Ok(g)) => g,
            Some(Err(e)) => {
                return Err(AttemptEnd::Retry(format!(
                    "reading the chat's workspace: {e}"
                )));
            }
        };
        let paths: Vec<&str> = gathered.paths.iter().map(String::as_str).collect();
        let detection = detect_framework(
            gathered.package_json.as_deref(),
            &paths,
            chat_run::recorded_framework(&history),
        );
        // The first request must leave room for the answer in the window.
        let reserve = u64::from(self.inner.config.max_output_tokens_per_call);
        let fit = self
            .model_client()
            .context_window(model)
            .map_or(u64::MAX, |w| w.saturating_sub(reserve.min(w / 4)));
        let prepared = assemble_context(
            &ContextInput {
                system_prompt: SYSTEM_PROMPT,
                prompt: &request.prompt,
                history: &history,
                snapshot: &gathered.snapshot,
                framework: &detection,
                max_input_tokens: fit.min(budgets.max_input_tokens),
            },
            &crate::pricing::estimate_tokens,
        );
        self.log
            .emit(EngineEvent::FrameworkDetected {
                framework: detection.framework.as_str().into(),
                evidence: detection.evidence.clone(),
            })
            .await;
        let st = prepared.stats;
        self.log
            .emit(EngineEvent::ContextPrepared {
                history_messages: st.history_messages,
                history_dropped: st.history_dropped,
                files_listed: st.files_listed,
                files_included: st.files_included,
                estimated_tokens: st.estimated_tokens,
            })
            .await;
        state.messages = prepared.messages;
        state.system = Some(prepared.system);
        self.inner
            .store
            .put_messages(
                self.run_id,
                self.fence,
                0,
                vec![NewMessage::user(request.prompt.clone())],
            )
            .await
            .map_err(|e| self.store_error(e))
    }

    /// After the last turn: when builds are on, a turn wrote files and the
    /// project can be built, run build job `state.builds + 1` (create, claim
    /// by compare-and-set, run, record), note it in `notes`, and grant one
    /// autofix turn after a first failed build when budgets allow.
    pub(super) async fn build(
        &self,
        turn: u32,
        budgets: &Budgets,
        state: &mut RunState,
        target: &FlushTarget,
        notes: &mut TurnEffects,
    ) -> Result<BuildEnd, AttemptEnd> {
        let none = BuildEnd {
            failed: false,
            autofix: None,
        };
        let cfg = &self.inner.config.chat.build;
        if !cfg.enabled || !state.files_changed || state.builds >= 2 {
            return Ok(none);
        }
        let sandbox = match target.slot.get(&self.control.token).await {
            Ok(sb) => sb,
            Err(e) => return Err(self.effect_end(e, state).await),
        };
        let command = match &cfg.command {
            Some(c) if !c.is_empty() => c.clone(),
            Some(_) => return Ok(none),
            None => {
                let package_json = match SandboxPath::new("package.json") {
                    Ok(p) => sandbox.read_file(&p).await.ok(),
                    Err(_) => None,
                };
                let text = package_json.and_then(|b| String::from_utf8(b.to_vec()).ok());
                if !build_script(text.as_deref()) {
                    return Ok(none);
                }
                let manager = self.inner.config.package_manager;
                if manager == crate::engine::config::PackageManager::None {
                    return Ok(none);
                }
                // `run build` runs the project's own scripts: code.
                if !self
                    .inner
                    .config
                    .commands
                    .scripts
                    .allows(sandbox.isolation().is_isolated())
                {
                    tracing::info!("no build: package scripts may not run in this sandbox");
                    return Ok(none);
                }
                vec![manager.as_str().into(), "run".into(), "build".into()]
            }
        };
        let store = &self.inner.store;
        let number = state.builds + 1;
        store
            .create_build(self.run_id, self.fence, number, command.clone())
            .await
            .map_err(|e| self.store_error(e))?;
        let claimed = store
            .claim_build(self.run_id, number, self.fence, &self.worker)
            .await
            .map_err(|e| self.store_error(e))?;
        let result = match claimed {
            Some(_) => {
                self.log
                    .emit(EngineEvent::BuildStarted {
                        number,
                        command: command.clone(),
                        worker: self.worker.clone(),
                    })
                    .await;
                let started = Instant::now();
                let req = ExecRequest {
                    program: command[0].clone(),
                    args: command[1..].to_vec(),
                    cwd: None,
                    env: Vec::new(),
                    timeout: cfg.timeout,
                    output_cap: cfg.output_cap,
                };
                let result = match sandbox.exec(req, self.control.token.child_token()).await {
                    Ok(out) => {
                        let mut output = out.stdout;
                        if !out.stderr.is_empty() {
                            if !output.is_empty() && !output.ends_with('\n') {
                                output.push('\n');
                            }
                            output.push_str(&out.stderr);
                        }
                        if out.timed_out {
                            output.push_str("\n(killed: timed out)");
                        }
                        BuildResult {
                            status: if out.exit_code == Some(0) {
                                BuildStatus::Succeeded
                            } else {
                                BuildStatus::Failed
                            },
                            exit_code: out.exit_code,
                            output: bounded(&output, cfg.output_cap),
                            duration_ms: out.duration_ms,
                        }
                    }
                    Err(SandboxError::Cancelled) => return Err(self.stopped(state).await),
                    Err(_) if self.control.token.is_cancelled() => {
                        return Err(self.stopped(state).await);
                    }
                    Err(e) => BuildResult {
                        status: BuildStatus::Failed,
                        exit_code: None,
                        output: format!("the build could not run: {e}"),
                        duration_ms: started.elapsed().as_millis() as u64,
                    },
                };
                store
                    .finish_build(self.run_id, number, self.fence, result.clone())
                    .await
                    .map_err(|e| self.store_error(e))?;
                result
            }
            None => {
                // Finished by an earlier attempt of this run (a replay):
                // reuse its result. Otherwise a newer attempt holds it.
                let jobs = store
                    .builds(self.run_id)
                    .await
                    .map_err(|e| self.store_error(e))?;
                match jobs
                    .into_iter()
                    .find(|j| j.number == number && j.status.is_terminal())
                {
                    Some(j) => BuildResult {
                        status: j.status,
                        exit_code: j.exit_code,
                        output: j.output.unwrap_or_default(),
                        duration_ms: j.duration_ms.unwrap_or(0),
                    },
                    None => {
                        return Err(self.store_error(StoreError::BuildConflict {
                            run_id: self.run_id,
                            number,
                            status: "claimed by another attempt".into(),
                            action: "claim",
                        }));
                    }
                }
            }
        };
        state.builds = number;
        let failed = result.status == BuildStatus::Failed;
        let autofix = failed
            && cfg.autofix
            && number == 1
            && turn < budgets.max_turns
            && state.budget.exhausted(budgets).is_none();
        self.log
            .emit(EngineEvent::BuildFinished {
                number,
                status: result.status.as_str().into(),
                exit_code: result.exit_code,
                output: result.output.clone(),
                duration_ms: result.duration_ms,
                autofix,
            })
            .await;
        let shown = command.join(" ");
        notes.commands.push(CommandNote {
            command: format!("build: {shown}"),
            exit_code: result.exit_code,
            output: bounded(&result.output, NOTE_OUTPUT_CAP),
        });
        Ok(BuildEnd {
            failed,
            autofix: autofix.then(|| {
                let code = result
                    .exit_code
                    .map_or("no exit code".to_string(), |c| format!("exit code {c}"));
                format!(
                    "The project's build (`{shown}`) failed with {code}. Fix the project so \
                     that the build succeeds (it runs again after this turn). Build output:\n{}",
                    result.output
                )
            }),
        })
    }

    /// The end of an attempt whose run token fired.
    async fn stopped(&self, state: &RunState) -> AttemptEnd {
        self.check_stopped(state)
            .await
            .unwrap_or(AttemptEnd::Abandoned)
    }

    async fn effect_end(&self, e: EffectError, state: &RunState) -> AttemptEnd {
        match e {
            EffectError::Stopped => self.stopped(state).await,
            EffectError::Store(e) => self.store_error(e),
            e => AttemptEnd::Retry(e.to_string()),
        }
    }
}

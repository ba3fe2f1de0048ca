//! Side effects of a turn: the lazily provisioned sandbox, the write buffer
//! and its flush scheduler, installs, commands and web search — each keyed by
//! an idempotency key `t{turn}/{index}/{kind}` through `begin_effect` /
//! `complete_effect`, so a resumed run never repeats or loses one.
//!
//! The handler consumes [`EffectItem`]s from a bounded channel fed by the
//! parser loop, one at a time, in order. That makes it the serial
//! per-sandbox queue: an install finishes before a later command starts,
//! and files are flushed before every command and install.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::Utc;
use serde_json::json;
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

use super::config::EngineConfig;
use super::events::{EngineEvent, ToolRun};
use super::prompt::ToolResult;
use super::sink::RunLog;
use crate::{
    EffectRecord, EffectState, ExecOutput, ExecRequest, Fence, FileWrite, InfraError, PendingFile,
    RunId, RunStore, Sandbox, SandboxError, SandboxKey, SandboxPath, SandboxProvider, SandboxSpec,
    StoreError, WebSearch, WriteBuffer,
};

/// Why an effect could not be carried out (the run stops).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EffectError {
    /// The run token fired.
    #[error("stopped")]
    Stopped,
    /// The store refused (lost fence, finished) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sandbox could not be provisioned.
    #[error("sandbox: {0}")]
    Sandbox(SandboxError),
    /// The write buffer failed.
    #[error("write buffer: {0}")]
    Buffer(#[from] InfraError),
}

/// The run's sandbox, provisioned on first use.
pub(crate) struct SandboxSlot {
    provider: Arc<dyn SandboxProvider>,
    key: SandboxKey,
    spec: Mutex<SandboxSpec>,
    cell: OnceCell<Arc<dyn Sandbox>>,
    log: RunLog,
}

impl SandboxSlot {
    pub(crate) fn new(provider: Arc<dyn SandboxProvider>, key: SandboxKey, log: RunLog) -> Self {
        SandboxSlot {
            provider,
            key,
            spec: Mutex::new(SandboxSpec::default()),
            cell: OnceCell::new(),
            log,
        }
    }

    pub(crate) fn key(&self) -> &SandboxKey {
        &self.key
    }

    /// Record the first `<edward_sandbox>` attributes (used if not provisioned yet).
    pub(crate) fn set_spec(&self, spec: SandboxSpec) {
        if self.cell.get().is_none() {
            *self
                .spec
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = spec;
        }
    }

    /// The sandbox, provisioning it (idempotently) on first use.
    pub(crate) async fn get(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Arc<dyn Sandbox>, EffectError> {
        let fut = self.cell.get_or_try_init(|| async {
            let spec = self
                .spec
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let sb = self.provider.provision(&self.key, &spec).await?;
            self.log
                .emit(EngineEvent::SandboxReady {
                    key: self.key.0.clone(),
                    location: sb.location(),
                })
                .await;
            if let crate::Isolation::None { reason } = sb.isolation() {
                self.log
                    .emit(EngineEvent::SandboxNotIsolated {
                        key: self.key.0.clone(),
                        reason,
                    })
                    .await;
            }
            Ok::<_, SandboxError>(sb)
        });
        match cancel.run_until_cancelled(fut).await {
            None => Err(EffectError::Stopped),
            Some(Ok(sb)) => Ok(sb.clone()),
            Some(Err(e)) => Err(EffectError::Sandbox(e)),
        }
    }
}

/// One run's view for the flush scheduler: flushing its pending files and
/// recording each as a completed effect plus a `file_written` event.
pub(crate) struct FlushTarget {
    pub(crate) run_id: RunId,
    pub(crate) fence: Fence,
    pub(crate) slot: Arc<SandboxSlot>,
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) buffer: Arc<dyn WriteBuffer>,
    pub(crate) log: RunLog,
    pub(crate) cancel: CancellationToken,
    /// Debounce policy for files put back after a failed flush.
    policy: crate::FlushPolicy,
    /// Serialises take+write so an older version never overwrites a newer one.
    flushing: tokio::sync::Mutex<()>,
    /// Effect keys waiting for each path.
    keys: Mutex<HashMap<SandboxPath, Vec<String>>>,
    /// Files written (or failed) since the last drain: `(path, bytes, error)`.
    written: Mutex<Vec<(String, u64, Option<String>)>>,
    /// When this worker's own pending files are due.
    due: Mutex<Option<DueAt>>,
}

impl FlushTarget {
    /// `run` is the run and the fence its worker writes with.
    pub(crate) fn new(
        (run_id, fence): (RunId, Fence),
        slot: Arc<SandboxSlot>,
        store: Arc<dyn RunStore>,
        buffer: Arc<dyn WriteBuffer>,
        log: RunLog,
        cancel: CancellationToken,
        policy: crate::FlushPolicy,
    ) -> Self {
        FlushTarget {
            run_id,
            fence,
            slot,
            store,
            buffer,
            log,
            cancel,
            policy,
            flushing: tokio::sync::Mutex::new(()),
            keys: Mutex::new(HashMap::new()),
            written: Mutex::new(Vec::new()),
            due: Mutex::new(None),
        }
    }

    fn lock_keys(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxPath, Vec<String>>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, Vec<(String, u64, Option<String>)>> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take and drain the written-files list.
    pub(crate) fn drain_written(&self) -> Vec<(String, u64, Option<String>)> {
        std::mem::take(&mut *self.lock_written())
    }

    /// Flush everything pending for this sandbox now.
    pub(crate) async fn flush(&self) -> Result<(), EffectError> {
        let _guard = match self.cancel.run_until_cancelled(self.flushing.lock()).await {
            Some(g) => g,
            None => return Err(EffectError::Stopped),
        };
        *self.lock_due() = None;
        let files = self.buffer.take(self.slot.key()).await?;
        if files.is_empty() {
            return Ok(());
        }
        let sandbox = self.slot.get(&self.cancel).await?;
        let writes: Vec<FileWrite> = files
            .iter()
            .map(|f| FileWrite {
                path: f.path.clone(),
                content: f.content.clone(),
            })
            .collect();
        let result = match self
            .cancel
            .run_until_cancelled(sandbox.write_files(writes))
            .await
        {
            None => return Err(EffectError::Stopped),
            Some(r) => r,
        };
        match result {
            Ok(()) => {
                for f in files {
                    self.record_written(f).await?;
                }
                Ok(())
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(run_id = %self.run_id, error = %e, "flush failed; files put back");
                self.buffer
                    .put_back(self.slot.key(), files, Utc::now(), self.policy)
                    .await?;
                self.note_put(self.policy);
                Ok(())
            }
            Err(e) if files.len() > 1 => {
                // One bad file must not fail the others: write each alone
                // (whole-file writes are idempotent) and report each.
                tracing::debug!(run_id = %self.run_id, error = %e, "batch failed; writing files one by one");
                for f in files {
                    let one = vec![FileWrite {
                        path: f.path.clone(),
                        content: f.content.clone(),
                    }];
                    match self
                        .cancel
                        .run_until_cancelled(sandbox.write_files(one))
                        .await
                    {
                        None => return Err(EffectError::Stopped),
                        Some(Ok(())) => self.record_written(f).await?,
                        Some(Err(e)) if e.is_retryable() => {
                            self.buffer
                                .put(self.slot.key(), vec![f], Utc::now(), self.policy)
                                .await?;
                            self.note_put(self.policy);
                        }
                        Some(Err(e)) => self.record_failed(f, &e).await,
                    }
                }
                Ok(())
            }
            Err(e) => {
                for f in files {
                    self.record_failed(f, &e).await;
                }
                Ok(())
            }
        }
    }

    async fn record_written(&self, f: PendingFile) -> Result<(), EffectError> {
        let keys = self.lock_keys().remove(&f.path).unwrap_or_default();
        let bytes = f.content.len() as u64;
        for k in &keys {
            self.store
                .complete_effect(self.run_id, self.fence, k, json!({ "bytes": bytes }))
                .await?;
        }
        self.log
            .emit(EngineEvent::FileWritten {
                key: keys.last().cloned().unwrap_or_default(),
                path: f.path.to_string(),
                bytes,
                reused: false,
            })
            .await;
        self.lock_written().push((f.path.to_string(), bytes, None));
        Ok(())
    }

    async fn record_failed(&self, f: PendingFile, e: &SandboxError) {
        let keys = self.lock_keys().remove(&f.path).unwrap_or_default();
        self.log
            .emit(EngineEvent::FileWriteFailed {
                key: keys.last().cloned().unwrap_or_default(),
                path: f.path.to_string(),
                error: e.to_string(),
            })
            .await;
        self.lock_written()
            .push((f.path.to_string(), 0, Some(e.to_string())));
    }

    /// Drop everything this run left pending (a turn that failed or was
    /// cancelled): nothing stays in the buffer or its due index.
    pub(crate) async fn discard_pending(&self) {
        self.lock_keys().clear();
        if let Err(e) = self.buffer.take(self.slot.key()).await {
            tracing::warn!(run_id = %self.run_id, error = %e, "discarding pending writes failed");
        }
        *self.lock_due() = None;
    }

    fn lock_due(&self) -> std::sync::MutexGuard<'_, Option<DueAt>> {
        self.due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Note a put at `now` (the same rule as `WriteBuffer::put`), so the
    /// scheduler finds this target without the shared due index.
    fn note_put(&self, policy: crate::FlushPolicy) {
        let now = tokio::time::Instant::now();
        let mut due = self.lock_due();
        let first = due.map_or(now, |d| d.first);
        let at = (first + policy.max_wait).min(now + policy.debounce);
        *due = Some(DueAt { first, at });
    }

    /// Whether a local put is due at `now`.
    fn locally_due(&self, now: tokio::time::Instant) -> bool {
        self.lock_due().is_some_and(|d| d.at <= now)
    }
}

/// When a target's pending files are due (tracked per worker).
#[derive(Debug, Clone, Copy)]
struct DueAt {
    first: tokio::time::Instant,
    at: tokio::time::Instant,
}

/// The flush targets of one worker, looked up by the scheduler.
#[derive(Default, Clone)]
pub(crate) struct FlushRegistry {
    targets: Arc<Mutex<HashMap<SandboxKey, Arc<FlushTarget>>>>,
}

impl FlushRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxKey, Arc<FlushTarget>>> {
        self.targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Register; the guard removes it again (only if still the same target).
    pub(crate) fn register(&self, target: Arc<FlushTarget>) -> RegistryGuard {
        let key = target.slot.key().clone();
        self.lock().insert(key.clone(), target.clone());
        RegistryGuard {
            registry: self.clone(),
            key,
            target,
        }
    }

    pub(crate) fn get(&self, key: &SandboxKey) -> Option<Arc<FlushTarget>> {
        self.lock().get(key).cloned()
    }

    /// The targets whose own puts are due at `now`. Filtered under the lock:
    /// a scheduler tick clones only those, not every run's target (a
    /// thousand runs would cost a thousand reference counts and a large
    /// allocation 40 times a second).
    fn locally_due(&self, now: tokio::time::Instant) -> Vec<Arc<FlushTarget>> {
        self.lock()
            .values()
            .filter(|t| t.locally_due(now))
            .cloned()
            .collect()
    }
}

/// Unregisters a flush target when dropped.
pub(crate) struct RegistryGuard {
    registry: FlushRegistry,
    key: SandboxKey,
    target: Arc<FlushTarget>,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let mut map = self.registry.lock();
        if map
            .get(&self.key)
            .is_some_and(|t| Arc::ptr_eq(t, &self.target))
        {
            map.remove(&self.key);
        }
    }
}

/// The flush scheduler: polls `WriteBuffer::due(now)` (the due-time index)
/// and flushes the sandboxes of this worker's runs until `shutdown`.
/// Keys owned by other workers (a shared buffer) are left to them.
pub(crate) async fn flush_scheduler(
    buffer: Arc<dyn WriteBuffer>,
    registry: FlushRegistry,
    poll: std::time::Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if shutdown.run_until_cancelled(tick.tick()).await.is_none() {
            return;
        }
        // This worker's own targets first: keys other workers (or runs that
        // ended elsewhere) left in a shared due index can never crowd them out.
        let now = tokio::time::Instant::now();
        let mut targets: Vec<Arc<FlushTarget>> = registry.locally_due(now);
        match buffer.due(Utc::now(), 256).await {
            Ok(due) => {
                for t in due.iter().filter_map(|k| registry.get(k)) {
                    if !targets.iter().any(|x| Arc::ptr_eq(x, &t)) {
                        targets.push(t);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "write buffer due() failed"),
        }
        let flushes = targets.iter().map(|t| async move {
            if let Err(e) = t.flush().await {
                if !matches!(e, EffectError::Stopped) {
                    tracing::warn!(run_id = %t.run_id, error = %e, "scheduled flush failed");
                }
            }
        });
        futures::future::join_all(flushes).await;
    }
}

/// Work for the side-effect handler, in stream order.
#[derive(Debug)]
pub(crate) enum EffectItem {
    /// `<edward_sandbox>` attributes.
    Sandbox(SandboxSpec),
    /// A whole file (sent at `file_end`).
    File { path: String, content: String },
    /// A file cut off before `</file>`: not written.
    TruncatedFile {
        path: String,
        bytes: u64,
        reason: String,
    },
    /// An install block.
    Install {
        dependencies: Vec<String>,
        framework: Option<String>,
    },
    /// A command.
    Command { command: String, args: Vec<String> },
    /// A web search.
    WebSearch { query: String, max_results: u8 },
}

/// Bytes of a command's output kept in the chat's message of its turn.
pub(crate) const NOTE_OUTPUT_CAP: usize = 2_000;

/// What the handler reports at the end of a turn.
#[derive(Debug, Default)]
pub(crate) struct EffectReport {
    pub results: Vec<ToolResult>,
    pub tool_calls: u32,
    pub skipped_turn_limit: bool,
    pub skipped_run_limit: bool,
    /// Files reused from a previous attempt (not written again).
    pub reused_files: Vec<(String, u64)>,
    /// Installs and commands, compactly, for the chat's message of this turn.
    pub notes: crate::chat::TurnEffects,
}

/// Everything the handler needs.
pub(crate) struct EffectCtx {
    pub run_id: RunId,
    pub fence: Fence,
    pub turn: u32,
    pub store: Arc<dyn RunStore>,
    pub target: Arc<FlushTarget>,
    pub web: Arc<dyn WebSearch>,
    pub config: Arc<EngineConfig>,
    pub log: RunLog,
    pub cancel: CancellationToken,
    /// Tool calls used by earlier turns.
    pub run_tool_calls: u32,
    pub max_per_turn: u32,
    pub max_per_run: u32,
}

fn tool_run_from(out: ExecOutput) -> ToolRun {
    ToolRun {
        exit_code: out.exit_code,
        stdout: out.stdout,
        stderr: out.stderr,
        stdout_truncated: out.stdout_truncated,
        stderr_truncated: out.stderr_truncated,
        timed_out: out.timed_out,
        duration_ms: out.duration_ms,
        error: None,
        reused: false,
    }
}

fn result_body(r: &ToolRun) -> String {
    let mut s = String::new();
    if let Some(e) = &r.error {
        s.push_str(&format!("error: {e}\n"));
    }
    if r.timed_out {
        s.push_str("(killed: timed out)\n");
    }
    if !r.stdout.is_empty() {
        s.push_str("stdout:\n");
        s.push_str(&r.stdout);
        if r.stdout_truncated > 0 {
            s.push_str(&format!("\n[{} more bytes]", r.stdout_truncated));
        }
        s.push('\n');
    }
    if !r.stderr.is_empty() {
        s.push_str("stderr:\n");
        s.push_str(&r.stderr);
        if r.stderr_truncated > 0 {
            s.push_str(&format!("\n[{} more bytes]", r.stderr_truncated));
        }
        s.push('\n');
    }
    s
}

impl EffectCtx {
    fn begin_key(&self, index: u32, kind: &str) -> String {
        format!("t{}/{}/{}", self.turn, index, kind)
    }

    async fn begin(
        &self,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, EffectError> {
        Ok(self
            .store
            .begin_effect(self.run_id, self.fence, key, request)
            .await?)
    }

    /// Process items until the channel closes (end of the turn's stream).
    pub(crate) async fn handle(
        &self,
        mut rx: mpsc::Receiver<EffectItem>,
    ) -> Result<EffectReport, EffectError> {
        let mut report = EffectReport::default();
        let mut index = 0u32;
        while let Some(item) = rx.recv().await {
            if self.cancel.is_cancelled() {
                return Err(EffectError::Stopped);
            }
            match item {
                EffectItem::Sandbox(spec) => self.target.slot.set_spec(spec),
                EffectItem::File { path, content } => {
                    let i = index;
                    index += 1;
                    self.file(i, path, content, &mut report).await?;
                }
                EffectItem::TruncatedFile {
                    path,
                    bytes,
                    reason,
                } => {
                    let i = index;
                    index += 1;
                    self.truncated_file(i, path, bytes, reason, &mut report)
                        .await;
                }
                EffectItem::Install {
                    dependencies,
                    framework,
                } => {
                    let i = index;
                    index += 1;
                    self.install(i, dependencies, framework, &mut report)
                        .await?;
                }
                EffectItem::Command { command, args } => {
                    let i = index;
                    index += 1;
                    self.command(i, command, args, &mut report).await?;
                }
                EffectItem::WebSearch { query, max_results } => {
                    let i = index;
                    index += 1;
                    self.web_search(i, query, max_results, &mut report).await?;
                }
            }
        }
        Ok(report)
    }

    async fn file(
        &self,
        index: u32,
        path: String,
        content: String,
        report: &mut EffectReport,
    ) -> Result<(), EffectError> {
        let key = self.begin_key(index, "write");
        let sp = match SandboxPath::new(&path) {
            Ok(p) => p,
            Err(e) => {
                self.log
                    .emit(EngineEvent::FileWriteFailed {
                        key,
                        path: path.clone(),
                        error: e.to_string(),
                    })
                    .await;
                report.results.push(ToolResult {
                    index,
                    title: format!("file {path}: not written"),
                    exit_code: None,
                    body: e.to_string(),
                });
                return Ok(());
            }
        };
        let bytes = content.len() as u64;
        let request = json!({
            "path": sp.as_str(),
            "bytes": bytes,
            "fnv1a": format!("{:016x}", crate::hash::fnv1a64(content.as_bytes())),
        });
        let rec = self.begin(&key, request.clone()).await?;
        if rec.state == EffectState::Completed
            && rec.request == request
            && self.still_there(&sp, &content).await?
        {
            // Written by a previous attempt and still in the workspace:
            // reuse, do not write again.
            self.log
                .emit(EngineEvent::FileWritten {
                    key,
                    path: sp.to_string(),
                    bytes,
                    reused: true,
                })
                .await;
            report.reused_files.push((sp.to_string(), bytes));
            return Ok(());
        }
        self.target
            .lock_keys()
            .entry(sp.clone())
            .or_default()
            .push(key);
        self.target
            .buffer
            .put(
                self.target.slot.key(),
                vec![PendingFile {
                    path: sp,
                    content: Bytes::from(content),
                }],
                Utc::now(),
                self.config.flush,
            )
            .await?;
        self.target.note_put(self.config.flush);
        Ok(())
    }

    /// Whether the workspace still holds `content` at `path` (a resumed run
    /// re-checks what a previous attempt recorded as written: the workspace
    /// may have been wiped or changed since).
    async fn still_there(&self, path: &SandboxPath, content: &str) -> Result<bool, EffectError> {
        let sandbox = self.target.slot.get(&self.cancel).await?;
        match self
            .cancel
            .run_until_cancelled(sandbox.read_file(path))
            .await
        {
            None => Err(EffectError::Stopped),
            Some(Ok(bytes)) => Ok(bytes.len() == content.len() && bytes == content.as_bytes()),
            Some(Err(_)) => Ok(false),
        }
    }

    /// A file the stream cut off: recorded (event + tool result), not
    /// written, so a complete earlier version is never replaced by a prefix.
    async fn truncated_file(
        &self,
        index: u32,
        path: String,
        bytes: u64,
        reason: String,
        report: &mut EffectReport,
    ) {
        let key = self.begin_key(index, "write");
        if reason == "file_too_large" {
            let limit = self.config.max_file_bytes;
            let error = format!("{bytes} bytes is over the {limit}-byte file limit");
            self.log
                .emit(EngineEvent::FileWriteFailed {
                    key,
                    path: path.clone(),
                    error: error.clone(),
                })
                .await;
            report.results.push(ToolResult {
                index,
                title: format!("file {path}: NOT written"),
                exit_code: None,
                body: format!("{error}; split it into smaller files."),
            });
            return;
        }
        let why = match reason.as_str() {
            "length" => "the model hit its output token limit",
            "output_budget" => "the run's output-token budget cut the stream",
            "turn_output_cap" => "the turn's output passed its byte limit",
            "stop" | "stream_ended" => "the response ended before </file>",
            _ => "the stream ended before </file>",
        };
        self.log
            .emit(EngineEvent::FileTruncated {
                key,
                path: path.clone(),
                bytes,
                finish_reason: reason.clone(),
            })
            .await;
        report.results.push(ToolResult {
            index,
            title: format!("file {path}: truncated, NOT written"),
            exit_code: None,
            body: format!(
                "Only {bytes} bytes of {path} arrived ({why}; finish reason `{reason}`). \
                 The file was not written: any previous content is unchanged. \
                 Write the complete file again (split very large files)."
            ),
        });
    }

    /// Budget check before a tool runs: `false` = skipped (a `tool_skipped`
    /// event and a result for the model were recorded).
    async fn admit_tool(
        &self,
        index: u32,
        key: &str,
        tool: &str,
        detail: &str,
        report: &mut EffectReport,
    ) -> bool {
        let budget = if report.tool_calls >= self.max_per_turn {
            report.skipped_turn_limit = true;
            "tool_calls_per_turn"
        } else if self.run_tool_calls + report.tool_calls >= self.max_per_run {
            report.skipped_run_limit = true;
            "tool_calls_per_run"
        } else {
            report.tool_calls += 1;
            return true;
        };
        self.log
            .emit(EngineEvent::ToolSkipped {
                key: key.to_string(),
                tool: tool.to_string(),
                budget: budget.to_string(),
                detail: detail.to_string(),
            })
            .await;
        report.results.push(ToolResult {
            index,
            title: format!("{tool} `{detail}`: skipped ({budget} budget used up)"),
            exit_code: None,
            body: String::new(),
        });
        false
    }

    async fn exec(
        &self,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        timeout: std::time::Duration,
    ) -> Result<ToolRun, EffectError> {
        let sandbox = self.target.slot.get(&self.cancel).await?;
        let req = ExecRequest {
            program: program.clone(),
            args,
            cwd: None,
            env,
            timeout,
            output_cap: self.config.commands.output_cap,
        };
        // The sandbox kills the process when this token fires.
        match sandbox.exec(req, self.cancel.child_token()).await {
            Ok(out) => Ok(tool_run_from(out)),
            Err(SandboxError::Cancelled) => Err(EffectError::Stopped),
            Err(e) if self.cancel.is_cancelled() => {
                tracing::debug!(error = %e, "exec ended by cancel");
                Err(EffectError::Stopped)
            }
            Err(e) => Ok(ToolRun {
                error: Some(e.to_string()),
                ..Default::default()
            }),
        }
    }

    async fn install(
        &self,
        index: u32,
        dependencies: Vec<String>,
        framework: Option<String>,
        report: &mut EffectReport,
    ) -> Result<(), EffectError> {
        let key = self.begin_key(index, "install");
        let detail = dependencies.join(" ");
        if dependencies.is_empty() {
            return Ok(());
        }
        if !self
            .admit_tool(index, &key, "install", &detail, report)
            .await
        {
            return Ok(());
        }
        let manager = self.config.package_manager;
        let request = json!({ "manager": manager.as_str(), "dependencies": dependencies });
        self.target.flush().await?;
        let rec = self.begin(&key, request.clone()).await?;
        self.log
            .emit(EngineEvent::InstallStarted {
                key: key.clone(),
                manager: manager.as_str().into(),
                dependencies: dependencies.clone(),
                framework: framework.clone(),
                attempt: rec.attempts,
            })
            .await;
        let result = if let Some(prev) = reusable(&rec, &request) {
            prev
        } else {
            let r = match manager.install_argv(&dependencies) {
                None => ToolRun {
                    error: Some("installs are disabled (package manager: none)".into()),
                    ..Default::default()
                },
                Some((program, mut args)) => {
                    // Lifecycle scripts of packages (and of the model's own
                    // package.json) are code: run them only where allowed.
                    let sandbox = self.target.slot.get(&self.cancel).await?;
                    let scripts_ok = self
                        .config
                        .commands
                        .scripts
                        .allows(sandbox.isolation().is_isolated());
                    let mut env = Vec::new();
                    if !scripts_ok {
                        args.insert(1, "--ignore-scripts".into());
                        env.push(("npm_config_ignore_scripts".into(), "true".into()));
                    }
                    self.exec(program, args, env, self.config.commands.install_timeout)
                        .await?
                }
            };
            self.complete_tool_run(&key, &r).await?;
            r
        };
        report.notes.installs.push(crate::chat::InstallNote {
            packages: dependencies,
            framework,
            exit_code: result.exit_code,
        });
        report.results.push(ToolResult {
            index,
            title: format!("install ({}): {detail}", manager.as_str()),
            exit_code: result.exit_code,
            body: result_body(&result),
        });
        self.log
            .emit(EngineEvent::InstallFinished { key, result })
            .await;
        Ok(())
    }

    async fn command(
        &self,
        index: u32,
        command: String,
        args: Vec<String>,
        report: &mut EffectReport,
    ) -> Result<(), EffectError> {
        let key = self.begin_key(index, "command");
        let shown = std::iter::once(command.as_str())
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        let prepared = match self.prepare_command(&command, &args).await? {
            Ok(p) => Some(p),
            Err(reason) => {
                self.reject(index, key.clone(), &command, &args, &shown, reason, report)
                    .await;
                None
            }
        };
        let Some(prepared) = prepared else {
            return Ok(());
        };
        if !self
            .admit_tool(index, &key, "command", &shown, report)
            .await
        {
            return Ok(());
        }
        let request = json!({ "command": command, "args": args });
        // Files streamed before the command are in the sandbox (and their
        // `file_written` events precede `command_started`).
        self.target.flush().await?;
        let rec = self.begin(&key, request.clone()).await?;
        self.log
            .emit(EngineEvent::CommandStarted {
                key: key.clone(),
                command: command.clone(),
                args: args.clone(),
                attempt: rec.attempts,
            })
            .await;
        let result = if let Some(prev) = reusable(&rec, &request) {
            prev
        } else {
            let r = self
                .exec(
                    prepared.program,
                    prepared.args,
                    prepared.env,
                    self.config.commands.timeout,
                )
                .await?;
            self.complete_tool_run(&key, &r).await?;
            r
        };
        let body = result_body(&result);
        report.notes.commands.push(crate::chat::CommandNote {
            command: shown.clone(),
            exit_code: result.exit_code,
            output: super::prompt::bounded(&body, NOTE_OUTPUT_CAP),
        });
        report.results.push(ToolResult {
            index,
            title: format!("command `{shown}`"),
            exit_code: result.exit_code,
            body,
        });
        self.log
            .emit(EngineEvent::CommandFinished {
                key,
                command,
                result,
            })
            .await;
        Ok(())
    }

    /// The command as it will run, or why it may not: the policy (given
    /// whether the sandbox isolates) and, for git, the workspace's config.
    async fn prepare_command(
        &self,
        command: &str,
        args: &[String],
    ) -> Result<Result<super::config::PreparedCommand, String>, EffectError> {
        let policy = &self.config.commands;
        // Checks that do not depend on the sandbox first: a refused command
        // never provisions one.
        if let Err(reason) = policy.prepare(command, args, true) {
            return Ok(Err(reason));
        }
        let sandbox = self.target.slot.get(&self.cancel).await?;
        let prepared = match policy.prepare(command, args, sandbox.isolation().is_isolated()) {
            Ok(p) => p,
            Err(reason) => return Ok(Err(reason)),
        };
        if prepared.check_git_config {
            // Files streamed so far may include `.git/config`.
            self.target.flush().await?;
            if let Some(reason) = git_hazard(&*sandbox).await {
                return Ok(Err(reason));
            }
        }
        Ok(Ok(prepared))
    }

    #[allow(clippy::too_many_arguments)]
    async fn reject(
        &self,
        index: u32,
        key: String,
        command: &str,
        args: &[String],
        shown: &str,
        reason: String,
        report: &mut EffectReport,
    ) {
        {
            self.log
                .emit(EngineEvent::CommandRejected {
                    key,
                    command: command.to_string(),
                    args: args.to_vec(),
                    reason: reason.clone(),
                })
                .await;
            report.notes.commands.push(crate::chat::CommandNote {
                command: shown.to_string(),
                exit_code: None,
                output: format!("rejected: {reason}"),
            });
            report.results.push(ToolResult {
                index,
                title: format!("command `{shown}`: rejected"),
                exit_code: None,
                body: reason,
            });
        }
    }

    async fn web_search(
        &self,
        index: u32,
        query: String,
        max_results: u8,
        report: &mut EffectReport,
    ) -> Result<(), EffectError> {
        let key = self.begin_key(index, "web_search");
        if !self
            .admit_tool(index, &key, "web_search", &query, report)
            .await
        {
            return Ok(());
        }
        let request = json!({ "query": query, "max_results": max_results });
        let rec = self.begin(&key, request.clone()).await?;
        self.log
            .emit(EngineEvent::WebSearchStarted {
                key: key.clone(),
                query: query.clone(),
            })
            .await;
        let outcome: Result<Vec<crate::SearchResult>, String> = match (&rec.state, &rec.result) {
            (EffectState::Completed, Some(v)) if rec.request == request => {
                serde_json::from_value(v["results"].clone()).map_err(|e| e.to_string())
            }
            _ => {
                let r = match self
                    .cancel
                    .run_until_cancelled(self.web.search(&query, max_results, self.cancel.clone()))
                    .await
                {
                    None => return Err(EffectError::Stopped),
                    Some(r) => r.map_err(|e| e.to_string()),
                };
                let stored = match &r {
                    Ok(results) => json!({ "results": results }),
                    Err(e) => json!({ "error": e }),
                };
                self.store
                    .complete_effect(self.run_id, self.fence, &key, stored)
                    .await?;
                r
            }
        };
        let (count, error, body) = match &outcome {
            Ok(results) => (
                results.len(),
                None,
                results
                    .iter()
                    .map(|r| format!("- {} ({})\n  {}", r.title, r.url, r.snippet))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            Err(e) => (0, Some(e.clone()), format!("error: {e}")),
        };
        self.log
            .emit(EngineEvent::WebSearchFinished {
                key,
                results: count,
                error,
            })
            .await;
        report.results.push(ToolResult {
            index,
            title: format!("web search `{query}`"),
            exit_code: None,
            body,
        });
        Ok(())
    }
}

/// A completed record for the same request: its result, marked reused.
impl EffectCtx {
    /// Record an install's or command's result under its idempotency key.
    async fn complete_tool_run(&self, key: &str, run: &ToolRun) -> Result<(), StoreError> {
        // `ToolRun` holds only strings, integers and booleans: serialising it
        // cannot fail, so `Null` here is unreachable rather than a silent drop.
        let result = serde_json::to_value(run).unwrap_or(serde_json::Value::Null);
        self.store
            .complete_effect(self.run_id, self.fence, key, result)
            .await
    }
}

/// Why the workspace's git metadata may not be used by a git command, if
/// it may not: a `.git` file (a link to another repository), a
/// `commondir`/`alternates` pointing elsewhere, or configuration that runs
/// programs ([`super::config::git_config_hazard`]).
async fn git_hazard(sandbox: &dyn Sandbox) -> Option<String> {
    let path = |p: &str| SandboxPath::new(p).ok();
    for (p, what) in [
        (".git/commondir", "links to another repository"),
        (
            ".git/objects/info/alternates",
            "borrows objects from elsewhere",
        ),
    ] {
        if let Some(sp) = path(p) {
            if sandbox.read_file(&sp).await.is_ok() {
                return Some(format!("`{p}` {what}; git is not allowed here"));
            }
        }
    }
    let config = path(".git/config")?;
    match sandbox.read_file(&config).await {
        Ok(bytes) => super::config::git_config_hazard(&String::from_utf8_lossy(&bytes)),
        Err(SandboxError::NotFound { .. }) => {
            // No repository yet, or `.git` is a file (`gitdir:` link).
            let dot_git = path(".git")?;
            match sandbox.read_file(&dot_git).await {
                Ok(_) => Some("`.git` is a file linking to another repository".into()),
                Err(_) => None,
            }
        }
        Err(e) => Some(format!("`.git/config` cannot be checked: {e}")),
    }
}

fn reusable(rec: &EffectRecord, request: &serde_json::Value) -> Option<ToolRun> {
    if rec.state != EffectState::Completed || &rec.request != request {
        return None;
    }
    let mut r: ToolRun = serde_json::from_value(rec.result.clone()?).ok()?;
    r.reused = true;
    Some(r)
}

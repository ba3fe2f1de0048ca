//! The worker: claims runs with a lease, runs up to N at once, heartbeats
//! each lease at a third of its length, checks run status periodically,
//! routes cancel signals, and runs the flush scheduler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Inner;
use super::effects::{FlushRegistry, flush_scheduler};
use super::run::{AttemptEnd, RunControl, StopCause, execute};
use crate::{Lease, QueueError, RetryOutcome, RetryPolicy, RunId};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Owner name written into leases (unique per worker).
    pub id: String,
    /// Runs executed at once.
    pub concurrency: usize,
    /// Lease length; heartbeats every third of it.
    pub lease: Duration,
    /// How often to look for work when idle (submits on the same engine wake it at once).
    pub poll_interval: Duration,
    /// How often each running run re-reads its status (backup for lost
    /// cancels: a run finished elsewhere is stopped without writing).
    pub status_check_interval: Duration,
    /// Retry policy for attempts that failed on infrastructure.
    pub retry: RetryPolicy,
    /// Fire to stop: in-flight runs are abandoned without writing (no ack);
    /// their leases lapse and another worker resumes them.
    pub shutdown: CancellationToken,
    /// How often queued runs missing from the queue are enqueued again
    /// (default 30 s; zero turns the reconciler off).
    pub reconcile_interval: Duration,
}

impl WorkerConfig {
    /// Defaults: 4 concurrent runs, 30 s lease, 200 ms poll, 2 s status check.
    pub fn new(shutdown: CancellationToken) -> Self {
        WorkerConfig {
            id: format!("worker-{}", uuid::Uuid::new_v4()),
            concurrency: 4,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(200),
            status_check_interval: Duration::from_secs(2),
            retry: RetryPolicy::default(),
            shutdown,
            reconcile_interval: Duration::from_secs(30),
        }
    }

    /// Set the worker id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Set the concurrency.
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Set the status check interval.
    pub fn with_status_check(mut self, every: Duration) -> Self {
        self.status_check_interval = every;
        self
    }

    /// Set the lease length.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Range checks: a zero lease or interval would busy-loop or lose every lease.
    pub fn validate(&self) -> Result<(), super::BuildError> {
        let invalid = |field: &str, reason: &str| super::BuildError::InvalidSetting {
            field: field.to_string(),
            reason: reason.to_string(),
        };
        if self.id.trim().is_empty() {
            return Err(invalid("worker.id", "must not be empty"));
        }
        if self.concurrency == 0 {
            return Err(invalid("worker.concurrency", "must be at least 1"));
        }
        if self.lease < Duration::from_millis(30) {
            return Err(invalid("worker.lease", "must be at least 30 ms"));
        }
        for (field, d) in [
            ("worker.poll_interval", self.poll_interval),
            ("worker.status_check_interval", self.status_check_interval),
        ] {
            if d.is_zero() {
                return Err(invalid(field, "must be greater than zero"));
            }
        }
        Ok(())
    }
}

type Controls = Arc<Mutex<HashMap<RunId, Arc<RunControl>>>>;

fn lock(c: &Controls) -> std::sync::MutexGuard<'_, HashMap<RunId, Arc<RunControl>>> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Claims taken in one `claim_many` at most.
const CLAIM_BATCH: usize = 64;

pub(crate) async fn run_worker(inner: Arc<Inner>, cfg: WorkerConfig) {
    let span = tracing::info_span!("worker", worker = %cfg.id);
    worker_loop(inner, cfg).instrument(span).await
}

async fn worker_loop(inner: Arc<Inner>, cfg: WorkerConfig) {
    let controls: Controls = Arc::default();
    let registry = FlushRegistry::default();
    let aux_stop = cfg.shutdown.child_token();

    let scheduler = flush_scheduler(
        inner.write_buffer.clone(),
        registry.clone(),
        inner.config.flush_poll,
        aux_stop.clone(),
    );
    let cancels = cancel_listener(inner.clone(), controls.clone(), aux_stop.clone());
    let (retention, reaper) = super::retention::reaper(inner.clone(), aux_stop.clone());
    let reconcile = reconciler(inner.clone(), cfg.reconcile_interval, aux_stop.clone());
    let main = async {
        let mut runs: JoinSet<()> = JoinSet::new();
        loop {
            while runs.try_join_next().is_some() {}
            if cfg.shutdown.is_cancelled() {
                break;
            }
            if runs.len() < cfg.concurrency {
                // Several at once: a store that claims a batch in one round
                // trip starts a burst of submitted runs quickly.
                let room = (cfg.concurrency - runs.len()).min(CLAIM_BATCH);
                match inner.queue.claim_many(&cfg.id, cfg.lease, room).await {
                    Ok(leases) if !leases.is_empty() => {
                        for lease in leases {
                            tracing::debug!(run_id = %lease.run_id, attempt = lease.attempt, "claimed");
                            runs.spawn(run_task(
                                inner.clone(),
                                cfg.clone(),
                                lease,
                                controls.clone(),
                                registry.clone(),
                                retention.clone(),
                            ));
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "claim failed"),
                }
            }
            tokio::select! {
                _ = cfg.shutdown.cancelled() => break,
                _ = runs.join_next(), if !runs.is_empty() => {}
                _ = inner.wake.notified() => {}
                _ = tokio::time::sleep(cfg.poll_interval) => {}
            }
        }
        for c in lock(&controls).values() {
            c.stop(StopCause::Shutdown);
        }
        while runs.join_next().await.is_some() {}
        aux_stop.cancel();
    };
    tokio::join!(scheduler, cancels, reaper, reconcile, main);
}

async fn cancel_listener(inner: Arc<Inner>, controls: Controls, stop: CancellationToken) {
    let mut stream = match inner.notifier.subscribe_cancels().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "no cancel subscription; relying on status checks");
            return;
        }
    };
    while let Some(Some(run_id)) = stop.run_until_cancelled(stream.next()).await {
        if let Some(c) = lock(&controls).get(&run_id) {
            tracing::info!(%run_id, "cancel requested");
            c.stop(StopCause::Cancelled);
        }
    }
}

async fn run_task(
    inner: Arc<Inner>,
    cfg: WorkerConfig,
    lease: Lease,
    controls: Controls,
    registry: FlushRegistry,
    retention: super::retention::RetentionHandle,
) {
    let run_id = lease.run_id;
    let control = Arc::new(RunControl::new());
    lock(&controls).insert(run_id, control.clone());
    let current = Arc::new(Mutex::new(lease.clone()));

    let heartbeat = {
        let inner = inner.clone();
        let control = control.clone();
        let current = current.clone();
        let every = cfg.lease / 3;
        let lease_for = cfg.lease;
        async move {
            loop {
                tokio::time::sleep(every).await;
                let held = current
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                match inner.queue.heartbeat(&held, lease_for).await {
                    Ok(l) => {
                        *current
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = l
                    }
                    Err(QueueError::LeaseLost { .. }) => {
                        tracing::warn!(%run_id, "lease lost; stopping");
                        control.stop(StopCause::Lost);
                    }
                    Err(e) => {
                        tracing::warn!(%run_id, error = %e, "heartbeat failed");
                        if chrono::Utc::now() >= held.expires_at {
                            control.stop(StopCause::Lost);
                        }
                    }
                }
            }
        }
    };
    let status_check = {
        let inner = inner.clone();
        let control = control.clone();
        let every = cfg.status_check_interval;
        async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(Some(run)) = inner.store.get_run(run_id).await {
                    if run.status.is_terminal() {
                        // Finished elsewhere (forced cancel, reaper): write nothing more.
                        control.stop(StopCause::FinishedElsewhere);
                    } else if run.cancel_requested_at.is_some() {
                        // A durable cancel request whose signal did not reach us.
                        control.stop(StopCause::Cancelled);
                    }
                }
            }
        }
    };
    let attempt = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(execute(
        inner.clone(),
        lease.clone(),
        cfg.id.clone(),
        control.clone(),
        registry,
        cfg.retry.max_attempts.max(1),
    )));
    let end = tokio::select! {
        end = attempt => match end {
            Ok(end) => end,
            Err(panic) => {
                // A panic (in a model client, a sandbox, …) is recorded and
                // retried with backoff; the abnormal-attempt cap ends the run.
                let message = panic_message(&*panic);
                tracing::error!(%run_id, panic = %message, "run attempt panicked");
                record_attempt_failed(&inner, &lease, "panic", &message).await;
                AttemptEnd::Retry(format!("panic: {message}"))
            }
        },
        // Neither ever ends. Gated together: two timers, polled when one of
        // them fires rather than on every wake-up of the run (once per
        // streamed chunk).
        _ = control.gates.gate(async { tokio::join!(heartbeat, status_check) }) => {
            AttemptEnd::Abandoned
        }
    };
    lock(&controls).remove(&run_id);
    let held = current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    match end {
        AttemptEnd::Finished => {
            if let Err(e) = inner.queue.ack(&held).await {
                tracing::warn!(%run_id, error = %e, "ack failed");
            }
            retention.finished(run_id);
        }
        AttemptEnd::Abandoned => tracing::info!(%run_id, "run abandoned on this worker"),
        AttemptEnd::Defer(msg) => {
            tracing::debug!(%run_id, reason = %msg, "run deferred");
            if let Err(e) = inner
                .queue
                .retry(&held, &msg, super::run::DEFER_POLICY)
                .await
            {
                tracing::warn!(%run_id, error = %e, "could not defer the run");
            }
        }
        AttemptEnd::Retry(msg) | AttemptEnd::Fail(msg) => {
            tracing::warn!(%run_id, error = %msg, "attempt failed; retrying");
            match inner.queue.retry(&held, &msg, cfg.retry).await {
                Ok(RetryOutcome::DeadLettered) => {
                    // Out of attempts: the run ends `failed` through the
                    // single terminal path (its events end, its admission
                    // slot is freed) instead of staying `running`.
                    let reason = format!(
                        "error: dead-lettered after {} attempts: {msg}",
                        held.attempt
                    );
                    match super::run::finish_run(
                        &*inner.store,
                        &*inner.notifier,
                        run_id,
                        None,
                        crate::RunStatus::Failed,
                        &reason,
                        super::run::Summary::default(),
                    )
                    .await
                    {
                        Ok(_) | Err(crate::StoreError::Finished { .. }) => {}
                        Err(e) => {
                            tracing::error!(%run_id, error = %e, "could not finish a dead-lettered run")
                        }
                    }
                }
                Ok(RetryOutcome::Scheduled { .. }) => {}
                Err(e) => tracing::warn!(%run_id, error = %e, "retry failed"),
            }
        }
    }
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic payload)".into())
}

/// Record why an attempt ended abnormally, as an `attempt_failed` event.
async fn record_attempt_failed(inner: &Inner, lease: &Lease, cause: &str, error: &str) {
    let event = super::events::EngineEvent::AttemptFailed {
        attempt: lease.attempt,
        cause: cause.to_string(),
        error: error.chars().take(2048).collect(),
    }
    .into_new_event();
    match inner
        .store
        .append_events(lease.run_id, lease.fence, vec![event])
        .await
    {
        Ok(written) => {
            if let Some(last) = written.last() {
                let _ = inner.notifier.notify_events(lease.run_id, last.seq).await;
            }
        }
        Err(e) => {
            tracing::warn!(run_id = %lease.run_id, error = %e, "could not record the failed attempt")
        }
    }
}

/// Queued runs with no queue entry (a crash between admission and enqueue,
/// where the store does not hold the queue) are enqueued again. Enqueuing an
/// id that is queued already is a no-op, so this is safe to run anywhere.
async fn reconciler(inner: Arc<Inner>, every: Duration, stop: CancellationToken) {
    if every.is_zero() {
        return;
    }
    loop {
        if stop
            .run_until_cancelled(tokio::time::sleep(every))
            .await
            .is_none()
        {
            return;
        }
        let runs = match inner.store.list_runs(crate::RunStatus::Queued, 1000).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reconciler: listing queued runs failed");
                continue;
            }
        };
        let older_than = chrono::Utc::now()
            - chrono::Duration::from_std(every).unwrap_or(chrono::Duration::zero());
        for run in runs.into_iter().filter(|r| r.created_at < older_than) {
            if let Err(e) = inner.queue.enqueue(run.id).await {
                tracing::warn!(run_id = %run.id, error = %e, "reconciler: enqueue failed");
            }
        }
    }
}

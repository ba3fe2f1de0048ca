//! Sandbox retention: destroy the sandboxes of finished runs after
//! [`EngineConfig::sandbox_retention`](super::EngineConfig::sandbox_retention).
//!
//! Each worker keeps a due-time heap of the runs it finished (and, when it
//! starts, of recently finished runs found in the store), and destroys their
//! sandboxes when due. Destroy is idempotent, so two workers reaping the same
//! run is harmless.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Engine, Inner};
use crate::{RunId, RunStatus};

/// How many finished runs of each terminal status the start-up sweep reads.
const SWEEP_LIMIT: usize = 10_000;

/// Sends finished runs to the reaper (a no-op when retention is off).
#[derive(Clone)]
pub(crate) struct RetentionHandle {
    tx: Option<mpsc::UnboundedSender<(tokio::time::Instant, RunId)>>,
    retention: Duration,
}

impl RetentionHandle {
    /// The run just finished: destroy its sandbox after the retention time.
    pub(crate) fn finished(&self, run_id: RunId) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((tokio::time::Instant::now() + self.retention, run_id));
        }
    }
}

/// The reaper task and its handle. The task ends when `stop` fires.
pub(crate) fn reaper(
    inner: Arc<Inner>,
    stop: CancellationToken,
) -> (RetentionHandle, impl Future<Output = ()>) {
    let retention = inner.config.sandbox_retention;
    let (tx, rx) = match retention {
        Some(_) => {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let handle = RetentionHandle {
        tx,
        retention: retention.unwrap_or_default(),
    };
    let task = async move {
        let (Some(retention), Some(rx)) = (retention, rx) else {
            return;
        };
        stop.run_until_cancelled(reap(inner, retention, rx)).await;
    };
    (handle, task)
}

async fn reap(
    inner: Arc<Inner>,
    retention: Duration,
    mut rx: mpsc::UnboundedReceiver<(tokio::time::Instant, RunId)>,
) {
    let mut due: BinaryHeap<Reverse<(tokio::time::Instant, RunId)>> = BinaryHeap::new();
    // Runs finished before this worker started (by it in an earlier life, or
    // by others): schedule by their finish time.
    for status in [
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ] {
        match inner.store.list_runs(status, SWEEP_LIMIT).await {
            Ok(runs) => {
                for run in runs {
                    let Some(finished) = run.finished_at else {
                        continue;
                    };
                    let age = (Utc::now() - finished).to_std().unwrap_or_default();
                    let wait = retention.saturating_sub(age);
                    due.push(Reverse((tokio::time::Instant::now() + wait, run.id)));
                }
            }
            Err(e) => tracing::warn!(error = %e, "retention sweep could not list runs"),
        }
    }
    loop {
        let next = due.peek().map(|Reverse((at, _))| *at);
        tokio::select! {
            msg = rx.recv() => match msg {
                Some((at, run_id)) => due.push(Reverse((at, run_id))),
                None => return,
            },
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(Reverse((_, run_id))) = due.pop() {
                    let Some(key) = idle_chat_key(&inner, run_id).await else {
                        continue;
                    };
                    match inner.sandboxes.destroy(&key).await {
                        Ok(()) => tracing::debug!(%run_id, "sandbox retention: destroyed"),
                        Err(e) => tracing::warn!(%run_id, error = %e, "sandbox retention: destroy failed"),
                    }
                }
            }
        }
    }
}

/// The sandbox key of `run_id`'s chat if `run_id` is the chat's newest run
/// and has finished: a chat's workspace is reaped only `retention` after
/// its last run (an older run's timer leaves it alone).
async fn idle_chat_key(inner: &Inner, run_id: RunId) -> Option<crate::SandboxKey> {
    let run = inner.store.get_run(run_id).await.ok()??;
    if !run.status.is_terminal() {
        return None;
    }
    let newest = inner
        .store
        .list_user_runs(
            &run.user_id,
            &crate::RunFilter::new().chat(run.chat_id.clone()),
            None,
            1,
        )
        .await
        .ok()?;
    (newest.first().map(|r| r.id) == Some(run_id)).then(|| Engine::sandbox_key(&run))
}

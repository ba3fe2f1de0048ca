//! Helpers shared by the SQLite and Postgres adapters: options, the checks
//! that precede every write (so both backends refuse the same things, in the
//! same order as the in-memory store), integer conversions and backoff jitter.

use std::time::Duration;

use edward_core::{
    Checkpoint, EffectState, Fence, NewEvent, QueueError, RUN_FINISHED, RetryPolicy, RunId,
    RunStatus, StoreError,
};
use rand::Rng;

/// Options common to both backends.
///
/// ```
/// let options = edward_store::StoreOptions::default().migrate(false).max_connections(4);
/// assert!(!options.run_migrations);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Run the embedded migrations on connect (default `true`).
    pub run_migrations: bool,
    /// Pool size (default 8). For SQLite this is the number of readers;
    /// writes go through one connection.
    pub max_connections: u32,
    /// How long to wait for a pooled connection (and, on SQLite, for the
    /// write lock held by another process) before failing retryably.
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            run_migrations: true,
            max_connections: 8,
            acquire_timeout: Duration::from_secs(30),
        }
    }
}

impl StoreOptions {
    /// Turn migrations on connect on or off.
    pub fn migrate(mut self, run: bool) -> Self {
        self.run_migrations = run;
        self
    }

    /// Set the pool size (at least 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Set the acquire timeout.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }
}

/// Stored `u64` → SQL `BIGINT`.
pub(crate) fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::permanent(format!("{what} {value} out of range")))
}

/// SQL `BIGINT` → `u64`.
pub(crate) fn to_u64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative {what} {value}")))
}

pub(crate) fn parse_effect_state(s: &str) -> Result<EffectState, StoreError> {
    match s {
        "started" => Ok(EffectState::Started),
        "completed" => Ok(EffectState::Completed),
        other => Err(StoreError::Corrupt(format!("effect state `{other}`"))),
    }
}

pub(crate) fn parse_status(s: &str) -> Result<RunStatus, StoreError> {
    s.parse::<RunStatus>().map_err(StoreError::Corrupt)
}

/// `append_events` may not carry the terminal event: only `finish_run` appends it.
pub(crate) fn check_append_events(run_id: RunId, events: &[NewEvent]) -> Result<(), StoreError> {
    if events.iter().any(|e| e.kind == RUN_FINISHED) {
        return Err(StoreError::permanent(format!(
            "run {run_id}: `{RUN_FINISHED}` may only be appended by finish_run"
        )));
    }
    Ok(())
}

/// Decide whether a `finish_run` may proceed on a run in `status` with `fence`.
/// Same order of checks as the in-memory store: finished, fence, transition, events.
pub(crate) fn check_finish(
    run_id: RunId,
    current_status: RunStatus,
    current_fence: Fence,
    given_fence: Option<Fence>,
    to: RunStatus,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    if current_status.is_terminal() {
        return Err(StoreError::Finished { run_id });
    }
    if let Some(given) = given_fence {
        check_fence(run_id, current_fence, given)?;
    }
    if !to.is_terminal() {
        return Err(StoreError::InvalidTransition {
            run_id,
            from: current_status,
            to,
        });
    }
    let ok = match events.split_last() {
        Some((last, rest)) => {
            last.kind == RUN_FINISHED && !rest.iter().any(|e| e.kind == RUN_FINISHED)
        }
        None => false,
    };
    if !ok {
        return Err(StoreError::permanent(format!(
            "run {run_id}: finish_run needs exactly one `{RUN_FINISHED}` event, last"
        )));
    }
    Ok(())
}

/// `StaleFence` when `given` is older than the run's fence.
pub(crate) fn check_fence(run_id: RunId, current: Fence, given: Fence) -> Result<(), StoreError> {
    if given < current {
        return Err(StoreError::StaleFence {
            run_id,
            given,
            current,
        });
    }
    Ok(())
}

/// The explanation for a conditional write that matched no row.
pub(crate) fn diagnose(
    run_id: RunId,
    found: Option<(RunStatus, Fence)>,
    given: Fence,
    check_finished: bool,
) -> StoreError {
    match found {
        None => StoreError::NotFound { run_id },
        Some((status, _)) if check_finished && status.is_terminal() => {
            StoreError::Finished { run_id }
        }
        Some((_, current)) if given < current => StoreError::StaleFence {
            run_id,
            given,
            current,
        },
        // The row changed between the write and the read: report it as a
        // retryable conflict rather than guess.
        Some(_) => StoreError::transient(format!("run {run_id}: concurrent update, retry")),
    }
}

/// The retry delay after `attempt` with up to +10 % random jitter, so that
/// jobs failing together do not come back together.
pub(crate) fn backoff_with_jitter(policy: &RetryPolicy, attempt: u32) -> Duration {
    let base = policy.delay_after(attempt);
    let max_jitter_ms = u64::try_from(base.as_millis() / 10).unwrap_or(u64::MAX);
    let jitter = if max_jitter_ms == 0 {
        0
    } else {
        rand::rng().random_range(0..=max_jitter_ms)
    };
    base + Duration::from_millis(jitter)
}

/// Milliseconds of a lease (zero releases it at once: claimable again).
pub(crate) fn lease_ms(lease_for: Duration) -> i64 {
    i64::try_from(lease_for.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn lease_lost(run_id: RunId, fence: Fence) -> QueueError {
    QueueError::LeaseLost { run_id, fence }
}

pub(crate) fn queue_range(value: u64) -> Result<i64, QueueError> {
    i64::try_from(value).map_err(|_| QueueError::Backend {
        message: format!("fence {value} out of range"),
        retryable: false,
    })
}

pub(crate) fn queue_corrupt(what: impl std::fmt::Display) -> QueueError {
    QueueError::Backend {
        message: format!("corrupt queue row: {what}"),
        retryable: false,
    }
}

/// Stable 64-bit FNV-1a hash (advisory-lock keys must agree across builds and
/// processes, which `std`'s hasher does not promise).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> i64 {
    edward_core::hash::fnv1a64_parts(parts) as i64
}

/// Decode JSON stored as text.
pub(crate) fn parse_json(text: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("json: {e}")))
}

/// Encode JSON as text for storage.
pub(crate) fn json_text(value: &serde_json::Value) -> String {
    // Serialising a `Value` cannot fail: its keys are strings.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A checkpoint from its two columns (`checkpoint_turn`, `checkpoint`);
/// `None` when no checkpoint was written yet.
pub(crate) fn checkpoint_from_columns(
    turn: Option<i64>,
    state: Option<String>,
) -> Result<Option<Checkpoint>, StoreError> {
    match (turn, state) {
        (Some(turn), Some(state)) => Ok(Some(Checkpoint {
            turn: u32::try_from(turn).map_err(|_| StoreError::Corrupt(format!("turn {turn}")))?,
            state: parse_json(&state)?,
        })),
        _ => Ok(None),
    }
}

/// A broadcast receiver as a stream; a lagging receiver skips what it
/// missed (hints only), and the stream ends when the notifier is dropped.
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
pub(crate) fn broadcast_stream<T: Clone + Send + 'static>(
    rx: tokio::sync::broadcast::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(item) => return Some((item, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(skipped = n, "notification subscriber lagged");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// [`RunStore::list_user_runs`](edward_core::RunStore::list_user_runs)'s
/// query with only the filters given, so the planner seeks the index on
/// them: a generic `(? IS NULL OR chat_id = ?)` walked every run of the
/// user, and a run's start asks twice for its chat's runs (1,000 runs of
/// one user starting at once read a million rows). `placeholder(n)` spells
/// the n-th parameter (1-based) in the backend's syntax; bind with
/// [`bind_user_runs`].
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn user_runs_sql(
    select_from: &str,
    placeholder: fn(usize) -> String,
    filter: &edward_core::RunFilter,
    before: Option<RunId>,
) -> String {
    let mut sql = format!("{select_from} WHERE user_id = {}", placeholder(1));
    let mut n = 1;
    let mut next = || {
        n += 1;
        placeholder(n)
    };
    if filter.chat_id.is_some() {
        sql.push_str(&format!(" AND chat_id = {}", next()));
    }
    if filter.status.is_some() {
        sql.push_str(&format!(" AND status = {}", next()));
    }
    if before.is_some() {
        sql.push_str(&format!(" AND id < {}", next()));
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT {}", next()));
    sql
}

/// [`user_runs_sql`]'s query with its parameters bound, in its order.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn bind_user_runs<'q, DB>(
    sql: &'q str,
    user_id: &'q str,
    filter: &'q edward_core::RunFilter,
    before: Option<RunId>,
    limit: usize,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    uuid::Uuid: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let mut query = sqlx::query(sql).bind(user_id);
    if let Some(chat) = filter.chat_id.as_deref() {
        query = query.bind(chat);
    }
    if let Some(status) = filter.status {
        query = query.bind(status.as_str());
    }
    if let Some(before) = before {
        query = query.bind(before.0);
    }
    query.bind(i64::try_from(limit).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let policy = RetryPolicy {
            max_attempts: 5,
            base_delay_ms: 1000,
            max_delay_ms: 60_000,
        };
        for attempt in 1..6 {
            let base = policy.delay_after(attempt);
            let d = backoff_with_jitter(&policy, attempt);
            assert!(d >= base && d <= base + base / 10, "{d:?} vs {base:?}");
        }
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(
            fnv1a64(&[b"user:", b"alice"]),
            fnv1a64(&[b"user:", b"alice"])
        );
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
    }

    #[test]
    fn finish_checks_follow_memory_order() {
        let id = RunId::new();
        let done = vec![NewEvent::new(RUN_FINISHED, serde_json::json!({}))];
        assert!(matches!(
            check_finish(
                id,
                RunStatus::Completed,
                Fence(1),
                Some(Fence(0)),
                RunStatus::Running,
                &done
            ),
            Err(StoreError::Finished { .. })
        ));
        assert!(matches!(
            check_finish(
                id,
                RunStatus::Running,
                Fence(2),
                Some(Fence(1)),
                RunStatus::Running,
                &done
            ),
            Err(StoreError::StaleFence { .. })
        ));
        assert!(matches!(
            check_finish(
                id,
                RunStatus::Running,
                Fence(2),
                None,
                RunStatus::Running,
                &done
            ),
            Err(StoreError::InvalidTransition { .. })
        ));
        assert!(
            check_finish(
                id,
                RunStatus::Running,
                Fence(2),
                None,
                RunStatus::Failed,
                &[]
            )
            .is_err()
        );
        assert!(
            check_finish(
                id,
                RunStatus::Queued,
                Fence(0),
                None,
                RunStatus::Cancelled,
                &done
            )
            .is_ok()
        );
    }
}

//! Bodies of the run and queue writes of [`super::SqliteStore`]. Each runs
//! on the writer thread inside the tick's transaction, in a savepoint of its
//! own (see `writer.rs`): an `Err` rolls back whatever it wrote, and a
//! refusal is checked before anything is written.

use std::time::Duration;

use chrono::DateTime;
use edward_core::{
    AdmissionError, AdmissionLimits, AdmitError, Checkpoint, EffectRecord, Fence, Lease, NewEvent,
    NewRun, QueueError, RetryOutcome, RetryPolicy, Run, RunEvent, RunId, RunStatus, StoreError,
};
use rusqlite::{Connection, OptionalExtension, params};

use super::rows::{LEASE_COLUMNS, RUN_COLUMNS, effect_from, lease_from, run_from};
use super::writer::{sqlite_queue_err, sqlite_store_err};
use super::{micros, now};
use crate::common::{
    backoff_with_jitter, check_fence, check_finish, diagnose, json_text, lease_lost, lease_ms,
    parse_status, queue_range, to_i64, to_u64,
};

fn se(e: rusqlite::Error) -> StoreError {
    sqlite_store_err(&e)
}

fn qe(e: rusqlite::Error) -> QueueError {
    sqlite_queue_err(&e)
}

/// `(status, fence, last seq)` of a run: the last seq is its newest
/// event's (see [`RUN_COLUMNS`]).
pub(crate) const LAST_SEQ_STATE: &str = "SELECT status, fence, \
     COALESCE((SELECT seq FROM run_events WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1), 0) \
     FROM runs WHERE id = ?1";

/// `(status, fence, last seq)` of a run.
pub(crate) fn run_state(
    conn: &Connection,
    run_id: RunId,
) -> Result<Option<(RunStatus, Fence, i64)>, StoreError> {
    let row = conn
        .prepare_cached(LAST_SEQ_STATE)
        .map_err(se)?
        .query_row(params![run_id.0], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .optional()
        .map_err(se)?;
    match row {
        None => Ok(None),
        Some((status, fence, last_seq)) => Ok(Some((
            parse_status(&status)?,
            Fence(to_u64(fence, "fence")?),
            last_seq,
        ))),
    }
}

/// Why a fenced write found nothing to change.
fn diagnose_in(conn: &Connection, run_id: RunId, given: Fence, check_finished: bool) -> StoreError {
    match run_state(conn, run_id) {
        Ok(found) => diagnose(run_id, found.map(|(s, f, _)| (s, f)), given, check_finished),
        Err(e) => e,
    }
}

/// `Ok` when the run exists and `fence` is not older than its fence.
pub(crate) fn check_run_fence(
    conn: &Connection,
    run_id: RunId,
    fence: Fence,
) -> Result<(), StoreError> {
    let Some((_, current, _)) = run_state(conn, run_id)? else {
        return Err(StoreError::NotFound { run_id });
    };
    check_fence(run_id, current, fence)
}

/// Insert `events` with seqs `first_seq..`, all stamped `at`.
fn insert_events(
    conn: &Connection,
    run_id: RunId,
    first_seq: i64,
    at: DateTime<chrono::Utc>,
    events: &[NewEvent],
) -> Result<Vec<RunEvent>, StoreError> {
    let at_us = micros(at);
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO run_events (run_id, seq, kind, at, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(se)?;
    let mut out = Vec::with_capacity(events.len());
    for (i, event) in events.iter().enumerate() {
        let seq = first_seq + i as i64;
        insert
            .execute(params![
                run_id.0,
                seq,
                event.kind,
                at_us,
                json_text(&event.payload)
            ])
            .map_err(se)?;
        out.push(RunEvent {
            run_id,
            seq: to_u64(seq, "seq")?,
            kind: event.kind.clone(),
            at,
            payload: event.payload.clone(),
        });
    }
    Ok(out)
}

fn count(conn: &Connection, sql: &str, keys: &[&str]) -> Result<u32, StoreError> {
    let n: i64 = conn
        .prepare_cached(sql)
        .map_err(se)?
        .query_row(rusqlite::params_from_iter(keys.iter()), |r| r.get(0))
        .map_err(se)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

pub(crate) fn admit(
    conn: &Connection,
    (run, limits): &(NewRun, AdmissionLimits),
) -> Result<Run, AdmitError> {
    let exists = conn
        .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
        .map_err(se)?
        .exists(params![run.id.0])
        .map_err(se)?;
    if exists {
        return Err(StoreError::AlreadyExists { run_id: run.id }.into());
    }
    // A chat belongs to its user: another user's chat of the same id is another chat.
    let chat = count(
        conn,
        "SELECT COUNT(*) FROM runs WHERE user_id = ?1 AND chat_id = ?2 \
         AND status IN ('queued', 'running')",
        &[&run.user_id, &run.chat_id],
    )?;
    if chat >= limits.per_chat {
        return Err(AdmissionError::ChatLimit {
            limit: limits.per_chat,
        }
        .into());
    }
    let user = count(
        conn,
        "SELECT COUNT(*) FROM runs WHERE user_id = ?1 AND status IN ('queued', 'running')",
        &[&run.user_id],
    )?;
    if user >= limits.per_user {
        return Err(AdmissionError::UserLimit {
            limit: limits.per_user,
        }
        .into());
    }
    let global = count(
        conn,
        "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')",
        &[],
    )?;
    if global >= limits.global {
        return Err(AdmissionError::GlobalLimit {
            limit: limits.global,
        }
        .into());
    }
    let at = now();
    conn.prepare_cached(
        "INSERT INTO runs (id, user_id, chat_id, status, request, fence, last_seq, created_at, updated_at) \
         VALUES (?1, ?2, ?3, 'queued', ?4, 0, 1, ?5, ?5)",
    )
    .map_err(se)?
    .execute(params![
        run.id.0,
        run.user_id,
        run.chat_id,
        json_text(&run.request),
        micros(at)
    ])
    .map_err(se)?;
    insert_events(conn, run.id, 1, at, std::slice::from_ref(&run.first_event))?;
    let stored = select_run(conn, run.id)?;
    // The queue lives in the same database: the run is enqueued in the
    // admitting transaction, so a crash can never leave it admitted
    // (holding a slot) but unqueued. `enqueue` afterwards is a no-op.
    conn.prepare_cached(
        "INSERT INTO queue (run_id, run_at) VALUES (?1, ?2) ON CONFLICT (run_id) DO NOTHING",
    )
    .map_err(se)?
    .execute(params![run.id.0, micros(at)])
    .map_err(se)?;
    Ok(stored)
}

pub(crate) fn start_run(
    conn: &Connection,
    &(run_id, fence): &(RunId, Fence),
) -> Result<Run, StoreError> {
    let given = to_i64(fence.0, "fence")?;
    let started = conn
        .prepare_cached(
            "UPDATE runs SET fence = ?1, status = 'running', updated_at = ?2 \
             WHERE id = ?3 AND fence <= ?1 AND status IN ('queued', 'running')",
        )
        .map_err(se)?
        .execute(params![given, micros(now()), run_id.0])
        .map_err(se)?;
    if started == 0 {
        return Err(diagnose_in(conn, run_id, fence, true));
    }
    select_run(conn, run_id)
}

/// The run as [`run_from`] reads it.
fn select_run(conn: &Connection, run_id: RunId) -> Result<Run, StoreError> {
    conn.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"))
        .map_err(se)?
        .query_row(params![run_id.0], |row| Ok(run_from(row)))
        .map_err(se)?
}

/// A `finish_run` request.
pub(crate) struct Finish {
    pub(crate) run_id: RunId,
    pub(crate) fence: Option<Fence>,
    pub(crate) status: RunStatus,
    pub(crate) reason: String,
    pub(crate) events: Vec<NewEvent>,
}

pub(crate) fn finish_run(conn: &Connection, f: &Finish) -> Result<Vec<RunEvent>, StoreError> {
    let run_id = f.run_id;
    let Some((current, current_fence, last_seq)) = run_state(conn, run_id)? else {
        return Err(StoreError::NotFound { run_id });
    };
    check_finish(run_id, current, current_fence, f.fence, f.status, &f.events)?;
    let at = now();
    conn.prepare_cached(
        "UPDATE runs SET status = ?1, terminal_reason = ?2, finished_at = ?3, updated_at = ?3 \
         WHERE id = ?4",
    )
    .map_err(se)?
    .execute(params![f.status.as_str(), f.reason, micros(at), run_id.0])
    .map_err(se)?;
    insert_events(conn, run_id, last_seq + 1, at, &f.events)
}

pub(crate) fn save_checkpoint(
    conn: &Connection,
    (run_id, fence, checkpoint): &(RunId, Fence, Checkpoint),
) -> Result<(), StoreError> {
    let given = to_i64(fence.0, "fence")?;
    let done = conn
        .prepare_cached(
            "UPDATE runs SET checkpoint_turn = ?1, checkpoint = ?2, updated_at = ?3 \
             WHERE id = ?4 AND fence <= ?5",
        )
        .map_err(se)?
        .execute(params![
            i64::from(checkpoint.turn),
            json_text(&checkpoint.state),
            micros(now()),
            run_id.0,
            given
        ])
        .map_err(se)?;
    if done == 0 {
        return Err(diagnose_in(conn, *run_id, *fence, false));
    }
    Ok(())
}

/// A `begin_effect` / `complete_effect` request.
pub(crate) struct Effect {
    pub(crate) run_id: RunId,
    pub(crate) fence: Fence,
    pub(crate) key: String,
    pub(crate) value: serde_json::Value,
}

pub(crate) fn begin_effect(conn: &Connection, e: &Effect) -> Result<EffectRecord, StoreError> {
    check_run_fence(conn, e.run_id, e.fence)?;
    let at = micros(now());
    conn.prepare_cached(
        "INSERT INTO effects (run_id, key, state, request, result, attempts, created_at, updated_at) \
         VALUES (?1, ?2, 'started', ?3, NULL, 1, ?4, ?4) \
         ON CONFLICT (run_id, key) DO UPDATE SET \
           attempts = effects.attempts + (effects.state = 'started'), \
           updated_at = excluded.updated_at \
         RETURNING state, request, result, attempts",
    )
    .map_err(se)?
    .query_row(params![e.run_id.0, e.key, json_text(&e.value), at], |row| {
        Ok(effect_from(&e.key, row))
    })
    .map_err(se)?
}

pub(crate) fn complete_effect(conn: &Connection, e: &Effect) -> Result<(), StoreError> {
    check_run_fence(conn, e.run_id, e.fence)?;
    let at = micros(now());
    conn.prepare_cached(
        "INSERT INTO effects (run_id, key, state, request, result, attempts, created_at, updated_at) \
         VALUES (?1, ?2, 'completed', 'null', ?3, 1, ?4, ?4) \
         ON CONFLICT (run_id, key) DO UPDATE SET \
           state = 'completed', result = excluded.result, updated_at = excluded.updated_at",
    )
    .map_err(se)?
    .execute(params![e.run_id.0, e.key, json_text(&e.value), at])
    .map_err(se)?;
    Ok(())
}

pub(crate) fn request_cancel(
    conn: &Connection,
    (run_id, event): &(RunId, NewEvent),
) -> Result<Run, StoreError> {
    let run_id = *run_id;
    let Some((current, _, last_seq)) = run_state(conn, run_id)? else {
        return Err(StoreError::NotFound { run_id });
    };
    if !current.is_terminal() {
        let at = now();
        let updated = conn
            .prepare_cached(
                "UPDATE runs SET cancel_requested_at = ?1, updated_at = ?1 \
                 WHERE id = ?2 AND cancel_requested_at IS NULL",
            )
            .map_err(se)?
            .execute(params![micros(at), run_id.0])
            .map_err(se)?;
        if updated == 1 {
            insert_events(conn, run_id, last_seq + 1, at, std::slice::from_ref(event))?;
        }
    }
    select_run(conn, run_id)
}

pub(crate) fn enqueue(conn: &Connection, run_id: &RunId) -> Result<(), QueueError> {
    conn.prepare_cached(
        "INSERT INTO queue (run_id, run_at) VALUES (?1, ?2) ON CONFLICT (run_id) DO NOTHING",
    )
    .map_err(qe)?
    .execute(params![run_id.0, micros(now())])
    .map_err(qe)?;
    Ok(())
}

/// Claim up to `max` claimable jobs, oldest first: one fence per job from
/// the counter, in claim order.
pub(crate) fn claim(
    conn: &Connection,
    (owner, lease_for, max): &(String, Duration, usize),
) -> Result<Vec<Lease>, QueueError> {
    let now_us = micros(now());
    let candidates: Vec<i64> = conn
        .prepare_cached(
            "SELECT seq FROM queue WHERE dead_lettered_at IS NULL AND run_at <= ?1 \
             AND (owner IS NULL OR lease_expires_at <= ?1) ORDER BY run_at, seq LIMIT ?2",
        )
        .map_err(qe)?
        .query_map(
            params![now_us, i64::try_from(*max).unwrap_or(i64::MAX)],
            |r| r.get(0),
        )
        .map_err(qe)?
        .collect::<Result<_, _>>()
        .map_err(qe)?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let k = candidates.len() as i64;
    let last_fence: i64 = conn
        .prepare_cached("UPDATE fence_counter SET value = value + ?1 WHERE id = 1 RETURNING value")
        .map_err(qe)?
        .query_row(params![k], |r| r.get(0))
        .map_err(qe)?;
    let expires = now_us.saturating_add(lease_ms(*lease_for).saturating_mul(1000));
    let mut update = conn
        .prepare_cached(&format!(
            "UPDATE queue SET owner = ?1, fence = ?2, attempts = attempts + 1, lease_expires_at = ?3 \
             WHERE seq = ?4 RETURNING {LEASE_COLUMNS}"
        ))
        .map_err(qe)?;
    let mut leases = Vec::with_capacity(candidates.len());
    for (i, seq) in candidates.into_iter().enumerate() {
        let lease = update
            .query_row(
                params![owner, last_fence - k + 1 + i as i64, expires, seq],
                |row| Ok(lease_from(row)),
            )
            .map_err(qe)??;
        leases.push(lease);
    }
    Ok(leases)
}

pub(crate) fn heartbeat(
    conn: &Connection,
    (lease, lease_for): &(Lease, Duration),
) -> Result<Lease, QueueError> {
    let expires = micros(now()).saturating_add(lease_ms(*lease_for).saturating_mul(1000));
    let row = conn
        .prepare_cached(&format!(
            "UPDATE queue SET lease_expires_at = ?1 WHERE run_id = ?2 AND owner = ?3 AND fence = ?4 \
             AND dead_lettered_at IS NULL RETURNING {LEASE_COLUMNS}"
        ))
        .map_err(qe)?
        .query_row(
            params![
                expires,
                lease.run_id.0,
                lease.owner,
                queue_range(lease.fence.0)?
            ],
            |row| Ok(lease_from(row)),
        )
        .optional()
        .map_err(qe)?;
    match row {
        Some(lease) => lease,
        None => Err(lease_lost(lease.run_id, lease.fence)),
    }
}

pub(crate) fn ack(conn: &Connection, lease: &Lease) -> Result<(), QueueError> {
    let done = conn
        .prepare_cached(
            "DELETE FROM queue WHERE run_id = ?1 AND owner = ?2 AND fence = ?3 \
             AND dead_lettered_at IS NULL",
        )
        .map_err(qe)?
        .execute(params![
            lease.run_id.0,
            lease.owner,
            queue_range(lease.fence.0)?
        ])
        .map_err(qe)?;
    if done == 0 {
        return Err(lease_lost(lease.run_id, lease.fence));
    }
    Ok(())
}

pub(crate) fn retry(
    conn: &Connection,
    (lease, error, policy): &(Lease, String, RetryPolicy),
) -> Result<RetryOutcome, QueueError> {
    let attempts: Option<i64> = conn
        .prepare_cached(
            "SELECT attempts FROM queue WHERE run_id = ?1 AND owner = ?2 AND fence = ?3 \
             AND dead_lettered_at IS NULL",
        )
        .map_err(qe)?
        .query_row(
            params![lease.run_id.0, lease.owner, queue_range(lease.fence.0)?],
            |r| r.get(0),
        )
        .optional()
        .map_err(qe)?;
    let Some(attempts) = attempts else {
        return Err(lease_lost(lease.run_id, lease.fence));
    };
    let attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
    let at = now();
    if attempts >= policy.max_attempts {
        conn.prepare_cached(
            "UPDATE queue SET owner = NULL, lease_expires_at = NULL, last_error = ?1, \
             dead_lettered_at = ?2 WHERE run_id = ?3",
        )
        .map_err(qe)?
        .execute(params![error, micros(at), lease.run_id.0])
        .map_err(qe)?;
        tracing::warn!(run_id = %lease.run_id, attempts, error, "job dead-lettered");
        Ok(RetryOutcome::DeadLettered)
    } else {
        let delay = backoff_with_jitter(policy, attempts);
        let run_at = at + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        conn.prepare_cached(
            "UPDATE queue SET owner = NULL, lease_expires_at = NULL, last_error = ?1, run_at = ?2 \
             WHERE run_id = ?3",
        )
        .map_err(qe)?
        .execute(params![error, micros(run_at), lease.run_id.0])
        .map_err(qe)?;
        Ok(RetryOutcome::Scheduled { at: run_at })
    }
}

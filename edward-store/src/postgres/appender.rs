//! Group commit for event appends: one task drains the appends of every run
//! in this process into one statement (one transaction, one WAL flush) per
//! tick, instead of a transaction and a round trip per append.
//!
//! A tick takes every append that is waiting (up to [`MAX_BATCH`]), at most
//! one per run — a run's later append waits for the next tick, so a run's
//! appends still commit in the order they were made — and runs them as one
//! `UPDATE … FROM unnest(…)` that reserves each run's seqs under the same
//! fence and status check as a single append, plus one `INSERT … SELECT`
//! of all the events. A run whose check fails gets no row back and is
//! answered alone by the caller's diagnosis; a statement that fails (a
//! deadlock with another multi-row writer, say) is retried as single appends,
//! so one bad append never fails the others.
//!
//! Latency: an append waits for the tick in flight to commit and then for its
//! own; under light load a tick holds one append and costs what a single
//! append did.

use std::collections::{HashMap, HashSet, VecDeque};

use chrono::{DateTime, Utc};
use edward_core::{NewEvent, RunEvent, RunId, StoreError};
use sqlx::Row;
use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::common::{json_text, to_u64};

/// Appends per tick at most (bounds the statement's size).
const MAX_BATCH: usize = 512;

/// Ticks in flight at once, each on its own connection: a slow tick (a
/// checkpoint, autovacuum) does not hold up the appends that arrive behind
/// it, and Postgres flushes concurrent commits' WAL together.
const MAX_IN_FLIGHT: usize = 4;

/// What a tick answers one append.
pub(super) enum Appended {
    /// Committed with these seqs.
    Done(Vec<RunEvent>),
    /// Committed, but the rows that came back do not match the events.
    Failed(StoreError),
    /// The run's fence or status check refused it: nothing was written; the
    /// caller diagnoses why.
    Refused,
    /// The tick's statement failed: nothing of it was written; the caller
    /// appends these events alone.
    Retry(Vec<NewEvent>),
}

pub(super) struct Request {
    pub(super) run_id: RunId,
    pub(super) fence: i64,
    pub(super) events: Vec<NewEvent>,
    pub(super) reply: oneshot::Sender<Appended>,
}

/// Handle on the group-commit task; the task stops when the last handle is
/// dropped.
#[derive(Debug)]
pub(super) struct Appender {
    requests: mpsc::UnboundedSender<Request>,
}

impl Appender {
    /// Start the task (needs a tokio runtime). It writes over
    /// [`MAX_IN_FLIGHT`] connections of its own, opened as `pool`'s are:
    /// when a thousand runs start or finish at once, their admissions,
    /// claims and effect records occupy the shared pool, and appends queued
    /// behind them were the slowest chunks of the load test (p99 ~1 s in
    /// those seconds, ~250 ms in between; with their own connections,
    /// ~420 ms overall).
    pub(super) fn spawn(pool: PgPool) -> Self {
        let pool = super::own_pool(&pool, MAX_IN_FLIGHT as u32);
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(group_commit(pool, rx));
        Appender { requests }
    }

    /// Queue `events` for `run_id` and wait for the tick that commits them.
    pub(super) async fn append(
        &self,
        run_id: RunId,
        fence: i64,
        events: Vec<NewEvent>,
    ) -> Result<Appended, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request {
                run_id,
                fence,
                events,
                reply,
            })
            .map_err(|_| StoreError::transient("postgres group commit stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::transient("postgres group commit stopped"))
    }
}

async fn group_commit(pool: PgPool, rx: mpsc::UnboundedReceiver<Request>) {
    // The state: runs with an append in a tick in flight (or in the tick
    // being built); their next append waits, so each run's appends commit
    // in order.
    super::tick_loop(
        rx,
        MAX_IN_FLIGHT,
        HashSet::new(),
        |busy, waiting| take_tick(waiting, busy),
        |tick| {
            let pool = pool.clone();
            async move {
                let runs: Vec<RunId> = tick.iter().map(|r| r.run_id).collect();
                let started = std::time::Instant::now();
                commit_tick(&pool, tick).await;
                tracing::trace!(
                    appends = runs.len(),
                    micros = started.elapsed().as_micros() as u64,
                    "postgres group commit"
                );
                runs
            }
        },
        |busy, runs| {
            for run_id in runs {
                busy.remove(&run_id);
            }
        },
    )
    .await;
}

/// The next tick: waiting appends of runs that are not busy, oldest first,
/// at most one per run and [`MAX_BATCH`] in all (their runs become busy).
fn take_tick(waiting: &mut VecDeque<Request>, busy: &mut HashSet<RunId>) -> Vec<Request> {
    let mut tick = Vec::new();
    let mut rest = VecDeque::with_capacity(waiting.len());
    for request in waiting.drain(..) {
        if tick.len() < MAX_BATCH && busy.insert(request.run_id) {
            tick.push(request);
        } else {
            rest.push_back(request);
        }
    }
    *waiting = rest;
    tick
}

const TICK_SQL: &str = "WITH input AS ( \
       SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS i(run_id, fence, n) \
     ), reserve AS ( \
       UPDATE edward_runs r SET last_seq = r.last_seq + i.n, updated_at = now() \
       FROM input i \
       WHERE r.id = i.run_id AND r.fence <= i.fence AND r.status IN ('queued', 'running') \
       RETURNING r.id, r.last_seq, r.updated_at, i.n \
     ) \
     INSERT INTO edward_run_events (run_id, seq, kind, at, payload) \
     SELECT r.id, r.last_seq - r.n + e.ord, e.kind, r.updated_at, e.payload::json \
     FROM reserve r \
     JOIN unnest($4::uuid[], $5::bigint[], $6::text[], $7::text[]) AS e(run_id, ord, kind, payload) \
       ON e.run_id = r.id \
     RETURNING run_id, seq, at";

async fn commit_tick(pool: &PgPool, tick: Vec<Request>) {
    let mut run_ids = Vec::with_capacity(tick.len());
    let mut fences = Vec::with_capacity(tick.len());
    let mut counts = Vec::with_capacity(tick.len());
    let total: usize = tick.iter().map(|r| r.events.len()).sum();
    let mut event_runs = Vec::with_capacity(total);
    let mut ords = Vec::with_capacity(total);
    let mut kinds = Vec::with_capacity(total);
    let mut payloads = Vec::with_capacity(total);
    for request in &tick {
        run_ids.push(request.run_id.0);
        fences.push(request.fence);
        counts.push(request.events.len() as i64);
        for (i, event) in request.events.iter().enumerate() {
            event_runs.push(request.run_id.0);
            ords.push(i as i64 + 1);
            kinds.push(event.kind.clone());
            payloads.push(json_text(&event.payload));
        }
    }
    let result = sqlx::query(TICK_SQL)
        .bind(&run_ids)
        .bind(&fences)
        .bind(&counts)
        .bind(&event_runs)
        .bind(&ords)
        .bind(&kinds)
        .bind(&payloads)
        .fetch_all(pool)
        .await;
    let rows = match result {
        Ok(rows) => rows,
        Err(error) => {
            tracing::debug!(%error, appends = tick.len(), "group commit failed; appending alone");
            for request in tick {
                let _ = request.reply.send(Appended::Retry(request.events));
            }
            return;
        }
    };
    // (first seq, at) per run that got rows.
    let mut firsts: HashMap<Uuid, (i64, DateTime<Utc>, usize)> = HashMap::new();
    for row in &rows {
        let (Ok(run), Ok(seq), Ok(at)) = (
            row.try_get::<Uuid, _>(0),
            row.try_get::<i64, _>(1),
            row.try_get::<DateTime<Utc>, _>(2),
        ) else {
            continue;
        };
        let entry = firsts.entry(run).or_insert((seq, at, 0));
        entry.0 = entry.0.min(seq);
        entry.2 += 1;
    }
    for request in tick {
        let answer = match firsts.get(&request.run_id.0) {
            None => Appended::Refused,
            Some(&(first, at, got)) => {
                match numbered(request.run_id, first, at, got, request.events) {
                    Ok(events) => Appended::Done(events),
                    Err(e) => Appended::Failed(e),
                }
            }
        };
        let _ = request.reply.send(answer);
    }
}

/// The events as committed: consecutive seqs from `first`, all at `at`;
/// an error if `got` (the rows inserted) is not their number.
pub(super) fn numbered(
    run_id: RunId,
    first: i64,
    at: DateTime<Utc>,
    got: usize,
    events: Vec<NewEvent>,
) -> Result<Vec<RunEvent>, StoreError> {
    if got != events.len() {
        return Err(StoreError::transient(format!(
            "run {run_id}: inserted {got} of {} events",
            events.len()
        )));
    }
    events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            Ok(RunEvent {
                run_id,
                seq: to_u64(first + i as i64, "seq")?,
                kind: e.kind,
                at,
                payload: e.payload,
            })
        })
        .collect()
}

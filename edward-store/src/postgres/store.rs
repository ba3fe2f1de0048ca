//! [`PgStore`]: runs, events, checkpoints and effect records on Postgres
//! (chat messages and build jobs: `postgres/chats.rs`).
//!
//! # Admission without a global lock
//!
//! `admit` is one call of the `edward_admit` function (migration 0012), so
//! one round trip and one implicit transaction. It first takes
//! transaction-scoped advisory locks on a hash of the user and a hash of the
//! chat (the user's id and the chat id: another user's chat of the same id
//! is another chat) — always in ascending key order, so two admissions can
//! never deadlock — then counts the active runs of that chat and that user
//! and inserts. Submits of different users and chats never wait for each
//! other, and the per-user and per-chat limits are **exact**: a second
//! submit for the same user waits for the first to commit, and its counts
//! (the function is `VOLATILE`, so each statement takes a new READ
//! COMMITTED snapshot, after the lock was granted) see it. The locks are held
//! only as long as the server needs: done as seven client round trips, a
//! busy client made each admission of one user wait for the scheduling of
//! the previous one (1,000 submits of one user took 5–27 s under load).
//!
//! The **global** cap is checked by counting active runs (a partial index
//! keeps it cheap) without a global lock. It is therefore **approximate under
//! extreme concurrency**: admissions of different users that are in flight at
//! the same instant do not see each other, so the cap can be exceeded by at
//! most the number of concurrent in-flight admissions (bounded by the pool
//! sizes of all submitters). Making it exact would mean one lock that every
//! submit in the cluster serialises on, which is exactly what this design
//! avoids; give the global cap headroom instead.
//!
//! # Event append
//!
//! Appends are group-committed (`postgres/appender.rs`): one task gathers
//! the appends of all runs in this process that are waiting and writes up to
//! 512 of them (one per run) in one statement — an `UPDATE … FROM unnest(…)`
//! that bumps each run's `last_seq` by its batch size where `fence <= given`
//! and the run is not terminal, and an `INSERT … SELECT` of all the events
//! with the seqs that reservation produced — with up to four such
//! statements in flight. The row lock on each run serialises its appends,
//! a run's next append waits for its previous one, and a stale worker racing
//! `start_run` re-checks the fence on the newest row version, so seqs stay
//! gap-free. A run that gets no rows back is explained by a follow-up read as
//! `NotFound`, `Finished` or `StaleFence`; a statement that fails is retried
//! as single appends (the same reservation, one run per statement), so one
//! bad append fails only itself. The events just appended are kept for this
//! process's tailers (`recent.rs`), which read them without a round trip.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use edward_core::engine::Backend;
use edward_core::{
    AdmissionError, AdmissionLimits, AdmitError, BuildJob, BuildResult, ChatMessage, Checkpoint,
    EffectRecord, Fence, NewEvent, NewMessage, NewRun, Run, RunEvent, RunFilter, RunId, RunStatus,
    RunStore, StoreError,
};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};
use uuid::Uuid;

use super::appender::{Appended, Appender, numbered};
use super::reader::Reader;
use super::{PgOptions, PgQueue, connect_pool};
use crate::common::{
    check_append_events, check_finish, checkpoint_from_columns, diagnose, fnv1a64, json_text,
    parse_effect_state, parse_json, parse_status, to_i64, to_u64,
};
use crate::error::{ConnectError, corrupt, is_unique_violation, store_err};
use crate::recent::Recent;

const RUN_COLUMNS: &str = "id, user_id, chat_id, status, request::text AS request, fence, \
     last_seq, created_at, updated_at, finished_at, terminal_reason, cancel_requested_at";

/// Postgres [`RunStore`]. Cloning is cheap (the pool is shared).
///
/// ```no_run
/// # async fn demo() -> Result<(), edward_store::ConnectError> {
/// let store = edward_store::PgStore::connect("postgres://edward@localhost/edward").await?;
/// let queue = store.queue();
/// # let _ = queue; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    shared: Arc<Shared>,
}

/// What the clones of one store share.
#[derive(Debug, Default)]
struct Shared {
    /// The group-commit task, started by the first append (a store may be
    /// built outside a runtime).
    appender: OnceLock<Appender>,
    /// The grouped-read task for tailers' cache misses, started by the
    /// first miss.
    reader: OnceLock<Reader>,
    /// Events this process appended lately, for its own tailers.
    recent: Recent,
}

impl PgStore {
    /// Connect with default options (migrations run).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with(url, PgOptions::default()).await
    }

    /// Connect with `options`.
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self, ConnectError> {
        Ok(Self::from_pool(connect_pool(url, &options).await?))
    }

    /// Use an existing pool (its migrations are the caller's business; see
    /// [`crate::migrate_postgres`]).
    pub fn from_pool(pool: PgPool) -> Self {
        PgStore {
            pool,
            shared: Arc::default(),
        }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This store as the engine's [`Backend`]: store, a [`PgQueue`] and a
    /// [`PgNotifier`] (LISTEN/NOTIFY, so events and cancels reach every
    /// process at once), all on this store's pool (the notifier holds one
    /// connection for listening).
    pub async fn backend(&self) -> Result<Backend, ConnectError> {
        let notifier = super::PgNotifier::from_pool(self.pool.clone(), "edward").await?;
        Ok(Backend::new(
            Arc::new(self.clone()),
            Arc::new(self.queue()),
            Arc::new(notifier),
        ))
    }

    /// A [`PgQueue`] sharing this store's pool.
    pub fn queue(&self) -> PgQueue {
        PgQueue::from_pool(self.pool.clone())
    }

    /// One append in its own statement (what a group-commit tick falls back
    /// to when its statement failed).
    async fn append_alone(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let given = to_i64(fence.0, "fence")?;
        let n = events.len() as i64;
        let (kinds, payloads) = batch_columns(&events);
        let rows = sqlx::query(&format!(
            "WITH reserve AS ( \
               UPDATE edward_runs SET last_seq = last_seq + $3, updated_at = now() \
               WHERE id = $1 AND fence <= $2 AND status IN ('queued', 'running') \
               RETURNING last_seq, updated_at \
             ) {INSERT_RESERVED}"
        ))
        .bind(run_id.0)
        .bind(given)
        .bind(n)
        .bind(&kinds)
        .bind(&payloads)
        .fetch_all(&self.pool)
        .await
        .map_err(store_err)?;
        if rows.is_empty() {
            return Err(self.diagnose(run_id, fence, true).await);
        }
        persisted(run_id, rows, events)
    }

    async fn diagnose(&self, run_id: RunId, given: Fence, check_finished: bool) -> StoreError {
        match run_state(&self.pool, run_id).await {
            Ok(found) => diagnose(run_id, found.map(|(s, f, _)| (s, f)), given, check_finished),
            Err(e) => e,
        }
    }
}

async fn run_state<'e, E>(
    executor: E,
    run_id: RunId,
) -> Result<Option<(RunStatus, Fence, i64)>, StoreError>
where
    E: sqlx::PgExecutor<'e>,
{
    let row = sqlx::query("SELECT status, fence, last_seq FROM edward_runs WHERE id = $1")
        .bind(run_id.0)
        .fetch_optional(executor)
        .await
        .map_err(store_err)?;
    state_from_row(row)
}

fn state_from_row(row: Option<PgRow>) -> Result<Option<(RunStatus, Fence, i64)>, StoreError> {
    match row {
        None => Ok(None),
        Some(row) => {
            let status: String = row.try_get(0).map_err(store_err)?;
            let fence: i64 = row.try_get(1).map_err(store_err)?;
            let last_seq: i64 = row.try_get(2).map_err(store_err)?;
            Ok(Some((
                parse_status(&status)?,
                Fence(to_u64(fence, "fence")?),
                last_seq,
            )))
        }
    }
}

/// Postgres keeps microseconds; truncate so values we return equal re-read ones.
fn run_from_row(row: &PgRow) -> Result<Run, StoreError> {
    let id: Uuid = row.try_get("id").map_err(store_err)?;
    let status: String = row.try_get("status").map_err(store_err)?;
    let request: String = row.try_get("request").map_err(store_err)?;
    Ok(Run {
        id: RunId(id),
        user_id: row.try_get("user_id").map_err(store_err)?,
        chat_id: row.try_get("chat_id").map_err(store_err)?,
        status: parse_status(&status)?,
        request: parse_json(&request)?,
        fence: Fence(to_u64(row.try_get("fence").map_err(store_err)?, "fence")?),
        last_seq: to_u64(row.try_get("last_seq").map_err(store_err)?, "last_seq")?,
        created_at: row.try_get("created_at").map_err(store_err)?,
        updated_at: row.try_get("updated_at").map_err(store_err)?,
        finished_at: row.try_get("finished_at").map_err(store_err)?,
        terminal_reason: row.try_get("terminal_reason").map_err(store_err)?,
        cancel_requested_at: row.try_get("cancel_requested_at").map_err(store_err)?,
    })
}

/// The shared tail of append and finish: reserve seqs on the run row (the
/// `reserve` CTE, which must return `last_seq` and `updated_at`) and insert
/// the batch with them, in one statement.
const INSERT_RESERVED: &str = "INSERT INTO edward_run_events (run_id, seq, kind, at, payload) \
     SELECT $1, r.last_seq - $3 + t.ord, t.kind, r.updated_at, t.payload::json \
     FROM reserve r, unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(kind, payload, ord) \
     RETURNING seq, at";

fn batch_columns(events: &[NewEvent]) -> (Vec<String>, Vec<String>) {
    events
        .iter()
        .map(|e| (e.kind.clone(), json_text(&e.payload)))
        .unzip()
}

/// Pair the inserted `(seq, at)` rows with the events, in order.
fn persisted(
    run_id: RunId,
    rows: Vec<PgRow>,
    events: Vec<NewEvent>,
) -> Result<Vec<RunEvent>, StoreError> {
    let mut first: Option<(i64, DateTime<Utc>)> = None;
    for row in &rows {
        let seq: i64 = row.try_get(0).map_err(store_err)?;
        let at: DateTime<Utc> = row.try_get(1).map_err(store_err)?;
        if first.is_none_or(|(s, _)| seq < s) {
            first = Some((seq, at));
        }
    }
    match first {
        Some((first_seq, at)) => numbered(run_id, first_seq, at, rows.len(), events),
        None if events.is_empty() => Ok(Vec::new()),
        None => numbered(run_id, 0, Utc::now(), 0, events),
    }
}

#[async_trait]
impl RunStore for PgStore {
    #[tracing::instrument(level = "debug", skip_all, fields(run_id = %run.id))]
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        let mut keys = [
            fnv1a64(&[b"edward-user:", run.user_id.as_bytes()]),
            // A chat belongs to its user: another user's chat of the same
            // id is another chat (and another lock).
            fnv1a64(&[
                b"edward-chat:",
                run.user_id.as_bytes(),
                run.chat_id.as_bytes(),
            ]),
        ];
        keys.sort_unstable();
        let row = sqlx::query(
            "SELECT outcome, created FROM edward_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(run.id.0)
        .bind(&run.user_id)
        .bind(&run.chat_id)
        .bind(json_text(&run.request))
        .bind(&run.first_event.kind)
        .bind(json_text(&run.first_event.payload))
        .bind(keys[0])
        .bind(keys[1])
        .bind(i64::from(limits.per_chat))
        .bind(i64::from(limits.per_user))
        .bind(i64::from(limits.global))
        .fetch_one(&self.pool)
        .await;
        let row = match row {
            Ok(row) => row,
            // The same id submitted concurrently under another user/chat.
            Err(e) if is_unique_violation(&e) => {
                return Err(StoreError::AlreadyExists { run_id: run.id }.into());
            }
            Err(e) => return Err(store_err(e).into()),
        };
        let outcome: String = row.try_get(0).map_err(store_err)?;
        let created: Option<DateTime<Utc>> = row.try_get(1).map_err(store_err)?;
        match (outcome.as_str(), created) {
            ("admitted", Some(at)) => Ok(Run {
                id: run.id,
                user_id: run.user_id,
                chat_id: run.chat_id,
                status: RunStatus::Queued,
                request: run.request,
                fence: Fence(0),
                last_seq: 1,
                created_at: at,
                updated_at: at,
                finished_at: None,
                terminal_reason: None,
                cancel_requested_at: None,
            }),
            ("exists", _) => Err(StoreError::AlreadyExists { run_id: run.id }.into()),
            ("chat", _) => Err(AdmissionError::ChatLimit {
                limit: limits.per_chat,
            }
            .into()),
            ("user", _) => Err(AdmissionError::UserLimit {
                limit: limits.per_user,
            }
            .into()),
            ("global", _) => Err(AdmissionError::GlobalLimit {
                limit: limits.global,
            }
            .into()),
            (other, _) => Err(corrupt(format!("edward_admit answered `{other}`")).into()),
        }
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM edward_runs WHERE id = $1"
        ))
        .bind(run_id.0)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_err)?;
        row.as_ref().map(run_from_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip(self), fields(run_id = %run_id, fence = %fence))]
    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        let given = to_i64(fence.0, "fence")?;
        let row = sqlx::query(&format!(
            "UPDATE edward_runs SET fence = $2, status = 'running', updated_at = now() \
             WHERE id = $1 AND fence <= $2 AND status IN ('queued', 'running') \
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(run_id.0)
        .bind(given)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_err)?;
        match row {
            Some(row) => run_from_row(&row),
            None => Err(self.diagnose(run_id, fence, true).await),
        }
    }

    #[tracing::instrument(level = "debug", skip(self, events), fields(run_id = %run_id, n = events.len()))]
    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        check_append_events(run_id, &events)?;
        let given = to_i64(fence.0, "fence")?;
        if events.is_empty() {
            let ok = sqlx::query(
                "SELECT 1 FROM edward_runs WHERE id = $1 AND fence <= $2 \
                 AND status IN ('queued', 'running')",
            )
            .bind(run_id.0)
            .bind(given)
            .fetch_optional(&self.pool)
            .await
            .map_err(store_err)?;
            return match ok {
                Some(_) => Ok(Vec::new()),
                None => Err(self.diagnose(run_id, fence, true).await),
            };
        }
        let appender = self
            .shared
            .appender
            .get_or_init(|| Appender::spawn(self.pool.clone()));
        let appended = match appender.append(run_id, given, events).await? {
            Appended::Done(events) => Ok(events),
            Appended::Failed(e) => Err(e),
            Appended::Refused => Err(self.diagnose(run_id, fence, true).await),
            Appended::Retry(events) => self.append_alone(run_id, fence, events).await,
        };
        match &appended {
            Ok(events) => self.shared.recent.record(run_id, events),
            Err(_) => self.shared.recent.forget(run_id),
        }
        appended
    }

    #[tracing::instrument(level = "debug", skip(self, events), fields(run_id = %run_id, status = %status))]
    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(store_err)?;
        let row =
            sqlx::query("SELECT status, fence, last_seq FROM edward_runs WHERE id = $1 FOR UPDATE")
                .bind(run_id.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_err)?;
        let Some((current, current_fence, _)) = state_from_row(row)? else {
            return Err(StoreError::NotFound { run_id });
        };
        check_finish(run_id, current, current_fence, fence, status, &events)?;
        let n = events.len() as i64;
        let (kinds, payloads) = batch_columns(&events);
        let rows = sqlx::query(&format!(
            "WITH reserve AS ( \
               UPDATE edward_runs SET last_seq = last_seq + $3, updated_at = now(), \
                 status = $2, terminal_reason = $6, finished_at = now() \
               WHERE id = $1 RETURNING last_seq, updated_at \
             ) {INSERT_RESERVED}"
        ))
        .bind(run_id.0)
        .bind(status.as_str())
        .bind(n)
        .bind(&kinds)
        .bind(&payloads)
        .bind(reason)
        .fetch_all(&mut *tx)
        .await
        .map_err(store_err)?;
        let out = persisted(run_id, rows, events)?;
        tx.commit().await.map_err(store_err)?;
        self.shared.recent.forget(run_id);
        Ok(out)
    }

    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        if let Some(events) = self.shared.recent.after(run_id, after_seq, limit) {
            return Ok(events);
        }
        let reader = self.shared.reader.get_or_init(|| Reader::spawn(&self.pool));
        let grouped = reader.events_after(run_id, after_seq, limit).await?;
        if let Some(events) = grouped {
            if events.is_empty() && run_state(&self.pool, run_id).await?.is_none() {
                return Err(StoreError::NotFound { run_id });
            }
            return Ok(events);
        }
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(
            "SELECT seq, kind, at, payload::text FROM edward_run_events \
             WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(run_id.0)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(store_err)?;
        if rows.is_empty() && run_state(&self.pool, run_id).await?.is_none() {
            return Err(StoreError::NotFound { run_id });
        }
        rows.iter()
            .map(|row| {
                let payload: String = row.try_get(3).map_err(store_err)?;
                Ok(RunEvent {
                    run_id,
                    seq: to_u64(row.try_get(0).map_err(store_err)?, "seq")?,
                    kind: row.try_get(1).map_err(store_err)?,
                    at: row.try_get(2).map_err(store_err)?,
                    payload: parse_json(&payload)?,
                })
            })
            .collect()
    }

    async fn save_checkpoint(
        &self,
        run_id: RunId,
        fence: Fence,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        let given = to_i64(fence.0, "fence")?;
        let done = sqlx::query(
            "UPDATE edward_runs SET checkpoint_turn = $3, checkpoint = $4::json, updated_at = now() \
             WHERE id = $1 AND fence <= $2",
        )
        .bind(run_id.0)
        .bind(given)
        .bind(i32::try_from(checkpoint.turn).map_err(|_| StoreError::permanent(format!("turn {} out of range", checkpoint.turn)))?)
        .bind(json_text(&checkpoint.state))
        .execute(&self.pool)
        .await
        .map_err(store_err)?;
        if done.rows_affected() == 0 {
            return Err(self.diagnose(run_id, fence, false).await);
        }
        Ok(())
    }

    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError> {
        let row =
            sqlx::query("SELECT checkpoint_turn, checkpoint::text FROM edward_runs WHERE id = $1")
                .bind(run_id.0)
                .fetch_optional(&self.pool)
                .await
                .map_err(store_err)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound { run_id });
        };
        let turn: Option<i32> = row.try_get(0).map_err(store_err)?;
        let state: Option<String> = row.try_get(1).map_err(store_err)?;
        checkpoint_from_columns(turn.map(i64::from), state)
    }

    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError> {
        let given = to_i64(fence.0, "fence")?;
        // FOR SHARE holds off a concurrent start_run (which raises the
        // fence) until this statement's transaction ends.
        let row = sqlx::query(
            "WITH r AS (SELECT id FROM edward_runs WHERE id = $1 AND fence <= $2 FOR SHARE) \
             INSERT INTO edward_effects (run_id, key, state, request, attempts) \
             SELECT r.id, $3, 'started', $4::json, 1 FROM r \
             ON CONFLICT (run_id, key) DO UPDATE SET \
               attempts = edward_effects.attempts \
                 + CASE WHEN edward_effects.state = 'started' THEN 1 ELSE 0 END, \
               updated_at = now() \
             RETURNING state, request::text, result::text, attempts",
        )
        .bind(run_id.0)
        .bind(given)
        .bind(key)
        .bind(json_text(&request))
        .fetch_optional(&self.pool)
        .await
        .map_err(store_err)?;
        let Some(row) = row else {
            return Err(self.diagnose(run_id, fence, false).await);
        };
        let state: String = row.try_get(0).map_err(store_err)?;
        let request: String = row.try_get(1).map_err(store_err)?;
        let result: Option<String> = row.try_get(2).map_err(store_err)?;
        let attempts: i32 = row.try_get(3).map_err(store_err)?;
        Ok(EffectRecord {
            key: key.to_owned(),
            state: parse_effect_state(&state)?,
            request: parse_json(&request)?,
            result: result.as_deref().map(parse_json).transpose()?,
            attempts: u32::try_from(attempts)
                .map_err(|_| corrupt(format!("attempts {attempts}")))?,
        })
    }

    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        let given = to_i64(fence.0, "fence")?;
        let done = sqlx::query(
            "WITH r AS (SELECT id FROM edward_runs WHERE id = $1 AND fence <= $2 FOR SHARE) \
             INSERT INTO edward_effects (run_id, key, state, request, result, attempts) \
             SELECT r.id, $3, 'completed', 'null'::json, $4::json, 1 FROM r \
             ON CONFLICT (run_id, key) DO UPDATE SET \
               state = 'completed', result = excluded.result, updated_at = now()",
        )
        .bind(run_id.0)
        .bind(given)
        .bind(key)
        .bind(json_text(&result))
        .execute(&self.pool)
        .await
        .map_err(store_err)?;
        if done.rows_affected() == 0 {
            return Err(self.diagnose(run_id, fence, false).await);
        }
        Ok(())
    }

    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError> {
        let mut tx = self.pool.begin().await.map_err(store_err)?;
        let row = sqlx::query(
            "SELECT status, fence, last_seq, cancel_requested_at IS NOT NULL \
             FROM edward_runs WHERE id = $1 FOR UPDATE",
        )
        .bind(run_id.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_err)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound { run_id });
        };
        let status: String = row.try_get(0).map_err(store_err)?;
        let requested: bool = row.try_get(3).map_err(store_err)?;
        if !parse_status(&status)?.is_terminal() && !requested {
            let events = vec![event];
            let (kinds, payloads) = batch_columns(&events);
            let rows = sqlx::query(&format!(
                "WITH reserve AS ( \
                   UPDATE edward_runs SET last_seq = last_seq + $3, updated_at = now(), \
                     cancel_requested_at = now() \
                   WHERE id = $1 RETURNING last_seq, updated_at \
                 ) {INSERT_RESERVED}"
            ))
            .bind(run_id.0)
            .bind(None::<String>)
            .bind(1_i64)
            .bind(&kinds)
            .bind(&payloads)
            .fetch_all(&mut *tx)
            .await
            .map_err(store_err)?;
            persisted(run_id, rows, events)?;
        }
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM edward_runs WHERE id = $1"
        ))
        .bind(run_id.0)
        .fetch_one(&mut *tx)
        .await
        .map_err(store_err)?;
        let run = run_from_row(&row)?;
        tx.commit().await.map_err(store_err)?;
        self.shared.recent.forget(run_id);
        Ok(run)
    }

    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM edward_runs WHERE status = $1 \
             ORDER BY created_at, id LIMIT $2"
        ))
        .bind(status.as_str())
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(store_err)?;
        rows.iter().map(run_from_row).collect()
    }

    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let sql = crate::common::user_runs_sql(
            &format!("SELECT {RUN_COLUMNS} FROM edward_runs"),
            |n| format!("${n}"),
            filter,
            before,
        );
        let rows = crate::common::bind_user_runs(&sql, user_id, filter, before, limit)
            .fetch_all(&self.pool)
            .await
            .map_err(store_err)?;
        rows.iter().map(run_from_row).collect()
    }

    // ------------------------------------------------------------ chats (postgres/chats.rs)

    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        self.put_chat_messages(run_id, fence, turn, messages).await
    }

    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError> {
        self.read_chat_messages(user_id, chat_id, before_run, limit)
            .await
    }

    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<BuildJob, StoreError> {
        self.create_build_job(run_id, fence, number, command).await
    }

    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError> {
        self.claim_build_job(run_id, number, fence, worker).await
    }

    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        self.finish_build_job(run_id, number, fence, result).await
    }

    async fn builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError> {
        self.list_builds(run_id).await
    }
}

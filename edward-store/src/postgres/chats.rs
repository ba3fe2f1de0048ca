//! Chat messages (`edward_chat_messages`) and build jobs (`edward_builds`)
//! of [`PgStore`]: the bodies of the chat methods of its
//! [`edward_core::RunStore`] impl, which delegates here.
//!
//! Every write checks the fence against the run row under `FOR SHARE`, in
//! the same transaction (or statement) as the write, so a concurrent
//! `start_run` (which raises the fence) waits for it and a stale attempt
//! cannot write after a newer one started. The build claim is one
//! compare-and-set `UPDATE`: concurrent claimers queue on the job's row
//! lock and re-check `(status, claim_fence)` on the version the winner
//! committed, so exactly one of them gets it.

use edward_core::{
    BuildJob, BuildResult, BuildStatus, ChatMessage, Fence, NewMessage, RunId, StoreError,
};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::PgStore;
use crate::chat_rows::{
    build_conflict, command_json, effects_json, parse_build_status, parse_command, parse_effects,
    parse_role, to_u32,
};
use crate::common::{check_fence, to_i64, to_u64};
use crate::error::store_err;

const MESSAGE_COLUMNS: &str = "run_id, turn, idx, role, text, effects::text AS effects, at";

/// Columns of `edward_builds b`.
const BUILD_COLUMNS: &str = "b.run_id, b.number, b.status, b.command::text AS command, \
     b.claimed_by, b.claim_fence, b.exit_code, b.output, b.duration_ms, b.created_at, b.updated_at";

/// The run row, share-locked, when `fence` is current: the prefix of every
/// fenced build write (`$1` run id, `$3` fence).
const FENCED_RUN: &str =
    "WITH r AS (SELECT id FROM edward_runs WHERE id = $1 AND fence <= $3 FOR SHARE)";

fn message_from_row(row: &PgRow) -> Result<ChatMessage, StoreError> {
    let run_id: Uuid = row.try_get("run_id").map_err(store_err)?;
    let turn: i32 = row.try_get("turn").map_err(store_err)?;
    let index: i32 = row.try_get("idx").map_err(store_err)?;
    let role: String = row.try_get("role").map_err(store_err)?;
    let effects: Option<String> = row.try_get("effects").map_err(store_err)?;
    Ok(ChatMessage {
        run_id: RunId(run_id),
        turn: to_u32(i64::from(turn), "turn")?,
        index: to_u32(i64::from(index), "message index")?,
        role: parse_role(&role)?,
        text: row.try_get("text").map_err(store_err)?,
        effects: parse_effects(effects.as_deref())?,
        at: row.try_get("at").map_err(store_err)?,
    })
}

fn build_from_row(row: &PgRow) -> Result<BuildJob, StoreError> {
    let run_id: Uuid = row.try_get("run_id").map_err(store_err)?;
    let number: i32 = row.try_get("number").map_err(store_err)?;
    let status: String = row.try_get("status").map_err(store_err)?;
    let command: String = row.try_get("command").map_err(store_err)?;
    let duration_ms: Option<i64> = row.try_get("duration_ms").map_err(store_err)?;
    Ok(BuildJob {
        run_id: RunId(run_id),
        number: to_u32(i64::from(number), "build number")?,
        status: parse_build_status(&status)?,
        command: parse_command(&command)?,
        claimed_by: row.try_get("claimed_by").map_err(store_err)?,
        claim_fence: Fence(to_u64(
            row.try_get("claim_fence").map_err(store_err)?,
            "claim_fence",
        )?),
        exit_code: row.try_get("exit_code").map_err(store_err)?,
        output: row.try_get("output").map_err(store_err)?,
        duration_ms: duration_ms.map(|d| to_u64(d, "duration_ms")).transpose()?,
        created_at: row.try_get("created_at").map_err(store_err)?,
        updated_at: row.try_get("updated_at").map_err(store_err)?,
    })
}

/// A `u32` as an SQL `integer` parameter.
fn to_i32(value: u32, what: &str) -> Result<i32, StoreError> {
    i32::try_from(value).map_err(|_| StoreError::permanent(format!("{what} {value} out of range")))
}

impl PgStore {
    /// The run's fence, if the run exists.
    async fn run_fence<'e, E>(executor: E, run_id: RunId) -> Result<Option<Fence>, StoreError>
    where
        E: sqlx::PgExecutor<'e>,
    {
        let fence: Option<i64> = sqlx::query_scalar("SELECT fence FROM edward_runs WHERE id = $1")
            .bind(run_id.0)
            .fetch_optional(executor)
            .await
            .map_err(store_err)?;
        fence.map(|f| Ok(Fence(to_u64(f, "fence")?))).transpose()
    }

    /// After a fenced build write matched no row: `NotFound` or
    /// `StaleFence` when the run explains it, else the build's status
    /// (`None`: no such build).
    async fn explain_build_miss(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
    ) -> Result<Option<BuildStatus>, StoreError> {
        let Some(current) = Self::run_fence(self.pool(), run_id).await? else {
            return Err(StoreError::NotFound { run_id });
        };
        check_fence(run_id, current, fence)?;
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM edward_builds WHERE run_id = $1 AND number = $2",
        )
        .bind(run_id.0)
        .bind(to_i32(number, "build number")?)
        .fetch_optional(self.pool())
        .await
        .map_err(store_err)?;
        status.as_deref().map(parse_build_status).transpose()
    }

    pub(super) async fn put_chat_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        let turn = to_i32(turn, "turn")?;
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        let texts: Vec<&str> = messages.iter().map(|m| m.text.as_str()).collect();
        let effects: Vec<Option<String>> = messages
            .iter()
            .map(|m| effects_json(m.effects.as_ref()))
            .collect();
        // One round trip: the lock, the fence check, the delete and the
        // insert run in `edward_put_messages` (migration 0014).
        let current: Option<i64> =
            sqlx::query_scalar("SELECT edward_put_messages($1, $2, $3, $4, $5, $6)")
                .bind(run_id.0)
                .bind(to_i64(fence.0, "fence")?)
                .bind(turn)
                .bind(&roles)
                .bind(&texts)
                .bind(&effects)
                .fetch_one(self.pool())
                .await
                .map_err(store_err)?;
        let Some(current) = current else {
            return Err(StoreError::NotFound { run_id });
        };
        check_fence(run_id, Fence(to_u64(current, "fence")?), fence)
    }

    pub(super) async fn read_chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM edward_chat_messages \
             WHERE user_id = $1 AND chat_id = $2 AND ($3::uuid IS NULL OR run_id < $3) \
             ORDER BY run_id DESC, turn DESC, idx DESC LIMIT $4"
        ))
        .bind(user_id)
        .bind(chat_id)
        .bind(before_run.map(|id| id.0))
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(store_err)?;
        let mut page = rows
            .iter()
            .map(message_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        page.reverse();
        Ok(page)
    }

    pub(super) async fn create_build_job(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<BuildJob, StoreError> {
        let number = to_i32(number, "build number")?;
        let mut tx = self.pool().begin().await.map_err(store_err)?;
        let current: Option<i64> =
            sqlx::query_scalar("SELECT fence FROM edward_runs WHERE id = $1 FOR SHARE")
                .bind(run_id.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(store_err)?;
        let Some(current) = current else {
            return Err(StoreError::NotFound { run_id });
        };
        check_fence(run_id, Fence(to_u64(current, "fence")?), fence)?;
        sqlx::query(
            "INSERT INTO edward_builds (run_id, number, status, command) \
             VALUES ($1, $2, 'queued', $3::json) ON CONFLICT (run_id, number) DO NOTHING",
        )
        .bind(run_id.0)
        .bind(number)
        .bind(command_json(&command))
        .execute(&mut *tx)
        .await
        .map_err(store_err)?;
        // A new statement: its snapshot sees a row a concurrent creator
        // committed while this insert waited on it.
        let row = sqlx::query(&format!(
            "SELECT {BUILD_COLUMNS} FROM edward_builds b WHERE b.run_id = $1 AND b.number = $2"
        ))
        .bind(run_id.0)
        .bind(number)
        .fetch_one(&mut *tx)
        .await
        .map_err(store_err)?;
        let job = build_from_row(&row)?;
        tx.commit().await.map_err(store_err)?;
        Ok(job)
    }

    pub(super) async fn claim_build_job(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError> {
        let row = sqlx::query(&format!(
            "{FENCED_RUN} UPDATE edward_builds b SET status = 'building', claimed_by = $4, \
               claim_fence = $3, updated_at = now() \
             FROM r WHERE b.run_id = r.id AND b.number = $2 \
               AND (b.status = 'queued' OR (b.status = 'building' AND b.claim_fence < $3)) \
             RETURNING {BUILD_COLUMNS}"
        ))
        .bind(run_id.0)
        .bind(to_i32(number, "build number")?)
        .bind(to_i64(fence.0, "fence")?)
        .bind(worker)
        .fetch_optional(self.pool())
        .await
        .map_err(store_err)?;
        match row {
            Some(row) => build_from_row(&row).map(Some),
            None => match self.explain_build_miss(run_id, number, fence).await? {
                None => Err(build_conflict(run_id, number, None, "claim")),
                // Finished, or claimed under this or a newer fence.
                Some(_) => Ok(None),
            },
        }
    }

    pub(super) async fn finish_build_job(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        let row = if result.status.is_terminal() {
            sqlx::query(&format!(
                "{FENCED_RUN} UPDATE edward_builds b SET status = $4, exit_code = $5, \
                   output = $6, duration_ms = $7, updated_at = now() \
                 FROM r WHERE b.run_id = r.id AND b.number = $2 \
                   AND b.status = 'building' AND b.claim_fence = $3 \
                 RETURNING {BUILD_COLUMNS}"
            ))
            .bind(run_id.0)
            .bind(to_i32(number, "build number")?)
            .bind(to_i64(fence.0, "fence")?)
            .bind(result.status.as_str())
            .bind(result.exit_code)
            .bind(&result.output)
            .bind(to_i64(result.duration_ms, "duration_ms")?)
            .fetch_optional(self.pool())
            .await
            .map_err(store_err)?
        } else {
            None
        };
        match row {
            Some(row) => build_from_row(&row),
            None => {
                let status = self.explain_build_miss(run_id, number, fence).await?;
                Err(build_conflict(run_id, number, status, "finish"))
            }
        }
    }

    pub(super) async fn list_builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {BUILD_COLUMNS} FROM edward_builds b WHERE b.run_id = $1 ORDER BY b.number"
        ))
        .bind(run_id.0)
        .fetch_all(self.pool())
        .await
        .map_err(store_err)?;
        if rows.is_empty() && Self::run_fence(self.pool(), run_id).await?.is_none() {
            return Err(StoreError::NotFound { run_id });
        }
        rows.iter().map(build_from_row).collect()
    }
}

//! Chat messages (table `chat_messages`) and build jobs (table `builds`) of
//! [`SqliteStore`]: the bodies of the chat methods of its
//! [`edward_core::RunStore`] impl, which delegates here.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction that reads the run's
//! fence and writes under the database's write lock, so a newer
//! `start_run` cannot slip between the fence check and the write. The
//! build claim is one compare-and-set `UPDATE` on `(status, claim_fence)`.

use edward_core::{
    BuildJob, BuildResult, BuildStatus, ChatMessage, Fence, NewMessage, RunId, StoreError,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite, Transaction};
use uuid::Uuid;

use super::{INSERT_CHUNK, SqliteStore, from_micros, micros, now, run_state};
use crate::chat_rows::{
    build_conflict, command_json, effects_json, parse_build_status, parse_command, parse_effects,
    parse_role, to_u32,
};
use crate::common::{check_fence, to_i64, to_u64};
use crate::error::store_err;

const MESSAGE_COLUMNS: &str = "run_id, turn, idx, role, text, effects, at";

const BUILD_COLUMNS: &str = "run_id, number, status, command, claimed_by, claim_fence, \
     exit_code, output, duration_ms, created_at, updated_at";

fn message_from_row(row: &SqliteRow) -> Result<ChatMessage, StoreError> {
    let run_id: Uuid = row.try_get("run_id").map_err(store_err)?;
    let role: String = row.try_get("role").map_err(store_err)?;
    let effects: Option<String> = row.try_get("effects").map_err(store_err)?;
    Ok(ChatMessage {
        run_id: RunId(run_id),
        turn: to_u32(row.try_get("turn").map_err(store_err)?, "turn")?,
        index: to_u32(row.try_get("idx").map_err(store_err)?, "message index")?,
        role: parse_role(&role)?,
        text: row.try_get("text").map_err(store_err)?,
        effects: parse_effects(effects.as_deref())?,
        at: from_micros(row.try_get("at").map_err(store_err)?)?,
    })
}

fn build_from_row(row: &SqliteRow) -> Result<BuildJob, StoreError> {
    let run_id: Uuid = row.try_get("run_id").map_err(store_err)?;
    let status: String = row.try_get("status").map_err(store_err)?;
    let command: String = row.try_get("command").map_err(store_err)?;
    let exit_code: Option<i64> = row.try_get("exit_code").map_err(store_err)?;
    let duration_ms: Option<i64> = row.try_get("duration_ms").map_err(store_err)?;
    Ok(BuildJob {
        run_id: RunId(run_id),
        number: to_u32(row.try_get("number").map_err(store_err)?, "build number")?,
        status: parse_build_status(&status)?,
        command: parse_command(&command)?,
        claimed_by: row.try_get("claimed_by").map_err(store_err)?,
        claim_fence: Fence(to_u64(
            row.try_get("claim_fence").map_err(store_err)?,
            "claim_fence",
        )?),
        exit_code: exit_code
            .map(|c| i32::try_from(c).map_err(|_| crate::error::corrupt(format!("exit code {c}"))))
            .transpose()?,
        output: row.try_get("output").map_err(store_err)?,
        duration_ms: duration_ms.map(|d| to_u64(d, "duration_ms")).transpose()?,
        created_at: from_micros(row.try_get("created_at").map_err(store_err)?)?,
        updated_at: from_micros(row.try_get("updated_at").map_err(store_err)?)?,
    })
}

/// `Ok` when the run exists and `fence` is not older than its fence.
async fn check_run_fence(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: RunId,
    fence: Fence,
) -> Result<(), StoreError> {
    let Some((_, current, _)) = run_state(tx, run_id).await? else {
        return Err(StoreError::NotFound { run_id });
    };
    check_fence(run_id, current, fence)
}

/// The status of build `number`, inside `tx` (`None`: no such build).
async fn build_status(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: RunId,
    number: u32,
) -> Result<Option<BuildStatus>, StoreError> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM builds WHERE run_id = ? AND number = ?")
            .bind(run_id.0)
            .bind(i64::from(number))
            .fetch_optional(&mut **tx)
            .await
            .map_err(store_err)?;
    status.as_deref().map(parse_build_status).transpose()
}

impl SqliteStore {
    pub(super) async fn put_chat_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await.map_err(store_err)?;
        let row = sqlx::query("SELECT fence, user_id, chat_id FROM runs WHERE id = ?")
            .bind(run_id.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_err)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound { run_id });
        };
        let current = Fence(to_u64(row.try_get(0).map_err(store_err)?, "fence")?);
        check_fence(run_id, current, fence)?;
        let user_id: String = row.try_get(1).map_err(store_err)?;
        let chat_id: String = row.try_get(2).map_err(store_err)?;
        sqlx::query("DELETE FROM chat_messages WHERE run_id = ? AND turn >= ?")
            .bind(run_id.0)
            .bind(i64::from(turn))
            .execute(&mut *tx)
            .await
            .map_err(store_err)?;
        let at = micros(now());
        let effects: Vec<Option<String>> = messages
            .iter()
            .map(|m| effects_json(m.effects.as_ref()))
            .collect();
        let mut offset = 0usize;
        for chunk in messages.chunks(INSERT_CHUNK) {
            let mut builder: sqlx::QueryBuilder<'_, Sqlite> = sqlx::QueryBuilder::new(
                "INSERT INTO chat_messages \
                 (run_id, user_id, chat_id, turn, idx, role, text, effects, at) ",
            );
            builder.push_values(chunk.iter().enumerate(), |mut row, (i, m)| {
                row.push_bind(run_id.0)
                    .push_bind(user_id.as_str())
                    .push_bind(chat_id.as_str())
                    .push_bind(i64::from(turn))
                    .push_bind((offset + i) as i64)
                    .push_bind(m.role.as_str())
                    .push_bind(m.text.as_str())
                    .push_bind(effects[offset + i].as_deref())
                    .push_bind(at);
            });
            builder.build().execute(&mut *tx).await.map_err(store_err)?;
            offset += chunk.len();
        }
        tx.commit().await.map_err(store_err)
    }

    pub(super) async fn read_chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let before = before_run.map(|id| id.0);
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM chat_messages \
             WHERE user_id = ? AND chat_id = ? AND (? IS NULL OR run_id < ?) \
             ORDER BY run_id DESC, turn DESC, idx DESC LIMIT ?"
        ))
        .bind(user_id)
        .bind(chat_id)
        .bind(before)
        .bind(before)
        .bind(limit)
        .fetch_all(&self.reader)
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
        let mut tx = self.begin_write().await.map_err(store_err)?;
        check_run_fence(&mut tx, run_id, fence).await?;
        let at = micros(now());
        sqlx::query(
            "INSERT INTO builds (run_id, number, status, command, claim_fence, created_at, updated_at) \
             VALUES (?, ?, 'queued', ?, 0, ?, ?) ON CONFLICT (run_id, number) DO NOTHING",
        )
        .bind(run_id.0)
        .bind(i64::from(number))
        .bind(command_json(&command))
        .bind(at)
        .bind(at)
        .execute(&mut *tx)
        .await
        .map_err(store_err)?;
        let row = sqlx::query(&format!(
            "SELECT {BUILD_COLUMNS} FROM builds WHERE run_id = ? AND number = ?"
        ))
        .bind(run_id.0)
        .bind(i64::from(number))
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
        let given = to_i64(fence.0, "fence")?;
        let mut tx = self.begin_write().await.map_err(store_err)?;
        let row = sqlx::query(&format!(
            "UPDATE builds SET status = 'building', claimed_by = ?, claim_fence = ?, updated_at = ? \
             WHERE run_id = ? AND number = ? \
               AND (status = 'queued' OR (status = 'building' AND claim_fence < ?)) \
               AND EXISTS (SELECT 1 FROM runs WHERE id = ? AND fence <= ?) \
             RETURNING {BUILD_COLUMNS}"
        ))
        .bind(worker)
        .bind(given)
        .bind(micros(now()))
        .bind(run_id.0)
        .bind(i64::from(number))
        .bind(given)
        .bind(run_id.0)
        .bind(given)
        .fetch_optional(&mut *tx)
        .await
        .map_err(store_err)?;
        let Some(row) = row else {
            check_run_fence(&mut tx, run_id, fence).await?;
            if build_status(&mut tx, run_id, number).await?.is_none() {
                return Err(build_conflict(run_id, number, None, "claim"));
            }
            // Finished, or claimed under this or a newer fence.
            return Ok(None);
        };
        let job = build_from_row(&row)?;
        tx.commit().await.map_err(store_err)?;
        Ok(Some(job))
    }

    pub(super) async fn finish_build_job(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        let given = to_i64(fence.0, "fence")?;
        let duration_ms = to_i64(result.duration_ms, "duration_ms")?;
        let mut tx = self.begin_write().await.map_err(store_err)?;
        check_run_fence(&mut tx, run_id, fence).await?;
        let row = if result.status.is_terminal() {
            sqlx::query(&format!(
                "UPDATE builds SET status = ?, exit_code = ?, output = ?, duration_ms = ?, updated_at = ? \
                 WHERE run_id = ? AND number = ? AND status = 'building' AND claim_fence = ? \
                 RETURNING {BUILD_COLUMNS}"
            ))
            .bind(result.status.as_str())
            .bind(result.exit_code)
            .bind(&result.output)
            .bind(duration_ms)
            .bind(micros(now()))
            .bind(run_id.0)
            .bind(i64::from(number))
            .bind(given)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_err)?
        } else {
            None
        };
        let Some(row) = row else {
            let status = build_status(&mut tx, run_id, number).await?;
            return Err(build_conflict(run_id, number, status, "finish"));
        };
        let job = build_from_row(&row)?;
        tx.commit().await.map_err(store_err)?;
        Ok(job)
    }

    pub(super) async fn list_builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {BUILD_COLUMNS} FROM builds WHERE run_id = ? ORDER BY number"
        ))
        .bind(run_id.0)
        .fetch_all(&self.reader)
        .await
        .map_err(store_err)?;
        if rows.is_empty() && !self.run_exists(run_id).await? {
            return Err(StoreError::NotFound { run_id });
        }
        rows.iter().map(build_from_row).collect()
    }

    /// Whether the run exists.
    async fn run_exists(&self, run_id: RunId) -> Result<bool, StoreError> {
        let found = sqlx::query("SELECT 1 FROM runs WHERE id = ?")
            .bind(run_id.0)
            .fetch_optional(&self.reader)
            .await
            .map_err(store_err)?;
        Ok(found.is_some())
    }
}

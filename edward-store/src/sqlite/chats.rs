//! Chat messages (table `chat_messages`) and build jobs (table `builds`) of
//! [`SqliteStore`]: the bodies of the chat methods of its
//! [`edward_core::RunStore`] impl, which delegates here.
//!
//! Every write is a request to the writer thread (`writer.rs`): it reads
//! the run's fence and writes inside the write transaction, so a newer
//! `start_run` cannot slip between the fence check and the write. The
//! build claim is one compare-and-set `UPDATE` on `(status, claim_fence)`.

use edward_core::{
    BuildJob, BuildResult, BuildStatus, ChatMessage, Fence, NewMessage, RunId, StoreError,
};
use rusqlite::{Connection, OptionalExtension, params};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::ops::check_run_fence;
use super::rows::{BUILD_COLUMNS, build_from};
use super::writer::sqlite_store_err;
use super::{SqliteStore, from_micros, micros, now};
use crate::chat_rows::{
    build_conflict, command_json, effects_json, parse_build_status, parse_effects, parse_role,
    to_u32,
};
use crate::common::{check_fence, to_i64, to_u64};
use crate::error::store_err;

const MESSAGE_COLUMNS: &str = "run_id, turn, idx, role, text, effects, at";

fn se(e: rusqlite::Error) -> StoreError {
    sqlite_store_err(&e)
}

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

/// The status of build `number` (`None`: no such build).
fn build_status(
    conn: &Connection,
    run_id: RunId,
    number: u32,
) -> Result<Option<BuildStatus>, StoreError> {
    let status: Option<String> = conn
        .prepare_cached("SELECT status FROM builds WHERE run_id = ?1 AND number = ?2")
        .map_err(se)?
        .query_row(params![run_id.0, i64::from(number)], |r| r.get(0))
        .optional()
        .map_err(se)?;
    status.as_deref().map(parse_build_status).transpose()
}

fn select_build(conn: &Connection, run_id: RunId, number: u32) -> Result<BuildJob, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {BUILD_COLUMNS} FROM builds WHERE run_id = ?1 AND number = ?2"
    ))
    .map_err(se)?
    .query_row(params![run_id.0, i64::from(number)], |row| {
        Ok(build_from(row))
    })
    .map_err(se)?
}

/// A `put_messages` request.
struct PutMessages {
    run_id: RunId,
    fence: Fence,
    turn: u32,
    messages: Vec<NewMessage>,
}

fn put_messages(conn: &Connection, p: &PutMessages) -> Result<(), StoreError> {
    let run_id = p.run_id;
    let row = conn
        .prepare_cached("SELECT fence, user_id, chat_id FROM runs WHERE id = ?1")
        .map_err(se)?
        .query_row(params![run_id.0], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .optional()
        .map_err(se)?;
    let Some((fence, user_id, chat_id)) = row else {
        return Err(StoreError::NotFound { run_id });
    };
    check_fence(run_id, Fence(to_u64(fence, "fence")?), p.fence)?;
    conn.prepare_cached("DELETE FROM chat_messages WHERE run_id = ?1 AND turn >= ?2")
        .map_err(se)?
        .execute(params![run_id.0, i64::from(p.turn)])
        .map_err(se)?;
    let at = micros(now());
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO chat_messages \
             (run_id, user_id, chat_id, turn, idx, role, text, effects, at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .map_err(se)?;
    for (i, m) in p.messages.iter().enumerate() {
        insert
            .execute(params![
                run_id.0,
                user_id,
                chat_id,
                i64::from(p.turn),
                i as i64,
                m.role.as_str(),
                m.text,
                effects_json(m.effects.as_ref()),
                at
            ])
            .map_err(se)?;
    }
    Ok(())
}

/// A `create_build` request.
struct CreateBuild {
    run_id: RunId,
    fence: Fence,
    number: u32,
    command: Vec<String>,
}

fn create_build(conn: &Connection, c: &CreateBuild) -> Result<BuildJob, StoreError> {
    check_run_fence(conn, c.run_id, c.fence)?;
    let at = micros(now());
    conn.prepare_cached(
        "INSERT INTO builds (run_id, number, status, command, claim_fence, created_at, updated_at) \
         VALUES (?1, ?2, 'queued', ?3, 0, ?4, ?4) ON CONFLICT (run_id, number) DO NOTHING",
    )
    .map_err(se)?
    .execute(params![
        c.run_id.0,
        i64::from(c.number),
        command_json(&c.command),
        at
    ])
    .map_err(se)?;
    select_build(conn, c.run_id, c.number)
}

/// A `claim_build` request.
struct ClaimBuild {
    run_id: RunId,
    number: u32,
    fence: Fence,
    worker: String,
}

fn claim_build(conn: &Connection, c: &ClaimBuild) -> Result<Option<BuildJob>, StoreError> {
    let given = to_i64(c.fence.0, "fence")?;
    let row = conn
        .prepare_cached(&format!(
            "UPDATE builds SET status = 'building', claimed_by = ?1, claim_fence = ?2, updated_at = ?3 \
             WHERE run_id = ?4 AND number = ?5 \
               AND (status = 'queued' OR (status = 'building' AND claim_fence < ?2)) \
               AND EXISTS (SELECT 1 FROM runs WHERE id = ?4 AND fence <= ?2) \
             RETURNING {BUILD_COLUMNS}"
        ))
        .map_err(se)?
        .query_row(
            params![c.worker, given, micros(now()), c.run_id.0, i64::from(c.number)],
            |row| Ok(build_from(row)),
        )
        .optional()
        .map_err(se)?;
    match row {
        Some(job) => job.map(Some),
        None => {
            check_run_fence(conn, c.run_id, c.fence)?;
            if build_status(conn, c.run_id, c.number)?.is_none() {
                return Err(build_conflict(c.run_id, c.number, None, "claim"));
            }
            // Finished, or claimed under this or a newer fence.
            Ok(None)
        }
    }
}

/// A `finish_build` request.
struct FinishBuild {
    run_id: RunId,
    number: u32,
    fence: Fence,
    result: BuildResult,
}

fn finish_build(conn: &Connection, f: &FinishBuild) -> Result<BuildJob, StoreError> {
    let given = to_i64(f.fence.0, "fence")?;
    let duration_ms = to_i64(f.result.duration_ms, "duration_ms")?;
    check_run_fence(conn, f.run_id, f.fence)?;
    let row = if f.result.status.is_terminal() {
        conn.prepare_cached(&format!(
            "UPDATE builds SET status = ?1, exit_code = ?2, output = ?3, duration_ms = ?4, updated_at = ?5 \
             WHERE run_id = ?6 AND number = ?7 AND status = 'building' AND claim_fence = ?8 \
             RETURNING {BUILD_COLUMNS}"
        ))
        .map_err(se)?
        .query_row(
            params![
                f.result.status.as_str(),
                f.result.exit_code,
                f.result.output,
                duration_ms,
                micros(now()),
                f.run_id.0,
                i64::from(f.number),
                given
            ],
            |row| Ok(build_from(row)),
        )
        .optional()
        .map_err(se)?
    } else {
        None
    };
    match row {
        Some(job) => job,
        None => {
            let status = build_status(conn, f.run_id, f.number)?;
            Err(build_conflict(f.run_id, f.number, status, "finish"))
        }
    }
}

impl SqliteStore {
    pub(super) async fn put_chat_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        let put = PutMessages {
            run_id,
            fence,
            turn,
            messages,
        };
        self.jobs.run(put, put_messages).await
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
        let create = CreateBuild {
            run_id,
            fence,
            number,
            command,
        };
        self.jobs.run(create, create_build).await
    }

    pub(super) async fn claim_build_job(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError> {
        let claim = ClaimBuild {
            run_id,
            number,
            fence,
            worker: worker.to_owned(),
        };
        self.jobs.run(claim, claim_build).await
    }

    pub(super) async fn finish_build_job(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        let finish = FinishBuild {
            run_id,
            number,
            fence,
            result,
        };
        self.jobs.run(finish, finish_build).await
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
        rows.iter().map(build_from).collect()
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

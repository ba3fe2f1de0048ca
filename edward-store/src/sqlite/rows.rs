//! Row decoding shared by the two ways [`super::SqliteStore`] talks to its
//! file: sqlx rows from the reader pool and rusqlite rows from the writer
//! thread. Each record type has one decoder, written against [`Cols`].

use edward_core::{BuildJob, EffectRecord, Fence, Lease, QueueError, Run, RunId, StoreError};
use uuid::Uuid;

use super::from_micros;
use crate::chat_rows::{parse_build_status, parse_command, to_u32};
use crate::common::{parse_effect_state, parse_json, parse_status, queue_corrupt, to_u64};
use crate::error::{corrupt, store_err};

/// Named columns of one result row, whichever library produced it.
pub(crate) trait Cols {
    /// An `INTEGER` column.
    fn int(&self, name: &str) -> Result<i64, StoreError>;
    /// A nullable `INTEGER` column.
    fn opt_int(&self, name: &str) -> Result<Option<i64>, StoreError>;
    /// A `TEXT` column.
    fn text(&self, name: &str) -> Result<String, StoreError>;
    /// A nullable `TEXT` column.
    fn opt_text(&self, name: &str) -> Result<Option<String>, StoreError>;
    /// A `BLOB` column.
    fn blob(&self, name: &str) -> Result<Vec<u8>, StoreError>;
    /// A 16-byte UUID `BLOB` column.
    fn uuid(&self, name: &str) -> Result<Uuid, StoreError> {
        let bytes = self.blob(name)?;
        Uuid::from_slice(&bytes).map_err(|_| corrupt(format!("{name}: not a 16-byte uuid")))
    }
}

impl Cols for sqlx::sqlite::SqliteRow {
    fn int(&self, name: &str) -> Result<i64, StoreError> {
        sqlx::Row::try_get(self, name).map_err(store_err)
    }
    fn opt_int(&self, name: &str) -> Result<Option<i64>, StoreError> {
        sqlx::Row::try_get(self, name).map_err(store_err)
    }
    fn text(&self, name: &str) -> Result<String, StoreError> {
        sqlx::Row::try_get(self, name).map_err(store_err)
    }
    fn opt_text(&self, name: &str) -> Result<Option<String>, StoreError> {
        sqlx::Row::try_get(self, name).map_err(store_err)
    }
    fn blob(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        sqlx::Row::try_get(self, name).map_err(store_err)
    }
}

impl Cols for rusqlite::Row<'_> {
    fn int(&self, name: &str) -> Result<i64, StoreError> {
        column(self, name)
    }
    fn opt_int(&self, name: &str) -> Result<Option<i64>, StoreError> {
        column(self, name)
    }
    fn text(&self, name: &str) -> Result<String, StoreError> {
        column(self, name)
    }
    fn opt_text(&self, name: &str) -> Result<Option<String>, StoreError> {
        column(self, name)
    }
    fn blob(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        column(self, name)
    }
}

fn column<T: rusqlite::types::FromSql>(
    row: &rusqlite::Row<'_>,
    name: &str,
) -> Result<T, StoreError> {
    row.get(name)
        .map_err(|e| super::writer::sqlite_store_err(&e))
}

/// The columns [`run_from`] reads, as a `SELECT` list over `runs`.
///
/// A run's last seq and last change are its newest event's: appends write
/// only `run_events`, never the run's row (which holds the checkpoint, a
/// page of its own per run: rewriting it on every append doubled the pages
/// each group commit wrote). The `runs.last_seq` column is not maintained.
pub(crate) const RUN_COLUMNS: &str = "id, user_id, chat_id, status, request, fence, \
     COALESCE((SELECT e.seq FROM run_events e WHERE e.run_id = runs.id \
       ORDER BY e.seq DESC LIMIT 1), 0) AS last_seq, \
     created_at, \
     MAX(updated_at, COALESCE((SELECT e.at FROM run_events e WHERE e.run_id = runs.id \
       ORDER BY e.seq DESC LIMIT 1), 0)) AS updated_at, \
     finished_at, terminal_reason, cancel_requested_at";

pub(crate) fn run_from(row: &impl Cols) -> Result<Run, StoreError> {
    Ok(Run {
        id: RunId(row.uuid("id")?),
        user_id: row.text("user_id")?,
        chat_id: row.text("chat_id")?,
        status: parse_status(&row.text("status")?)?,
        request: parse_json(&row.text("request")?)?,
        fence: Fence(to_u64(row.int("fence")?, "fence")?),
        last_seq: to_u64(row.int("last_seq")?, "last_seq")?,
        created_at: from_micros(row.int("created_at")?)?,
        updated_at: from_micros(row.int("updated_at")?)?,
        finished_at: row.opt_int("finished_at")?.map(from_micros).transpose()?,
        terminal_reason: row.opt_text("terminal_reason")?,
        cancel_requested_at: row
            .opt_int("cancel_requested_at")?
            .map(from_micros)
            .transpose()?,
    })
}

/// An effect record from `state, request, result, attempts`.
pub(crate) fn effect_from(key: &str, row: &impl Cols) -> Result<EffectRecord, StoreError> {
    let attempts = row.int("attempts")?;
    Ok(EffectRecord {
        key: key.to_owned(),
        state: parse_effect_state(&row.text("state")?)?,
        request: parse_json(&row.text("request")?)?,
        result: row
            .opt_text("result")?
            .as_deref()
            .map(parse_json)
            .transpose()?,
        attempts: u32::try_from(attempts).map_err(|_| corrupt(format!("attempts {attempts}")))?,
    })
}

/// The columns [`build_from`] reads.
pub(crate) const BUILD_COLUMNS: &str = "run_id, number, status, command, claimed_by, claim_fence, \
     exit_code, output, duration_ms, created_at, updated_at";

pub(crate) fn build_from(row: &impl Cols) -> Result<BuildJob, StoreError> {
    Ok(BuildJob {
        run_id: RunId(row.uuid("run_id")?),
        number: to_u32(row.int("number")?, "build number")?,
        status: parse_build_status(&row.text("status")?)?,
        command: parse_command(&row.text("command")?)?,
        claimed_by: row.opt_text("claimed_by")?,
        claim_fence: Fence(to_u64(row.int("claim_fence")?, "claim_fence")?),
        exit_code: row
            .opt_int("exit_code")?
            .map(|c| i32::try_from(c).map_err(|_| corrupt(format!("exit code {c}"))))
            .transpose()?,
        output: row.opt_text("output")?,
        duration_ms: row
            .opt_int("duration_ms")?
            .map(|d| to_u64(d, "duration_ms"))
            .transpose()?,
        created_at: from_micros(row.int("created_at")?)?,
        updated_at: from_micros(row.int("updated_at")?)?,
    })
}

/// The columns [`lease_from`] reads.
pub(crate) const LEASE_COLUMNS: &str = "run_id, owner, fence, attempts, lease_expires_at";

pub(crate) fn lease_from(row: &impl Cols) -> Result<Lease, QueueError> {
    let q = |e: StoreError| queue_corrupt(e);
    let fence = row.int("fence").map_err(q)?;
    let attempts = row.int("attempts").map_err(q)?;
    let expires = row.int("lease_expires_at").map_err(q)?;
    Ok(Lease {
        run_id: RunId(row.uuid("run_id").map_err(q)?),
        owner: row.text("owner").map_err(q)?,
        fence: Fence(u64::try_from(fence).map_err(|_| queue_corrupt(format!("fence {fence}")))?),
        attempt: u32::try_from(attempts)
            .map_err(|_| queue_corrupt(format!("attempts {attempts}")))?,
        expires_at: chrono::DateTime::from_timestamp_micros(expires)
            .ok_or_else(|| queue_corrupt(format!("timestamp {expires}")))?,
    })
}

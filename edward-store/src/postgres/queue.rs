//! [`PgQueue`]: the work queue on Postgres.
//!
//! `claim` picks the oldest ready row (`run_at <= now()`, not dead-lettered,
//! unleased or lease expired) with `FOR UPDATE SKIP LOCKED`, so concurrent
//! claimers never block on each other or take the same row, and stamps it
//! with the owner, `attempts + 1`, a lease expiry and a fence from the
//! `edward_fence_seq` sequence (strictly increasing across all claims).
//! Heartbeat, ack and retry are compare-and-set on `(owner, fence)`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use edward_core::{
    DeadLetter, Fence, Lease, QueueError, RetryOutcome, RetryPolicy, RunId, RunQueue,
};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};
use uuid::Uuid;

use super::{PgOptions, connect_pool};
use crate::common::{backoff_with_jitter, lease_lost, lease_ms, queue_corrupt, queue_range};
use crate::error::{ConnectError, queue_err};

/// Postgres [`RunQueue`]. Cloning is cheap (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgQueue {
    pool: PgPool,
}

impl PgQueue {
    /// Connect with `options` (migrations run unless turned off).
    pub async fn connect_with(url: &str, options: PgOptions) -> Result<Self, ConnectError> {
        Ok(PgQueue {
            pool: connect_pool(url, &options).await?,
        })
    }

    /// Use an existing, migrated pool.
    pub fn from_pool(pool: PgPool) -> Self {
        PgQueue { pool }
    }
}

fn lease_from_row(row: &PgRow) -> Result<Lease, QueueError> {
    let id: Uuid = row.try_get("run_id").map_err(queue_err)?;
    let fence: i64 = row.try_get("fence").map_err(queue_err)?;
    let attempts: i32 = row.try_get("attempts").map_err(queue_err)?;
    Ok(Lease {
        run_id: RunId(id),
        owner: row.try_get("owner").map_err(queue_err)?,
        fence: Fence(u64::try_from(fence).map_err(|_| queue_corrupt(format!("fence {fence}")))?),
        attempt: u32::try_from(attempts)
            .map_err(|_| queue_corrupt(format!("attempts {attempts}")))?,
        expires_at: row.try_get("lease_expires_at").map_err(queue_err)?,
    })
}

#[async_trait]
impl RunQueue for PgQueue {
    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError> {
        sqlx::query(
            "INSERT INTO edward_queue (run_id) VALUES ($1) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(run_id.0)
        .execute(&self.pool)
        .await
        .map_err(queue_err)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError> {
        let row = sqlx::query(
            "WITH next AS ( \
               SELECT run_id FROM edward_queue \
               WHERE dead_lettered_at IS NULL AND run_at <= now() \
                 AND (owner IS NULL OR lease_expires_at <= now()) \
               ORDER BY run_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED \
             ) \
             UPDATE edward_queue q SET owner = $1, fence = nextval('edward_fence_seq'), \
               attempts = q.attempts + 1, \
               lease_expires_at = now() + $2 * interval '1 millisecond' \
             FROM next WHERE q.run_id = next.run_id \
             RETURNING q.run_id, q.owner, q.fence, q.attempts, q.lease_expires_at",
        )
        .bind(owner)
        .bind(lease_ms(lease_for) as f64)
        .fetch_optional(&self.pool)
        .await
        .map_err(queue_err)?;
        let lease = row.as_ref().map(lease_from_row).transpose()?;
        if let Some(lease) = &lease {
            tracing::debug!(run_id = %lease.run_id, fence = %lease.fence, attempt = lease.attempt, "claimed");
        }
        Ok(lease)
    }

    /// Up to `max` jobs in one statement (one round trip, one commit).
    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim_many(
        &self,
        owner: &str,
        lease_for: Duration,
        max: usize,
    ) -> Result<Vec<Lease>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "WITH next AS ( \
               SELECT run_id FROM edward_queue \
               WHERE dead_lettered_at IS NULL AND run_at <= now() \
                 AND (owner IS NULL OR lease_expires_at <= now()) \
               ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED \
             ) \
             UPDATE edward_queue q SET owner = $1, fence = nextval('edward_fence_seq'), \
               attempts = q.attempts + 1, \
               lease_expires_at = now() + $2 * interval '1 millisecond' \
             FROM next WHERE q.run_id = next.run_id \
             RETURNING q.run_id, q.owner, q.fence, q.attempts, q.lease_expires_at, q.run_at, q.seq",
        )
        .bind(owner)
        .bind(lease_ms(lease_for) as f64)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(queue_err)?;
        // RETURNING has no order: oldest first, as the claims were chosen.
        let mut claimed = rows
            .iter()
            .map(|row| {
                let run_at: DateTime<Utc> = row.try_get("run_at").map_err(queue_err)?;
                let seq: i64 = row.try_get("seq").map_err(queue_err)?;
                Ok(((run_at, seq), lease_from_row(row)?))
            })
            .collect::<Result<Vec<_>, QueueError>>()?;
        claimed.sort_by_key(|c| c.0);
        Ok(claimed.into_iter().map(|(_, lease)| lease).collect())
    }

    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError> {
        let row = sqlx::query(
            "UPDATE edward_queue SET lease_expires_at = now() + $4 * interval '1 millisecond' \
             WHERE run_id = $1 AND owner = $2 AND fence = $3 AND dead_lettered_at IS NULL \
             RETURNING run_id, owner, fence, attempts, lease_expires_at",
        )
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .bind(lease_ms(lease_for) as f64)
        .fetch_optional(&self.pool)
        .await
        .map_err(queue_err)?;
        match row {
            Some(row) => lease_from_row(&row),
            None => Err(lease_lost(lease.run_id, lease.fence)),
        }
    }

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        let done = sqlx::query(
            "DELETE FROM edward_queue WHERE run_id = $1 AND owner = $2 AND fence = $3 \
             AND dead_lettered_at IS NULL",
        )
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .execute(&self.pool)
        .await
        .map_err(queue_err)?;
        if done.rows_affected() == 0 {
            return Err(lease_lost(lease.run_id, lease.fence));
        }
        Ok(())
    }

    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError> {
        // While the lease is held, the stored attempts equal `lease.attempt`
        // (claim sets both together), so the delay can be computed here and
        // the decision made in one statement against the stored value.
        let delay = backoff_with_jitter(&policy, lease.attempt);
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX) as f64;
        let max_attempts = i32::try_from(policy.max_attempts).unwrap_or(i32::MAX);
        let row = sqlx::query(
            "UPDATE edward_queue SET owner = NULL, lease_expires_at = NULL, last_error = $4, \
               dead_lettered_at = CASE WHEN attempts >= $5 THEN now() END, \
               run_at = CASE WHEN attempts >= $5 THEN run_at \
                        ELSE now() + $6 * interval '1 millisecond' END \
             WHERE run_id = $1 AND owner = $2 AND fence = $3 AND dead_lettered_at IS NULL \
             RETURNING dead_lettered_at IS NOT NULL AS dead, run_at, attempts",
        )
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .bind(error)
        .bind(max_attempts)
        .bind(delay_ms)
        .fetch_optional(&self.pool)
        .await
        .map_err(queue_err)?;
        let Some(row) = row else {
            return Err(lease_lost(lease.run_id, lease.fence));
        };
        let dead: bool = row.try_get(0).map_err(queue_err)?;
        if dead {
            let attempts: i32 = row.try_get(2).map_err(queue_err)?;
            tracing::warn!(run_id = %lease.run_id, attempts, error, "job dead-lettered");
            return Ok(RetryOutcome::DeadLettered);
        }
        let at: DateTime<Utc> = row.try_get(1).map_err(queue_err)?;
        Ok(RetryOutcome::Scheduled { at })
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(
            "SELECT run_id, attempts, last_error, dead_lettered_at FROM edward_queue \
             WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at DESC, seq DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(queue_err)?;
        rows.iter()
            .map(|row| {
                let id: Uuid = row.try_get(0).map_err(queue_err)?;
                let attempts: i32 = row.try_get(1).map_err(queue_err)?;
                Ok(DeadLetter {
                    run_id: RunId(id),
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    last_error: row.try_get(2).map_err(queue_err)?,
                    at: row.try_get(3).map_err(queue_err)?,
                })
            })
            .collect()
    }
}

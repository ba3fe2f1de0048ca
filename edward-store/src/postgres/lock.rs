//! [`PgLock`]: owner-checked lease locks on Postgres.
//!
//! A row per held lock with a random token and an expiry (database time).
//! Acquire is one `INSERT … ON CONFLICT DO UPDATE … WHERE expired`, so two
//! racing acquirers are serialised by the row lock and exactly one wins;
//! renew and release compare the token and refuse an expired guard, so a
//! holder that lost its lease can never extend or drop the next holder's.
//! Fencing tokens come from `edward_fence_seq`, the queue's fence sequence.
//! (A table rather than `pg_advisory_lock`: advisory locks belong to a
//! session, which a pooled connection cannot keep for a lease's lifetime.)

use std::time::Duration;

use async_trait::async_trait;
use edward_core::{InfraError, Lock, LockGuard};
use sqlx::Row;
use sqlx::postgres::PgPool;
use uuid::Uuid;

use crate::common::lease_ms;
use crate::error::infra_err;

/// Postgres [`Lock`]. Cloning is cheap (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgLock {
    pool: PgPool,
}

impl PgLock {
    /// Use a migrated pool (e.g. [`super::PgStore::pool`]).
    pub fn from_pool(pool: PgPool) -> Self {
        PgLock { pool }
    }
}

#[async_trait]
impl Lock for PgLock {
    async fn try_acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, InfraError> {
        let token = Uuid::new_v4().simple().to_string();
        let won = sqlx::query(
            "INSERT INTO edward_locks (name, owner, token, expires_at) \
             VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond') \
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, token = excluded.token, \
               expires_at = excluded.expires_at \
             WHERE edward_locks.expires_at <= now() \
             RETURNING nextval('edward_fence_seq') AS fence",
        )
        .bind(name)
        .bind(owner)
        .bind(&token)
        .bind(lease_ms(ttl) as f64)
        .fetch_optional(&self.pool)
        .await
        .map_err(infra_err)?;
        let Some(row) = won else {
            return Ok(None);
        };
        let fence: i64 = row.try_get("fence").map_err(infra_err)?;
        Ok(Some(LockGuard {
            name: name.to_owned(),
            owner: owner.to_owned(),
            token,
            fence: u64::try_from(fence).map_err(|_| InfraError::Backend {
                message: format!("negative lock fence {fence}"),
                retryable: false,
            })?,
        }))
    }

    async fn renew(&self, guard: &LockGuard, ttl: Duration) -> Result<bool, InfraError> {
        let done = sqlx::query(
            "UPDATE edward_locks SET expires_at = now() + $3 * interval '1 millisecond' \
             WHERE name = $1 AND token = $2 AND expires_at > now()",
        )
        .bind(&guard.name)
        .bind(&guard.token)
        .bind(lease_ms(ttl) as f64)
        .execute(&self.pool)
        .await
        .map_err(infra_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, guard: &LockGuard) -> Result<bool, InfraError> {
        let done = sqlx::query(
            "DELETE FROM edward_locks WHERE name = $1 AND token = $2 AND expires_at > now()",
        )
        .bind(&guard.name)
        .bind(&guard.token)
        .execute(&self.pool)
        .await
        .map_err(infra_err)?;
        Ok(done.rows_affected() == 1)
    }
}

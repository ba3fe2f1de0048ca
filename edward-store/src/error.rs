//! Mapping of [`sqlx::Error`] onto the trait error types, with the
//! retryable/permanent split: serialization failures, deadlocks, lock
//! timeouts, connection loss and SQLite `BUSY`/`LOCKED` are retryable.

use edward_core::{InfraError, QueueError, StoreError};

/// Failure to open a store (connect, configure or migrate).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL or options were refused.
    #[error("invalid database configuration: {0}")]
    Config(String),
    /// The database could not be reached or refused the connection.
    #[error("could not connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    /// Running the embedded migrations failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Whether retrying the same call may succeed after `err`.
pub(crate) fn is_retryable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let Some(code) = db.code() else {
                return false;
            };
            match code.as_ref() {
                // Postgres: serialization_failure, deadlock_detected,
                // lock_not_available, admin/crash shutdown, cannot_connect_now,
                // too_many_connections, connection exceptions (class 08).
                "40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03" | "53300" => true,
                c if c.starts_with("08") => true,
                // SQLite: the primary result code is the low byte of the
                // extended code; 5 = BUSY, 6 = LOCKED, 10 = IOERR, 13 = FULL
                // (space can be freed; the writer connection is recovered).
                c => c
                    .parse::<i64>()
                    .map(|n| matches!(n & 0xff, 5 | 6 | 10 | 13))
                    .unwrap_or(false),
            }
        }
        _ => false,
    }
}

/// Whether `err` is a unique-constraint violation.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db.is_unique_violation(),
        _ => false,
    }
}

pub(crate) fn store_err(err: sqlx::Error) -> StoreError {
    let retryable = is_retryable(&err);
    tracing::debug!(error = %err, retryable, "store backend error");
    StoreError::Backend {
        message: err.to_string(),
        retryable,
    }
}

pub(crate) fn queue_err(err: sqlx::Error) -> QueueError {
    let retryable = is_retryable(&err);
    tracing::debug!(error = %err, retryable, "queue backend error");
    QueueError::Backend {
        message: err.to_string(),
        retryable,
    }
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn infra_err(err: sqlx::Error) -> InfraError {
    let retryable = is_retryable(&err);
    InfraError::Backend {
        message: err.to_string(),
        retryable,
    }
}

pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

//! Durable adapters of Edward's storage traits over [`sqlx`].
//!
//! - [`SqliteStore`] (feature `sqlite`): the embedded durable default — one
//!   SQLite file holds runs, events, checkpoints, side-effect records, chat
//!   messages, build jobs and the work queue; implements [`edward_core::RunStore`] and
//!   [`edward_core::RunQueue`].
//! - [`PgStore`], [`PgQueue`], [`PgNotifier`] and [`PgLock`] (feature `postgres`): many
//!   worker processes on one Postgres database, with `FOR UPDATE SKIP LOCKED`
//!   claims, fences from a sequence, advisory-lock admission and
//!   `LISTEN`/`NOTIFY` wake-ups.
//!
//! - [`RedisBackend`] (feature `redis`): one Redis connection that makes
//!   [`RedisWriteBuffer`], [`RedisLock`], [`RedisNotifier`] and
//!   [`RedisQueue`] — the hot paths of a multi-process deployment, with
//!   runs kept in SQLite or Postgres.
//!
//! Migrations are embedded (`migrations/sqlite`, `migrations/postgres`) and
//! run on connect unless [`StoreOptions::migrate`] is turned off.
//!
//! **Architecture invariant:** this crate is the only one that knows SQL and Redis.
//! **API boundary:** everything public here is a constructor or an options
//! type; behaviour is the trait contract of `edward-core`.
#![deny(missing_docs)]

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod chat_rows;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
mod common;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod error;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod recent;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use common::StoreOptions;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use error::ConnectError;
#[cfg(feature = "postgres")]
pub use postgres::{PgLock, PgNotifier, PgOptions, PgQueue, PgStore, migrate as migrate_postgres};
#[cfg(feature = "redis")]
pub use redis::{
    RedisBackend, RedisConnectError, RedisLock, RedisNotifier, RedisOptions, RedisQueue,
    RedisWriteBuffer,
};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

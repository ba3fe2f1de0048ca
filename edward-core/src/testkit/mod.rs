//! Conformance suites: the same assertions for every adapter of a trait.
//! Each adapter's tests call these functions (memory, SQLite, Postgres, Redis, local, Docker).

pub mod sandbox;

//! Durable stores: SQLite (feature `sqlite`), Postgres (feature `postgres`) and Redis adapters. Work in progress.

//! The HTTP API of Edward: an axum router with REST + SSE. Work in progress.

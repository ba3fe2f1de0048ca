//! `Idempotency-Key` for `POST /v1/runs`: the same key with the same body
//! gives the same run (one admission); a different body is `409`.
//!
//! Keys are remembered per API key, in this process, for
//! [`HttpConfig::idempotency_ttl`](crate::HttpConfig::idempotency_ttl).
//! Concurrent requests with one key wait for the first one's outcome; a
//! failed submit is not remembered, so it can be retried with the same key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edward_core::RunId;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::auth::KeyHash;
use crate::error::{ApiError, ErrorCode};

/// Longest accepted `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

struct Entry {
    body: [u8; 32],
    created: Instant,
    run: Arc<OnceCell<RunId>>,
}

pub(crate) struct Idempotency {
    ttl: Duration,
    entries: Mutex<HashMap<(KeyHash, String), Entry>>,
}

/// The slot a submit fills (or finds filled).
pub(crate) type Slot = Arc<OnceCell<RunId>>;

impl Idempotency {
    pub(crate) fn new(ttl: Duration) -> Self {
        Idempotency {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The slot of `(api key, idempotency key)`, or `409` if the key was used
    /// with another body.
    pub(crate) fn slot(&self, api_key: KeyHash, key: &str, body: &[u8]) -> Result<Slot, ApiError> {
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !key.is_ascii() {
            return Err(ApiError::invalid(
                "Idempotency-Key",
                format!("must be 1..={MAX_IDEMPOTENCY_KEY_BYTES} ASCII characters"),
            ));
        }
        let body: [u8; 32] = Sha256::digest(body).into();
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() > 10_000 {
            let ttl = self.ttl;
            entries.retain(|_, e| now.duration_since(e.created) < ttl);
        }
        let entry = entries
            .entry((api_key, key.to_string()))
            .and_modify(|e| {
                if now.duration_since(e.created) >= self.ttl {
                    *e = Entry {
                        body,
                        created: now,
                        run: Arc::new(OnceCell::new()),
                    };
                }
            })
            .or_insert_with(|| Entry {
                body,
                created: now,
                run: Arc::new(OnceCell::new()),
            });
        if entry.body != body {
            return Err(ApiError::new(
                ErrorCode::IdempotencyConflict,
                "this Idempotency-Key was already used with a different request body",
            ));
        }
        Ok(entry.run.clone())
    }
}

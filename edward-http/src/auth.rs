//! Bearer API keys, stored hashed (SHA-256), each mapped to a user.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

/// The SHA-256 of an API key: the only form in which keys are kept.
pub type KeyHash = [u8; 32];

/// Hash an API key.
pub fn hash_key(key: &str) -> KeyHash {
    Sha256::digest(key.as_bytes()).into()
}

/// API keys → users. Only hashes are kept; `Debug` never shows keys.
///
/// ```
/// let mut keys = edward_http::ApiKeys::new();
/// keys.insert("alice", "sk-alice-secret");
/// assert_eq!(keys.user("sk-alice-secret"), Some("alice"));
/// assert_eq!(keys.user("nope"), None);
/// ```
#[derive(Clone, Default)]
pub struct ApiKeys {
    by_hash: HashMap<KeyHash, Arc<str>>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeys")
            .field("keys", &self.by_hash.len())
            .finish()
    }
}

impl ApiKeys {
    /// No keys (every request is `401`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Let `key` act as `user` (the key is hashed at once).
    pub fn insert(&mut self, user: impl Into<String>, key: &str) -> &mut Self {
        self.insert_hash(user, hash_key(key))
    }

    /// Let the key whose SHA-256 is `hash` act as `user`.
    pub fn insert_hash(&mut self, user: impl Into<String>, hash: KeyHash) -> &mut Self {
        self.by_hash.insert(hash, Arc::from(user.into()));
        self
    }

    /// Parse `USER:KEY` (the `--api-key` form of `examples/server`).
    pub fn parse_pair(pair: &str) -> Result<(String, String), String> {
        match pair.split_once(':') {
            Some((user, key)) if !user.is_empty() && !key.is_empty() => {
                Ok((user.to_string(), key.to_string()))
            }
            _ => Err("expected USER:KEY with both parts non-empty".to_string()),
        }
    }

    /// The user of `key`, if known.
    pub fn user(&self, key: &str) -> Option<&str> {
        self.by_hash.get(&hash_key(key)).map(|u| &**u)
    }

    /// How many keys are known.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// The authenticated caller, put in request extensions by the auth layer.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The user the key maps to.
    pub user_id: Arc<str>,
    /// The key's hash (rate limits and idempotency are per key).
    pub key_hash: KeyHash,
}

/// Auth + per-key rate limit for `/v1` routes.
pub(crate) async fn require_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let unauthorized = || {
        ApiError::new(
            ErrorCode::Unauthorized,
            "a valid `Authorization: Bearer <key>` is required",
        )
    };
    let key = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|k| !k.is_empty())
        .ok_or_else(unauthorized)?;
    let key_hash = hash_key(key);
    let user_id = state
        .keys
        .by_hash
        .get(&key_hash)
        .cloned()
        .ok_or_else(unauthorized)?;
    state.limiter.check(&key_hash)?;
    req.extensions_mut().insert(Caller { user_id, key_hash });
    Ok(next.run(req).await)
}

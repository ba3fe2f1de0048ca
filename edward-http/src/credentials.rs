//! `/v1/credentials`: a user's own provider keys (feature `registry`).
//!
//! `PUT /v1/credentials/{provider}/{name}` stores a key (encrypted by the
//! registry's [`CredentialVault`]), `GET /v1/credentials` lists the caller's
//! credentials with keys masked to their last four characters, `DELETE
//! /v1/credentials/{provider}/{name}` deletes one. A credential is always
//! the caller's: another user's is never listed and answers `404`.
//!
//! **Keys are never echoed or logged:** the body is parsed into a type whose
//! `Debug` redacts the key, a malformed body's error names the field but not
//! the value, and answers carry only the masked form.
//!
//! [`CredentialVault`]: edward_core::registry::CredentialVault

use std::fmt;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use edward_core::engine::RouteError;
use edward_core::providers::ApiKey;
use edward_core::registry::{CredentialVault, MaskedCredential, NewCredential, ProviderRegistry};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::extract;
use crate::state::AppState;

/// Longest accepted provider key.
const MAX_KEY_BYTES: usize = 4096;
/// Longest credential name.
const MAX_NAME_BYTES: usize = 64;

/// `PUT /v1/credentials/{provider}/{name}` body. `Debug` redacts the key.
#[derive(Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutCredential {
    /// The provider key (stored encrypted; never shown again).
    pub key: String,
    /// A base URL override (used only where the operator allows it).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Make it the user's default for the provider (default true): runs
    /// that name no credential use it.
    #[serde(default = "yes")]
    pub default: bool,
}

fn yes() -> bool {
    true
}

impl fmt::Debug for PutCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PutCredential")
            .field("key", &"[redacted]")
            .field("base_url", &self.base_url)
            .field("default", &self.default)
            .finish()
    }
}

/// A credential as its owner sees it: the key masked.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CredentialView {
    /// Its id.
    pub id: Uuid,
    /// The provider (`openai`, or an operator-named endpoint).
    pub provider: String,
    /// The user's name for it (what `credential` of `POST /v1/runs` names).
    pub name: String,
    /// The key's last four characters (`…abcd`; `…` for short keys).
    pub masked_key: String,
    /// The base URL override.
    pub base_url: Option<String>,
    /// Whether runs naming no credential use it.
    pub is_default: bool,
    /// Whether it was revoked.
    pub revoked: bool,
}

impl From<MaskedCredential> for CredentialView {
    fn from(c: MaskedCredential) -> Self {
        CredentialView {
            id: c.id,
            provider: c.provider,
            name: c.name,
            masked_key: c.masked_key,
            base_url: c.base_url,
            is_default: c.is_default,
            revoked: c.revoked,
        }
    }
}

/// `GET /v1/credentials`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CredentialList {
    /// The caller's credentials.
    pub credentials: Vec<CredentialView>,
}

fn registry(state: &AppState) -> Result<(&Arc<ProviderRegistry>, &CredentialVault), ApiError> {
    state
        .registry
        .get()
        .and_then(|r| r.credentials().map(|v| (r, v)))
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "this server keeps no user credentials"))
}

fn no_such_credential() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such credential")
}

fn check_name(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() || value.len() > MAX_NAME_BYTES {
        return Err(ApiError::invalid(
            field,
            format!("must be 1..={MAX_NAME_BYTES} bytes"),
        ));
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(ApiError::invalid(
            field,
            "only ASCII letters, digits, `-`, `_` and `.`",
        ));
    }
    Ok(())
}

/// Parse the body; an error names the field, never the value (it may be a key).
fn parse(headers: &HeaderMap, bytes: &[u8]) -> Result<PutCredential, ApiError> {
    extract::json::<PutCredential>(headers, bytes).map_err(|e| match e.field {
        Some(field) => ApiError::invalid(field, "missing, unknown or of the wrong type"),
        None if e.code == ErrorCode::InvalidJson => {
            ApiError::new(ErrorCode::InvalidJson, "the body is not valid JSON")
        }
        None => e,
    })
}

fn route_error(e: RouteError) -> ApiError {
    match e {
        RouteError::Store(e) => e.into(),
        e @ (RouteError::UnknownProvider { .. } | RouteError::CredentialNotAccepted { .. }) => {
            ApiError::invalid("provider", e)
        }
        e => ApiError::invalid(e.field(), e),
    }
}

/// The caller's credentials, keys masked.
#[utoipa::path(
    get, path = "/v1/credentials", tag = "credentials",
    responses(
        (status = 200, body = CredentialList),
        (status = 404, description = "The server keeps no user credentials", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<CredentialList>, ApiError> {
    let (_, vault) = registry(&state)?;
    let credentials = vault
        .list_masked(&caller.user_id)
        .await?
        .into_iter()
        .map(CredentialView::from)
        .collect();
    Ok(Json(CredentialList { credentials }))
}

/// Store (or replace) the caller's key for `provider` under `name`.
#[utoipa::path(
    put, path = "/v1/credentials/{provider}/{name}", tag = "credentials",
    request_body = PutCredential,
    params(
        ("provider" = String, Path, description = "A provider of the server's registry that accepts users' keys"),
        ("name" = String, Path, description = "The user's name for the credential (1..=64 of `A-Za-z0-9-_.`)"),
    ),
    responses(
        (status = 200, description = "Stored; the key is shown masked", body = CredentialView),
        (status = 400, description = "Invalid JSON", body = ErrorBody),
        (status = 404, description = "The server keeps no user credentials", body = ErrorBody),
        (status = 422, description = "Unknown provider, one that takes no users' keys, or an invalid field (`error.field`)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn put(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((provider, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CredentialView>, ApiError> {
    let (registry, vault) = registry(&state)?;
    check_name("provider", &provider)?;
    check_name("name", &name)?;
    let bytes = extract::body(body)?;
    let req = parse(&headers, &bytes)?;
    let key = req.key.trim();
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(
            "key",
            format!("must be 1..={MAX_KEY_BYTES} bytes"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "key",
            "must not contain control characters",
        ));
    }
    if let Some(url) = &req.base_url {
        if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() > 2048 {
            return Err(ApiError::invalid(
                "base_url",
                "must be an http(s) URL of at most 2048 bytes",
            ));
        }
    }
    let stored = registry
        .put_credential(NewCredential {
            user_id: caller.user_id.to_string(),
            provider,
            name,
            key: ApiKey::new(key),
            base_url: req.base_url.clone(),
            is_default: req.default,
        })
        .await
        .map_err(route_error)?;
    let view = vault
        .list_masked(&caller.user_id)
        .await?
        .into_iter()
        .find(|c| c.id == stored.id)
        .map(CredentialView::from)
        .ok_or_else(no_such_credential)?;
    tracing::info!(user = %caller.user_id, provider = %view.provider, name = %view.name, "credential stored");
    Ok(Json(view))
}

/// Delete the caller's credential (runs that use it then fail with a
/// `credential … not found` reason; new runs need another one).
#[utoipa::path(
    delete, path = "/v1/credentials/{provider}/{name}", tag = "credentials",
    params(
        ("provider" = String, Path, description = "The provider"),
        ("name" = String, Path, description = "The credential's name"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such credential of the caller's", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((provider, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (_, vault) = registry(&state)?;
    let Some(found) = vault
        .store()
        .list_credentials(&caller.user_id)
        .await?
        .into_iter()
        .find(|c| c.provider == provider && c.name == name)
    else {
        return Err(no_such_credential());
    };
    if !vault.delete(&caller.user_id, found.id).await? {
        return Err(no_such_credential());
    }
    tracing::info!(user = %caller.user_id, %provider, %name, "credential deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

//! Request parsing that answers with the API's JSON errors (axum's own
//! rejections are plain text).

use std::str::FromStr;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use edward_core::{Run, RunId};
use serde::de::DeserializeOwned;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

/// The body bytes, or `413`/`400`.
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(ErrorCode::PayloadTooLarge, "the request body is too large")
        } else {
            ApiError::new(ErrorCode::InvalidJson, r.body_text())
        }
    })
}

/// Parse a JSON body: `415` without a JSON content type, `400` for bad
/// syntax, `422` naming the field for a wrong shape.
pub(crate) fn json<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim();
            m.eq_ignore_ascii_case("application/json")
                || (m.starts_with("application/") && m.ends_with("+json"))
        });
    if !is_json {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "expected `Content-Type: application/json`",
        ));
    }
    // Syntax first (400), then the shape (422 naming the field): a value of
    // the wrong type (`"double_texting": 3`) is valid JSON, and serde_json
    // would report some of those as syntax errors when deserializing in one pass.
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(ErrorCode::InvalidJson, format!("invalid JSON: {e}")))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.into_inner().to_string();
        let field = if path == "." || path.is_empty() {
            // `missing field `x``, `unknown field `x``: name it.
            msg.split('`').nth(1).unwrap_or("body").to_string()
        } else {
            path
        };
        ApiError::invalid(field, msg)
    })
}

/// Parse an optional query value, `422` naming `field` when malformed.
pub(crate) fn query<T: FromStr>(field: &str, raw: Option<&str>) -> Result<Option<T>, ApiError>
where
    T::Err: std::fmt::Display,
{
    raw.filter(|s| !s.is_empty())
        .map(|s| s.parse::<T>().map_err(|e| ApiError::invalid(field, e)))
        .transpose()
}

/// Parse a duration: `30s`, `1500ms`, `2m` or plain seconds.
pub(crate) fn duration(field: &str, raw: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(s) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let bad = || ApiError::invalid(field, "expected a duration such as `30s`, `500ms` or `2m`");
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    Ok(Some(match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(bad()),
    }))
}

/// The run `id` if it exists and is the caller's; `404` otherwise (the same
/// answer for a malformed id, an unknown run and another user's run).
pub(crate) async fn owned_run(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Run, ApiError> {
    let id = RunId::from_str(id).map_err(|_| ApiError::run_not_found())?;
    match state.engine.get(id).await? {
        Some(run) if *run.user_id == *caller.user_id => Ok(run),
        _ => Err(ApiError::run_not_found()),
    }
}

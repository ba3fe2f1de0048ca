//! JSON errors with stable codes: `{"error": {"code", "message", …}}`.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use edward_core::engine::{FilesError, SubmitError};
use edward_core::{AdmissionError, RunId, SandboxError, StoreError};
use serde::Serialize;
use utoipa::ToSchema;

/// A stable, machine-readable error code. The string form (`as_str`) is
/// the `error.code` of every error response and never changes meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 401: no bearer key, or an unknown one.
    Unauthorized,
    /// 404: no such run (or not the caller's), file or route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 400: the body is not valid JSON.
    InvalidJson,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 413: the body is larger than the configured limit.
    PayloadTooLarge,
    /// 422: a field is invalid; `error.field` names it.
    ValidationFailed,
    /// 409: an `Idempotency-Key` was reused with a different body.
    IdempotencyConflict,
    /// 429: an admission limit (active runs) was hit; `error.limit` names it.
    LimitExceeded,
    /// 429: the per-key request rate was exceeded.
    RateLimited,
    /// 408: a non-streaming request took longer than the request timeout.
    RequestTimeout,
    /// 503: the store (or another backend) failed; retrying may help.
    Unavailable,
    /// 500: anything else.
    Internal,
}

impl ErrorCode {
    /// The code as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::ValidationFailed => "validation_failed",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status sent with this code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::InvalidJson => StatusCode::BAD_REQUEST,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::ValidationFailed => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::IdempotencyConflict => StatusCode::CONFLICT,
            ErrorCode::LimitExceeded | ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error answered as JSON. Messages never contain API keys.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ApiError {
    /// The stable code.
    pub code: ErrorCode,
    /// What went wrong, for humans.
    pub message: String,
    /// The invalid field (`validation_failed`).
    pub field: Option<String>,
    /// The limit that was hit (`limit_exceeded`: `global`, `user`, `chat`).
    pub limit: Option<&'static str>,
    /// When to retry (`Retry-After`), for 429 and 503.
    pub retry_after: Option<Duration>,
    /// The chat's active run, when a submit was refused because the chat
    /// is busy (`limit_exceeded` with limit `chat`).
    pub active_run: Option<RunId>,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            field: None,
            limit: None,
            retry_after: None,
            active_run: None,
        }
    }

    /// 404 for a run that does not exist or is not the caller's (the same
    /// answer for both, so existence never leaks).
    pub fn run_not_found() -> Self {
        ApiError::new(ErrorCode::NotFound, "no such run")
    }

    /// 422 naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        let field = field.into();
        ApiError {
            message: format!("invalid `{field}`: {reason}"),
            field: Some(field),
            ..ApiError::new(ErrorCode::ValidationFailed, "")
        }
    }

    /// Whether retrying the same request later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::LimitExceeded
                | ErrorCode::RateLimited
                | ErrorCode::RequestTimeout
                | ErrorCode::Unavailable
        )
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.as_str().to_string(),
                message: self.message.clone(),
                field: self.field.clone(),
                limit: self.limit.map(str::to_string),
                active_run: self.active_run.map(|id| id.0),
            },
        }
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// `error` of [`ErrorBody`].
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code (`not_found`, `validation_failed`, `limit_exceeded`, …).
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// The invalid field, for `validation_failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The limit hit (`global`, `user`, `chat`), for `limit_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// The chat's active run, for `limit_exceeded` with limit `chat` when
    /// the chat already has a queued or running run (double-texting policy
    /// `reject`): watch or cancel it, or submit with `enqueue`/`interrupt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<uuid::Uuid>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.code.status(), Json(self.body())).into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                res.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => ApiError::run_not_found(),
            e if e.is_retryable() => ApiError {
                retry_after: Some(Duration::from_secs(1)),
                ..ApiError::new(ErrorCode::Unavailable, e.to_string())
            },
            e => {
                tracing::error!(error = %e, "store error");
                ApiError::new(ErrorCode::Internal, "internal store error")
            }
        }
    }
}

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        match e {
            SandboxError::InvalidPath { reason, .. } => ApiError::invalid("path", reason),
            SandboxError::NotFound { path } => {
                ApiError::new(ErrorCode::NotFound, format!("no such file: {path}"))
            }
            e if e.is_retryable() => ApiError {
                retry_after: Some(Duration::from_secs(1)),
                ..ApiError::new(ErrorCode::Unavailable, e.to_string())
            },
            e => {
                tracing::error!(error = %e, "sandbox error");
                ApiError::new(ErrorCode::Internal, "internal sandbox error")
            }
        }
    }
}

impl From<FilesError> for ApiError {
    fn from(e: FilesError) -> Self {
        match e {
            FilesError::RunNotFound { .. } => ApiError::run_not_found(),
            FilesError::NoSandbox { .. } => {
                ApiError::new(ErrorCode::NotFound, "the run has no files")
            }
            FilesError::Store(e) => e.into(),
            FilesError::Sandbox(e) => e.into(),
            e => {
                tracing::error!(error = %e, "files failed");
                ApiError::new(ErrorCode::Internal, "internal files error")
            }
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid { field, reason } => ApiError::invalid(field, reason),
            SubmitError::Rejected(rejected) => {
                let limit = match rejected {
                    AdmissionError::GlobalLimit { .. } => "global",
                    AdmissionError::UserLimit { .. } => "user",
                    AdmissionError::ChatLimit { .. } => "chat",
                    _ => "unknown",
                };
                ApiError {
                    limit: Some(limit),
                    retry_after: Some(Duration::from_secs(5)),
                    ..ApiError::new(ErrorCode::LimitExceeded, rejected.to_string())
                }
            }
            SubmitError::Store(e) => e.into(),
            e @ SubmitError::ChatBusy { active_run, .. } => ApiError {
                limit: Some("chat"),
                active_run: Some(active_run),
                retry_after: Some(Duration::from_secs(5)),
                ..ApiError::new(ErrorCode::LimitExceeded, e.to_string())
            },
            e => {
                tracing::error!(error = %e, "submit failed");
                ApiError {
                    retry_after: Some(Duration::from_secs(1)),
                    ..ApiError::new(ErrorCode::Unavailable, e.to_string())
                }
            }
        }
    }
}

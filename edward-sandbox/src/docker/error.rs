//! Mapping bollard errors onto [`SandboxError`].

use bollard::errors::Error as DockerError;
use edward_core::SandboxError;

/// HTTP status of a daemon error response, if it is one.
pub(crate) fn status(err: &DockerError) -> Option<u16> {
    match err {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether the daemon answered "no such object".
pub(crate) fn is_not_found(err: &DockerError) -> bool {
    status(err) == Some(404)
}

/// A backend error for a failed Docker call. Transport failures (daemon
/// unreachable, connection reset, request timeout) and 5xx answers are
/// retryable: a restarting daemon comes back. 4xx answers are not.
pub(crate) fn backend(what: &str, err: DockerError) -> SandboxError {
    let retryable = match &err {
        DockerError::DockerResponseServerError { status_code, .. } => *status_code >= 500,
        DockerError::JsonDataError { .. }
        | DockerError::JsonSerdeError { .. }
        | DockerError::APIVersionParseError {}
        | DockerError::UnsupportedURISchemeError { .. }
        | DockerError::URLParseError { .. }
        | DockerError::InvalidURIError { .. } => false,
        _ => true,
    };
    SandboxError::Backend {
        message: format!("docker: {what}: {err}"),
        retryable,
    }
}

/// A backend error that no retry fixes.
pub(crate) fn fatal(message: impl Into<String>) -> SandboxError {
    SandboxError::Backend {
        message: message.into(),
        retryable: false,
    }
}

//! Encoding of chat messages and build jobs shared by the SQLite and
//! Postgres adapters: JSON columns, enum columns and the `BuildConflict`
//! explanation of a build write that matched no row.

use edward_core::{BuildStatus, MessageRole, RunId, StoreError, TurnEffects};

use crate::error::corrupt;

/// `TurnEffects` → JSON text (`None` stays SQL `NULL`).
pub(crate) fn effects_json(effects: Option<&TurnEffects>) -> Option<String> {
    // Serialising plain structs of strings and integers cannot fail.
    effects.map(|e| serde_json::to_string(e).unwrap_or_else(|_| "{}".to_owned()))
}

/// JSON text → `TurnEffects`.
pub(crate) fn parse_effects(text: Option<&str>) -> Result<Option<TurnEffects>, StoreError> {
    text.map(|t| serde_json::from_str(t).map_err(|e| corrupt(format!("message effects: {e}"))))
        .transpose()
}

/// A build command → JSON array text.
pub(crate) fn command_json(command: &[String]) -> String {
    serde_json::to_string(command).unwrap_or_else(|_| "[]".to_owned())
}

/// JSON array text → a build command.
pub(crate) fn parse_command(text: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("build command: {e}")))
}

pub(crate) fn parse_role(s: &str) -> Result<MessageRole, StoreError> {
    s.parse().map_err(corrupt)
}

pub(crate) fn parse_build_status(s: &str) -> Result<BuildStatus, StoreError> {
    s.parse().map_err(corrupt)
}

/// A stored non-negative integer column that must fit a `u32`.
pub(crate) fn to_u32(value: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| corrupt(format!("{what} {value}")))
}

/// `BuildConflict` for build `number` found in `status` (`None`: missing).
pub(crate) fn build_conflict(
    run_id: RunId,
    number: u32,
    status: Option<BuildStatus>,
    action: &'static str,
) -> StoreError {
    StoreError::BuildConflict {
        run_id,
        number,
        status: status.map_or("missing", BuildStatus::as_str).to_owned(),
        action,
    }
}

//! Chat routes: a chat's messages, runs and workspace files.
//!
//! A chat has no record of its own: it exists for a caller once the caller
//! submitted a run in it (or the store still keeps a message of it). Chat
//! ids are per user, so another user's chat of the same id is simply a chat
//! the caller does not have: every route answers `404` (`no such chat`) for
//! it, the same answer as for an id nobody used — existence never leaks.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::response::Response;
use edward_core::Run;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::extract;
use crate::model::{ChatFileList, MessageList, RunPage};
use crate::state::AppState;

/// Default and largest number of messages of `GET /v1/chats/{id}/messages`.
const MESSAGES_DEFAULT: usize = 100;
const MESSAGES_MAX: usize = 1000;

fn chat_not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such chat")
}

/// Whether the caller has the chat: a run of it, or a message of it.
async fn chat_exists(state: &AppState, caller: &Caller, chat: &str) -> Result<bool, ApiError> {
    if newest_run(state, caller, chat).await?.is_some() {
        return Ok(true);
    }
    Ok(!state
        .engine
        .chat_messages(&caller.user_id, chat, 1)
        .await?
        .is_empty())
}

/// The caller's newest run of the chat (every run of a chat shares its
/// workspace, so its files are the chat's).
async fn newest_run(
    state: &AppState,
    caller: &Caller,
    chat: &str,
) -> Result<Option<Run>, ApiError> {
    Ok(state
        .engine
        .chat_runs(&caller.user_id, chat, None, 1)
        .await?
        .into_iter()
        .next())
}

/// The chat's messages, oldest first: the user's prompts and each turn's
/// reply with its side effects.
#[utoipa::path(
    get, path = "/v1/chats/{chat_id}/messages", tag = "chats",
    params(
        ("chat_id" = String, Path, description = "Chat id"),
        ("limit" = Option<u32>, Query, description = "The newest N messages, 1..=1000 (default 100)"),
    ),
    responses(
        (status = 200, body = MessageList),
        (status = 404, description = "The caller has no such chat", body = ErrorBody),
        (status = 422, description = "`limit` is invalid", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn messages(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(chat_id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<MessageList>, ApiError> {
    let limit: usize =
        extract::query("limit", q.get("limit").map(String::as_str))?.unwrap_or(MESSAGES_DEFAULT);
    if limit == 0 || limit > MESSAGES_MAX {
        return Err(ApiError::invalid(
            "limit",
            format!("must be 1..={MESSAGES_MAX}"),
        ));
    }
    let messages = state
        .engine
        .chat_messages(&caller.user_id, &chat_id, limit)
        .await?;
    if messages.is_empty() && !chat_exists(&state, &caller, &chat_id).await? {
        return Err(chat_not_found());
    }
    Ok(Json(MessageList {
        chat_id,
        messages: messages.into_iter().map(Into::into).collect(),
    }))
}

/// The chat's runs, newest first (paginated like `GET /v1/runs`).
#[utoipa::path(
    get, path = "/v1/chats/{chat_id}/runs", tag = "chats",
    params(
        ("chat_id" = String, Path, description = "Chat id"),
        ("status" = Option<String>, Query, description = "Only runs in this status"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
        ("limit" = Option<u32>, Query, description = "Page size, 1..=100 (default 20)"),
    ),
    responses(
        (status = 200, body = RunPage),
        (status = 404, description = "The caller has no such chat", body = ErrorBody),
        (status = 422, description = "A query parameter is invalid", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(chat_id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<RunPage>, ApiError> {
    let page = crate::runs::run_page(&state, &caller, Some(&chat_id), &q).await?;
    if page.runs.is_empty() && !chat_exists(&state, &caller, &chat_id).await? {
        return Err(chat_not_found());
    }
    Ok(Json(page))
}

/// The chat's workspace files with sizes (shared by all its runs).
#[utoipa::path(
    get, path = "/v1/chats/{chat_id}/files", tag = "chats",
    params(("chat_id" = String, Path, description = "Chat id")),
    responses(
        (status = 200, body = ChatFileList),
        (status = 404, description = "The caller has no run in this chat", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_files(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(chat_id): Path<String>,
) -> Result<Json<ChatFileList>, ApiError> {
    let run = newest_run(&state, &caller, &chat_id)
        .await?
        .ok_or_else(chat_not_found)?;
    let files = crate::files::list(&state.engine, run.id).await?;
    Ok(Json(ChatFileList {
        chat_id,
        run_id: run.id.0,
        files,
    }))
}

/// One file of the chat's workspace, with a `Content-Type` from its extension.
#[utoipa::path(
    get, path = "/v1/chats/{chat_id}/files/{path}", tag = "chats",
    params(
        ("chat_id" = String, Path, description = "Chat id"),
        ("path" = String, Path, description = "File path relative to the workspace (validated like model paths)"),
    ),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream"),
        (status = 404, description = "No such chat (of the caller) or file", body = ErrorBody),
        (status = 413, description = "The file is larger than the server serves", body = ErrorBody),
        (status = 422, description = "Invalid path", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((chat_id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let run = newest_run(&state, &caller, &chat_id)
        .await?
        .ok_or_else(chat_not_found)?;
    crate::runs::file_response(&state, run.id, &path).await
}

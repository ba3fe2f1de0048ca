//! Run routes: submit, get, list, cancel, files.

use std::collections::HashMap;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use edward_core::engine::{CancelOutcome, RunRequest};
use edward_core::{Run, RunFilter, RunId, RunStatus, SandboxPath};

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::extract;
use crate::metrics::LimitLabels;
use crate::model::{BuildList, FileList, RunPage, RunView, SubmitRun, SubmittedRun, events_url};
use crate::state::AppState;

/// The header naming an idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Start a run.
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs",
    request_body = SubmitRun,
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Same key + same body → the same run (no second admission); a different body → 409")),
    responses(
        (status = 201, description = "Admitted and queued", body = SubmittedRun),
        (status = 400, description = "Invalid JSON", body = ErrorBody),
        (status = 401, description = "No valid bearer key", body = ErrorBody),
        (status = 409, description = "Idempotency-Key reused with another body", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "A field is invalid (`error.field`)", body = ErrorBody),
        (status = 429, description = "An admission limit (`error.limit`) or the key's rate; see Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn submit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = extract::body(body)?;
    let req: SubmitRun = extract::json(&headers, &bytes)?;
    let mut run_request = RunRequest::new(caller.user_id.to_string(), req.chat_id, req.prompt);
    run_request.model = req.model;
    run_request.budgets = req.budgets;
    run_request.credential = req.credential;
    run_request.double_texting = req.double_texting.map(Into::into);
    let (run_id, replayed) = match headers.get(IDEMPOTENCY_KEY) {
        Some(key) => {
            let key = key
                .to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be ASCII"))?;
            let slot = state.idempotency.slot(caller.key_hash, key, &bytes)?;
            let mut fresh = false;
            let id = *slot
                .get_or_try_init(|| {
                    fresh = true;
                    submit_once(&state, run_request)
                })
                .await?;
            (id, !fresh)
        }
        None => (submit_once(&state, run_request).await?, false),
    };
    let status = match state.engine.get(run_id).await? {
        Some(run) => run.status,
        None => RunStatus::Queued,
    };
    let mut res = (
        StatusCode::CREATED,
        Json(SubmittedRun {
            run_id: run_id.0,
            status: status.as_str().to_string(),
            events_url: events_url(run_id),
        }),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/runs/{run_id}")) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    if replayed {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

async fn submit_once(state: &AppState, req: RunRequest) -> Result<RunId, ApiError> {
    match state.engine.submit(req).await {
        Ok(id) => {
            state.metrics.runs_submitted.inc();
            if let Some(webhooks) = &state.webhooks {
                webhooks.watch(id);
            }
            Ok(id)
        }
        Err(e) => {
            let e = ApiError::from(e);
            if let Some(limit) = e.limit {
                state
                    .metrics
                    .admissions_rejected
                    .get_or_create(&LimitLabels {
                        limit: limit.to_string(),
                    })
                    .inc();
            }
            Err(e)
        }
    }
}

/// The run's view, with usage, cost and turns from its terminal event.
pub(crate) async fn full_view(state: &AppState, run: &Run) -> Result<RunView, ApiError> {
    let terminal = if run.status.is_terminal() && run.last_seq > 0 {
        state
            .engine
            .store()
            .events_after(run.id, run.last_seq - 1, 1)
            .await?
            .into_iter()
            .find(|e| e.is_terminal())
    } else {
        None
    };
    Ok(RunView::new(
        run,
        state.engine.default_model(),
        terminal.as_ref(),
    ))
}

/// One run.
#[utoipa::path(
    get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = RunView),
        (status = 404, description = "No such run, or not the caller's", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    let run = extract::owned_run(&state, &caller, &id).await?;
    Ok(Json(full_view(&state, &run).await?))
}

/// Default and largest page size of `GET /v1/runs`.
const PAGE_DEFAULT: usize = 20;
const PAGE_MAX: usize = 100;

/// The caller's runs, newest first.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs",
    params(
        ("chat_id" = Option<String>, Query, description = "Only this chat's runs"),
        ("status" = Option<String>, Query, description = "Only runs in this status"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
        ("limit" = Option<u32>, Query, description = "Page size, 1..=100 (default 20)"),
    ),
    responses(
        (status = 200, body = RunPage),
        (status = 422, description = "A query parameter is invalid", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<RunPage>, ApiError> {
    let chat = q
        .get("chat_id")
        .map(String::as_str)
        .filter(|c| !c.is_empty());
    Ok(Json(run_page(&state, &caller, chat, &q).await?))
}

/// One page of the caller's runs (of `chat`, when given) for the query
/// `q` (`status`, `cursor`, `limit`).
pub(crate) async fn run_page(
    state: &AppState,
    caller: &Caller,
    chat: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<RunPage, ApiError> {
    let get = |k: &str| q.get(k).map(String::as_str);
    let status: Option<RunStatus> = extract::query("status", get("status"))?;
    let cursor: Option<RunId> = extract::query("cursor", get("cursor"))?;
    let limit: usize = extract::query("limit", get("limit"))?.unwrap_or(PAGE_DEFAULT);
    if limit == 0 || limit > PAGE_MAX {
        return Err(ApiError::invalid(
            "limit",
            format!("must be 1..={PAGE_MAX}"),
        ));
    }
    let mut filter = RunFilter::new();
    if let Some(chat) = chat {
        filter = filter.chat(chat);
    }
    if let Some(status) = status {
        filter = filter.status(status);
    }
    let mut runs = state
        .engine
        .store()
        .list_user_runs(&caller.user_id, &filter, cursor, limit + 1)
        .await?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    let next_cursor = more
        .then(|| runs.last().map(|r| r.id.to_string()))
        .flatten();
    let default_model = state.engine.default_model();
    Ok(RunPage {
        runs: runs
            .iter()
            .map(|r| RunView::new(r, default_model, None))
            .collect(),
        next_cursor,
    })
}

/// Cancel a run (idempotent).
#[utoipa::path(
    post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"),
        ("wait" = Option<bool>, Query, description = "Answer once the run has finished (at most the server's max wait)"),
    ),
    responses(
        (status = 202, description = "Cancellation requested; the run ends with `run_finished{status: cancelled}`", body = RunView),
        (status = 200, description = "The run has finished (its final state)", body = RunView),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let wait: bool = extract::query("wait", q.get("wait").map(String::as_str))?.unwrap_or(false);
    let run = extract::owned_run(&state, &caller, &id).await?;
    if run.status.is_terminal() {
        return Ok((StatusCode::OK, Json(full_view(&state, &run).await?)).into_response());
    }
    let outcome = state.engine.cancel(run.id).await?;
    if outcome == CancelOutcome::AlreadyFinished || wait {
        if wait {
            wait_finished(&state, &run, state.config.max_wait).await?;
        }
        let now = state
            .engine
            .get(run.id)
            .await?
            .ok_or_else(ApiError::run_not_found)?;
        if now.status.is_terminal() {
            return Ok((StatusCode::OK, Json(full_view(&state, &now).await?)).into_response());
        }
    }
    let now = state
        .engine
        .get(run.id)
        .await?
        .ok_or_else(ApiError::run_not_found)?;
    Ok((StatusCode::ACCEPTED, Json(full_view(&state, &now).await?)).into_response())
}

/// Wait (at most `max`) until the run's terminal event exists.
async fn wait_finished(state: &AppState, run: &Run, max: Duration) -> Result<(), ApiError> {
    let mut events = state.engine.raw_events(run.id, run.last_seq);
    let until_terminal = async {
        while let Some(e) = events.next().await {
            if e?.is_terminal() {
                break;
            }
        }
        Ok::<(), ApiError>(())
    };
    tokio::select! {
        r = tokio::time::timeout(max, until_terminal) => r.unwrap_or(Ok(())),
        _ = state.shutdown.cancelled() => Ok(()),
    }
}

/// The run's files with sizes.
#[utoipa::path(
    get, path = "/v1/runs/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = FileList),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_files(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<FileList>, ApiError> {
    let run = extract::owned_run(&state, &caller, &id).await?;
    let files = crate::files::list(&state.engine, run.id).await?;
    Ok(Json(FileList {
        run_id: run.id.0,
        files,
    }))
}

/// One file's content, with a `Content-Type` from its extension.
#[utoipa::path(
    get, path = "/v1/runs/{id}/files/{path}", tag = "files",
    params(
        ("id" = String, Path, description = "Run id"),
        ("path" = String, Path, description = "File path relative to the workspace (validated like model paths)"),
    ),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream"),
        (status = 404, body = ErrorBody),
        (status = 413, description = "The file is larger than the server serves", body = ErrorBody),
        (status = 422, description = "Invalid path", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let run = extract::owned_run(&state, &caller, &id).await?;
    file_response(&state, run.id, &path).await
}

/// The file at `path` of `run_id`'s workspace, served as untrusted bytes.
pub(crate) async fn file_response(
    state: &AppState,
    run_id: RunId,
    path: &str,
) -> Result<Response, ApiError> {
    let path = SandboxPath::new(path)?;
    let bytes = crate::files::read(&state.engine, run_id, &path).await?;
    if bytes.len() as u64 > state.config.max_file_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "{path} is {} bytes, more than the {} bytes served",
                bytes.len(),
                state.config.max_file_bytes
            ),
        ));
    }
    let mime = mime_guess::from_path(path.as_str()).first_or_octet_stream();
    let content_type = if mime.type_() == mime_guess::mime::TEXT
        || mime.subtype() == mime_guess::mime::JAVASCRIPT
        || mime.subtype() == mime_guess::mime::JSON
    {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_string()
    };
    let mut res = bytes.into_response();
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    // Model-written files are untrusted: never sniffed, never scripted on this origin.
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// The run's build jobs (`queued → building → succeeded | failed`).
#[utoipa::path(
    get, path = "/v1/runs/{id}/builds", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, body = BuildList),
        (status = 404, description = "No such run, or not the caller's", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_builds(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<BuildList>, ApiError> {
    let run = extract::owned_run(&state, &caller, &id).await?;
    let builds = state.engine.builds(run.id).await?;
    Ok(Json(BuildList {
        run_id: run.id.0,
        builds: builds.into_iter().map(Into::into).collect(),
    }))
}

//! Request and response bodies (their schemas make up `/openapi.json`).

use chrono::{DateTime, Utc};
use edward_core::engine::Budgets;
use edward_core::{Run, RunEvent, RunId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `POST /v1/runs` body. The run's user is the API key's user.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRun {
    /// The chat (conversation) the run belongs to (1..=128 bytes).
    pub chat_id: String,
    /// What to build (non-empty, at most 100 KiB).
    pub prompt: String,
    /// Model name; omitted = the server's default model.
    #[serde(default)]
    pub model: Option<String>,
    /// Budgets overriding the server's defaults (`max_turns`,
    /// `max_tool_calls_per_turn`, `max_tool_calls_per_run`,
    /// `max_input_tokens`, `max_output_tokens`, `max_cost_usd`, `deadline_ms`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub budgets: Option<Budgets>,
    /// The name of one of the caller's credentials (`/v1/credentials`) to
    /// run with; omitted = the caller's default for the model's provider,
    /// or the operator's key where the server allows it.
    #[serde(default)]
    pub credential: Option<String>,
}

/// `201` answer of `POST /v1/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SubmittedRun {
    /// The new run (or, for a repeated `Idempotency-Key`, the first one).
    pub run_id: Uuid,
    /// Its status now.
    pub status: String,
    /// Where to stream its events.
    pub events_url: String,
}

/// Token usage.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct UsageView {
    /// Input (prompt) tokens over all turns.
    pub input_tokens: u64,
    /// Output tokens over all turns.
    pub output_tokens: u64,
}

/// A run as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    /// Its id.
    pub run_id: Uuid,
    /// The chat.
    pub chat_id: String,
    /// `queued`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// Why it finished (`done`, `cancelled`, `budget_exhausted:turns`, `error: …`).
    pub reason: Option<String>,
    /// The model.
    pub model: String,
    /// The newest event's seq (resume cursor upper bound).
    pub last_seq: u64,
    /// Turns run (known once finished).
    pub turns: Option<u64>,
    /// Token usage (known once finished; live usage is in `turn_finished` events).
    pub usage: Option<UsageView>,
    /// Cost in USD (known once finished).
    pub cost_usd: Option<f64>,
    /// When it was admitted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// Where to stream its events.
    pub events_url: String,
}

impl RunView {
    /// The view of `run` (summary fields from its terminal event, if given).
    pub(crate) fn new(run: &Run, default_model: &str, terminal: Option<&RunEvent>) -> Self {
        let model = run
            .request
            .get("model")
            .and_then(|m| m.as_str())
            .unwrap_or(default_model)
            .to_string();
        let p = terminal.map(|e| &e.payload);
        let usage = p.and_then(|p| p.get("usage")).map(|u| UsageView {
            input_tokens: u.get("input_tokens").and_then(|v| v.as_u64()).unwrap_or(0),
            output_tokens: u.get("output_tokens").and_then(|v| v.as_u64()).unwrap_or(0),
        });
        RunView {
            run_id: run.id.0,
            chat_id: run.chat_id.clone(),
            status: run.status.as_str().to_string(),
            reason: run.terminal_reason.clone(),
            model,
            last_seq: run.last_seq,
            turns: p.and_then(|p| p.get("turns")).and_then(|v| v.as_u64()),
            usage,
            cost_usd: p.and_then(|p| p.get("cost_usd")).and_then(|v| v.as_f64()),
            created_at: run.created_at,
            updated_at: run.updated_at,
            finished_at: run.finished_at,
            events_url: events_url(run.id),
        }
    }
}

pub(crate) fn events_url(id: RunId) -> String {
    format!("/v1/runs/{id}/events")
}

/// A page of the caller's runs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// One file of a run's workspace.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileView {
    /// Path relative to the workspace root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// `GET /v1/runs/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    /// The run.
    pub run_id: Uuid,
    /// Its files, sorted by path (empty until the sandbox exists).
    pub files: Vec<FileView>,
}

/// A run event: the same object `examples/run --json` prints and SSE `data:` carries.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventView {
    /// The run.
    pub run_id: Uuid,
    /// 1, 2, 3 … gap-free per run: the resume cursor.
    pub seq: u64,
    /// The event type (docs/EVENTS.md).
    #[serde(rename = "type")]
    pub kind: String,
    /// When it was persisted.
    pub at: DateTime<Utc>,
    /// Type-specific fields.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

impl From<RunEvent> for EventView {
    fn from(e: RunEvent) -> Self {
        EventView {
            run_id: e.run_id.0,
            seq: e.seq,
            kind: e.kind,
            at: e.at,
            payload: e.payload,
        }
    }
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` when the store answered.
    pub status: String,
}

//! Request and response bodies (their schemas make up `/openapi.json`).

use chrono::{DateTime, Utc};
use edward_core::engine::{Budgets, DoubleTexting};
use edward_core::{BuildJob, ChatMessage, Run, RunEvent, RunId};
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
    /// What to do when the chat already has a queued or running run:
    /// `reject` (`429`, limit `chat`, naming `error.active_run`), `enqueue`
    /// (admitted `queued`, starts after the chat's earlier runs) or
    /// `interrupt` (cancel the chat's active runs, then start). Omitted =
    /// the server's policy (`reject` by default).
    #[serde(default)]
    pub double_texting: Option<DoubleTextingPolicy>,
}

/// The double-texting policy of a submit (see docs/CHATS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DoubleTextingPolicy {
    /// Refuse while the chat has an active run (`429`, limit `chat`).
    Reject,
    /// Queue behind the chat's active runs.
    Enqueue,
    /// Cancel the chat's active runs, then start.
    Interrupt,
}

impl From<DoubleTextingPolicy> for DoubleTexting {
    fn from(p: DoubleTextingPolicy) -> Self {
        match p {
            DoubleTextingPolicy::Reject => DoubleTexting::Reject,
            DoubleTextingPolicy::Enqueue => DoubleTexting::Enqueue,
            DoubleTextingPolicy::Interrupt => DoubleTexting::Interrupt,
        }
    }
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

/// A chat message: the user's prompt (turn 0 of its run) or one turn's
/// visible reply with a compact record of that turn's side effects.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatMessageView {
    /// The run that wrote it.
    pub run_id: Uuid,
    /// The turn (0 = the run's prompt).
    pub turn: u32,
    /// Order within the turn.
    pub index: u32,
    /// `user` or `assistant`.
    pub role: String,
    /// The prompt, or the turn's reply text (outside tags).
    pub text: String,
    /// The turn's side effects (assistant messages): `files` [{`path`,
    /// `bytes`}], `installs` [{`packages`, `framework`?, `exit_code`}],
    /// `commands` [{`command`, `exit_code`, `output`}].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub effects: Option<serde_json::Value>,
    /// When it was stored.
    pub at: DateTime<Utc>,
}

impl From<ChatMessage> for ChatMessageView {
    fn from(m: ChatMessage) -> Self {
        ChatMessageView {
            run_id: m.run_id.0,
            turn: m.turn,
            index: m.index,
            role: m.role.as_str().to_string(),
            text: m.text,
            effects: m.effects.and_then(|e| serde_json::to_value(e).ok()),
            at: m.at,
        }
    }
}

/// `GET /v1/chats/{chat_id}/messages`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MessageList {
    /// The chat.
    pub chat_id: String,
    /// Its newest `limit` messages, oldest first.
    pub messages: Vec<ChatMessageView>,
}

/// A build job of a run (`queued → building → succeeded | failed`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BuildView {
    /// 1 for the run's first build, 2 for the build after an autofix turn.
    pub number: u32,
    /// `queued`, `building`, `succeeded` or `failed`.
    pub status: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// The exit code, once finished (`null` if it could not run).
    pub exit_code: Option<i32>,
    /// Its output (capped), once finished.
    pub output: Option<String>,
    /// How long it took, once finished.
    pub duration_ms: Option<u64>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<BuildJob> for BuildView {
    fn from(b: BuildJob) -> Self {
        BuildView {
            number: b.number,
            status: b.status.as_str().to_string(),
            command: b.command,
            exit_code: b.exit_code,
            output: b.output,
            duration_ms: b.duration_ms,
            created_at: b.created_at,
            updated_at: b.updated_at,
        }
    }
}

/// `GET /v1/runs/{id}/builds`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BuildList {
    /// The run.
    pub run_id: Uuid,
    /// Its build jobs by number (empty when it built nothing).
    pub builds: Vec<BuildView>,
}

/// `GET /v1/chats/{chat_id}/files`: the chat's workspace, shared by all
/// its runs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChatFileList {
    /// The chat.
    pub chat_id: String,
    /// The chat's newest run (whose workspace this is: every run of a chat
    /// shares one).
    pub run_id: Uuid,
    /// The files, sorted by path (empty until a run wrote one).
    pub files: Vec<FileView>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` when the store answered.
    pub status: String,
}

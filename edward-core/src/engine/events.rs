//! The run-event vocabulary written by the engine (documented in `docs/EVENTS.md`).

use serde::{Deserialize, Serialize};

use crate::{NewEvent, RunStatus, Usage};

/// Every event type the engine appends to a run's log.
///
/// Serialises with `type` as the tag; [`EngineEvent::into_new_event`] splits it
/// into the `kind` and the payload (all other fields) of a [`NewEvent`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EngineEvent {
    /// The run was admitted (seq 1, written by `RunStore::admit`).
    RunQueued {
        /// The model that will be used.
        model: String,
        /// Bytes of the prompt.
        prompt_bytes: usize,
    },
    /// A worker started the run for the first time.
    RunStarted {
        /// The worker.
        worker: String,
        /// Queue attempt (1 on a first claim).
        attempt: u32,
        /// Fencing token the worker writes with.
        fence: u64,
        /// Model name.
        model: String,
        /// Model provider.
        provider: String,
    },
    /// A worker took over a run that another worker had started.
    RunResumed {
        /// The worker.
        worker: String,
        /// Queue attempt.
        attempt: u32,
        /// Fencing token.
        fence: u64,
        /// The number of turns completed before (resumes at `from_turn + 1`).
        from_turn: u32,
    },
    /// The partial turn of a previous attempt is superseded: events with seq in
    /// `(superseded_after_seq, this event's seq)` belonging to `turn` are void.
    TurnRestarted {
        /// The turn being restarted.
        turn: u32,
        /// The last seq that belonged to completed turns.
        superseded_after_seq: u64,
    },
    /// The run waits for an earlier active run of its chat to finish before
    /// it starts (runs of one chat never overlap: they share a workspace).
    RunWaiting {
        /// The earlier run it waits for.
        behind: String,
    },
    /// The project's framework, detected before the first model call.
    FrameworkDetected {
        /// `next`, `astro`, `svelte`, `vite`, `vue`, `react`, `static` or `none`.
        framework: String,
        /// The fact it rests on.
        evidence: String,
    },
    /// The model's context was assembled (before the first `turn_started`).
    ContextPrepared {
        /// Earlier chat messages included.
        history_messages: u32,
        /// Earlier chat messages dropped (oldest first) to fit.
        history_dropped: u32,
        /// Workspace files listed.
        files_listed: u32,
        /// Workspace files whose text is included.
        files_included: u32,
        /// Estimated input tokens of the first request.
        estimated_tokens: u64,
    },
    /// A build job started (after the turns that changed files).
    BuildStarted {
        /// 1 for the first build, 2 for the build after an autofix turn.
        number: u32,
        /// The program and arguments.
        command: Vec<String>,
        /// The worker that claimed it.
        worker: String,
    },
    /// A build job finished.
    BuildFinished {
        /// Build number.
        number: u32,
        /// `succeeded` or `failed`.
        status: String,
        /// Exit code (`None` if it could not run or timed out).
        exit_code: Option<i32>,
        /// Output, capped.
        output: String,
        /// Wall time.
        duration_ms: u64,
        /// Whether an autofix turn follows.
        #[serde(default, skip_serializing_if = "is_false")]
        autofix: bool,
    },
    /// A cancel was requested (recorded once, however often it is asked);
    /// the run ends `cancelled` when a worker honours it.
    CancelRequested {},
    /// A turn began (one model call).
    TurnStarted {
        /// 1-based turn number.
        turn: u32,
        /// Estimated input tokens of the request.
        estimated_input_tokens: u64,
    },
    /// Model output text outside files and thinking (coalesced).
    TextDelta {
        /// The text.
        content: String,
    },
    /// Model thinking (coalesced).
    ThinkingDelta {
        /// The text.
        content: String,
    },
    /// Bytes of a file being streamed (coalesced per file).
    FileDelta {
        /// Normalised path.
        path: String,
        /// The content bytes, verbatim.
        content: String,
    },
    /// The parser found a protocol violation; nothing was silently dropped.
    ParseError {
        /// Parser error code (PROTOCOL.md §7).
        code: String,
        /// Explanation.
        message: String,
        /// `recoverable` or `fatal`.
        severity: String,
        /// Input bytes consumed without other events.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skipped_bytes: Option<u64>,
    },
    /// A sandbox was provisioned (or reattached).
    SandboxReady {
        /// Its key.
        key: String,
        /// Where it lives.
        location: String,
    },
    /// The sandbox does not confine commands: they run with the host
    /// user's rights (model-written scripts are code execution on the host).
    SandboxNotIsolated {
        /// Its key.
        key: String,
        /// Why (e.g. `bubblewrap not found`).
        reason: String,
    },
    /// A file's content ended before its closing tag (the stream stopped):
    /// it was not written, and the previous content, if any, is kept.
    FileTruncated {
        /// Idempotency key of the write.
        key: String,
        /// Path.
        path: String,
        /// Bytes received before the stream ended.
        bytes: u64,
        /// Why the stream ended (`length`, `stop`, `output_budget`, …).
        finish_reason: String,
    },
    /// An attempt of the run ended abnormally (a panic in the worker); the
    /// run is retried, and finished `failed` once too many attempts did.
    AttemptFailed {
        /// Queue attempt.
        attempt: u32,
        /// `panic`.
        cause: String,
        /// What happened.
        error: String,
    },
    /// A whole file is now in the sandbox.
    FileWritten {
        /// Idempotency key of the write.
        key: String,
        /// Normalised path.
        path: String,
        /// Size in bytes.
        bytes: u64,
        /// True when a previous attempt already wrote it (resume).
        #[serde(default, skip_serializing_if = "is_false")]
        reused: bool,
    },
    /// Writing a file failed.
    FileWriteFailed {
        /// Idempotency key.
        key: String,
        /// Path.
        path: String,
        /// Why.
        error: String,
    },
    /// An install began.
    InstallStarted {
        /// Idempotency key.
        key: String,
        /// Package manager (`npm`, …, `none`).
        manager: String,
        /// Packages.
        dependencies: Vec<String>,
        /// Framework hint.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        framework: Option<String>,
        /// Attempt (> 1 when re-done after a crash).
        attempt: u32,
    },
    /// An install ended (failures are events, not run failures).
    InstallFinished {
        /// Idempotency key.
        key: String,
        /// The result.
        #[serde(flatten)]
        result: ToolRun,
    },
    /// A command began.
    CommandStarted {
        /// Idempotency key.
        key: String,
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Attempt (> 1 when re-run after a crash).
        attempt: u32,
    },
    /// A command ended.
    CommandFinished {
        /// Idempotency key.
        key: String,
        /// Program.
        command: String,
        /// The result.
        #[serde(flatten)]
        result: ToolRun,
    },
    /// A command was refused (allowlist, path outside the workspace).
    CommandRejected {
        /// Idempotency key.
        key: String,
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Why.
        reason: String,
    },
    /// A tool call was not run because a budget was used up.
    ToolSkipped {
        /// Idempotency key.
        key: String,
        /// `command`, `install` or `web_search`.
        tool: String,
        /// The budget (`tool_calls_per_turn`, `tool_calls_per_run`).
        budget: String,
        /// What was asked, for humans.
        detail: String,
    },
    /// A web search began.
    WebSearchStarted {
        /// Idempotency key.
        key: String,
        /// Query.
        query: String,
    },
    /// A web search ended.
    WebSearchFinished {
        /// Idempotency key.
        key: String,
        /// Number of results.
        results: usize,
        /// Error, if it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The model call is retried after a retryable error before output
    /// began: one event per retry, whether the engine or the provider's
    /// HTTP client retries.
    ModelRetry {
        /// Turn.
        turn: u32,
        /// Attempt number that failed.
        attempt: u32,
        /// The error.
        error: String,
        /// Backoff before the next attempt.
        delay_ms: u64,
        /// The HTTP status of the failed attempt, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// The provider's own error message, when it sent one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The model's stream ended on its own (not cut by the engine): every
    /// end-of-stream signal the provider gave, so a stream a gateway closed
    /// as if finished after its upstream died is visible as such.
    ModelFinished {
        /// Turn.
        turn: u32,
        /// The provider's finish reason (`stop`, `length`, `content_filter`,
        /// or its own word); `None` when the stream carried none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
        /// Whether the token counts came from the server (`false`: Edward
        /// estimated at least one of them).
        usage_reported: bool,
        /// The Edward protocol scope still open when the stream ended
        /// (`file <path>`): the output was cut inside it, whatever the
        /// finish reason says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        open_scope: Option<String>,
    },
    /// A budget passed 80 % of its limit (once per budget per run).
    BudgetWarning {
        /// Which budget.
        budget: String,
        /// Used so far.
        used: f64,
        /// The limit.
        limit: f64,
    },
    /// A turn ended.
    TurnFinished {
        /// Turn number.
        turn: u32,
        /// Usage of this turn's model call.
        usage: Usage,
        /// Files written this turn.
        files_written: u32,
        /// Tool calls run this turn.
        tool_calls: u32,
        /// Whether the model said done.
        done: bool,
        /// The decision: `complete`, `continue`, `nudge` or `stop`.
        outcome: String,
    },
    /// The single terminal event; always the last.
    RunFinished {
        /// Terminal status.
        status: RunStatus,
        /// Why (`done`, `no_progress`, `budget_exhausted:<budget>`, `cancelled`, `error: …`).
        reason: String,
        /// Turns started (the highest turn number with a `turn_started`):
        /// a turn cut short by a cancel, a budget or an error counts.
        turns: u32,
        /// Total usage.
        usage: Usage,
        /// Total cost in USD (0 for unpriced models).
        cost_usd: f64,
        /// Tool calls run.
        tool_calls: u32,
        /// Wall time since first start, in milliseconds.
        duration_ms: u64,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The result of an install or a command, as recorded in events and effect records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ToolRun {
    /// Exit code (`None` when killed, skipped or failed to start).
    pub exit_code: Option<i32>,
    /// Captured stdout (capped).
    pub stdout: String,
    /// Captured stderr (capped).
    pub stderr: String,
    /// Stdout bytes discarded beyond the cap.
    pub stdout_truncated: u64,
    /// Stderr bytes discarded beyond the cap.
    pub stderr_truncated: u64,
    /// Killed by the timeout.
    pub timed_out: bool,
    /// Wall time.
    pub duration_ms: u64,
    /// Error starting it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// True when reused from a previous attempt's record (not run again).
    #[serde(default, skip_serializing_if = "is_false")]
    pub reused: bool,
}

impl ToolRun {
    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.exit_code == Some(0)
    }
}

impl EngineEvent {
    /// The `type` string.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineEvent::RunQueued { .. } => "run_queued",
            EngineEvent::RunStarted { .. } => "run_started",
            EngineEvent::RunResumed { .. } => "run_resumed",
            EngineEvent::TurnRestarted { .. } => "turn_restarted",
            EngineEvent::CancelRequested {} => "cancel_requested",
            EngineEvent::RunWaiting { .. } => "run_waiting",
            EngineEvent::FrameworkDetected { .. } => "framework_detected",
            EngineEvent::ContextPrepared { .. } => "context_prepared",
            EngineEvent::BuildStarted { .. } => "build_started",
            EngineEvent::BuildFinished { .. } => "build_finished",
            EngineEvent::TurnStarted { .. } => "turn_started",
            EngineEvent::TextDelta { .. } => "text_delta",
            EngineEvent::ThinkingDelta { .. } => "thinking_delta",
            EngineEvent::FileDelta { .. } => "file_delta",
            EngineEvent::ParseError { .. } => "parse_error",
            EngineEvent::SandboxReady { .. } => "sandbox_ready",
            EngineEvent::SandboxNotIsolated { .. } => "sandbox_not_isolated",
            EngineEvent::FileTruncated { .. } => "file_truncated",
            EngineEvent::AttemptFailed { .. } => "attempt_failed",
            EngineEvent::FileWritten { .. } => "file_written",
            EngineEvent::FileWriteFailed { .. } => "file_write_failed",
            EngineEvent::InstallStarted { .. } => "install_started",
            EngineEvent::InstallFinished { .. } => "install_finished",
            EngineEvent::CommandStarted { .. } => "command_started",
            EngineEvent::CommandFinished { .. } => "command_finished",
            EngineEvent::CommandRejected { .. } => "command_rejected",
            EngineEvent::ToolSkipped { .. } => "tool_skipped",
            EngineEvent::WebSearchStarted { .. } => "web_search_started",
            EngineEvent::WebSearchFinished { .. } => "web_search_finished",
            EngineEvent::ModelRetry { .. } => "model_retry",
            EngineEvent::ModelFinished { .. } => "model_finished",
            EngineEvent::BudgetWarning { .. } => "budget_warning",
            EngineEvent::TurnFinished { .. } => "turn_finished",
            EngineEvent::RunFinished { .. } => "run_finished",
        }
    }

    /// Split into the store's form: `kind` plus the other fields as payload.
    pub fn into_new_event(self) -> NewEvent {
        self.to_new_event()
    }

    /// [`EngineEvent::into_new_event`] by reference (serialising needs no
    /// ownership), for a batch kept until its append succeeded.
    pub(crate) fn to_new_event(&self) -> NewEvent {
        let kind = self.kind();
        // Content deltas, most of a run's events, are built directly: the
        // same object serde makes, without a `type` entry added and removed.
        let string = |s: &String| serde_json::Value::String(s.clone());
        let fields = match self {
            EngineEvent::TextDelta { content } | EngineEvent::ThinkingDelta { content } => {
                Some(vec![("content", string(content))])
            }
            EngineEvent::FileDelta { path, content } => {
                Some(vec![("path", string(path)), ("content", string(content))])
            }
            _ => None,
        };
        if let Some(fields) = fields {
            let map = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            return NewEvent::new(kind, serde_json::Value::Object(map));
        }
        let mut value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(obj) = value.as_object_mut() {
            obj.remove("type");
        }
        if !value.is_object() {
            value = serde_json::Value::Object(Default::default());
        }
        NewEvent::new(kind, value)
    }

    /// Parse a stored event back (`None` for kinds this version does not know).
    pub fn from_stored(kind: &str, payload: &serde_json::Value) -> Option<EngineEvent> {
        Self::decode_stored(kind, payload).ok()
    }

    /// Parse a stored event back: `kind` as the `type` tag, the payload's
    /// fields (a non-object payload has none; a `type` field in it is
    /// ignored, the stored kind wins). Read in place: the payload is not
    /// copied into a new object with the tag added first.
    pub(crate) fn decode_stored(
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<EngineEvent, serde_json::Error> {
        // Content deltas directly, when their fields are plain strings (the
        // derived decoding ignores other fields too); anything else, errors
        // included, through serde.
        if let Some(obj) = payload.as_object() {
            let text = |k: &str| obj.get(k).and_then(serde_json::Value::as_str);
            let event = match (kind, text("content")) {
                ("text_delta", Some(content)) => Some(EngineEvent::TextDelta {
                    content: content.to_owned(),
                }),
                ("thinking_delta", Some(content)) => Some(EngineEvent::ThinkingDelta {
                    content: content.to_owned(),
                }),
                ("file_delta", Some(content)) => text("path").map(|path| EngineEvent::FileDelta {
                    path: path.to_owned(),
                    content: content.to_owned(),
                }),
                _ => None,
            };
            if let Some(event) = event {
                return Ok(event);
            }
        }
        let fields = payload.as_object().map(|m| m.iter());
        EngineEvent::deserialize(stored::Tagged { kind, fields })
    }

    /// Content deltas are coalesced; everything else is appended as is.
    pub(crate) fn is_content(&self) -> bool {
        matches!(
            self,
            EngineEvent::TextDelta { .. }
                | EngineEvent::ThinkingDelta { .. }
                | EngineEvent::FileDelta { .. }
        )
    }

    /// The content's length, for a content delta.
    pub(crate) fn content_len(&self) -> Option<usize> {
        match self {
            EngineEvent::TextDelta { content }
            | EngineEvent::ThinkingDelta { content }
            | EngineEvent::FileDelta { content, .. } => Some(content.len()),
            _ => None,
        }
    }

    /// Approximate payload size, for batching.
    pub(crate) fn approx_bytes(&self) -> usize {
        match self {
            EngineEvent::TextDelta { content } | EngineEvent::ThinkingDelta { content } => {
                content.len()
            }
            EngineEvent::FileDelta { path, content } => path.len() + content.len(),
            EngineEvent::CommandFinished { result, .. }
            | EngineEvent::InstallFinished { result, .. } => {
                result.stdout.len() + result.stderr.len() + 128
            }
            _ => 128,
        }
    }

    /// Append `other` to `self` if both are content deltas of the same stream
    /// and the result stays under `cap` bytes. Returns `other` back otherwise.
    pub(crate) fn try_merge(&mut self, other: EngineEvent, cap: usize) -> Option<EngineEvent> {
        match (self, other) {
            (EngineEvent::TextDelta { content: a }, EngineEvent::TextDelta { content: b })
                if a.len() + b.len() <= cap =>
            {
                a.push_str(&b);
                None
            }
            (
                EngineEvent::ThinkingDelta { content: a },
                EngineEvent::ThinkingDelta { content: b },
            ) if a.len() + b.len() <= cap => {
                a.push_str(&b);
                None
            }
            (
                EngineEvent::FileDelta {
                    path: pa,
                    content: a,
                },
                EngineEvent::FileDelta {
                    path: pb,
                    content: b,
                },
            ) if *pa == pb && a.len() + b.len() <= cap => {
                a.push_str(&b);
                None
            }
            (_, other) => Some(other),
        }
    }
}

/// A stored event as a map deserializer: `type` first (the stored kind),
/// then the payload's fields, each read from the stored value by reference.
mod stored {
    use serde::de::value::BorrowedStrDeserializer;
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
    use serde_json::Value;

    pub(super) struct Tagged<'a> {
        pub(super) kind: &'a str,
        pub(super) fields: Option<serde_json::map::Iter<'a>>,
    }

    impl<'de> Deserializer<'de> for Tagged<'de> {
        type Error = serde_json::Error;

        fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            visitor.visit_map(Fields {
                kind: Some(self.kind),
                fields: self.fields,
                value: None,
            })
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map struct enum identifier ignored_any
        }
    }

    struct Fields<'de> {
        /// The tag, until its key was read.
        kind: Option<&'de str>,
        fields: Option<serde_json::map::Iter<'de>>,
        /// The value of the key just read (`None`: the tag's).
        value: Option<&'de Value>,
    }

    impl<'de> MapAccess<'de> for Fields<'de> {
        type Error = serde_json::Error;

        fn next_key_seed<K: DeserializeSeed<'de>>(
            &mut self,
            seed: K,
        ) -> Result<Option<K::Value>, Self::Error> {
            if self.kind.is_some() {
                self.value = None;
                return seed
                    .deserialize(BorrowedStrDeserializer::new("type"))
                    .map(Some);
            }
            let Some(fields) = self.fields.as_mut() else {
                return Ok(None);
            };
            for (key, value) in fields.by_ref() {
                if key == "type" {
                    continue;
                }
                self.value = Some(value);
                return seed
                    .deserialize(BorrowedStrDeserializer::new(key.as_str()))
                    .map(Some);
            }
            Ok(None)
        }

        fn next_value_seed<V: DeserializeSeed<'de>>(
            &mut self,
            seed: V,
        ) -> Result<V::Value, Self::Error> {
            match (self.kind.take(), self.value.take()) {
                (Some(kind), _) => seed.deserialize(BorrowedStrDeserializer::new(kind)),
                (None, Some(value)) => seed.deserialize(value),
                (None, None) => Err(serde::de::Error::custom("value without a key")),
            }
        }
    }
}

/// A content delta borrowed from the parser: queued by
/// [`RunLog::push_delta`](super::sink::RunLog::push_delta), it becomes an
/// owned [`EngineEvent`] only when it cannot be merged into the previous one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DeltaRef<'a> {
    /// As [`EngineEvent::TextDelta`].
    Text(&'a str),
    /// As [`EngineEvent::ThinkingDelta`].
    Thinking(&'a str),
    /// As [`EngineEvent::FileDelta`].
    File { path: &'a str, content: &'a str },
}

impl DeltaRef<'_> {
    /// The owned event.
    pub(crate) fn to_event(self) -> EngineEvent {
        self.to_event_with_room(0)
    }

    /// The owned event, its content with capacity for at least `room`
    /// bytes (deltas merged into it later need no reallocation).
    pub(crate) fn to_event_with_room(self, room: usize) -> EngineEvent {
        let owned = |content: &str| {
            let mut s = String::with_capacity(room.max(content.len()));
            s.push_str(content);
            s
        };
        match self {
            DeltaRef::Text(content) => EngineEvent::TextDelta {
                content: owned(content),
            },
            DeltaRef::Thinking(content) => EngineEvent::ThinkingDelta {
                content: owned(content),
            },
            DeltaRef::File { path, content } => EngineEvent::FileDelta {
                path: path.to_owned(),
                content: owned(content),
            },
        }
    }

    /// As [`EngineEvent::approx_bytes`] of the owned event.
    pub(crate) fn approx_bytes(&self) -> usize {
        match self {
            DeltaRef::Text(content) | DeltaRef::Thinking(content) => content.len(),
            DeltaRef::File { path, content } => path.len() + content.len(),
        }
    }
}

impl EngineEvent {
    /// [`EngineEvent::try_merge`] of a borrowed delta: appends it and returns
    /// `true`, or returns `false` (nothing changed) where `try_merge` would
    /// have handed the event back.
    pub(crate) fn try_merge_ref(&mut self, delta: DeltaRef<'_>, cap: usize) -> bool {
        let (a, b) = match (self, delta) {
            (EngineEvent::TextDelta { content: a }, DeltaRef::Text(b))
            | (EngineEvent::ThinkingDelta { content: a }, DeltaRef::Thinking(b)) => (a, b),
            (
                EngineEvent::FileDelta {
                    path: pa,
                    content: a,
                },
                DeltaRef::File {
                    path: pb,
                    content: b,
                },
            ) if pa == pb => (a, b),
            _ => return false,
        };
        if a.len() + b.len() > cap {
            return false;
        }
        a.push_str(b);
        true
    }
}

impl From<EngineEvent> for NewEvent {
    fn from(e: EngineEvent) -> Self {
        e.into_new_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_in_place_is_decoding_a_copy_with_the_tag() {
        // What `from_stored` did before: copy the payload, add the tag.
        let copied = |kind: &str, payload: &serde_json::Value| {
            let mut obj = payload.as_object().cloned().unwrap_or_default();
            obj.insert("type".into(), serde_json::Value::String(kind.to_string()));
            serde_json::from_value::<EngineEvent>(serde_json::Value::Object(obj))
        };
        let cases = [
            (
                "file_delta",
                serde_json::json!({"path": "a", "content": "x\n\"y\""}),
            ),
            (
                "text_delta",
                serde_json::json!({"content": "hi", "type": "file_delta"}),
            ),
            ("text_delta", serde_json::json!({"content": 5})),
            ("file_delta", serde_json::json!({"content": "hi"})),
            (
                "file_delta",
                serde_json::json!({"content": "hi", "path": 3}),
            ),
            (
                "file_delta",
                serde_json::json!({"content": "hi", "path": "p", "extra": 1}),
            ),
            ("thinking_delta", serde_json::json!({"content": null})),
            ("thinking_delta", serde_json::json!({"content": "c"})),
            ("text_delta", serde_json::json!({})),
            ("text_delta", serde_json::json!("not an object")),
            ("from_the_future", serde_json::json!({"content": "hi"})),
            (
                "turn_finished",
                serde_json::json!({"turn": 2, "usage": {"input_tokens": 1, "output_tokens": 2, "estimated": false},
                    "files_written": 1, "tool_calls": 0, "done": true, "outcome": "complete", "extra": [1, {"a": null}]}),
            ),
            (
                "run_queued",
                serde_json::json!({"request": {"deep": [1, 2.5, "s", true, null]}}),
            ),
        ];
        for (kind, payload) in cases {
            let (a, b) = (
                copied(kind, &payload),
                EngineEvent::decode_stored(kind, &payload),
            );
            assert_eq!(a.is_ok(), b.is_ok(), "{kind} {payload}: {a:?} vs {b:?}");
            if let (Ok(a), Ok(b)) = (a, b) {
                assert_eq!(a, b);
            }
        }
        for e in [
            EngineEvent::FileDelta {
                path: "p".into(),
                content: "c\"\n".into(),
            },
            EngineEvent::TextDelta {
                content: "t".into(),
            },
            EngineEvent::ThinkingDelta {
                content: String::new(),
            },
        ] {
            let n = e.to_new_event();
            // The direct form is the one serde makes.
            let mut serde_form = serde_json::to_value(&e).unwrap();
            serde_form.as_object_mut().unwrap().remove("type");
            assert_eq!(n.payload, serde_form);
            assert_eq!(EngineEvent::decode_stored(&n.kind, &n.payload).unwrap(), e);
        }
    }

    #[test]
    fn merging_a_borrowed_delta_is_merging_the_owned_one() {
        let deltas = [
            DeltaRef::Text("ab"),
            DeltaRef::Thinking("cd"),
            DeltaRef::File {
                path: "a",
                content: "ef",
            },
            DeltaRef::File {
                path: "b",
                content: "gh",
            },
        ];
        for first in deltas {
            for second in deltas {
                for cap in [3, 4, 16] {
                    let (mut owned, mut borrowed) = (first.to_event(), first.to_event());
                    let merged = owned.try_merge(second.to_event(), cap).is_none();
                    assert_eq!(borrowed.try_merge_ref(second, cap), merged);
                    assert_eq!(owned, borrowed);
                    assert_eq!(second.approx_bytes(), second.to_event().approx_bytes());
                }
            }
        }
    }

    #[test]
    fn new_event_has_kind_and_payload_without_type() {
        let e = EngineEvent::FileWritten {
            key: "t1/0/write".into(),
            path: "a.txt".into(),
            bytes: 3,
            reused: false,
        };
        let n = e.clone().into_new_event();
        assert_eq!(n.kind, "file_written");
        assert_eq!(
            n.payload,
            serde_json::json!({"key":"t1/0/write","path":"a.txt","bytes":3})
        );
        assert_eq!(EngineEvent::from_stored(&n.kind, &n.payload), Some(e));
    }

    #[test]
    fn flattened_tool_run_round_trips() {
        let e = EngineEvent::CommandFinished {
            key: "t1/1/command".into(),
            command: "ls".into(),
            result: ToolRun {
                exit_code: Some(0),
                stdout: "x".into(),
                ..Default::default()
            },
        };
        let n = e.clone().into_new_event();
        assert_eq!(n.payload["exit_code"], 0);
        assert_eq!(EngineEvent::from_stored(&n.kind, &n.payload), Some(e));
    }

    #[test]
    fn merge_respects_kind_path_and_cap() {
        let mut a = EngineEvent::TextDelta {
            content: "ab".into(),
        };
        assert!(
            a.try_merge(
                EngineEvent::TextDelta {
                    content: "c".into()
                },
                10
            )
            .is_none()
        );
        assert_eq!(
            a,
            EngineEvent::TextDelta {
                content: "abc".into()
            }
        );
        assert!(
            a.try_merge(
                EngineEvent::TextDelta {
                    content: "x".repeat(8)
                },
                10
            )
            .is_some()
        );
        let mut f = EngineEvent::FileDelta {
            path: "a".into(),
            content: "1".into(),
        };
        assert!(
            f.try_merge(
                EngineEvent::FileDelta {
                    path: "b".into(),
                    content: "2".into()
                },
                10
            )
            .is_some()
        );
        assert!(
            f.try_merge(
                EngineEvent::ThinkingDelta {
                    content: "t".into()
                },
                10
            )
            .is_some()
        );
    }
}

//! [`MemoryRunStore`]: runs, events, checkpoints and effect records in memory.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::lock_state;
use crate::chat::{BuildJob, BuildResult, BuildStatus, ChatMessage, NewMessage};
use crate::error::{AdmissionError, AdmitError, StoreError};
use crate::traits::{RunFilter, RunStore};
use crate::types::{
    AdmissionLimits, Checkpoint, EffectRecord, EffectState, Fence, NewEvent, NewRun, RUN_FINISHED,
    Run, RunEvent, RunId, RunStatus,
};

/// An in-memory [`RunStore`].
///
/// All state sits behind one mutex that is never held across an `.await`, so
/// every operation — admission check-and-insert in particular — is atomic.
/// Active-run counters (global, per user, per chat) are maintained on admit
/// and finish, so admission is O(1) rather than a scan.
///
/// Beyond the trait contract this store also refuses, with a permanent
/// [`StoreError::Backend`], a `run_finished` event passed to
/// [`RunStore::append_events`] and a [`RunStore::finish_run`] batch whose
/// last event is not `run_finished`: a run has exactly one terminal event,
/// and it is its last.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use edward_core::memory::MemoryRunStore;
/// use edward_core::{AdmissionLimits, NewEvent, NewRun, RunId, RunStore, RunStatus};
///
/// let store = MemoryRunStore::new();
/// let run = store
///     .admit(
///         NewRun {
///             id: RunId::new(),
///             user_id: "u".into(),
///             chat_id: "c".into(),
///             request: serde_json::json!({}),
///             first_event: NewEvent::new("run_queued", serde_json::json!({})),
///         },
///         AdmissionLimits::default(),
///     )
///     .await?;
/// assert_eq!(run.status, RunStatus::Queued);
/// assert_eq!(run.last_seq, 1);
/// # Ok(())
/// # }
/// ```
///
/// **Retention.** Finished runs are kept for tailing and replay, but not
/// forever: by default the newest [`MemoryRetention::DEFAULT_KEEP_FINISHED`]
/// finished runs stay (older ones are forgotten: `get_run` gives `None`,
/// `events_after` `NotFound`), and a finished run's checkpoint and
/// side-effect records are dropped at once (nothing reads them after the
/// terminal event). Set [`MemoryRunStore::with_retention`] to change it.
#[derive(Debug, Default)]
pub struct MemoryRunStore {
    state: Mutex<State>,
}

/// How many finished runs a [`MemoryRunStore`] keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryRetention {
    /// Keep at most this many finished runs (the newest).
    pub keep_finished: usize,
    /// Forget a finished run this long after it finished (`None`: no age limit).
    pub max_age: Option<std::time::Duration>,
}

impl MemoryRetention {
    /// The default number of finished runs kept.
    pub const DEFAULT_KEEP_FINISHED: usize = 1_000;

    /// Keep the newest `keep_finished` finished runs, with no age limit.
    pub fn keep(keep_finished: usize) -> Self {
        MemoryRetention {
            keep_finished,
            max_age: None,
        }
    }

    /// Also forget finished runs older than `max_age`.
    pub fn with_max_age(mut self, max_age: std::time::Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }
}

impl Default for MemoryRetention {
    fn default() -> Self {
        MemoryRetention::keep(Self::DEFAULT_KEEP_FINISHED)
    }
}

#[derive(Debug, Default)]
struct State {
    runs: HashMap<RunId, Entry>,
    /// `(created_at, id)` per status, for `list_runs` without a scan.
    by_status: HashMap<RunStatus, BTreeSet<(DateTime<Utc>, RunId)>>,
    /// Run ids per user, for `list_user_runs` without a scan of every run.
    by_user: HashMap<String, BTreeSet<RunId>>,
    active_global: u32,
    active_per_user: HashMap<String, u32>,
    active_per_chat: HashMap<String, u32>,
    /// Finished runs, oldest first, for retention.
    finished: std::collections::VecDeque<(DateTime<Utc>, RunId)>,
    retention: MemoryRetention,
    /// Chat messages by (user, chat), kept apart from runs: they outlive
    /// the run retention (up to [`MAX_CHAT_MESSAGES`] per chat).
    messages: HashMap<(String, String), ChatLog>,
}

/// One chat's messages by `(run, turn, index)`: conversation order.
type ChatLog = std::collections::BTreeMap<(RunId, u32, u32), ChatMessage>;

/// The newest messages a [`MemoryRunStore`] keeps per chat.
pub const MAX_CHAT_MESSAGES: usize = 2_000;

/// The key of per-chat admission counters: a chat belongs to its user.
fn chat_counter_key(user_id: &str, chat_id: &str) -> String {
    format!("{user_id}\0{chat_id}")
}

#[derive(Debug)]
struct Entry {
    run: Run,
    /// `events[i]` has seq `i + 1`.
    events: Vec<StoredEvent>,
    checkpoint: Option<Checkpoint>,
    effects: HashMap<String, EffectRecord>,
    builds: std::collections::BTreeMap<u32, BuildJob>,
}

impl MemoryRunStore {
    /// An empty store with the default retention.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store keeping finished runs as `retention` says.
    pub fn with_retention(retention: MemoryRetention) -> Self {
        let store = Self::default();
        lock_state(&store.state).retention = retention;
        store
    }

    /// How many runs (active and finished) the store holds.
    pub fn len(&self) -> usize {
        lock_state(&self.state).runs.len()
    }

    /// Whether the store holds no run.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl State {
    fn entry_mut(&mut self, run_id: RunId) -> Result<&mut Entry, StoreError> {
        self.runs
            .get_mut(&run_id)
            .ok_or(StoreError::NotFound { run_id })
    }

    fn set_status(
        &mut self,
        run_id: RunId,
        from: RunStatus,
        to: RunStatus,
        created: DateTime<Utc>,
    ) {
        if from == to {
            return;
        }
        if let Some(set) = self.by_status.get_mut(&from) {
            set.remove(&(created, run_id));
        }
        self.by_status
            .entry(to)
            .or_default()
            .insert((created, run_id));
    }

    /// Forget the oldest finished runs beyond the retention policy.
    fn enforce_retention(&mut self, now: DateTime<Utc>) {
        let max_age = self
            .retention
            .max_age
            .and_then(|d| chrono::TimeDelta::from_std(d).ok());
        while let Some(&(finished_at, run_id)) = self.finished.front() {
            let too_many = self.finished.len() > self.retention.keep_finished;
            let too_old = max_age.is_some_and(|age| finished_at + age <= now);
            if !too_many && !too_old {
                break;
            }
            self.finished.pop_front();
            if let Some(entry) = self.runs.remove(&run_id) {
                if let Some(set) = self.by_status.get_mut(&entry.run.status) {
                    set.remove(&(entry.run.created_at, run_id));
                }
            }
        }
    }

    fn release_active(&mut self, user_id: &str, chat_id: &str) {
        self.active_global = self.active_global.saturating_sub(1);
        decrement(&mut self.active_per_user, user_id);
        decrement(
            &mut self.active_per_chat,
            &chat_counter_key(user_id, chat_id),
        );
    }
}

fn decrement(map: &mut HashMap<String, u32>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// `StaleFence` when `given` is older than the run's fence.
fn check_fence(run: &Run, given: Fence) -> Result<(), StoreError> {
    if given < run.fence {
        return Err(StoreError::StaleFence {
            run_id: run.id,
            given,
            current: run.fence,
        });
    }
    Ok(())
}

fn check_not_finished(run: &Run) -> Result<(), StoreError> {
    if run.status.is_terminal() {
        return Err(StoreError::Finished { run_id: run.id });
    }
    Ok(())
}

/// An event as kept: its payload as compact JSON text. A `serde_json::Value`
/// object costs a B-tree node (~600 bytes) before any of its strings; a
/// streamed run keeps hundreds of small delta events, so the text form holds
/// a run's log in a fraction of the memory. Reads parse it back.
#[derive(Debug)]
struct StoredEvent {
    kind: Box<str>,
    at: DateTime<Utc>,
    payload: Box<str>,
}

impl StoredEvent {
    fn read(&self, run_id: RunId, seq: u64) -> Result<RunEvent, StoreError> {
        let payload = serde_json::from_str(&self.payload)
            .map_err(|e| StoreError::Corrupt(format!("event {run_id}/{seq}: {e}")))?;
        Ok(RunEvent {
            run_id,
            seq,
            kind: self.kind.to_string(),
            at: self.at,
            payload,
        })
    }
}

/// Assign seqs after the entry's last one and push the events.
fn push_events(entry: &mut Entry, events: Vec<NewEvent>, at: DateTime<Utc>) -> Vec<RunEvent> {
    let run_id = entry.run.id;
    let mut persisted = Vec::with_capacity(events.len());
    for event in events {
        let seq = entry.events.len() as u64 + 1;
        let event = RunEvent {
            run_id,
            seq,
            kind: event.kind,
            at,
            payload: event.payload,
        };
        entry.events.push(StoredEvent {
            kind: event.kind.as_str().into(),
            at,
            // `serde_json::to_string` writes bytes directly; `Display` (the
            // same compact text) goes through `fmt` machinery per token.
            payload: serde_json::to_string(&event.payload)
                .unwrap_or_else(|_| event.payload.to_string())
                .into_boxed_str(),
        });
        persisted.push(event);
    }
    entry.run.last_seq = entry.events.len() as u64;
    if !persisted.is_empty() {
        entry.run.updated_at = at;
    }
    persisted
}

#[async_trait]
impl RunStore for MemoryRunStore {
    fn durability(&self) -> crate::types::Durability {
        crate::types::Durability::InProcess
    }

    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        let mut state = lock_state(&self.state);
        if state.runs.contains_key(&run.id) {
            return Err(StoreError::AlreadyExists { run_id: run.id }.into());
        }
        let chat = state
            .active_per_chat
            .get(&chat_counter_key(&run.user_id, &run.chat_id))
            .copied()
            .unwrap_or(0);
        if chat >= limits.per_chat {
            tracing::debug!(run_id = %run.id, chat = chat, "admission rejected: chat limit");
            return Err(AdmissionError::ChatLimit {
                limit: limits.per_chat,
            }
            .into());
        }
        let user = state
            .active_per_user
            .get(&run.user_id)
            .copied()
            .unwrap_or(0);
        if user >= limits.per_user {
            tracing::debug!(run_id = %run.id, user = user, "admission rejected: user limit");
            return Err(AdmissionError::UserLimit {
                limit: limits.per_user,
            }
            .into());
        }
        if state.active_global >= limits.global {
            tracing::debug!(run_id = %run.id, "admission rejected: global limit");
            return Err(AdmissionError::GlobalLimit {
                limit: limits.global,
            }
            .into());
        }

        let now = Utc::now();
        let stored = Run {
            id: run.id,
            user_id: run.user_id,
            chat_id: run.chat_id,
            status: RunStatus::Queued,
            request: run.request,
            fence: Fence(0),
            last_seq: 0,
            created_at: now,
            updated_at: now,
            finished_at: None,
            terminal_reason: None,
            cancel_requested_at: None,
        };
        let mut entry = Entry {
            run: stored,
            events: Vec::new(),
            checkpoint: None,
            effects: HashMap::new(),
            builds: Default::default(),
        };
        push_events(&mut entry, vec![run.first_event], now);
        let result = entry.run.clone();

        state
            .by_user
            .entry(result.user_id.clone())
            .or_default()
            .insert(result.id);
        state.active_global += 1;
        *state
            .active_per_user
            .entry(result.user_id.clone())
            .or_default() += 1;
        *state
            .active_per_chat
            .entry(chat_counter_key(&result.user_id, &result.chat_id))
            .or_default() += 1;
        state
            .by_status
            .entry(RunStatus::Queued)
            .or_default()
            .insert((now, result.id));
        state.runs.insert(result.id, entry);
        Ok(result)
    }

    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        if !entry.run.status.is_terminal() && entry.run.cancel_requested_at.is_none() {
            let now = Utc::now();
            entry.run.cancel_requested_at = Some(now);
            push_events(entry, vec![event], now);
        }
        Ok(entry.run.clone())
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        let state = lock_state(&self.state);
        Ok(state.runs.get(&run_id).map(|e| e.run.clone()))
    }

    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_not_finished(&entry.run)?;
        check_fence(&entry.run, fence)?;
        let from = entry.run.status;
        let created = entry.run.created_at;
        entry.run.fence = fence;
        entry.run.status = RunStatus::Running;
        entry.run.updated_at = Utc::now();
        let run = entry.run.clone();
        state.set_status(run_id, from, RunStatus::Running, created);
        Ok(run)
    }

    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_not_finished(&entry.run)?;
        check_fence(&entry.run, fence)?;
        if events.iter().any(|e| e.kind == RUN_FINISHED) {
            return Err(StoreError::permanent(format!(
                "run {run_id}: `{RUN_FINISHED}` may only be appended by finish_run"
            )));
        }
        Ok(push_events(entry, events, Utc::now()))
    }

    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_not_finished(&entry.run)?;
        if let Some(fence) = fence {
            check_fence(&entry.run, fence)?;
        }
        if !status.is_terminal() {
            return Err(StoreError::InvalidTransition {
                run_id,
                from: entry.run.status,
                to: status,
            });
        }
        if events.last().map(|e| e.kind.as_str()) != Some(RUN_FINISHED)
            || events[..events.len() - 1]
                .iter()
                .any(|e| e.kind == RUN_FINISHED)
        {
            return Err(StoreError::permanent(format!(
                "run {run_id}: finish_run needs exactly one `{RUN_FINISHED}` event, last"
            )));
        }
        let now = Utc::now();
        let from = entry.run.status;
        let created = entry.run.created_at;
        entry.run.status = status;
        entry.run.finished_at = Some(now);
        entry.run.terminal_reason = Some(reason.to_owned());
        let persisted = push_events(entry, events, now);
        entry.run.updated_at = now;
        // Nothing reads these after the terminal event; they can be large.
        entry.checkpoint = None;
        entry.effects = HashMap::new();
        let (user_id, chat_id) = (entry.run.user_id.clone(), entry.run.chat_id.clone());
        state.set_status(run_id, from, status, created);
        state.release_active(&user_id, &chat_id);
        state.finished.push_back((now, run_id));
        state.enforce_retention(now);
        Ok(persisted)
    }

    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let state = lock_state(&self.state);
        let entry = state
            .runs
            .get(&run_id)
            .ok_or(StoreError::NotFound { run_id })?;
        let start = usize::try_from(after_seq).unwrap_or(usize::MAX);
        entry
            .events
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take(limit)
            .zip(after_seq + 1..)
            .map(|(event, seq)| event.read(run_id, seq))
            .collect()
    }

    async fn save_checkpoint(
        &self,
        run_id: RunId,
        fence: Fence,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        entry.checkpoint = Some(checkpoint);
        Ok(())
    }

    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError> {
        let state = lock_state(&self.state);
        let entry = state
            .runs
            .get(&run_id)
            .ok_or(StoreError::NotFound { run_id })?;
        Ok(entry.checkpoint.clone())
    }

    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let record = entry
            .effects
            .entry(key.to_owned())
            .and_modify(|r| {
                if r.state == EffectState::Started {
                    r.attempts = r.attempts.saturating_add(1);
                }
            })
            .or_insert_with(|| EffectRecord {
                key: key.to_owned(),
                state: EffectState::Started,
                request,
                result: None,
                attempts: 1,
            });
        Ok(record.clone())
    }

    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let record = entry
            .effects
            .entry(key.to_owned())
            .or_insert_with(|| EffectRecord {
                key: key.to_owned(),
                state: EffectState::Started,
                request: serde_json::Value::Null,
                result: None,
                attempts: 1,
            });
        record.state = EffectState::Completed;
        record.result = Some(result);
        Ok(())
    }

    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError> {
        let state = lock_state(&self.state);
        let Some(set) = state.by_status.get(&status) else {
            return Ok(Vec::new());
        };
        Ok(set
            .iter()
            .take(limit)
            .filter_map(|(_, id)| state.runs.get(id).map(|e| e.run.clone()))
            .collect())
    }

    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let state = lock_state(&self.state);
        let Some(ids) = state.by_user.get(user_id) else {
            return Ok(Vec::new());
        };
        let page = match before {
            Some(before) => ids.range(..before),
            None => ids.range(..),
        };
        Ok(page
            .rev()
            .filter_map(|id| state.runs.get(id).map(|e| &e.run))
            .filter(|run| filter.matches(run))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let key = (entry.run.user_id.clone(), entry.run.chat_id.clone());
        let chat = state.messages.entry(key).or_default();
        let stale: Vec<_> = chat
            .range((run_id, turn, 0)..=(run_id, u32::MAX, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            chat.remove(&k);
        }
        let at = Utc::now();
        for (index, m) in messages.into_iter().enumerate() {
            let index = index as u32;
            chat.insert(
                (run_id, turn, index),
                ChatMessage {
                    run_id,
                    turn,
                    index,
                    role: m.role,
                    text: m.text,
                    effects: m.effects,
                    at,
                },
            );
        }
        while chat.len() > MAX_CHAT_MESSAGES {
            chat.pop_first();
        }
        Ok(())
    }

    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError> {
        let state = lock_state(&self.state);
        let Some(chat) = state
            .messages
            .get(&(user_id.to_owned(), chat_id.to_owned()))
        else {
            return Ok(Vec::new());
        };
        let range = match before_run {
            Some(before) => chat.range(..(before, 0, 0)),
            None => chat.range(..),
        };
        let mut page: Vec<ChatMessage> = range.rev().take(limit).map(|(_, m)| m.clone()).collect();
        page.reverse();
        Ok(page)
    }

    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<BuildJob, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let now = Utc::now();
        Ok(entry
            .builds
            .entry(number)
            .or_insert_with(|| BuildJob {
                run_id,
                number,
                status: BuildStatus::Queued,
                command,
                claimed_by: None,
                claim_fence: Fence(0),
                exit_code: None,
                output: None,
                duration_ms: None,
                created_at: now,
                updated_at: now,
            })
            .clone())
    }

    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let Some(job) = entry.builds.get_mut(&number) else {
            return Err(StoreError::BuildConflict {
                run_id,
                number,
                status: "missing".into(),
                action: "claim",
            });
        };
        let claimable = job.status == BuildStatus::Queued
            || (job.status == BuildStatus::Building && job.claim_fence < fence);
        if !claimable {
            return Ok(None);
        }
        job.status = BuildStatus::Building;
        job.claimed_by = Some(worker.to_owned());
        job.claim_fence = fence;
        job.updated_at = Utc::now();
        Ok(Some(job.clone()))
    }

    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        let mut state = lock_state(&self.state);
        let entry = state.entry_mut(run_id)?;
        check_fence(&entry.run, fence)?;
        let conflict = |status: &str| StoreError::BuildConflict {
            run_id,
            number,
            status: status.to_owned(),
            action: "finish",
        };
        let Some(job) = entry.builds.get_mut(&number) else {
            return Err(conflict("missing"));
        };
        if job.status != BuildStatus::Building
            || job.claim_fence != fence
            || !result.status.is_terminal()
        {
            return Err(conflict(job.status.as_str()));
        }
        job.status = result.status;
        job.exit_code = result.exit_code;
        job.output = Some(result.output);
        job.duration_ms = Some(result.duration_ms);
        job.updated_at = Utc::now();
        Ok(job.clone())
    }

    async fn builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError> {
        let state = lock_state(&self.state);
        let entry = state
            .runs
            .get(&run_id)
            .ok_or(StoreError::NotFound { run_id })?;
        Ok(entry.builds.values().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn new_run(user: &str, chat: &str) -> NewRun {
        NewRun {
            id: RunId::new(),
            user_id: user.into(),
            chat_id: chat.into(),
            request: json!({}),
            first_event: NewEvent::new("run_queued", json!({})),
        }
    }

    fn finished() -> NewEvent {
        NewEvent::new(RUN_FINISHED, json!({}))
    }

    #[tokio::test]
    async fn terminal_event_only_through_finish_and_only_last() {
        let store = MemoryRunStore::new();
        let run = store
            .admit(new_run("u", "c"), AdmissionLimits::default())
            .await
            .unwrap();
        let refused = store
            .append_events(run.id, Fence(0), vec![finished()])
            .await;
        assert!(matches!(
            refused,
            Err(StoreError::Backend {
                retryable: false,
                ..
            })
        ));
        for events in [
            vec![],
            vec![NewEvent::new("x", json!({}))],
            vec![finished(), NewEvent::new("x", json!({}))],
            vec![finished(), finished()],
        ] {
            let refused = store
                .finish_run(run.id, None, RunStatus::Failed, "r", events)
                .await;
            assert!(matches!(
                refused,
                Err(StoreError::Backend {
                    retryable: false,
                    ..
                })
            ));
        }
        let run_after = store.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run_after.status, RunStatus::Queued);
        assert_eq!(run_after.last_seq, 1, "refused calls write nothing");
    }

    #[tokio::test]
    async fn counters_and_status_index_follow_the_lifecycle() {
        let store = MemoryRunStore::new();
        let a = store
            .admit(new_run("u", "c1"), AdmissionLimits::default())
            .await
            .unwrap();
        let b = store
            .admit(new_run("u", "c2"), AdmissionLimits::default())
            .await
            .unwrap();
        store.start_run(a.id, Fence(1)).await.unwrap();
        {
            let state = lock_state(&store.state);
            assert_eq!(state.active_global, 2);
            assert_eq!(state.active_per_user["u"], 2);
            assert_eq!(state.by_status[&RunStatus::Queued].len(), 1);
            assert_eq!(state.by_status[&RunStatus::Running].len(), 1);
        }
        for id in [a.id, b.id] {
            store
                .finish_run(id, None, RunStatus::Cancelled, "r", vec![finished()])
                .await
                .unwrap();
        }
        let state = lock_state(&store.state);
        assert_eq!(state.active_global, 0);
        assert!(state.active_per_user.is_empty(), "no empty counters linger");
        assert!(state.active_per_chat.is_empty());
        assert!(state.by_status[&RunStatus::Queued].is_empty());
        assert!(state.by_status[&RunStatus::Running].is_empty());
        assert_eq!(state.by_status[&RunStatus::Cancelled].len(), 2);
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;

    fn new_run_for(user: &str) -> NewRun {
        NewRun {
            id: RunId::new(),
            user_id: user.to_string(),
            chat_id: user.to_string(),
            request: serde_json::json!({}),
            first_event: NewEvent::new("run_queued", serde_json::json!({})),
        }
    }

    async fn finish_one(store: &MemoryRunStore, run_id: RunId) {
        store
            .finish_run(
                run_id,
                None,
                RunStatus::Cancelled,
                "test",
                vec![NewEvent::new(RUN_FINISHED, serde_json::json!({}))],
            )
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn keeps_only_the_newest_finished_runs() {
        let store = MemoryRunStore::with_retention(MemoryRetention::keep(2));
        let mut ids = Vec::new();
        for i in 0..5 {
            let run = store
                .admit(new_run_for(&format!("u{i}")), AdmissionLimits::default())
                .await
                .unwrap();
            finish_one(&store, run.id).await;
            ids.push(run.id);
        }
        let active = store
            .admit(new_run_for("active"), AdmissionLimits::default())
            .await
            .unwrap();
        assert_eq!(store.len(), 3, "two finished runs and the active one");
        for old in &ids[..3] {
            assert!(store.get_run(*old).await.unwrap().is_none());
            assert!(matches!(
                store.events_after(*old, 0, 10).await,
                Err(StoreError::NotFound { .. })
            ));
        }
        for kept in &ids[3..] {
            assert_eq!(
                store.events_after(*kept, 0, 10).await.unwrap().len(),
                2,
                "a kept run replays whole"
            );
        }
        assert!(store.get_run(active.id).await.unwrap().is_some());
        assert_eq!(
            store
                .list_runs(RunStatus::Cancelled, 100)
                .await
                .unwrap()
                .len(),
            2
        );
    }

    #[tokio::test]
    async fn forgets_finished_runs_past_their_age() {
        let store = MemoryRunStore::with_retention(
            MemoryRetention::keep(100).with_max_age(std::time::Duration::ZERO),
        );
        let first = store
            .admit(new_run_for("a"), AdmissionLimits::default())
            .await
            .unwrap();
        finish_one(&store, first.id).await;
        assert!(store.get_run(first.id).await.unwrap().is_none());
    }
}

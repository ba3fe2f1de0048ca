//! The engine's store, counting the events appended through it
//! ([`Engine::events_appended`](super::Engine::events_appended)).
//!
//! Every event the engine writes (admission, batched appends, attempt
//! records, cancel requests, the terminal event) goes through the store it
//! was built with, so wrapping that store once counts them all without a
//! hook at each call site.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use crate::{
    AdmissionLimits, AdmitError, Checkpoint, Durability, EffectRecord, Fence, NewEvent, NewRun,
    Run, RunEvent, RunFilter, RunId, RunStatus, RunStore, StoreError,
};

pub(crate) struct CountingStore {
    inner: Arc<dyn RunStore>,
    appended: Arc<AtomicU64>,
}

impl CountingStore {
    pub(crate) fn new(inner: Arc<dyn RunStore>, appended: Arc<AtomicU64>) -> Self {
        CountingStore { inner, appended }
    }

    fn count(&self, n: usize) {
        self.appended.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[async_trait]
impl RunStore for CountingStore {
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        let run = self.inner.admit(run, limits).await?;
        self.count(1);
        Ok(run)
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.inner.get_run(run_id).await
    }

    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        self.inner.start_run(run_id, fence).await
    }

    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let written = self.inner.append_events(run_id, fence, events).await?;
        self.count(written.len());
        Ok(written)
    }

    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let written = self
            .inner
            .finish_run(run_id, fence, status, reason, events)
            .await?;
        self.count(written.len());
        Ok(written)
    }

    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.inner.events_after(run_id, after_seq, limit).await
    }

    async fn save_checkpoint(
        &self,
        run_id: RunId,
        fence: Fence,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        self.inner.save_checkpoint(run_id, fence, checkpoint).await
    }

    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load_checkpoint(run_id).await
    }

    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError> {
        self.inner.begin_effect(run_id, fence, key, request).await
    }

    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        self.inner.complete_effect(run_id, fence, key, result).await
    }

    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError> {
        // Only the first request appends (it sets `cancel_requested_at`).
        // Two concurrent first requests may both count it: cancels are rare
        // and the counter is a metric, not a ledger.
        let before = self.inner.get_run(run_id).await?;
        let run = self.inner.request_cancel(run_id, event).await?;
        if before.is_some_and(|b| b.cancel_requested_at.is_none())
            && run.cancel_requested_at.is_some()
        {
            self.count(1);
        }
        Ok(run)
    }

    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.list_runs(status, limit).await
    }

    fn durability(&self) -> Durability {
        self.inner.durability()
    }

    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        self.inner
            .list_user_runs(user_id, filter, before, limit)
            .await
    }

    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<crate::NewMessage>,
    ) -> Result<(), StoreError> {
        self.inner.put_messages(run_id, fence, turn, messages).await
    }

    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<crate::ChatMessage>, StoreError> {
        self.inner
            .chat_messages(user_id, chat_id, before_run, limit)
            .await
    }

    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<crate::BuildJob, StoreError> {
        self.inner
            .create_build(run_id, fence, number, command)
            .await
    }

    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<crate::BuildJob>, StoreError> {
        self.inner.claim_build(run_id, number, fence, worker).await
    }

    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: crate::BuildResult,
    ) -> Result<crate::BuildJob, StoreError> {
        self.inner.finish_build(run_id, number, fence, result).await
    }

    async fn builds(&self, run_id: RunId) -> Result<Vec<crate::BuildJob>, StoreError> {
        self.inner.builds(run_id).await
    }
}

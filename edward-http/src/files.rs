//! A run's files, read through its existing sandbox.
//!
//! **Isolated on purpose:** the engine will grow `Engine::files(run_id)` /
//! `Engine::read_file(run_id, path)` (issue 8); this module is the one place
//! to switch over. Until then it keeps its own [`SandboxProvider`] and only
//! reattaches a sandbox the run's event log says exists (`sandbox_ready`),
//! so a request never creates a sandbox. Callers check that the run exists
//! and belongs to the caller first.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use edward_core::engine::Engine;
use edward_core::{FileEntry, Run, RunId, RunStore, Sandbox, SandboxPath, SandboxProvider};

use crate::error::ApiError;

const SANDBOX_READY: &str = "sandbox_ready";
const PAGE: usize = 512;
const REMEMBERED: usize = 10_000;

pub(crate) struct RunFiles {
    sandboxes: Arc<dyn SandboxProvider>,
    /// Runs known to have a sandbox (so the event log is scanned once).
    ready: Mutex<HashSet<RunId>>,
}

impl RunFiles {
    pub(crate) fn new(sandboxes: Arc<dyn SandboxProvider>) -> Self {
        RunFiles {
            sandboxes,
            ready: Mutex::new(HashSet::new()),
        }
    }

    /// The run's files (empty until its sandbox exists).
    pub(crate) async fn list(
        &self,
        store: &dyn RunStore,
        run: &Run,
    ) -> Result<Vec<FileEntry>, ApiError> {
        match self.sandbox(store, run).await? {
            Some(sandbox) => Ok(sandbox.list_files().await?),
            None => Ok(Vec::new()),
        }
    }

    /// One file's bytes; `None` when the run has no sandbox yet.
    pub(crate) async fn read(
        &self,
        store: &dyn RunStore,
        run: &Run,
        path: &SandboxPath,
    ) -> Result<Option<Bytes>, ApiError> {
        match self.sandbox(store, run).await? {
            Some(sandbox) => Ok(Some(sandbox.read_file(path).await?)),
            None => Ok(None),
        }
    }

    async fn sandbox(
        &self,
        store: &dyn RunStore,
        run: &Run,
    ) -> Result<Option<Arc<dyn Sandbox>>, ApiError> {
        if !self.has_sandbox(store, run).await? {
            return Ok(None);
        }
        let key = Engine::sandbox_key(run);
        // Reattach only: reading files never creates a sandbox.
        Ok(self.sandboxes.attach(&key).await?)
    }

    async fn has_sandbox(&self, store: &dyn RunStore, run: &Run) -> Result<bool, ApiError> {
        if self.lock().contains(&run.id) {
            return Ok(true);
        }
        let mut after = 0;
        loop {
            let page = store.events_after(run.id, after, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(false);
            };
            after = last.seq;
            if page.iter().any(|e| e.kind == SANDBOX_READY) {
                let mut ready = self.lock();
                if ready.len() >= REMEMBERED {
                    ready.clear();
                }
                ready.insert(run.id);
                return Ok(true);
            }
            if page.len() < PAGE {
                return Ok(false);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<RunId>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }
}

//! [`MemoryWriteBuffer`]: pending whole files per sandbox with a due-time index.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::{add_duration, lock_state};
use crate::error::InfraError;
use crate::traits::{FlushPolicy, PendingFile, WriteBuffer};
use crate::types::{SandboxKey, SandboxPath};

/// An in-memory [`WriteBuffer`].
///
/// Pending files live per sandbox (a later put of a path replaces the
/// earlier content); an ordered `(due, key)` index answers
/// [`WriteBuffer::due`] in O(log n + k) without visiting idle sandboxes.
#[derive(Debug, Default)]
pub struct MemoryWriteBuffer {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<SandboxKey, Pending>,
    index: BTreeSet<(DateTime<Utc>, SandboxKey)>,
}

#[derive(Debug)]
struct Pending {
    files: BTreeMap<SandboxPath, Bytes>,
    /// When the oldest pending write arrived (bounds the wait by `max_wait`).
    first_at: DateTime<Utc>,
    due: DateTime<Utc>,
}

impl MemoryWriteBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `files`; `replace` = false keeps a path already pending (put back).
    fn insert(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
        replace: bool,
    ) {
        if files.is_empty() {
            return;
        }
        let mut state = lock_state(&self.state);
        let state = &mut *state;
        let pending = state.pending.entry(key.clone()).or_insert_with(|| Pending {
            files: BTreeMap::new(),
            first_at: now,
            due: now,
        });
        state.index.remove(&(pending.due, key.clone()));
        for file in files {
            if replace {
                pending.files.insert(file.path, file.content);
            } else {
                pending.files.entry(file.path).or_insert(file.content);
            }
        }
        pending.due =
            add_duration(pending.first_at, policy.max_wait).min(add_duration(now, policy.debounce));
        state.index.insert((pending.due, key.clone()));
    }
}

#[async_trait]
impl WriteBuffer for MemoryWriteBuffer {
    async fn put(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError> {
        self.insert(key, files, now, policy, true);
        Ok(())
    }

    async fn put_back(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError> {
        self.insert(key, files, now, policy, false);
        Ok(())
    }

    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<SandboxKey>, InfraError> {
        let state = lock_state(&self.state);
        Ok(state
            .index
            .iter()
            .take_while(|(due, _)| *due <= now)
            .take(limit)
            .map(|(_, key)| key.clone())
            .collect())
    }

    async fn take(&self, key: &SandboxKey) -> Result<Vec<PendingFile>, InfraError> {
        let mut state = lock_state(&self.state);
        let Some(pending) = state.pending.remove(key) else {
            return Ok(Vec::new());
        };
        state.index.remove(&(pending.due, key.clone()));
        Ok(pending
            .files
            .into_iter()
            .map(|(path, content)| PendingFile { path, content })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::TimeDelta;

    use super::*;

    #[tokio::test]
    async fn due_time_is_min_of_debounce_and_max_wait_and_index_tracks_it() {
        let buffer = MemoryWriteBuffer::new();
        let key = SandboxKey("k".into());
        let policy = FlushPolicy {
            debounce: Duration::from_millis(100),
            max_wait: Duration::from_millis(250),
        };
        let t0 = Utc::now();
        let ms = |n: i64| t0 + TimeDelta::milliseconds(n);
        let file = |c: &'static str| PendingFile {
            path: SandboxPath::new("a.txt").unwrap(),
            content: Bytes::from_static(c.as_bytes()),
        };
        buffer.put(&key, vec![file("1")], t0, policy).await.unwrap();
        buffer
            .put(&key, vec![file("2")], ms(90), policy)
            .await
            .unwrap();
        buffer
            .put(&key, vec![file("3")], ms(180), policy)
            .await
            .unwrap();
        let state = lock_state(&buffer.state);
        assert_eq!(state.index.len(), 1, "one index entry per sandbox");
        assert_eq!(state.pending[&key].due, ms(250), "capped by max_wait");
    }
}

//! [`Backend`]: the store, queue and notifier an engine runs on, as one value.

use std::sync::Arc;

use crate::memory::MemoryBackends;
use crate::{Durability, Notifier, RunQueue, RunStore};

/// Where runs live: the run store, the work queue and the notifier, handed
/// to [`EngineBuilder::backend`](super::EngineBuilder::backend) as one value so
/// a durable store cannot be paired with an in-memory queue by accident.
///
/// Adapter crates give ready-made ones (`SqliteStore::backend()`,
/// `PgStore::backend()`); [`Backend::memory`] is the default.
/// [`Backend::with_queue`] and [`Backend::with_notifier`] swap one part
/// (a Redis queue over a Postgres store, say); the engine builder refuses a
/// store and a queue of different [`Durability`].
///
/// ```
/// use edward_core::engine::Backend;
/// use edward_core::Durability;
///
/// let backend = Backend::memory();
/// assert_eq!(backend.durability(), Ok(Durability::InProcess));
/// ```
#[derive(Clone)]
pub struct Backend {
    store: Arc<dyn RunStore>,
    queue: Arc<dyn RunQueue>,
    notifier: Arc<dyn Notifier>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("store", &self.store.durability())
            .field("queue", &self.queue.durability())
            .finish_non_exhaustive()
    }
}

/// A store and a queue of different durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the run store is {store:?} but the queue is {queue:?}: queued runs would be lost or \
     never claimed; use one backend (e.g. `SqliteStore::backend()`)"
)]
pub struct MixedDurability {
    /// The store's durability.
    pub store: Durability,
    /// The queue's durability.
    pub queue: Durability,
}

impl Backend {
    /// In-memory store, queue and notifier (lost when the process exits).
    pub fn memory() -> Self {
        let mem = MemoryBackends::new();
        Backend {
            store: mem.store,
            queue: mem.queue,
            notifier: mem.notifier,
        }
    }

    /// A backend from its three parts (for adapter crates).
    pub fn new(
        store: Arc<dyn RunStore>,
        queue: Arc<dyn RunQueue>,
        notifier: Arc<dyn Notifier>,
    ) -> Self {
        Backend {
            store,
            queue,
            notifier,
        }
    }

    /// The same backend with another queue.
    pub fn with_queue(mut self, queue: Arc<dyn RunQueue>) -> Self {
        self.queue = queue;
        self
    }

    /// The same backend with another notifier (e.g. one that reaches other
    /// processes, so their tailers wake at once rather than on the backstop).
    pub fn with_notifier(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.notifier = notifier;
        self
    }

    /// The run store.
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.store
    }

    /// The work queue.
    pub fn queue(&self) -> &Arc<dyn RunQueue> {
        &self.queue
    }

    /// The notifier.
    pub fn notifier(&self) -> &Arc<dyn Notifier> {
        &self.notifier
    }

    /// The durability of store and queue, or why they do not match.
    pub fn durability(&self) -> Result<Durability, MixedDurability> {
        let (store, queue) = (self.store.durability(), self.queue.durability());
        if store == queue {
            Ok(store)
        } else {
            Err(MixedDurability { store, queue })
        }
    }
}

impl Default for Backend {
    fn default() -> Self {
        Backend::memory()
    }
}

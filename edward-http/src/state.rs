//! Shared state of the router.

use std::ops::Deref;
use std::sync::Arc;

use edward_core::engine::Engine;
use tokio_util::sync::CancellationToken;

use crate::auth::ApiKeys;
use crate::config::HttpConfig;
use crate::hub::Hubs;
use crate::idempotency::Idempotency;
use crate::limit::Limiter;
use crate::metrics::Metrics;

pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) keys: ApiKeys,
    pub(crate) config: HttpConfig,
    pub(crate) idempotency: Idempotency,
    pub(crate) metrics: Metrics,
    /// Shared per-run tails of SSE streams.
    pub(crate) hubs: Arc<Hubs>,
    pub(crate) limiter: Limiter,
    /// Fired on shutdown: open streams end with a `reconnect` event.
    pub(crate) shutdown: CancellationToken,
    pub(crate) webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// The provider registry whose vault the credential routes use.
    #[cfg(feature = "registry")]
    pub(crate) registry: std::sync::OnceLock<Arc<edward_core::registry::ProviderRegistry>>,
}

#[derive(Clone)]
pub(crate) struct AppState(pub(crate) Arc<Inner>);

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

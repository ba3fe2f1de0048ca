//! `GET /metrics`: Prometheus text (runs by status, active runs, events
//! appended, SSE subscribers and hubs, events streamed, submits, request
//! latency histogram).

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use edward_core::RunStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::state::AppState;

/// Active runs are counted up to this many per status at each scrape.
pub(crate) const RUN_COUNT_CAP: usize = 10_000;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StatusLabels {
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) limit: String,
}

type LatencyFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

pub(crate) struct Metrics {
    registry: Registry,
    requests: LatencyFamily,
    runs: Family<StatusLabels, Gauge>,
    active_runs: Gauge,
    pub(crate) sse_subscribers: Gauge,
    pub(crate) events_streamed: Counter<u64, AtomicU64>,
    events_appended: Counter<u64, AtomicU64>,
    pub(crate) runs_submitted: Counter<u64, AtomicU64>,
    pub(crate) admissions_rejected: Family<LimitLabels, Counter>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    pub(crate) fn new(hubs: &crate::hub::HubMetrics) -> Self {
        let mut registry = Registry::with_prefix("edward");
        let requests: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency (to response headers for streams)",
            requests.clone(),
        );
        let runs = Family::<StatusLabels, Gauge>::default();
        registry.register(
            "runs",
            "Runs by status (queued and running; counted at scrape, capped at 10000)",
            runs.clone(),
        );
        let active_runs = Gauge::default();
        registry.register(
            "active_runs",
            "Queued plus running runs",
            active_runs.clone(),
        );
        let sse_subscribers = Gauge::default();
        registry.register(
            "sse_subscribers",
            "Open SSE event streams in this process",
            sse_subscribers.clone(),
        );
        let events_streamed = Counter::default();
        registry.register(
            "events_streamed",
            "Run events sent to clients (SSE and long-poll)",
            events_streamed.clone(),
        );
        registry.register(
            "sse_hubs",
            "Runs with a shared SSE tail in this process (one store reader each)",
            hubs.hubs.clone(),
        );
        registry.register(
            "sse_lag_recoveries",
            "Times an SSE subscriber fell behind its run's shared tail and replayed the gap from the store",
            hubs.lag_recoveries.clone(),
        );
        let events_appended = Counter::default();
        registry.register(
            "events_appended",
            "Run events this process's engine appended to the store (all runs, watched or not)",
            events_appended.clone(),
        );
        let runs_submitted = Counter::default();
        registry.register(
            "runs_submitted",
            "Runs admitted through POST /v1/runs",
            runs_submitted.clone(),
        );
        let admissions_rejected = Family::<LimitLabels, Counter>::default();
        registry.register(
            "admissions_rejected",
            "Submits refused by an admission limit",
            admissions_rejected.clone(),
        );
        Metrics {
            registry,
            requests,
            runs,
            active_runs,
            sse_subscribers,
            events_streamed,
            events_appended,
            runs_submitted,
            admissions_rejected,
        }
    }

    fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.to_string(),
                status,
            })
            .observe(seconds);
    }

    pub(crate) fn set_runs(&self, status: RunStatus, count: usize) {
        self.runs
            .get_or_create(&StatusLabels {
                status: status.as_str().to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Bring the counter up to the engine's total (read at scrape).
    pub(crate) fn set_events_appended(&self, total: u64) {
        let seen = self.events_appended.get();
        if total > seen {
            self.events_appended.inc_by(total - seen);
        }
    }

    pub(crate) fn set_active(&self, count: usize) {
        self.active_runs
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// Observe every request's latency by route template.
pub(crate) async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let res = next.run(req).await;
    state.metrics.observe(
        &method,
        &route,
        res.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    res
}

/// Decrements the subscriber gauge when a stream is dropped (client gone).
pub(crate) struct SubscriberGuard(Gauge);

impl SubscriberGuard {
    pub(crate) fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        SubscriberGuard(gauge.clone())
    }
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

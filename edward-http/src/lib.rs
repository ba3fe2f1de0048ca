//! The HTTP API of Edward: an axum router with REST + SSE.
//!
//! [`Api`] wraps an [`Engine`]: `POST /v1/runs` submits, `GET
//! /v1/runs/{id}/events` streams a run's events (SSE, resumable by `seq`
//! with `Last-Event-ID` or `?after=N`; a long-poll with `Accept:
//! application/json`), `POST /v1/runs/{id}/cancel` cancels, `GET
//! /v1/runs/{id}/files[/{path}]` reads the files, `GET /v1/runs/{id}/builds`
//! its build jobs; `GET /v1/chats/{chat_id}/messages|runs|files[/{path}]`
//! read a chat (its messages, runs and shared workspace); `GET /healthz`, `GET
//! /metrics`, `GET /openapi.json` and a small web page at `GET /`.
//! Bearer API keys ([`ApiKeys`], kept hashed) map to users; another
//! user's run is a `404`. Errors are `{"error": {"code", "message"}}` with
//! the stable codes of [`ErrorCode`]. See `docs/HTTP.md`.
//!
//! ```no_run
//! # async fn demo(engine: edward_core::engine::Engine) -> std::io::Result<()> {
//! use edward_http::{Api, ApiKeys, HttpConfig};
//!
//! let mut keys = ApiKeys::new();
//! keys.insert("alice", "sk-alice");
//! let api = Api::new(engine, keys, HttpConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! api.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! **Architecture invariant:** this is the only crate that knows HTTP; it
//! uses the engine's public API (plus [`RunStore::list_user_runs`]) and
//! nothing else.
//!
//! [`RunStore::list_user_runs`]: edward_core::RunStore::list_user_runs

#![deny(missing_docs)]

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use edward_core::engine::Engine;
use edward_core::{RunId, RunStatus};
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

mod auth;
mod chats;
mod config;
#[cfg(feature = "registry")]
mod credentials;
mod error;
mod events;
mod extract;
mod files;
mod hub;
mod idempotency;
mod limit;
mod metrics;
mod model;
mod openapi;
mod page;
mod runs;
mod state;
mod webhooks;

pub use auth::{ApiKeys, Caller, KeyHash, hash_key};
pub use config::{HttpConfig, RateLimit};
#[cfg(feature = "registry")]
pub use credentials::{CredentialList, CredentialView, PutCredential};
pub use error::{ApiError, ErrorBody, ErrorCode, ErrorDetail};
pub use idempotency::MAX_IDEMPOTENCY_KEY_BYTES;
pub use model::{
    BuildList, BuildView, ChatFileList, ChatMessageView, DoubleTextingPolicy, EventView, FileList,
    FileView, Health, MessageList, RunPage, RunView, SubmitRun, SubmittedRun, UsageView,
};
pub use openapi::openapi;
pub use webhooks::{DeliveryRecord, WebhookConfig, WebhookError, sign as sign_webhook};

use crate::state::{AppState, Inner};

/// The HTTP API over one [`Engine`]. Cheap to clone.
#[derive(Clone)]
pub struct Api {
    state: AppState,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("engine", &self.state.engine)
            .field("keys", &self.state.keys)
            .field("config", &self.state.config)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// The API over `engine` (files are read through [`Engine::files`] and
    /// [`Engine::read_file`]; a request never creates a sandbox). Requests
    /// need a bearer key from `keys`.
    pub fn new(engine: Engine, keys: ApiKeys, config: HttpConfig) -> Self {
        let shutdown = CancellationToken::new();
        let webhooks = config
            .webhook
            .clone()
            .map(|w| Arc::new(webhooks::Webhooks::new(w, engine.clone(), shutdown.clone())));
        let hubs = Arc::new(hub::Hubs::new(hub::HubConfig {
            ring: config.sse_hub_ring,
        }));
        Api {
            state: AppState(Arc::new(Inner {
                webhooks,
                engine,
                keys,
                idempotency: idempotency::Idempotency::new(config.idempotency_ttl),
                metrics: metrics::Metrics::new(&hubs.metrics),
                hubs,
                limiter: limit::Limiter::new(config.rate_limit),
                shutdown,
                config,
                #[cfg(feature = "registry")]
                registry: std::sync::OnceLock::new(),
            })),
        }
    }

    /// Serve `/v1/credentials` over `registry`'s credential vault (feature
    /// `registry`): users set, list (masked) and delete their own provider
    /// keys. Give the engine the same registry
    /// (`EngineBuilder::registry(registry.clone())`) so runs use them.
    /// Without a registry (or one without credentials) those routes answer
    /// `404`. The first registry given is kept.
    #[cfg(feature = "registry")]
    pub fn with_registry(self, registry: Arc<edward_core::registry::ProviderRegistry>) -> Self {
        if self.state.registry.set(registry).is_err() {
            tracing::warn!("Api::with_registry called twice; keeping the first registry");
        }
        self
    }

    /// The axum router (state included).
    pub fn router(&self) -> Router {
        let state = self.state.clone();
        let timeout = state.config.request_timeout;
        // Bounded by the request timeout: everything but streams and waits.
        let timed = Router::new()
            .route("/v1/runs", post(runs::submit).get(runs::list_runs))
            .route("/v1/runs/{id}", get(runs::get_run))
            .route("/v1/runs/{id}/files", get(runs::list_files))
            .route("/v1/runs/{id}/files/{*path}", get(runs::read_file))
            .route("/v1/runs/{id}/builds", get(runs::list_builds))
            .route("/v1/chats/{chat_id}/messages", get(chats::messages))
            .route("/v1/chats/{chat_id}/runs", get(chats::runs))
            .route("/v1/chats/{chat_id}/files", get(chats::list_files))
            .route("/v1/chats/{chat_id}/files/{*path}", get(chats::read_file));
        #[cfg(feature = "registry")]
        let timed = timed
            .route("/v1/credentials", get(credentials::list))
            .route(
                "/v1/credentials/{provider}/{name}",
                axum::routing::put(credentials::put).delete(credentials::delete),
            );
        let timed = timed.layer(middleware::from_fn(
            move |req: Request, next: Next| async move {
                match tokio::time::timeout(timeout, next.run(req)).await {
                    Ok(res) => res,
                    Err(_) => ApiError::new(
                        ErrorCode::RequestTimeout,
                        format!("the request took longer than {timeout:?}"),
                    )
                    .into_response(),
                }
            },
        ));
        // Bounded by their own `wait` (capped by `max_wait`) or streaming.
        let open = Router::new()
            .route("/v1/runs/{id}/events", get(events::events))
            .route("/v1/runs/{id}/cancel", post(runs::cancel));
        let api = timed
            .merge(open)
            .route_layer(middleware::from_fn_with_state(
                state.clone(),
                auth::require_key,
            ));
        let mut public = Router::new()
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics_text))
            .route("/openapi.json", get(openapi_json));
        if state.config.serve_page {
            public = public.merge(page::routes());
        }
        let mut router = public
            .merge(api)
            .fallback(not_found)
            .layer(middleware::from_fn(json_method_not_allowed))
            .layer(middleware::from_fn_with_state(
                state.clone(),
                metrics::track,
            ))
            .layer(DefaultBodyLimit::max(state.config.body_limit));
        if let Some(cors) = cors_layer(&state.config.cors_origins) {
            router = router.layer(cors);
        }
        router.with_state(state)
    }

    /// Webhook delivery attempts (of one run, or all), oldest first.
    pub fn webhook_deliveries(&self, run_id: Option<RunId>) -> Vec<DeliveryRecord> {
        self.state
            .webhooks
            .as_ref()
            .map(|w| w.records(run_id))
            .unwrap_or_default()
    }

    /// Tell open event streams to end with a `reconnect` event (and
    /// long-polls to answer now). [`Api::serve`] calls it on shutdown.
    pub fn begin_shutdown(&self) {
        self.state.shutdown.cancel();
    }

    /// Serve on `listener` until `signal` completes, then shut down
    /// gracefully: streams are told to reconnect, in-flight requests finish.
    /// Runs are not touched: they continue on other workers or resume after
    /// a restart.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let token = self.state.shutdown.clone();
        // `into_make_service`: one cheap clone per connection. Serving the
        // `Router` itself re-runs `with_state` per connection, rebuilding
        // the route table (~8 KiB per connection, measured with heaptrack:
        // a third of an idle SSE subscriber's memory).
        axum::serve(listener, self.router().into_make_service())
            .with_graceful_shutdown(async move {
                signal.await;
                tracing::info!("shutting down: telling streams to reconnect");
                token.cancel();
            })
            .await
    }
}

fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect::<Vec<_>>(),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::ACCEPT,
                header::HeaderName::from_static("last-event-id"),
                header::HeaderName::from_static(runs::IDEMPOTENCY_KEY),
            ])
            .expose_headers([
                header::RETRY_AFTER,
                header::LOCATION,
                header::HeaderName::from_static("idempotent-replayed"),
                header::HeaderName::from_static("x-next-after"),
            ]),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route")
}

/// axum answers a wrong method with an empty `405`; give it the JSON body.
async fn json_method_not_allowed(req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    if res.status() == StatusCode::METHOD_NOT_ALLOWED
        && !res.headers().contains_key(header::CONTENT_TYPE)
    {
        let allow = res.headers().get(header::ALLOW).cloned();
        let mut json = ApiError::new(
            ErrorCode::MethodNotAllowed,
            "this route does not accept that method",
        )
        .into_response();
        if let Some(allow) = allow {
            json.headers_mut().insert(header::ALLOW, allow);
        }
        return json;
    }
    res
}

/// The store is reachable.
#[utoipa::path(get, path = "/healthz", tag = "ops",
    responses((status = 200, body = Health), (status = 503, body = ErrorBody)))]
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.engine.get(RunId(uuid::Uuid::nil())).await?;
    Ok(Json(Health {
        status: "ok".to_string(),
    }))
}

/// Prometheus (OpenMetrics) text.
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text")))]
async fn metrics_text(State(state): State<AppState>) -> Response {
    let mut active = 0;
    for status in [RunStatus::Queued, RunStatus::Running] {
        match state
            .engine
            .store()
            .list_runs(status, metrics::RUN_COUNT_CAP)
            .await
        {
            Ok(runs) => {
                active += runs.len();
                state.metrics.set_runs(status, runs.len());
            }
            Err(e) => tracing::warn!(error = %e, "metrics: counting runs failed"),
        }
    }
    state.metrics.set_active(active);
    state
        .metrics
        .set_events_appended(state.engine.events_appended());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// This API's OpenAPI document (generated from the handlers' types).
#[utoipa::path(get, path = "/openapi.json", tag = "ops",
    responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_json() -> Response {
    Json(openapi::openapi()).into_response()
}

//! Per-run model routing: the engine asks a [`ModelResolver`] (the provider
//! registry, `edward_core::registry::ProviderRegistry`) which provider, model
//! and credential a request gets **at submit**, records that choice in the
//! stored request, and builds the run's client from the record **at run
//! start and on every resume**, so a resumed run never re-chooses.
//!
//! Without a resolver the engine uses its one fixed
//! [`EngineBuilder::model_client`](super::EngineBuilder::model_client).

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::config::RunRequest;
use super::{Engine, Inner, SubmitError};
use crate::pricing::ModelPrice;
use crate::{ModelClient, Run, StoreError};

/// The key of the recorded route in the stored request JSON.
pub(crate) const ROUTE_KEY: &str = "route";

/// Which key a run uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum CredentialChoice {
    /// The operator's configured key (or none, for keyless local endpoints).
    Operator,
    /// The user's stored credential with this id.
    User {
        /// The credential's id.
        id: uuid::Uuid,
    },
}

/// What a run was routed to at submit: recorded with the run, reused on resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRoute {
    /// The registry provider name (`openai`, `local`, …).
    pub provider: String,
    /// The model name as the provider knows it.
    pub model: String,
    /// Which key.
    pub credential: CredentialChoice,
}

impl ModelRoute {
    /// `provider:model`, the name used in events and for prices.
    pub fn spec(&self) -> String {
        format!("{}:{}", self.provider, self.model)
    }
}

/// Why a run could not be routed to a model, or its client not built.
/// Never contains a key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// Not `provider:model`.
    #[error("`{spec}` is not `provider:model`")]
    InvalidSpec {
        /// The value (truncated).
        spec: String,
    },
    /// No model named and no default configured.
    #[error("no model given and the registry has no default model")]
    NoDefaultModel,
    /// The provider is not configured (or not allowed).
    #[error("unknown provider `{provider}` (configured: {known})")]
    UnknownProvider {
        /// The name.
        provider: String,
        /// The configured providers, comma-separated.
        known: String,
    },
    /// The model is on no provider's allow-list.
    #[error("unknown model `{model}` for provider `{provider}`")]
    UnknownModel {
        /// The provider.
        provider: String,
        /// The model.
        model: String,
    },
    /// The model is allowed, but under another provider.
    #[error(
        "model `{model}` does not belong to provider `{provider}` (it is offered by: {belongs_to})"
    )]
    ModelProviderMismatch {
        /// The model.
        model: String,
        /// The provider asked for.
        provider: String,
        /// The providers offering it, comma-separated.
        belongs_to: String,
    },
    /// A bare model name offered by several providers.
    #[error(
        "model `{model}` is offered by several providers ({providers}); name one as `provider:model`"
    )]
    AmbiguousModel {
        /// The model.
        model: String,
        /// The providers, comma-separated.
        providers: String,
    },
    /// The request names a credential but the provider uses only the operator's key.
    #[error("provider `{provider}` uses the operator's key; user credentials are not accepted")]
    CredentialNotAccepted {
        /// The provider.
        provider: String,
    },
    /// The user has no usable credential for the provider and the operator's
    /// key may not be used for it.
    #[error(
        "no credential for provider `{provider}`: add one, or ask the operator to allow theirs"
    )]
    NoCredential {
        /// The provider.
        provider: String,
    },
    /// The named (or recorded) credential does not exist.
    #[error("credential `{name}` for provider `{provider}` not found")]
    CredentialNotFound {
        /// The provider.
        provider: String,
        /// Its name (or id, for a recorded one).
        name: String,
    },
    /// The credential was revoked.
    #[error("credential `{name}` for provider `{provider}` was revoked")]
    CredentialRevoked {
        /// The provider.
        provider: String,
        /// Its name.
        name: String,
    },
    /// The credential's master key is not configured.
    #[error("credential is encrypted under master key `{key_id}`, which is not configured")]
    UnknownMasterKey {
        /// The key id stored with the secret.
        key_id: String,
    },
    /// Authenticated decryption failed: a wrong master key under that id, or
    /// tampered data.
    #[error(
        "could not decrypt the credential with master key `{key_id}` (wrong key or tampered data)"
    )]
    Decryption {
        /// The key id stored with the secret.
        key_id: String,
    },
    /// The credential store failed.
    #[error("credential store: {0}")]
    Store(#[source] StoreError),
    /// The client could not be built (e.g. an invalid base URL).
    #[error("could not build the model client: {message}")]
    Client {
        /// Why (never the key).
        message: String,
    },
}

impl RouteError {
    /// Whether retrying can help: only a store outage passes.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RouteError::Store(e) if e.is_retryable())
    }

    /// The request field at fault: `model` or `credential`.
    pub fn field(&self) -> &'static str {
        match self {
            RouteError::InvalidSpec { .. }
            | RouteError::NoDefaultModel
            | RouteError::UnknownProvider { .. }
            | RouteError::UnknownModel { .. }
            | RouteError::ModelProviderMismatch { .. }
            | RouteError::AmbiguousModel { .. } => "model",
            _ => "credential",
        }
    }
}

/// Chooses and builds model clients per run (implemented by
/// `edward_core::registry::ProviderRegistry`).
#[async_trait]
pub trait ModelResolver: Send + Sync + 'static {
    /// Check a requested model name without I/O (`None` = the default).
    /// Returns `(provider, model)`.
    fn check_model(&self, model: Option<&str>) -> Result<(String, String), RouteError>;

    /// At submit: the provider, model and credential for `user_id`'s request
    /// (`credential` names one of the user's credentials; `None` = the
    /// user's default for the provider, or the operator's key where allowed).
    async fn route(
        &self,
        user_id: &str,
        model: Option<&str>,
        credential: Option<&str>,
    ) -> Result<ModelRoute, RouteError>;

    /// At run start and on resume: the client for a recorded route. The
    /// client expects the model name `route.spec()` in its requests.
    async fn client(
        &self,
        user_id: &str,
        route: &ModelRoute,
    ) -> Result<Arc<dyn ModelClient>, RouteError>;

    /// Prices of the allowed models, keyed `provider:model`.
    fn prices(&self) -> Vec<(String, ModelPrice)>;
}

/// A shared resolver (the same registry handed to the engine and to, say,
/// the HTTP API's credential routes).
#[async_trait]
impl<R: ModelResolver + ?Sized> ModelResolver for Arc<R> {
    fn check_model(&self, model: Option<&str>) -> Result<(String, String), RouteError> {
        (**self).check_model(model)
    }

    async fn route(
        &self,
        user_id: &str,
        model: Option<&str>,
        credential: Option<&str>,
    ) -> Result<ModelRoute, RouteError> {
        (**self).route(user_id, model, credential).await
    }

    async fn client(
        &self,
        user_id: &str,
        route: &ModelRoute,
    ) -> Result<Arc<dyn ModelClient>, RouteError> {
        (**self).client(user_id, route).await
    }

    fn prices(&self) -> Vec<(String, ModelPrice)> {
        (**self).prices()
    }
}

impl Engine {
    /// With a resolver: route `req` (filling in the canonical
    /// `provider:model`) and return the route to record.
    pub(super) async fn route_request(
        &self,
        req: &mut RunRequest,
    ) -> Result<Option<ModelRoute>, SubmitError> {
        let Some(resolver) = &self.inner.resolver else {
            return Ok(None);
        };
        // Ids first: routing looks the user's credentials up.
        super::config::check_id("user_id", &req.user_id).map_err(|(f, r)| {
            SubmitError::Invalid {
                field: f.to_string(),
                reason: r,
            }
        })?;
        let route = resolver
            .route(
                &req.user_id,
                req.model.as_deref(),
                req.credential.as_deref(),
            )
            .await
            .map_err(route_to_submit)?;
        req.model = Some(route.spec());
        Ok(Some(route))
    }
}

/// A routing failure at submit.
pub(super) fn route_to_submit(e: RouteError) -> SubmitError {
    match e {
        RouteError::Store(e) => SubmitError::Store(e),
        e => SubmitError::Invalid {
            field: e.field().to_string(),
            reason: e.to_string(),
        },
    }
}

/// Add the route to the stored request.
pub(super) fn record_route(
    mut request: serde_json::Value,
    route: Option<ModelRoute>,
) -> serde_json::Value {
    if let (Some(route), Some(obj)) = (route, request.as_object_mut()) {
        if let Ok(v) = serde_json::to_value(route) {
            obj.insert(ROUTE_KEY.to_string(), v);
        }
    }
    request
}

/// Why a run's client could not be had: the run's failure reason, or a
/// retryable outage (the attempt is retried).
pub(crate) struct RouteFailure {
    pub(crate) reason: String,
    pub(crate) retryable: bool,
}

/// The client a run uses: `None` without a resolver (the engine's fixed
/// client). With one, the route recorded at submit (routed now for a run
/// submitted without a resolver).
pub(crate) async fn client_for_run(
    inner: &Inner,
    run: &Run,
    request: &RunRequest,
) -> Result<Option<Arc<dyn ModelClient>>, RouteFailure> {
    let Some(resolver) = &inner.resolver else {
        return Ok(None);
    };
    let fail = |e: RouteError| RouteFailure {
        reason: format!("error: {}: {e}", e.field()),
        retryable: e.is_retryable(),
    };
    let route = match run.request.get(ROUTE_KEY) {
        Some(v) => serde_json::from_value::<ModelRoute>(v.clone()).map_err(|e| RouteFailure {
            reason: format!("error: stored model route is unreadable: {e}"),
            retryable: false,
        })?,
        None => resolver
            .route(
                &run.user_id,
                request.model.as_deref(),
                request.credential.as_deref(),
            )
            .await
            .map_err(fail)?,
    };
    resolver
        .client(&run.user_id, &route)
        .await
        .map(Some)
        .map_err(fail)
}

//! The provider registry: which providers and models the operator allows,
//! each provider's defaults (base URL, timeouts, retry policy, prices, the
//! operator's key and whether it may be used), and users' own keys, stored
//! encrypted ([`CredentialVault`]). Give it to
//! [`EngineBuilder::registry`](crate::engine::EngineBuilder::registry): every
//! run then names `provider:model` (`openai:gpt-4o-mini`, `local:qwen2.5-coder`),
//! checked at submit; the provider, model and credential chosen are recorded
//! with the run and reused when it resumes.
//!
//! ```
//! # fn demo(store: std::sync::Arc<dyn edward_core::CredentialStore>) -> Result<(), edward_core::registry::RegistryError> {
//! use edward_core::registry::{KeyPolicy, MasterKeys, ProviderConfig, ProviderRegistry};
//!
//! let registry = ProviderRegistry::builder()
//!     .provider(ProviderConfig::openai().model("gpt-4o-mini").keys(KeyPolicy::UserOnly))
//!     .provider(
//!         ProviderConfig::openai_compatible("local", "http://127.0.0.1:11434/v1")
//!             .model("qwen2.5-coder"),
//!     )
//!     .default_model("local:qwen2.5-coder")
//!     .credentials(store, MasterKeys::new("k1", [7; 32]))
//!     .build()?;
//! # let _ = registry; Ok(()) }
//! ```
//!
//! **Architecture invariant:** a plaintext key exists only in memory, inside
//! [`ApiKey`] (whose `Debug`/`Display` redact it) and the HTTP header marked
//! sensitive; stores, events, errors and checkpoints see only ciphertext,
//! key ids and credential ids.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

mod vault;

pub use vault::{CredentialVault, MASTER_KEYS_ENV, MaskedCredential, MasterKeys, NewCredential};

use crate::engine::{CredentialChoice, ModelResolver, ModelRoute, RouteError};
use crate::pricing::{ModelPrice, PriceTable};
use crate::providers::{ApiKey, RetryPolicy, Timeouts};
use crate::{CredentialStore, ModelClient, ModelError, ModelRequest, ModelStream};

/// Why a registry could not be configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two providers share a name.
    #[error("provider `{name}` is configured twice")]
    DuplicateProvider {
        /// The name.
        name: String,
    },
    /// A provider name is empty or contains `:`.
    #[error("invalid provider name `{name}` (non-empty, no `:`)")]
    InvalidProviderName {
        /// The name.
        name: String,
    },
    /// The default model is not allowed.
    #[error("default model: {0}")]
    DefaultModel(RouteError),
    /// A provider accepts users' keys but no credential store is configured.
    #[error("provider `{provider}` accepts users' keys but no credential store is configured")]
    NoCredentialStore {
        /// The provider.
        provider: String,
    },
    /// A provider needs a key from the operator that is not configured.
    #[error("provider `{provider}` uses the operator's key, which is not configured")]
    MissingOperatorKey {
        /// The provider.
        provider: String,
    },
    /// The provider's cargo feature is off.
    #[error("provider kind `{kind}` is not compiled in (enable its cargo feature)")]
    NotCompiled {
        /// `openai`, `anthropic` or `gemini`.
        kind: &'static str,
    },
    /// A master key could not be parsed.
    #[error("invalid master key `{id}`: {reason}")]
    InvalidMasterKey {
        /// The key id (empty when unknown).
        id: String,
        /// Why.
        reason: &'static str,
    },
}

impl RegistryError {
    /// Configuration errors never pass by retrying.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// The wire format of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderKind {
    /// OpenAI Chat Completions (OpenAI and compatible endpoints).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini `streamGenerateContent`.
    Gemini,
}

impl ProviderKind {
    fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
        }
    }
}

/// Whose key a provider's runs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyPolicy {
    /// Always the operator's key (or none, for keyless local endpoints);
    /// a request naming a credential is refused.
    #[default]
    OperatorOnly,
    /// Always a user's stored key; the operator's key is never used.
    UserOnly,
    /// The user's named or default key; the operator's key when the user has none.
    UserThenOperator,
}

/// One provider: wire format, endpoint, limits, allowed models and prices,
/// and whose key its runs use.
#[derive(Clone)]
pub struct ProviderConfig {
    name: String,
    kind: ProviderKind,
    base_url: Option<String>,
    timeouts: Timeouts,
    retry: RetryPolicy,
    models: BTreeMap<String, Option<ModelPrice>>,
    operator_key: Option<ApiKey>,
    keys: KeyPolicy,
    user_base_url: bool,
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .field("models", &self.models.keys().collect::<Vec<_>>())
            .field("operator_key", &self.operator_key)
            .field("keys", &self.keys)
            .field("user_base_url", &self.user_base_url)
            .finish()
    }
}

impl ProviderConfig {
    /// A provider named `name` speaking `kind`, with the kind's default
    /// base URL, default timeouts and retry policy, no models yet, and the
    /// operator's key only.
    pub fn new(name: impl Into<String>, kind: ProviderKind) -> Self {
        ProviderConfig {
            name: name.into(),
            kind,
            base_url: None,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            models: BTreeMap::new(),
            operator_key: None,
            keys: KeyPolicy::default(),
            user_base_url: false,
        }
    }
    /// `openai` (api.openai.com).
    pub fn openai() -> Self {
        Self::new("openai", ProviderKind::OpenAi)
    }
    /// `anthropic` (api.anthropic.com).
    pub fn anthropic() -> Self {
        Self::new("anthropic", ProviderKind::Anthropic)
    }
    /// `gemini` (generativelanguage.googleapis.com).
    pub fn gemini() -> Self {
        Self::new("gemini", ProviderKind::Gemini)
    }
    /// An operator-named OpenAI-compatible endpoint (vLLM, Ollama,
    /// llama.cpp, a gateway) at `base_url`.
    pub fn openai_compatible(name: impl Into<String>, base_url: impl Into<String>) -> Self {
        Self::new(name, ProviderKind::OpenAi).base_url(base_url)
    }
    /// Allow a model (priced from [`PriceTable::builtin`] when it knows it).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.models.insert(model.into(), None);
        self
    }
    /// Allow a model at this price.
    pub fn model_priced(mut self, model: impl Into<String>, price: ModelPrice) -> Self {
        self.models.insert(model.into(), Some(price));
        self
    }
    /// The base URL.
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }
    /// Timeouts of each call.
    pub fn timeouts(mut self, t: Timeouts) -> Self {
        self.timeouts = t;
        self
    }
    /// The retry policy (before the first byte).
    pub fn retry(mut self, r: RetryPolicy) -> Self {
        self.retry = r;
        self
    }
    /// The operator's key for this provider.
    pub fn operator_key(mut self, key: impl Into<String>) -> Self {
        self.operator_key = Some(ApiKey::new(key));
        self
    }
    /// Whose key runs use (default [`KeyPolicy::OperatorOnly`]).
    pub fn keys(mut self, policy: KeyPolicy) -> Self {
        self.keys = policy;
        self
    }
    /// Let users' credentials override the base URL (default off: a user
    /// could otherwise point the server at internal addresses).
    pub fn allow_user_base_url(mut self, yes: bool) -> Self {
        self.user_base_url = yes;
        self
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Builds a [`ProviderRegistry`].
#[derive(Debug, Default)]
#[must_use]
pub struct ProviderRegistryBuilder {
    providers: Vec<ProviderConfig>,
    default_model: Option<String>,
    credentials: Option<CredentialVault>,
}

impl ProviderRegistryBuilder {
    /// Add a provider.
    pub fn provider(mut self, p: ProviderConfig) -> Self {
        self.providers.push(p);
        self
    }
    /// The model of requests that name none (`provider:model`).
    pub fn default_model(mut self, spec: impl Into<String>) -> Self {
        self.default_model = Some(spec.into());
        self
    }
    /// Users' credentials: `store` holds them encrypted under `keys`.
    pub fn credentials(mut self, store: Arc<dyn CredentialStore>, keys: MasterKeys) -> Self {
        self.credentials = Some(CredentialVault::new(store, keys));
        self
    }
    /// Check and build.
    pub fn build(self) -> Result<ProviderRegistry, RegistryError> {
        let mut providers = BTreeMap::new();
        for p in self.providers {
            if p.name.is_empty() || p.name.contains(':') {
                return Err(RegistryError::InvalidProviderName { name: p.name });
            }
            match p.kind {
                #[cfg(feature = "openai")]
                ProviderKind::OpenAi => {}
                #[cfg(feature = "anthropic")]
                ProviderKind::Anthropic => {}
                #[cfg(feature = "gemini")]
                ProviderKind::Gemini => {}
                #[allow(unreachable_patterns)]
                k => return Err(RegistryError::NotCompiled { kind: k.as_str() }),
            }
            if p.keys != KeyPolicy::OperatorOnly && self.credentials.is_none() {
                return Err(RegistryError::NoCredentialStore { provider: p.name });
            }
            // Local OpenAI-compatible endpoints may need no key at all.
            if p.keys == KeyPolicy::OperatorOnly
                && p.operator_key.is_none()
                && p.kind != ProviderKind::OpenAi
            {
                return Err(RegistryError::MissingOperatorKey { provider: p.name });
            }
            if providers.contains_key(&p.name) {
                return Err(RegistryError::DuplicateProvider { name: p.name });
            }
            providers.insert(p.name.clone(), p);
        }
        let reg = ProviderRegistry {
            providers,
            default_model: None,
            credentials: self.credentials,
        };
        let default_model = match self.default_model {
            Some(spec) => Some(
                reg.resolve_model(Some(&spec))
                    .map_err(RegistryError::DefaultModel)?,
            ),
            None => None,
        };
        Ok(ProviderRegistry {
            default_model,
            ..reg
        })
    }
}

/// The operator's providers, allowed models, prices and users' credentials.
/// Implements [`ModelResolver`] for the engine.
#[derive(Debug)]
pub struct ProviderRegistry {
    providers: BTreeMap<String, ProviderConfig>,
    default_model: Option<(String, String)>,
    credentials: Option<CredentialVault>,
}

impl ProviderRegistry {
    /// A builder.
    pub fn builder() -> ProviderRegistryBuilder {
        ProviderRegistryBuilder::default()
    }

    /// The credential vault (to add, list, revoke and delete users' keys).
    pub fn credentials(&self) -> Option<&CredentialVault> {
        self.credentials.as_ref()
    }

    /// Store a user's key for `provider` (which must exist and accept users' keys).
    pub async fn put_credential(
        &self,
        cred: NewCredential,
    ) -> Result<crate::StoredCredential, RouteError> {
        let p = self.provider(&cred.provider)?;
        if p.keys == KeyPolicy::OperatorOnly {
            return Err(RouteError::CredentialNotAccepted {
                provider: p.name.clone(),
            });
        }
        let vault = self.vault()?;
        vault.put(cred).await.map_err(RouteError::Store)
    }

    fn vault(&self) -> Result<&CredentialVault, RouteError> {
        // Builder guarantees a vault for any provider accepting users' keys.
        self.credentials.as_ref().ok_or(RouteError::Client {
            message: "no credential store configured".into(),
        })
    }

    fn provider(&self, name: &str) -> Result<&ProviderConfig, RouteError> {
        self.providers
            .get(name)
            .ok_or_else(|| RouteError::UnknownProvider {
                provider: truncate(name),
                known: self
                    .providers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// `(provider, model)` for a requested spec (`None` = the default).
    fn resolve_model(&self, spec: Option<&str>) -> Result<(String, String), RouteError> {
        let Some(spec) = spec else {
            return self.default_model.clone().ok_or(RouteError::NoDefaultModel);
        };
        let spec = spec.trim();
        let offering = |model: &str| -> Vec<String> {
            self.providers
                .values()
                .filter(|p| p.models.contains_key(model))
                .map(|p| p.name.clone())
                .collect()
        };
        match spec.split_once(':') {
            Some((provider, model)) if !provider.is_empty() && !model.is_empty() => {
                let p = self.provider(provider)?;
                if p.models.contains_key(model) {
                    return Ok((p.name.clone(), model.to_string()));
                }
                let others = offering(model);
                if others.is_empty() {
                    Err(RouteError::UnknownModel {
                        provider: p.name.clone(),
                        model: truncate(model),
                    })
                } else {
                    Err(RouteError::ModelProviderMismatch {
                        model: truncate(model),
                        provider: p.name.clone(),
                        belongs_to: others.join(", "),
                    })
                }
            }
            Some(_) => Err(RouteError::InvalidSpec {
                spec: truncate(spec),
            }),
            None => {
                let others = offering(spec);
                match others.as_slice() {
                    [one] => Ok((one.clone(), spec.to_string())),
                    [] => Err(RouteError::InvalidSpec {
                        spec: truncate(spec),
                    }),
                    _ => Err(RouteError::AmbiguousModel {
                        model: truncate(spec),
                        providers: others.join(", "),
                    }),
                }
            }
        }
    }

    fn build_client(
        &self,
        p: &ProviderConfig,
        key: Option<ApiKey>,
        base_url: Option<&str>,
    ) -> Result<Arc<dyn ModelClient>, RouteError> {
        let base = base_url.or(p.base_url.as_deref());
        let client_err = |e: crate::providers::ProviderConfigError| RouteError::Client {
            message: e.to_string(),
        };
        // The three builders share this shape but not a type.
        macro_rules! build {
            ($builder:expr) => {{
                let mut b = $builder.timeouts(p.timeouts).retry(p.retry);
                if let Some(k) = key {
                    b = b.api_key(k.expose());
                }
                if let Some(u) = base {
                    b = b.base_url(u);
                }
                Arc::new(b.build().map_err(client_err)?)
            }};
        }
        let client: Arc<dyn ModelClient> = match p.kind {
            #[cfg(feature = "openai")]
            ProviderKind::OpenAi => {
                build!(crate::providers::OpenAiClient::builder())
            }
            #[cfg(feature = "anthropic")]
            ProviderKind::Anthropic => {
                build!(crate::providers::AnthropicClient::builder())
            }
            #[cfg(feature = "gemini")]
            ProviderKind::Gemini => {
                build!(crate::providers::GeminiClient::builder())
            }
            #[allow(unreachable_patterns)]
            k => {
                return Err(RouteError::Client {
                    message: format!("provider kind `{}` is not compiled in", k.as_str()),
                });
            }
        };
        Ok(client)
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

#[async_trait]
impl ModelResolver for ProviderRegistry {
    fn check_model(&self, model: Option<&str>) -> Result<(String, String), RouteError> {
        self.resolve_model(model)
    }

    async fn route(
        &self,
        user_id: &str,
        model: Option<&str>,
        credential: Option<&str>,
    ) -> Result<ModelRoute, RouteError> {
        let (provider, model) = self.resolve_model(model)?;
        let p = self.provider(&provider)?;
        let credential = match (p.keys, credential) {
            (KeyPolicy::OperatorOnly, Some(_)) => {
                return Err(RouteError::CredentialNotAccepted { provider });
            }
            (KeyPolicy::OperatorOnly, None) => CredentialChoice::Operator,
            (_, Some(name)) => {
                let c = self
                    .vault()?
                    .store()
                    .find_credential(user_id, &provider, Some(name))
                    .await
                    .map_err(RouteError::Store)?
                    .ok_or_else(|| RouteError::CredentialNotFound {
                        provider: provider.clone(),
                        name: truncate(name),
                    })?;
                if c.revoked_at.is_some() {
                    return Err(RouteError::CredentialRevoked {
                        provider,
                        name: c.name,
                    });
                }
                CredentialChoice::User { id: c.id }
            }
            (policy, None) => {
                let c = self
                    .vault()?
                    .store()
                    .find_credential(user_id, &provider, None)
                    .await
                    .map_err(RouteError::Store)?;
                match (c, policy) {
                    (Some(c), _) => CredentialChoice::User { id: c.id },
                    (None, KeyPolicy::UserThenOperator) => CredentialChoice::Operator,
                    (None, _) => return Err(RouteError::NoCredential { provider }),
                }
            }
        };
        Ok(ModelRoute {
            provider,
            model,
            credential,
        })
    }

    async fn client(
        &self,
        user_id: &str,
        route: &ModelRoute,
    ) -> Result<Arc<dyn ModelClient>, RouteError> {
        let p = self.provider(&route.provider)?;
        let (key, base_url) = match &route.credential {
            CredentialChoice::Operator => {
                if p.keys == KeyPolicy::UserOnly {
                    return Err(RouteError::NoCredential {
                        provider: p.name.clone(),
                    });
                }
                (p.operator_key.clone(), None)
            }
            CredentialChoice::User { id } => {
                if p.keys == KeyPolicy::OperatorOnly {
                    return Err(RouteError::CredentialNotAccepted {
                        provider: p.name.clone(),
                    });
                }
                let vault = self.vault()?;
                let c = vault
                    .store()
                    .get_credential(user_id, *id)
                    .await
                    .map_err(RouteError::Store)?
                    .ok_or_else(|| RouteError::CredentialNotFound {
                        provider: p.name.clone(),
                        name: id.to_string(),
                    })?;
                if c.revoked_at.is_some() {
                    return Err(RouteError::CredentialRevoked {
                        provider: p.name.clone(),
                        name: c.name,
                    });
                }
                let key = vault.decrypt(&c)?;
                let base = c.base_url.filter(|_| p.user_base_url);
                (Some(key), base)
            }
        };
        let inner = self.build_client(p, key, base_url.as_deref())?;
        Ok(Arc::new(RoutedClient {
            inner,
            provider: p.name.clone(),
        }))
    }

    fn prices(&self) -> Vec<(String, ModelPrice)> {
        let builtin = PriceTable::builtin();
        self.providers
            .values()
            .flat_map(|p| {
                let builtin = &builtin;
                p.models.iter().filter_map(move |(m, price)| {
                    price
                        .or_else(|| builtin.get(m))
                        .map(|price| (format!("{}:{m}", p.name), price))
                })
            })
            .collect()
    }
}

/// A provider client behind a registry route: the engine names models
/// `provider:model`; the provider gets the bare model name.
struct RoutedClient {
    inner: Arc<dyn ModelClient>,
    provider: String,
}

impl RoutedClient {
    fn bare<'a>(&self, model: &'a str) -> &'a str {
        model
            .strip_prefix(self.provider.as_str())
            .and_then(|m| m.strip_prefix(':'))
            .unwrap_or(model)
    }
}

#[async_trait]
impl ModelClient for RoutedClient {
    fn provider(&self) -> &str {
        &self.provider
    }

    async fn stream(
        &self,
        mut request: ModelRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        request.model = self.bare(&request.model).to_string();
        self.inner.stream(request, cancel).await
    }

    fn estimate_input_tokens(&self, request: &ModelRequest) -> u64 {
        // Tokenizers are chosen by the bare model name.
        let bare = self.bare(&request.model);
        if bare.len() == request.model.len() {
            return self.inner.estimate_input_tokens(request);
        }
        let mut request = request.clone();
        request.model = bare.to_string();
        self.inner.estimate_input_tokens(&request)
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        self.inner.context_window(self.bare(model))
    }

    fn retries_internally(&self) -> bool {
        self.inner.retries_internally()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryCredentialStore;

    fn vault(keys: MasterKeys) -> CredentialVault {
        CredentialVault::new(Arc::new(MemoryCredentialStore::new()), keys)
    }

    fn new_cred(user: &str, key: &str) -> NewCredential {
        NewCredential {
            user_id: user.into(),
            provider: "openai".into(),
            name: "main".into(),
            key: ApiKey::new(key),
            base_url: None,
            is_default: true,
        }
    }

    #[test]
    fn master_keys_parse_and_never_print() {
        let hex1 = "11".repeat(32);
        let hex2 = "AB".repeat(32);
        let k = MasterKeys::parse(&format!("k2={hex2}, k1={hex1}")).unwrap();
        assert_eq!(k.current_id(), "k2");
        let dbg = format!("{k:?}");
        assert!(
            dbg.contains("k1") && !dbg.to_lowercase().contains("abab"),
            "{dbg}"
        );
        for bad in [
            "",
            "k1",
            "k1=zz",
            &format!("={hex1}"),
            &format!("k1={hex1}00"),
        ] {
            assert!(
                matches!(
                    MasterKeys::parse(bad),
                    Err(RegistryError::InvalidMasterKey { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn ciphertext_is_bound_to_its_row_and_nonces_differ() {
        let v = vault(MasterKeys::new("k1", [5; 32]));
        let a = v.encrypt(&new_cred("alice", "sk-secret-aaaaaaaa")).unwrap();
        let b = v.encrypt(&new_cred("alice", "sk-secret-aaaaaaaa")).unwrap();
        assert_ne!(a.nonce, b.nonce);
        assert_ne!(a.ciphertext, b.ciphertext);
        assert!(!String::from_utf8_lossy(&a.ciphertext).contains("sk-secret"));
        assert_eq!(v.decrypt(&a).unwrap(), ApiKey::new("sk-secret-aaaaaaaa"));
        // Moved to another user's row: no longer decrypts.
        let mut moved = a.clone();
        moved.user_id = "mallory".into();
        assert!(matches!(
            v.decrypt(&moved),
            Err(RouteError::Decryption { .. })
        ));
        let mut tampered = a.clone();
        tampered.ciphertext[0] ^= 1;
        assert!(matches!(
            v.decrypt(&tampered),
            Err(RouteError::Decryption { .. })
        ));
    }

    #[test]
    fn mismatch_unknown_and_bare_names() {
        let r = ProviderRegistry::builder()
            .provider(ProviderConfig::openai().model("gpt-4o-mini"))
            .provider(ProviderConfig::openai_compatible("a", "http://127.0.0.1:1").model("m"))
            .provider(ProviderConfig::openai_compatible("b", "http://127.0.0.1:2").model("m"))
            .build()
            .unwrap();
        assert_eq!(
            r.check_model(Some("gpt-4o-mini")).unwrap(),
            ("openai".to_string(), "gpt-4o-mini".to_string())
        );
        assert!(matches!(
            r.check_model(Some("a:gpt-4o-mini")),
            Err(RouteError::ModelProviderMismatch { .. })
        ));
        assert!(matches!(
            r.check_model(Some("m")),
            Err(RouteError::AmbiguousModel { .. })
        ));
        assert!(matches!(
            r.check_model(Some("openai:nope")),
            Err(RouteError::UnknownModel { .. })
        ));
        assert!(matches!(
            r.check_model(None),
            Err(RouteError::NoDefaultModel)
        ));
        assert!(matches!(
            ProviderRegistry::builder()
                .provider(ProviderConfig::openai().keys(KeyPolicy::UserOnly))
                .build(),
            Err(RegistryError::NoCredentialStore { .. })
        ));
        assert!(matches!(
            ProviderRegistry::builder()
                .provider(ProviderConfig::openai())
                .default_model("openai:gpt-5")
                .build(),
            Err(RegistryError::DefaultModel(RouteError::UnknownModel { .. }))
        ));
    }
}

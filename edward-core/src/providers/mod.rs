//! Model providers over HTTP (OpenAI-compatible, Anthropic, Gemini) and the
//! Tavily web search.
//!
//! Each provider is a [`crate::ModelClient`] built from code (a builder per
//! provider: key, base URL, timeouts, retry policy, extra headers) or from the
//! environment ([`from_env`]). All of them share:
//!
//! - one SSE decoder ([`sse`]),
//! - one failure policy ([`RetryPolicy`]): retries only before the first
//!   byte of output, within a window (60 s for 429/529, 15 s otherwise) and
//!   the caller's deadline, exponential backoff with equal jitter,
//!   `Retry-After` honoured, every failed attempt reported to the caller's
//!   [`crate::ModelObserver`], every sleep raced against the cancel token;
//!   after the first byte a broken stream is
//!   [`crate::ModelError::StreamInterrupted`], preceded by the usage of what
//!   was streamed,
//! - a complete `application/json` reply to a streaming request read as one
//!   answer,
//! - three timeouts ([`Timeouts`]): connect, first byte, idle between chunks,
//! - one stream shape: `Text`/`Thinking` chunks as they arrive, then exactly
//!   one `Usage` (the provider's own counts, or an estimate marked
//!   `estimated: true` when it gave none) and one `Finish`,
//! - typed errors with the key scrubbed from every message ([`ApiKey`]
//!   never prints its value).
//!
//! **API boundary:** nothing outside this module knows a provider's wire
//! format; the engine sees only [`crate::ModelChunk`]s and
//! [`crate::ModelError`]s.

use std::sync::Arc;

mod http;
pub mod retry;
pub mod sse;
mod tokens;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "gemini")]
pub mod gemini;
#[cfg(feature = "openai")]
pub mod openai;
#[cfg(feature = "tavily")]
pub mod tavily;

pub use http::{ApiKey, ProviderConfigError, Timeouts};
pub use retry::RetryPolicy;
pub use tokens::{context_window, estimate_request_tokens, estimate_text_tokens};

#[cfg(feature = "anthropic")]
pub use anthropic::{AnthropicBuilder, AnthropicClient};
#[cfg(feature = "gemini")]
pub use gemini::{GeminiBuilder, GeminiClient};
#[cfg(feature = "openai")]
pub use openai::{OpenAiBuilder, OpenAiClient};
#[cfg(feature = "tavily")]
pub use tavily::{TavilyBuilder, TavilySearch};

use crate::ModelClient;

/// The environment variable naming the model: `openai:gpt-4o-mini`,
/// `anthropic:claude-sonnet-4-20250514`, `gemini:gemini-2.5-flash`, or `scripted`.
pub const MODEL_ENV: &str = "EDWARD_MODEL";

/// A parsed model spec: which provider, which model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// `openai`, `anthropic`, `gemini` or `scripted`.
    pub provider: String,
    /// The model name as the provider knows it (`scripted` for the scripted model).
    pub model: String,
}

impl ModelSpec {
    /// Parse `provider:model` or `scripted`. The model part may itself contain
    /// colons (`openai:llama3.1:8b` for Ollama).
    pub fn parse(spec: &str) -> Result<Self, ProviderConfigError> {
        let spec = spec.trim();
        if spec == "scripted" {
            return Ok(ModelSpec {
                provider: "scripted".into(),
                model: "scripted".into(),
            });
        }
        let invalid = || ProviderConfigError::InvalidModelSpec {
            spec: spec.to_owned(),
        };
        let (provider, model) = spec.split_once(':').ok_or_else(invalid)?;
        let (provider, model) = (provider.trim(), model.trim());
        if provider.is_empty() || model.is_empty() {
            return Err(invalid());
        }
        Ok(ModelSpec {
            provider: provider.to_ascii_lowercase(),
            model: model.to_owned(),
        })
    }
}

/// A model client and the model name to put in its requests.
#[derive(Clone)]
pub struct SelectedModel {
    /// The client.
    pub client: Arc<dyn ModelClient>,
    /// The model name as the provider knows it.
    pub model: String,
}

impl std::fmt::Debug for SelectedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectedModel")
            .field("provider", &self.client.provider())
            .field("model", &self.model)
            .finish()
    }
}

/// Build the model client `spec` names (`scripted` is
/// [`ScriptedModel::demo`](crate::scripted::ScriptedModel::demo)), reading keys and base URLs from the
/// environment (`OPENAI_API_KEY`, `OPENAI_BASE_URL`, `ANTHROPIC_API_KEY`,
/// `ANTHROPIC_BASE_URL`, `GEMINI_API_KEY`, `GEMINI_BASE_URL`).
pub fn client_for(spec: &ModelSpec) -> Result<SelectedModel, ProviderConfigError> {
    let client: Option<Arc<dyn ModelClient>> = match spec.provider.as_str() {
        "scripted" => Some(Arc::new(crate::scripted::ScriptedModel::demo())),
        #[cfg(feature = "openai")]
        "openai" => Some(Arc::new(OpenAiClient::from_env()?)),
        #[cfg(feature = "anthropic")]
        "anthropic" => Some(Arc::new(AnthropicClient::from_env()?)),
        #[cfg(feature = "gemini")]
        "gemini" => Some(Arc::new(GeminiClient::from_env()?)),
        _ => None,
    };
    let client = client.ok_or_else(|| ProviderConfigError::UnsupportedProvider {
        provider: spec.provider.clone(),
    })?;
    Ok(SelectedModel {
        client,
        model: spec.model.clone(),
    })
}

/// The model client named by `EDWARD_MODEL` (see [`client_for`]). Returns
/// `Ok(None)` when `EDWARD_MODEL` is unset, so the caller picks its default.
pub fn from_env() -> Result<Option<SelectedModel>, ProviderConfigError> {
    match std::env::var(MODEL_ENV) {
        Ok(v) if !v.trim().is_empty() => client_for(&ModelSpec::parse(&v)?).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let s = ModelSpec::parse("openai:llama3.1:8b").unwrap();
        assert_eq!(
            (s.provider.as_str(), s.model.as_str()),
            ("openai", "llama3.1:8b")
        );
        assert_eq!(ModelSpec::parse("scripted").unwrap().provider, "scripted");
        assert!(ModelSpec::parse("gpt-4o").is_err());
        assert!(ModelSpec::parse("openai:").is_err());
        assert!(matches!(
            client_for(&ModelSpec::parse("nope:x").unwrap()),
            Err(ProviderConfigError::UnsupportedProvider { .. })
        ));
        let scripted = client_for(&ModelSpec::parse("scripted").unwrap()).unwrap();
        assert_eq!(scripted.client.provider(), "scripted");
        assert_eq!(scripted.model, "scripted");
    }

    #[test]
    fn api_key_never_prints() {
        let k = ApiKey::new("sk-very-secret-123");
        assert!(!format!("{k:?} {k}").contains("very-secret"));
        assert_eq!(
            k.scrub("bad key sk-very-secret-123!"),
            "bad key [redacted]!"
        );
    }
}

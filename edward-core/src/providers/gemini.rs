//! Google Gemini `streamGenerateContent` over SSE.
//!
//! Wire format: `POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`
//! with the key in the `x-goog-api-key` header (never in the URL, so it can
//! never show up in a logged URL). Each `data:` event is a
//! `GenerateContentResponse`: `candidates[0].content.parts[].text` (parts
//! with `thought: true` are thinking), `candidates[0].finishReason`,
//! `usageMetadata` (cumulative), `promptFeedback.blockReason`. Gemini has no
//! end marker: the stream ends at EOF after a chunk with a finish reason.
//!
//! **Content filtering (decision):** a blocked *prompt*
//! (`promptFeedback.blockReason`, no output at all) is the typed error
//! [`ModelError::ContentFiltered`]. A *response* stopped by a safety system
//! (`finishReason` `SAFETY`, `RECITATION`, `BLOCKLIST`,
//! `PROHIBITED_CONTENT`, `SPII`, `IMAGE_SAFETY`) ends the stream normally
//! with `Finish(ContentFilter)`, after the text already delivered, exactly
//! like OpenAI's `finish_reason: content_filter` and Anthropic's `refusal`,
//! so the engine has one way to see it.

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::http::{
    CommonOptions, HttpCore, ProviderConfigError, StreamAcc, WireParser, common_builder_methods,
    common_client_methods, provider_error_from_object,
};
use super::sse::SseEvent;
use crate::{FinishReason, ModelCall, ModelClient, ModelError, ModelRequest, ModelStream, Role};

/// The default base URL.
pub const GEMINI_DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// Builder of [`GeminiClient`].
#[derive(Debug, Clone)]
pub struct GeminiBuilder {
    common: CommonOptions,
    include_thoughts: bool,
    api_version: String,
}

impl GeminiBuilder {
    common_builder_methods!();

    /// Ask for thought summaries (`thinkingConfig.includeThoughts`), streamed
    /// as `ModelChunk::Thinking`.
    pub fn include_thoughts(mut self, yes: bool) -> Self {
        self.include_thoughts = yes;
        self
    }

    /// The API version path segment (default `v1beta`).
    pub fn api_version(mut self, v: impl Into<String>) -> Self {
        self.api_version = v.into();
        self
    }

    /// Build the client; the key is required.
    pub fn build(self) -> Result<GeminiClient, ProviderConfigError> {
        let key = self
            .common
            .api_key
            .clone()
            .ok_or_else(|| ProviderConfigError::MissingEnv {
                var: "GEMINI_API_KEY".into(),
            })?;
        let core = HttpCore::new(
            "gemini",
            self.common,
            Some(("x-goog-api-key", key.expose().to_owned())),
        )?;
        Ok(GeminiClient {
            core,
            include_thoughts: self.include_thoughts,
            api_version: self.api_version,
        })
    }
}

/// Streams Gemini completions.
#[derive(Debug, Clone)]
pub struct GeminiClient {
    core: HttpCore,
    include_thoughts: bool,
    api_version: String,
}

impl GeminiClient {
    /// A builder with the default base URL.
    pub fn builder() -> GeminiBuilder {
        GeminiBuilder {
            common: CommonOptions::new(GEMINI_DEFAULT_BASE_URL),
            include_thoughts: false,
            api_version: "v1beta".into(),
        }
    }

    /// From `GEMINI_API_KEY` and optional `GEMINI_BASE_URL`.
    pub fn from_env() -> Result<Self, ProviderConfigError> {
        let mut b = Self::builder();
        b.common.read_env("GEMINI_API_KEY", "GEMINI_BASE_URL")?;
        b.build()
    }

    /// The streaming URL for `model`.
    pub fn url(&self, model: &str) -> String {
        let model = model.strip_prefix("models/").unwrap_or(model);
        format!(
            "{}/{}/models/{}:streamGenerateContent?alt=sse",
            self.core.base_url, self.api_version, model
        )
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let contents: Vec<Value> = request
            .messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "model",
                };
                json!({"role": role, "parts": [{"text": m.content}]})
            })
            .collect();
        let mut body = json!({ "contents": contents });
        if !request.system.is_empty() {
            body["systemInstruction"] = json!({"parts": [{"text": request.system}]});
        }
        let mut config = serde_json::Map::new();
        if let Some(max) = request.max_output_tokens {
            config.insert("maxOutputTokens".into(), json!(max));
        }
        if let Some(t) = request.temperature {
            config.insert("temperature".into(), json!(t));
        }
        if self.include_thoughts {
            config.insert("thinkingConfig".into(), json!({"includeThoughts": true}));
        }
        if !config.is_empty() {
            body["generationConfig"] = Value::Object(config);
        }
        body
    }
}

#[async_trait]
impl ModelClient for GeminiClient {
    fn provider(&self) -> &str {
        "gemini"
    }

    common_client_methods!();

    async fn stream(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        self.stream_call(request, cancel, ModelCall::default())
            .await
    }

    async fn stream_call(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
        call: ModelCall,
    ) -> Result<ModelStream, ModelError> {
        let body = self.request_body(&request);
        let url = self.url(&request.model);
        self.core
            .stream(&url, &body, GeminiParser, request, cancel, call)
            .await
    }
}

struct GeminiParser;

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::ContentFilter
        }
        other => FinishReason::Other(other.to_ascii_lowercase()),
    }
}

impl WireParser for GeminiParser {
    fn on_event(
        &mut self,
        core: &HttpCore,
        event: &SseEvent,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        let v: Value =
            serde_json::from_str(&event.data).map_err(|_| core.malformed("event", &event.data))?;
        match v.as_array() {
            Some(items) => items
                .iter()
                .try_for_each(|item| read_response(core, item, acc)),
            None => read_response(core, &v, acc),
        }
    }

    /// `generateContent`'s reply, or `streamGenerateContent` without
    /// `alt=sse` (a JSON array of responses): the same objects as the stream.
    fn on_complete(
        &mut self,
        core: &HttpCore,
        v: &Value,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        match v.as_array() {
            Some(items) => items
                .iter()
                .try_for_each(|item| read_response(core, item, acc)),
            None => read_response(core, v, acc),
        }
    }
}

/// One `GenerateContentResponse`.
fn read_response(core: &HttpCore, v: &Value, acc: &mut StreamAcc) -> Result<(), ModelError> {
    if let Some(err) = v.get("error").filter(|e| e.is_object()) {
        return Err(core.classify_in_stream(provider_error_from_object(err)));
    }
    if let Some(reason) = v["promptFeedback"]
        .get("blockReason")
        .and_then(|r| r.as_str())
    {
        return Err(ModelError::ContentFiltered {
            message: format!("prompt blocked: {reason}"),
        });
    }
    if let Some(candidate) = v
        .get("candidates")
        .and_then(|c| c.as_array())
        .and_then(|c| c.first())
    {
        if let Some(parts) = candidate["content"].get("parts").and_then(|p| p.as_array()) {
            for part in parts {
                let Some(text) = part.get("text").and_then(|t| t.as_str()) else {
                    continue;
                };
                if part.get("thought").and_then(|t| t.as_bool()) == Some(true) {
                    acc.thinking(text);
                } else {
                    acc.text(text);
                }
            }
        }
        if let Some(r) = candidate.get("finishReason").and_then(|r| r.as_str()) {
            acc.finish = Some(finish_reason(r));
        }
    }
    if let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) {
        acc.report_input(u.get("promptTokenCount").and_then(|n| n.as_u64()));
        let candidates = u.get("candidatesTokenCount").and_then(|n| n.as_u64());
        let thoughts = u.get("thoughtsTokenCount").and_then(|n| n.as_u64());
        if candidates.is_some() || thoughts.is_some() {
            // Thought tokens are billed as output.
            acc.report_output(Some(candidates.unwrap_or(0) + thoughts.unwrap_or(0)));
        }
    }
    Ok(())
}

//! OpenAI-compatible Chat Completions streaming: OpenAI itself, Azure-style
//! gateways, OpenRouter, vLLM, llama.cpp's server, Ollama's OpenAI API.
//!
//! Wire format: `POST {base}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`; `data:` events carry
//! `choices[0].delta.content` (text), `delta.reasoning_content` or
//! `delta.reasoning` (thinking), `choices[0].finish_reason`, and a final
//! chunk with `usage` and no choices; `data: [DONE]` ends the stream. An
//! `{"error": …}` object in the stream becomes a typed [`ModelError`].

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ApiKey;
use super::http::{
    CommonOptions, HttpCore, ProviderConfigError, StreamAcc, WireParser, base_url_from_env,
    common_builder_methods, common_client_methods, provider_error_from_object,
};
use super::sse::SseEvent;
use crate::{FinishReason, ModelCall, ModelClient, ModelError, ModelRequest, ModelStream, Role};

/// The default base URL.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Which request field carries the output cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens` (most compatible servers).
    MaxTokens,
    /// `max_completion_tokens` (required by OpenAI's o-series).
    MaxCompletionTokens,
}

/// Builder of [`OpenAiClient`].
#[derive(Debug, Clone)]
pub struct OpenAiBuilder {
    common: CommonOptions,
    auth_header: Option<String>,
    max_tokens_field: Option<MaxTokensField>,
}

impl OpenAiBuilder {
    common_builder_methods!();

    /// Send the key in this header instead of `Authorization: Bearer`
    /// (Azure-style gateways use `api-key`).
    pub fn api_key_header(mut self, name: impl Into<String>) -> Self {
        self.auth_header = Some(name.into());
        self
    }

    /// Which field carries the output cap (default: `max_completion_tokens`
    /// for api.openai.com, `max_tokens` elsewhere).
    pub fn max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = Some(field);
        self
    }

    /// Build the client. A missing key is allowed (local servers need none).
    pub fn build(self) -> Result<OpenAiClient, ProviderConfigError> {
        let auth = self
            .common
            .api_key
            .as_ref()
            .map(|k| match &self.auth_header {
                Some(h) => (h.as_str(), k.expose().to_owned()),
                None => ("authorization", format!("Bearer {}", k.expose())),
            });
        let official = self.common.base_url.contains("api.openai.com");
        let max_tokens_field = self.max_tokens_field.unwrap_or(if official {
            MaxTokensField::MaxCompletionTokens
        } else {
            MaxTokensField::MaxTokens
        });
        let core = HttpCore::new("openai", self.common.clone(), auth)?;
        Ok(OpenAiClient {
            core,
            max_tokens_field,
        })
    }
}

/// Streams OpenAI-compatible chat completions.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    core: HttpCore,
    max_tokens_field: MaxTokensField,
}

impl OpenAiClient {
    /// A builder with the default base URL and no key.
    pub fn builder() -> OpenAiBuilder {
        OpenAiBuilder {
            common: CommonOptions::new(OPENAI_DEFAULT_BASE_URL),
            auth_header: None,
            max_tokens_field: None,
        }
    }

    /// From `OPENAI_API_KEY` (optional when `OPENAI_BASE_URL` points at a
    /// local server) and `OPENAI_BASE_URL`.
    pub fn from_env() -> Result<Self, ProviderConfigError> {
        let mut b = Self::builder();
        let base = base_url_from_env("OPENAI_BASE_URL");
        let key = ApiKey::from_env("OPENAI_API_KEY");
        match (&key, &base) {
            (None, None) => {
                return Err(ProviderConfigError::MissingEnv {
                    var: "OPENAI_API_KEY".into(),
                });
            }
            (Some(k), _) => b.common.api_key = Some(k.clone()),
            _ => {}
        }
        if let Some(base) = base {
            b = b.base_url(base);
        }
        b.build()
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": request.system}));
        }
        for m in &request.messages {
            let role = match m.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            messages.push(json!({"role": role, "content": m.content}));
        }
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(max) = request.max_output_tokens {
            let field = match self.max_tokens_field {
                MaxTokensField::MaxTokens => "max_tokens",
                MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
            };
            body[field] = json!(max);
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        body
    }
}

#[async_trait]
impl ModelClient for OpenAiClient {
    fn provider(&self) -> &str {
        "openai"
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
        let url = format!("{}/chat/completions", self.core.base_url);
        self.core
            .stream(&url, &body, OpenAiParser, request, cancel, call)
            .await
    }
}

struct OpenAiParser;

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

impl WireParser for OpenAiParser {
    fn on_event(
        &mut self,
        core: &HttpCore,
        event: &SseEvent,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        if event.is_done() {
            acc.done = true;
            return Ok(());
        }
        let v: Value =
            serde_json::from_str(&event.data).map_err(|_| core.malformed("event", &event.data))?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(core.classify_in_stream(provider_error_from_object(err)));
        }
        if let Some(choice) = v
            .get("choices")
            .and_then(|c| c.as_array())
            .and_then(|c| c.first())
        {
            if let Some(delta) = choice.get("delta") {
                for field in ["reasoning_content", "reasoning"] {
                    if let Some(t) = delta.get(field).and_then(|t| t.as_str()) {
                        acc.thinking(t);
                    }
                }
                if let Some(t) = delta.get("content").and_then(|t| t.as_str()) {
                    acc.text(t);
                }
                // A refusal is what the model said: shown as text, never dropped.
                if let Some(t) = delta.get("refusal").and_then(|t| t.as_str()) {
                    acc.text(t);
                }
            }
            if let Some(r) = choice.get("finish_reason").and_then(|r| r.as_str()) {
                acc.finish = Some(finish_reason(r));
            }
        }
        read_usage(&v, acc);
        Ok(())
    }

    /// A `chat.completion` object: `choices[0].message` (content,
    /// reasoning, refusal), `finish_reason`, `usage`.
    fn on_complete(
        &mut self,
        core: &HttpCore,
        v: &Value,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(core.classify_in_stream(provider_error_from_object(err)));
        }
        let Some(choice) = v
            .get("choices")
            .and_then(|c| c.as_array())
            .and_then(|c| c.first())
        else {
            return Ok(());
        };
        let message = choice.get("message").unwrap_or(&Value::Null);
        for field in ["reasoning_content", "reasoning"] {
            if let Some(t) = message.get(field).and_then(|t| t.as_str()) {
                acc.thinking(t);
            }
        }
        for field in ["content", "refusal"] {
            if let Some(t) = message.get(field).and_then(|t| t.as_str()) {
                acc.text(t);
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(|r| r.as_str()) {
            acc.finish = Some(finish_reason(r));
        }
        read_usage(v, acc);
        Ok(())
    }
}

/// `usage` of a chunk or a whole reply. Gateways put it on a chunk that
/// still has choices, repeat it, or send `prompt_tokens: 0` first: the
/// largest non-zero count wins.
fn read_usage(v: &Value, acc: &mut StreamAcc) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        acc.report_input(u.get("prompt_tokens").and_then(|n| n.as_u64()));
        acc.report_output(u.get("completion_tokens").and_then(|n| n.as_u64()));
    }
}

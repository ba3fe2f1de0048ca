//! Anthropic Messages API streaming.
//!
//! Wire format: `POST {base}/v1/messages` with `stream: true`, headers
//! `x-api-key` and `anthropic-version: 2023-06-01`, the system prompt in
//! `system`. Events: `message_start` (input usage), `content_block_start`,
//! `content_block_delta` (`text_delta` → text, `thinking_delta` → thinking;
//! `signature_delta` and others are ignored), `content_block_stop`,
//! `message_delta` (`stop_reason`, cumulative output usage), `message_stop`
//! (end), `ping`, and `error` (typed: `overloaded_error` → `Overloaded`, …).

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
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version header value.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; used when the request has no cap.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 8192;

/// Builder of [`AnthropicClient`].
#[derive(Debug, Clone)]
pub struct AnthropicBuilder {
    common: CommonOptions,
    thinking_budget: Option<u32>,
}

impl AnthropicBuilder {
    common_builder_methods!();

    /// Enable extended thinking with this token budget (streamed as
    /// `ModelChunk::Thinking`).
    pub fn thinking_budget(mut self, tokens: u32) -> Self {
        self.thinking_budget = Some(tokens);
        self
    }

    /// Build the client; the key is required.
    pub fn build(self) -> Result<AnthropicClient, ProviderConfigError> {
        let key = self
            .common
            .api_key
            .clone()
            .ok_or_else(|| ProviderConfigError::MissingEnv {
                var: "ANTHROPIC_API_KEY".into(),
            })?;
        let mut common = self.common;
        common
            .extra_headers
            .insert(0, ("anthropic-version".into(), ANTHROPIC_VERSION.into()));
        let core = HttpCore::new(
            "anthropic",
            common,
            Some(("x-api-key", key.expose().to_owned())),
        )?;
        Ok(AnthropicClient {
            core,
            thinking_budget: self.thinking_budget,
        })
    }
}

/// Streams Anthropic Messages.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    core: HttpCore,
    thinking_budget: Option<u32>,
}

impl AnthropicClient {
    /// A builder with the default base URL.
    pub fn builder() -> AnthropicBuilder {
        AnthropicBuilder {
            common: CommonOptions::new(ANTHROPIC_DEFAULT_BASE_URL),
            thinking_budget: None,
        }
    }

    /// From `ANTHROPIC_API_KEY` and optional `ANTHROPIC_BASE_URL`.
    pub fn from_env() -> Result<Self, ProviderConfigError> {
        let mut b = Self::builder();
        b.common
            .read_env("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")?;
        b.build()
    }

    /// The request body for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                json!({"role": role, "content": m.content})
            })
            .collect();
        let mut body = json!({
            "model": request.model,
            "max_tokens": request.max_output_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS),
            "messages": messages,
            "stream": true,
        });
        if !request.system.is_empty() {
            body["system"] = json!(request.system);
        }
        if let Some(budget) = self.thinking_budget {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
        } else if let Some(t) = request.temperature {
            // The API rejects temperature together with thinking.
            body["temperature"] = json!(t);
        }
        body
    }
}

#[async_trait]
impl ModelClient for AnthropicClient {
    fn provider(&self) -> &str {
        "anthropic"
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
        let url = format!("{}/v1/messages", self.core.base_url);
        self.core
            .stream(
                &url,
                &body,
                AnthropicParser::default(),
                request,
                cancel,
                call,
            )
            .await
    }
}

/// Tracks the content blocks that are open, so a message that "stops"
/// inside one (a gateway closing a stream whose upstream died) is an
/// interrupted stream, not a finished answer.
#[derive(Default)]
struct AnthropicParser {
    open_blocks: std::collections::BTreeSet<u64>,
}

fn stop_reason(s: &str) -> FinishReason {
    match s {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// Usage counters are cumulative; input includes cache writes and reads.
/// Gateways send `input_tokens: 0` in `message_start` and the real count in
/// `message_delta`: the largest non-zero count wins.
fn read_usage(usage: &Value, acc: &mut StreamAcc) {
    if let Some(n) = usage.get("input_tokens").and_then(|n| n.as_u64()) {
        let cached = ["cache_creation_input_tokens", "cache_read_input_tokens"]
            .iter()
            .filter_map(|k| usage.get(*k).and_then(|n| n.as_u64()))
            .sum::<u64>();
        acc.report_input(Some(n + cached));
    }
    acc.report_output(usage.get("output_tokens").and_then(|n| n.as_u64()));
}

/// One content block into `acc`.
fn read_block(block: &Value, acc: &mut StreamAcc) {
    match block.get("type").and_then(|t| t.as_str()) {
        Some("text") => acc.text(block["text"].as_str().unwrap_or("")),
        Some("thinking") => acc.thinking(block["thinking"].as_str().unwrap_or("")),
        _ => {}
    }
}

impl WireParser for AnthropicParser {
    fn on_event(
        &mut self,
        core: &HttpCore,
        event: &SseEvent,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        let v: Value =
            serde_json::from_str(&event.data).map_err(|_| core.malformed("event", &event.data))?;
        // The `type` field in the data is authoritative; `event:` repeats it.
        let kind = v
            .get("type")
            .and_then(|t| t.as_str())
            .or(event.event.as_deref())
            .unwrap_or("");
        match kind {
            "message_start" => {
                read_usage(&v["message"]["usage"], acc);
            }
            "content_block_start" => {
                self.open_blocks
                    .insert(v["index"].as_u64().unwrap_or(u64::MAX));
                read_block(&v["content_block"], acc);
            }
            "content_block_stop" => {
                self.open_blocks
                    .remove(&v["index"].as_u64().unwrap_or(u64::MAX));
            }
            "content_block_delta" => {
                let delta = &v["delta"];
                match delta.get("type").and_then(|t| t.as_str()) {
                    Some("text_delta") => acc.text(delta["text"].as_str().unwrap_or("")),
                    Some("thinking_delta") => {
                        acc.thinking(delta["thinking"].as_str().unwrap_or(""))
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v["delta"].get("stop_reason").and_then(|r| r.as_str()) {
                    acc.finish = Some(stop_reason(r));
                }
                read_usage(&v["usage"], acc);
            }
            "message_stop" => {
                if let Some(index) = self.open_blocks.first() {
                    return Err(ModelError::StreamInterrupted {
                        message: format!(
                            "anthropic stream ended (stop_reason {}) inside content block {index}, \
                             which was never closed: the output is incomplete",
                            acc.finish
                                .as_ref()
                                .map(|f| format!("{f:?}"))
                                .unwrap_or_else(|| "none".into())
                        ),
                    });
                }
                acc.done = true
            }
            "error" => {
                return Err(core.classify_in_stream(provider_error_from_object(&v["error"])));
            }
            // ping and future event types.
            _ => {}
        }
        Ok(())
    }

    /// A complete `message` object: `content` blocks, `stop_reason`, `usage`.
    fn on_complete(
        &mut self,
        core: &HttpCore,
        v: &Value,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError> {
        if v.get("type").and_then(|t| t.as_str()) == Some("error") {
            return Err(core.classify_in_stream(provider_error_from_object(&v["error"])));
        }
        if let Some(blocks) = v.get("content").and_then(|c| c.as_array()) {
            for block in blocks {
                read_block(block, acc);
            }
        }
        if let Some(r) = v.get("stop_reason").and_then(|r| r.as_str()) {
            acc.finish = Some(stop_reason(r));
        }
        read_usage(&v["usage"], acc);
        Ok(())
    }
}

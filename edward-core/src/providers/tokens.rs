//! Token estimates and context windows, so the engine can refuse a turn that
//! cannot fit before paying for it.
//!
//! With feature `openai`, OpenAI model families are counted with the real
//! tokenizer (`tiktoken-rs`, whose BPE tables are embedded in the crate:
//! `o200k_base` for gpt-4o/4.1/5 and the o-series, `cl100k_base` for gpt-4 and
//! gpt-3.5). Everything else uses [`crate::pricing::estimate_tokens`]
//! (`ceil(bytes / 4)`), which over-counts code slightly — the safe side for a
//! fit check.

use crate::ModelRequest;
use crate::pricing::estimate_tokens;

/// Per-message framing overhead (role markers), as OpenAI documents it.
const TOKENS_PER_MESSAGE: u64 = 4;
/// Priming of the reply.
const TOKENS_PER_REPLY: u64 = 3;

/// Which tokenizer a model uses, if Edward knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tokenizer {
    O200k,
    Cl100k,
    Bytes,
}

fn tokenizer_for(model: &str) -> Tokenizer {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m); // `openai/gpt-4o` on OpenRouter
    if m.starts_with("gpt-4o")
        || m.starts_with("gpt-4.1")
        || m.starts_with("gpt-4.5")
        || m.starts_with("gpt-5")
        || m.starts_with("o1")
        || m.starts_with("o3")
        || m.starts_with("o4")
        || m.starts_with("chatgpt-4o")
    {
        Tokenizer::O200k
    } else if m.starts_with("gpt-4") || m.starts_with("gpt-3.5") {
        Tokenizer::Cl100k
    } else {
        Tokenizer::Bytes
    }
}

/// Tokens of `text` for `model` (tokenizer when known, else bytes / 4).
pub fn estimate_text_tokens(model: &str, text: &str) -> u64 {
    match tokenizer_for(model) {
        #[cfg(feature = "openai")]
        Tokenizer::O200k => tiktoken_rs::o200k_base_singleton().count_ordinary(text) as u64,
        #[cfg(feature = "openai")]
        Tokenizer::Cl100k => tiktoken_rs::cl100k_base_singleton().count_ordinary(text) as u64,
        _ => estimate_tokens(text),
    }
}

/// Estimated prompt tokens of `request`: system prompt and every message,
/// plus per-message framing.
///
/// ```
/// use edward_core::{Message, ModelRequest, Role};
/// let req = ModelRequest {
///     model: "claude-sonnet-4".into(),
///     system: "be brief".into(),
///     messages: vec![Message { role: Role::User, content: "hello world!".into() }],
///     max_output_tokens: None,
///     temperature: None,
/// };
/// assert!(edward_core::providers::estimate_request_tokens(&req) >= 5);
/// ```
pub fn estimate_request_tokens(request: &ModelRequest) -> u64 {
    let model = &request.model;
    let mut total = TOKENS_PER_REPLY;
    if !request.system.is_empty() {
        total += TOKENS_PER_MESSAGE + estimate_text_tokens(model, &request.system);
    }
    for m in &request.messages {
        total += TOKENS_PER_MESSAGE + estimate_text_tokens(model, &m.content);
    }
    total
}

/// Context windows (input + output tokens) by model-name prefix; the
/// longest matching prefix wins.
const CONTEXT_WINDOWS: &[(&str, u64)] = &[
    ("gpt-3.5-turbo", 16_385),
    ("gpt-4", 8_192),
    ("gpt-4-32k", 32_768),
    ("gpt-4-turbo", 128_000),
    ("gpt-4o", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.5", 128_000),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude-2", 100_000),
    ("claude-3", 200_000),
    ("claude-sonnet-4", 200_000),
    ("claude-opus-4", 200_000),
    ("claude-haiku-4", 200_000),
    ("gemini-1.0-pro", 32_760),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-2.0-flash", 1_048_576),
    ("gemini-2.5", 1_048_576),
    ("gemini-3", 1_048_576),
];

/// The context window of `model` in tokens, if Edward knows its family.
/// Provider prefixes such as `openai/` (OpenRouter) and `models/` are ignored.
///
/// ```
/// use edward_core::providers::context_window;
/// assert_eq!(context_window("gpt-4o-mini-2024-07-18"), Some(128_000));
/// assert_eq!(context_window("anthropic/claude-3-5-sonnet-latest"), Some(200_000));
/// assert_eq!(context_window("my-local-llama"), None);
/// ```
pub fn context_window(model: &str) -> Option<u64> {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m);
    CONTEXT_WINDOWS
        .iter()
        .filter(|(prefix, _)| m.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, w)| *w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Role};

    #[test]
    fn windows_by_longest_prefix() {
        assert_eq!(context_window("gpt-4"), Some(8_192));
        assert_eq!(context_window("gpt-4-turbo-preview"), Some(128_000));
        assert_eq!(context_window("gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(context_window("o1-mini"), Some(128_000));
        assert_eq!(context_window("models/gemini-2.5-pro"), Some(1_048_576));
        assert_eq!(context_window("claude-3-7-sonnet-20250219"), Some(200_000));
    }

    #[cfg(feature = "openai")]
    #[test]
    fn openai_models_use_the_real_tokenizer() {
        // "hello world" is two tokens in o200k and cl100k; bytes/4 says 3.
        assert_eq!(estimate_text_tokens("gpt-4o-mini", "hello world"), 2);
        assert_eq!(estimate_text_tokens("gpt-3.5-turbo", "hello world"), 2);
        assert_eq!(estimate_text_tokens("claude-3-5-haiku", "hello world"), 3);
    }

    #[test]
    fn request_estimate_counts_every_message() {
        let mut req = ModelRequest {
            model: "llama".into(),
            system: "x".repeat(400),
            messages: vec![],
            max_output_tokens: None,
            temperature: None,
        };
        let base = estimate_request_tokens(&req);
        assert_eq!(base, 3 + 4 + 100);
        req.messages.push(Message {
            role: Role::User,
            content: "y".repeat(40),
        });
        assert_eq!(estimate_request_tokens(&req), base + 4 + 10);
    }
}

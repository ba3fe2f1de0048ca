//! Token prices per model, feeding the USD budget. Overridable by the user.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::Usage;

/// Price of one model in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelPrice {
    /// USD per 1M input (prompt) tokens.
    pub input_per_mtok: f64,
    /// USD per 1M output (completion) tokens.
    pub output_per_mtok: f64,
}

impl ModelPrice {
    /// Cost of `usage` at this price.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input_per_mtok
            + usage.output_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// Per-model prices. Lookup is by exact name, then by the longest known
/// prefix (so `gpt-4o-mini-2024-07-18` finds `gpt-4o-mini`); unknown models
/// cost 0 and the engine says so in a `budget_warning`-free way (cost not tracked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    prices: HashMap<String, ModelPrice>,
}

impl PriceTable {
    /// An empty table.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Built-in list prices of common models (USD per 1M tokens; check your
    /// provider's current prices and override with [`PriceTable::set`]).
    pub fn builtin() -> Self {
        let mut t = Self::default();
        for (name, input, output) in [
            ("gpt-4o", 2.50, 10.00),
            ("gpt-4o-mini", 0.15, 0.60),
            ("gpt-4.1", 2.00, 8.00),
            ("gpt-4.1-mini", 0.40, 1.60),
            ("gpt-4.1-nano", 0.10, 0.40),
            ("o3-mini", 1.10, 4.40),
            ("claude-3-5-haiku", 0.80, 4.00),
            ("claude-3-5-sonnet", 3.00, 15.00),
            ("claude-3-7-sonnet", 3.00, 15.00),
            ("claude-sonnet-4", 3.00, 15.00),
            ("claude-opus-4", 15.00, 75.00),
            ("gemini-1.5-flash", 0.075, 0.30),
            ("gemini-1.5-pro", 1.25, 5.00),
            ("gemini-2.0-flash", 0.10, 0.40),
            ("gemini-2.5-flash", 0.30, 2.50),
            ("gemini-2.5-pro", 1.25, 10.00),
            ("scripted", 0.0, 0.0),
        ] {
            t.set(
                name,
                ModelPrice {
                    input_per_mtok: input,
                    output_per_mtok: output,
                },
            );
        }
        t
    }

    /// Set (or override) a model's price.
    pub fn set(&mut self, model: &str, price: ModelPrice) -> &mut Self {
        self.prices.insert(model.to_ascii_lowercase(), price);
        self
    }

    /// The price of `model`, if known.
    pub fn get(&self, model: &str) -> Option<ModelPrice> {
        let model = model.to_ascii_lowercase();
        if let Some(p) = self.prices.get(&model) {
            return Some(*p);
        }
        self.prices
            .iter()
            .filter(|(name, _)| model.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, p)| *p)
    }

    /// Cost of `usage` for `model` (0 when the model is unknown).
    pub fn cost(&self, model: &str, usage: &Usage) -> f64 {
        self.get(model).map(|p| p.cost(usage)).unwrap_or(0.0)
    }
}

/// Bytes per token used when no tokenizer applies (a documented, conservative
/// estimate for English text and code).
pub const BYTES_PER_TOKEN_ESTIMATE: u64 = 4;

/// Estimate tokens of `text` as `ceil(bytes / 4)`.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(BYTES_PER_TOKEN_ESTIMATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_lookup_prefers_longest() {
        let t = PriceTable::builtin();
        let mini = t.get("gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!(mini.input_per_mtok, 0.15);
        assert_eq!(t.get("gpt-4o-2024").unwrap().input_per_mtok, 2.50);
        assert!(t.get("unknown-model").is_none());
    }

    #[test]
    fn cost_is_per_million() {
        let p = ModelPrice {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
        };
        let u = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            estimated: false,
        };
        assert!((p.cost(&u) - 2.0).abs() < 1e-9);
    }
}

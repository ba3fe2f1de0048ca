//! Run budgets: limits, the counters a run has used, and 80 % warnings.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Usage;

/// Per-run budgets. Exhausting one ends the run with status `completed` and
/// reason `budget_exhausted:<budget>` — it is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budgets {
    /// Model turns (calls) per run.
    pub max_turns: u32,
    /// Tool calls (commands, installs, web searches) per turn; more are skipped.
    pub max_tool_calls_per_turn: u32,
    /// Tool calls per run; more are skipped.
    pub max_tool_calls_per_run: u32,
    /// Input (prompt) tokens summed over turns.
    pub max_input_tokens: u64,
    /// Output (completion) tokens summed over turns.
    pub max_output_tokens: u64,
    /// Cost in USD from the price table (unpriced models cost 0); `0.0` = no cost limit.
    pub max_cost_usd: f64,
    /// Wall clock for the whole run, from its first start, in milliseconds.
    pub deadline_ms: u64,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            max_turns: 12,
            max_tool_calls_per_turn: 12,
            max_tool_calls_per_run: 24,
            max_input_tokens: 2_000_000,
            max_output_tokens: 200_000,
            max_cost_usd: 5.0,
            deadline_ms: 30 * 60 * 1000,
        }
    }
}

impl Budgets {
    /// The wall-clock deadline.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }

    /// Check ranges; the error names the offending field and says why.
    pub fn validate(&self) -> Result<(), InvalidBudget> {
        fn range<T: PartialOrd + fmt::Display + Copy>(
            field: &'static str,
            v: T,
            lo: T,
            hi: T,
        ) -> Result<(), InvalidBudget> {
            if v < lo || v > hi {
                Err(InvalidBudget {
                    field,
                    reason: format!("{v} is outside {lo}..={hi}"),
                })
            } else {
                Ok(())
            }
        }
        range("budgets.max_turns", self.max_turns, 1, 100)?;
        range(
            "budgets.max_tool_calls_per_turn",
            self.max_tool_calls_per_turn,
            0,
            200,
        )?;
        range(
            "budgets.max_tool_calls_per_run",
            self.max_tool_calls_per_run,
            0,
            2000,
        )?;
        range(
            "budgets.max_input_tokens",
            self.max_input_tokens,
            1,
            100_000_000,
        )?;
        range(
            "budgets.max_output_tokens",
            self.max_output_tokens,
            1,
            10_000_000,
        )?;
        if !self.max_cost_usd.is_finite() {
            return Err(InvalidBudget {
                field: "budgets.max_cost_usd",
                reason: "not a finite number".into(),
            });
        }
        range("budgets.max_cost_usd", self.max_cost_usd, 0.0, 10_000.0)?;
        range("budgets.deadline_ms", self.deadline_ms, 1, 24 * 3600 * 1000)?;
        Ok(())
    }
}

/// A budget out of range: which field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
#[non_exhaustive]
pub struct InvalidBudget {
    /// The field (`budgets.max_turns`, …).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl Budgets {
    /// These budgets with every limit no higher than `ceiling`'s: the
    /// operator's budgets are ceilings a request may only lower. A
    /// `max_cost_usd` of 0 means "no cost limit", so it never lifts a
    /// ceiling above 0.
    pub fn capped_by(&self, ceiling: &Budgets) -> Budgets {
        let cost = match (self.max_cost_usd, ceiling.max_cost_usd) {
            (_, c) if c <= 0.0 => self.max_cost_usd,
            (r, c) if r <= 0.0 => c,
            (r, c) => r.min(c),
        };
        Budgets {
            max_turns: self.max_turns.min(ceiling.max_turns),
            max_tool_calls_per_turn: self
                .max_tool_calls_per_turn
                .min(ceiling.max_tool_calls_per_turn),
            max_tool_calls_per_run: self
                .max_tool_calls_per_run
                .min(ceiling.max_tool_calls_per_run),
            max_input_tokens: self.max_input_tokens.min(ceiling.max_input_tokens),
            max_output_tokens: self.max_output_tokens.min(ceiling.max_output_tokens),
            max_cost_usd: cost,
            deadline_ms: self.deadline_ms.min(ceiling.deadline_ms),
        }
    }
}

/// A budget's name, as it appears in events and terminal reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    /// `max_turns`.
    Turns,
    /// `max_tool_calls_per_turn`.
    ToolCallsPerTurn,
    /// `max_tool_calls_per_run`.
    ToolCallsPerRun,
    /// `max_input_tokens`.
    InputTokens,
    /// `max_output_tokens`.
    OutputTokens,
    /// `max_cost_usd`.
    Cost,
    /// `deadline_ms`.
    Deadline,
}

impl BudgetKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKind::Turns => "turns",
            BudgetKind::ToolCallsPerTurn => "tool_calls_per_turn",
            BudgetKind::ToolCallsPerRun => "tool_calls_per_run",
            BudgetKind::InputTokens => "input_tokens",
            BudgetKind::OutputTokens => "output_tokens",
            BudgetKind::Cost => "cost",
            BudgetKind::Deadline => "deadline",
        }
    }

    /// The terminal reason for exhausting it.
    pub fn exhausted_reason(self) -> String {
        format!("budget_exhausted:{}", self.as_str())
    }
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run has used so far; saved in every checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetState {
    /// Turns completed.
    pub turns: u32,
    /// Tool calls run (over all turns).
    pub tool_calls: u32,
    /// Input tokens used.
    pub input_tokens: u64,
    /// Output tokens used.
    pub output_tokens: u64,
    /// Whether any usage was estimated rather than reported.
    pub estimated: bool,
    /// USD spent.
    pub cost_usd: f64,
    /// Milliseconds since the run first started.
    pub elapsed_ms: u64,
    /// Budgets already warned about (80 %).
    pub warned: Vec<BudgetKind>,
}

impl BudgetState {
    /// Total usage.
    pub fn usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            estimated: self.estimated,
        }
    }

    /// Add one call's usage and cost.
    pub fn add_usage(&mut self, usage: &Usage, cost: f64) {
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        self.estimated |= usage.estimated;
        self.cost_usd += cost;
    }

    /// `(budget, used, limit)` for every budget measured as a running total.
    fn gauges(&self, b: &Budgets) -> [(BudgetKind, f64, f64); 6] {
        [
            (BudgetKind::Turns, self.turns as f64, b.max_turns as f64),
            (
                BudgetKind::ToolCallsPerRun,
                self.tool_calls as f64,
                b.max_tool_calls_per_run as f64,
            ),
            (
                BudgetKind::InputTokens,
                self.input_tokens as f64,
                b.max_input_tokens as f64,
            ),
            (
                BudgetKind::OutputTokens,
                self.output_tokens as f64,
                b.max_output_tokens as f64,
            ),
            (BudgetKind::Cost, self.cost_usd, b.max_cost_usd),
            (
                BudgetKind::Deadline,
                self.elapsed_ms as f64,
                b.deadline_ms as f64,
            ),
        ]
    }

    /// Budgets that just crossed 80 % (each reported once per run); marks them warned.
    pub fn new_warnings(&mut self, b: &Budgets) -> Vec<(BudgetKind, f64, f64)> {
        let mut out = Vec::new();
        for (kind, used, limit) in self.gauges(b) {
            if limit > 0.0 && used >= 0.8 * limit && !self.warned.contains(&kind) {
                self.warned.push(kind);
                out.push((kind, used, limit));
            }
        }
        out
    }

    /// The first running-total budget that is used up (`used >= limit`), in
    /// the order input tokens, output tokens, cost, deadline. Turns and tool
    /// calls are judged by [`super::decide_turn_outcome`].
    pub fn exhausted(&self, b: &Budgets) -> Option<BudgetKind> {
        if self.input_tokens >= b.max_input_tokens {
            Some(BudgetKind::InputTokens)
        } else if self.output_tokens >= b.max_output_tokens {
            Some(BudgetKind::OutputTokens)
        } else if b.max_cost_usd > 0.0 && self.cost_usd >= b.max_cost_usd {
            Some(BudgetKind::Cost)
        } else if self.elapsed_ms >= b.deadline_ms {
            Some(BudgetKind::Deadline)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_at_80_percent() {
        let b = Budgets {
            max_turns: 10,
            ..Budgets::default()
        };
        let mut s = BudgetState {
            turns: 7,
            ..Default::default()
        };
        assert!(s.new_warnings(&b).is_empty());
        s.turns = 8;
        let w = s.new_warnings(&b);
        assert_eq!(w, vec![(BudgetKind::Turns, 8.0, 10.0)]);
        s.turns = 9;
        assert!(s.new_warnings(&b).is_empty());
    }

    #[test]
    fn validate_names_the_field() {
        let b = Budgets {
            max_turns: 0,
            ..Budgets::default()
        };
        assert_eq!(b.validate().unwrap_err().field, "budgets.max_turns");
        let b = Budgets {
            max_cost_usd: f64::NAN,
            ..Budgets::default()
        };
        assert_eq!(b.validate().unwrap_err().field, "budgets.max_cost_usd");
        assert!(Budgets::default().validate().is_ok());
    }

    #[test]
    fn request_budgets_can_only_lower_the_operators() {
        let operator = Budgets::default();
        let greedy = Budgets {
            max_turns: 100,
            max_tool_calls_per_turn: 200,
            max_tool_calls_per_run: 2000,
            max_input_tokens: 100_000_000,
            max_output_tokens: 10_000_000,
            max_cost_usd: 10_000.0,
            deadline_ms: 24 * 3600 * 1000,
        };
        assert_eq!(greedy.capped_by(&operator), operator);
        let no_cost_limit = Budgets {
            max_cost_usd: 0.0,
            ..greedy
        };
        assert_eq!(no_cost_limit.capped_by(&operator).max_cost_usd, 5.0);
        let modest = Budgets {
            max_turns: 3,
            max_cost_usd: 0.5,
            deadline_ms: 1000,
            ..operator
        };
        assert_eq!(modest.capped_by(&operator), modest);
        let unlimited_operator = Budgets {
            max_cost_usd: 0.0,
            ..operator
        };
        assert_eq!(modest.capped_by(&unlimited_operator).max_cost_usd, 0.5);
    }

    #[test]
    fn exhausted_order() {
        let b = Budgets::default();
        let s = BudgetState {
            output_tokens: b.max_output_tokens,
            cost_usd: 100.0,
            ..Default::default()
        };
        assert_eq!(s.exhausted(&b), Some(BudgetKind::OutputTokens));
    }
}

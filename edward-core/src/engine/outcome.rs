//! The pure decision taken after every turn.

use serde::{Deserialize, Serialize};

use super::budget::{BudgetKind, BudgetState, Budgets};

/// What happened in one turn, as far as the decision needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFacts {
    /// The turn number (1-based).
    pub turn: u32,
    /// The model emitted `<edward_done/>`.
    pub done: bool,
    /// Files written to the sandbox this turn.
    pub files_written: u32,
    /// Tool calls with a result for the model (run, rejected, failed).
    pub tool_results: u32,
    /// A tool call was skipped because the per-turn limit was reached.
    pub skipped_turn_limit: bool,
    /// A tool call was skipped because the per-run limit was reached.
    pub skipped_run_limit: bool,
    /// The previous turn was a no-progress turn that got a nudge.
    pub previous_was_nudge: bool,
}

/// Why a run stops without the model saying done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A budget is used up.
    Budget(BudgetKind),
    /// Two turns in a row without files, tool calls or done.
    NoProgress,
}

impl StopReason {
    /// The terminal reason string (`budget_exhausted:<budget>`, `no_progress`).
    pub fn reason(self) -> String {
        match self {
            StopReason::Budget(k) => k.exhausted_reason(),
            StopReason::NoProgress => "no_progress".into(),
        }
    }
}

/// The decision after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    /// The model said done: finish `completed` with reason `done`.
    Complete,
    /// Run another turn with the tool results.
    Continue,
    /// Nothing happened: run another turn with a nudge message.
    Nudge,
    /// Finish `completed` with the stop reason.
    Stop(StopReason),
}

impl TurnOutcome {
    /// The name used in `turn_finished.outcome`.
    pub fn name(self) -> &'static str {
        match self {
            TurnOutcome::Complete => "complete",
            TurnOutcome::Continue => "continue",
            TurnOutcome::Nudge => "nudge",
            TurnOutcome::Stop(_) => "stop",
        }
    }
}

/// Decide what to do after a turn. Pure: no I/O, no clock.
///
/// `state` is the budget state *after* the turn was accounted (its `turns`
/// includes this turn). Rows are checked top to bottom; the first match wins:
///
/// | # | condition | outcome |
/// |---|---|---|
/// | 1 | `facts.done` | `Complete` (done wins over every budget) |
/// | 2 | input tokens, output tokens, cost or deadline used up (`used >= limit`, in that order) | `Stop(Budget(that))` |
/// | 3 | a tool call was skipped for the per-run limit | `Stop(Budget(ToolCallsPerRun))` |
/// | 4 | a tool call was skipped for the per-turn limit | `Stop(Budget(ToolCallsPerTurn))` |
/// | 5 | `state.turns >= budgets.max_turns` | `Stop(Budget(Turns))` |
/// | 6 | files written or tool results this turn | `Continue` |
/// | 7 | no progress and the previous turn was a nudge | `Stop(NoProgress)` |
/// | 8 | no progress | `Nudge` |
///
/// A skipped tool call (rows 3–4) ends the run because the model asked for
/// work the budget does not allow; continuing would only repeat the request.
pub fn decide_turn_outcome(
    facts: &TurnFacts,
    state: &BudgetState,
    budgets: &Budgets,
) -> TurnOutcome {
    if facts.done {
        return TurnOutcome::Complete;
    }
    if let Some(kind) = state.exhausted(budgets) {
        return TurnOutcome::Stop(StopReason::Budget(kind));
    }
    if facts.skipped_run_limit {
        return TurnOutcome::Stop(StopReason::Budget(BudgetKind::ToolCallsPerRun));
    }
    if facts.skipped_turn_limit {
        return TurnOutcome::Stop(StopReason::Budget(BudgetKind::ToolCallsPerTurn));
    }
    if state.turns >= budgets.max_turns {
        return TurnOutcome::Stop(StopReason::Budget(BudgetKind::Turns));
    }
    if facts.files_written > 0 || facts.tool_results > 0 {
        return TurnOutcome::Continue;
    }
    if facts.previous_was_nudge {
        TurnOutcome::Stop(StopReason::NoProgress)
    } else {
        TurnOutcome::Nudge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets() -> Budgets {
        Budgets {
            max_turns: 5,
            max_input_tokens: 1000,
            max_output_tokens: 500,
            max_cost_usd: 1.0,
            deadline_ms: 10_000,
            ..Budgets::default()
        }
    }

    fn state(turns: u32) -> BudgetState {
        BudgetState {
            turns,
            ..Default::default()
        }
    }

    #[test]
    fn decision_table() {
        use BudgetKind::*;
        use StopReason::*;
        use TurnOutcome::*;
        let b = budgets();
        let progress = TurnFacts {
            files_written: 1,
            ..Default::default()
        };
        let tools = TurnFacts {
            tool_results: 2,
            ..Default::default()
        };
        let nothing = TurnFacts::default();
        let done = TurnFacts {
            done: true,
            ..Default::default()
        };
        let nudged = TurnFacts {
            previous_was_nudge: true,
            ..Default::default()
        };
        let over_in = BudgetState {
            turns: 1,
            input_tokens: 1000,
            ..Default::default()
        };
        let over_out = BudgetState {
            turns: 1,
            output_tokens: 600,
            ..Default::default()
        };
        let over_cost = BudgetState {
            turns: 1,
            cost_usd: 1.5,
            ..Default::default()
        };
        let over_time = BudgetState {
            turns: 1,
            elapsed_ms: 10_000,
            ..Default::default()
        };
        let skip_run = TurnFacts {
            tool_results: 1,
            skipped_run_limit: true,
            skipped_turn_limit: true,
            ..Default::default()
        };
        let skip_turn = TurnFacts {
            tool_results: 1,
            skipped_turn_limit: true,
            ..Default::default()
        };
        let table: Vec<(&str, &TurnFacts, BudgetState, TurnOutcome)> = vec![
            ("done", &done, state(1), Complete),
            ("done beats max turns", &done, state(5), Complete),
            ("done beats tokens", &done, over_in.clone(), Complete),
            ("files -> continue", &progress, state(1), Continue),
            ("tools -> continue", &tools, state(1), Continue),
            ("nothing -> nudge", &nothing, state(1), Nudge),
            (
                "nothing after nudge -> stop",
                &nudged,
                state(2),
                Stop(NoProgress),
            ),
            ("max turns", &progress, state(5), Stop(Budget(Turns))),
            (
                "max turns beats nudge",
                &nothing,
                state(5),
                Stop(Budget(Turns)),
            ),
            (
                "input tokens",
                &progress,
                over_in,
                Stop(Budget(InputTokens)),
            ),
            (
                "output tokens",
                &progress,
                over_out,
                Stop(Budget(OutputTokens)),
            ),
            ("cost", &progress, over_cost, Stop(Budget(Cost))),
            ("deadline", &progress, over_time, Stop(Budget(Deadline))),
            (
                "per-run tools",
                &skip_run,
                state(1),
                Stop(Budget(ToolCallsPerRun)),
            ),
            (
                "per-turn tools",
                &skip_turn,
                state(1),
                Stop(Budget(ToolCallsPerTurn)),
            ),
        ];
        for (name, facts, st, want) in table {
            assert_eq!(decide_turn_outcome(facts, &st, &b), want, "row `{name}`");
        }
    }

    #[test]
    fn zero_cost_budget_means_unlimited_cost() {
        let b = Budgets {
            max_cost_usd: 0.0,
            ..budgets()
        };
        let f = TurnFacts {
            files_written: 1,
            ..Default::default()
        };
        assert_eq!(
            decide_turn_outcome(&f, &state(1), &b),
            TurnOutcome::Continue
        );
    }

    #[test]
    fn reasons() {
        assert_eq!(
            StopReason::Budget(BudgetKind::Cost).reason(),
            "budget_exhausted:cost"
        );
        assert_eq!(StopReason::NoProgress.reason(), "no_progress");
    }
}

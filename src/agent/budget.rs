//! Token budgets: how many tokens (input + output) a run, and a whole session, may use. The
//! loop checks them before each LLM step; a step that would start over a budget does not
//! start, and the run ends with `finish_reason: budget`.

use crate::model::Usage;

/// The token budgets in force for one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenBudget {
    /// Tokens this run may use; `None` = no limit.
    pub run: Option<u64>,
    /// Tokens the session may use over all its runs; `None` = no limit.
    pub session: Option<u64>,
    /// Tokens the session had used before this run began.
    pub session_used: u64,
}

/// Tokens of a usage, input and output together.
pub fn tokens(usage: Usage) -> u64 {
    usage.input_tokens.saturating_add(usage.output_tokens)
}

impl TokenBudget {
    /// The budgets of a run of a session: the session's own limits where it set them, else
    /// these (the server's defaults), with what the session has used so far.
    pub fn for_session(
        self,
        max_tokens: Option<u64>,
        max_run_tokens: Option<u64>,
        used: Usage,
    ) -> TokenBudget {
        TokenBudget {
            run: max_run_tokens.or(self.run),
            session: max_tokens.or(self.session),
            session_used: tokens(used),
        }
    }

    /// Why a run that has used `run_usage` so far may not start another step: the limit it
    /// reached, in words, or `None` while both budgets leave room.
    pub fn exceeded(&self, run_usage: Usage) -> Option<String> {
        let run_used = tokens(run_usage);
        if let Some(limit) = self.session {
            let used = self.session_used.saturating_add(run_used);
            if used >= limit {
                return Some(format!(
                    "token budget exhausted: the session has used {used} tokens \
                     (max_tokens={limit})"
                ));
            }
        }
        if let Some(limit) = self.run {
            if run_used >= limit {
                return Some(format!(
                    "token budget exhausted: the run has used {run_used} tokens \
                     (max_run_tokens={limit})"
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
        }
    }

    #[test]
    fn no_budget_never_stops() {
        assert_eq!(TokenBudget::default().exceeded(usage(u64::MAX, 1)), None);
    }

    #[test]
    fn the_run_budget_counts_input_and_output_of_this_run() {
        let budget = TokenBudget {
            run: Some(100),
            ..TokenBudget::default()
        };
        assert_eq!(budget.exceeded(usage(60, 39)), None);
        let why = budget.exceeded(usage(60, 40)).unwrap();
        assert!(why.contains("max_run_tokens=100"), "{why}");
    }

    #[test]
    fn the_session_budget_counts_earlier_runs() {
        let budget = TokenBudget {
            session: Some(100),
            ..TokenBudget::default()
        }
        .for_session(None, None, usage(50, 40));
        assert_eq!(budget.exceeded(usage(5, 4)), None);
        let why = budget.exceeded(usage(5, 5)).unwrap();
        assert!(why.contains("max_tokens=100"), "{why}");
        assert!(why.contains("100 tokens"), "{why}");
    }

    #[test]
    fn a_session_s_own_limits_win_over_the_server_s() {
        let server = TokenBudget {
            run: Some(10),
            session: Some(20),
            session_used: 0,
        };
        let budget = server.for_session(Some(2000), Some(1000), Usage::default());
        assert_eq!(budget.run, Some(1000));
        assert_eq!(budget.session, Some(2000));
        assert_eq!(
            server.for_session(None, None, Usage::default()).run,
            Some(10)
        );
    }
}

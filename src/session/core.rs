//! A session's state as its actor holds it.

use std::collections::HashMap;

use crate::model::waiting::Waiting;
use crate::model::{Message, RunRecord, RunResult, SessionRecord};

/// The session's state while its actor lives.
pub(super) struct Core {
    pub(super) record: SessionRecord,
    pub(super) next_seq: i64,
    /// The full history: read only for the commands that need it (runs, compactions), so
    /// that a cancel or a delete of a long session does not read all of it.
    pub(super) history: Vec<Message>,
    pub(super) history_loaded: bool,
    pub(super) last_result: Option<RunResult>,
    /// The newest run, for resume.
    pub(super) last_run: Option<RunRecord>,
    /// The newest run waits only for answers to its calls, and nothing drives it (found so
    /// after a restart or a takeover): what waits.
    pub(super) parked: Option<Waiting>,
    /// The newest artifact version of each path this actor has seen or recorded.
    pub(super) artifact_versions: HashMap<String, i64>,
    /// What the session's LLM steps cost so far, in US dollars (`None`: no step had a price);
    /// read from its steps with its history.
    pub(super) cost_usd: Option<f64>,
}

impl Core {
    /// Adds a step's cost to the session's total and answers the new total.
    pub(super) fn add_cost(&mut self, cost_usd: Option<f64>) -> Option<f64> {
        if let Some(cost) = cost_usd {
            let total = self.cost_usd.unwrap_or(0.0) + cost;
            self.cost_usd = Some(crate::llm::providers::round_usd(total));
        }
        self.cost_usd
    }
}

/// A session's state for tests: a new, idle session with its system message, history loaded.
#[cfg(test)]
pub(super) mod fixture {
    use super::*;
    use crate::model::{self, Role};

    pub fn core() -> Core {
        let now = model::now();
        let record = SessionRecord {
            message_count: 1,
            last_seq: 1,
            ..SessionRecord::new(model::new_id(), None, now)
        };
        Core {
            next_seq: 2,
            record,
            history: vec![Message::new(Role::System, "be brief")],
            history_loaded: true,
            last_result: None,
            last_run: None,
            parked: None,
            artifact_versions: HashMap::new(),
            cost_usd: None,
        }
    }
}

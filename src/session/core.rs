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
    /// This session as just read, with what an earlier load of it read beside the row (its
    /// history, its spend, its artifacts' versions) when nothing was written to it since: the
    /// same last event and message count. Any write of a run, a compaction or an artifact
    /// appends events, so an unchanged `last_seq` means none happened, on any replica. A
    /// replica that gives a session's lease back after each run then does not read a long
    /// history and every step again at the next run.
    pub(super) fn carrying(mut self, earlier: Option<Core>) -> Core {
        let Some(earlier) = earlier else {
            return self;
        };
        let unchanged = earlier.history_loaded
            && earlier.record.last_seq == self.record.last_seq
            && earlier.record.message_count == self.record.message_count
            && earlier.history.len() as i64 == self.record.message_count;
        if unchanged {
            self.history = earlier.history;
            self.history_loaded = true;
            self.cost_usd = earlier.cost_usd;
            self.artifact_versions = earlier.artifact_versions;
        }
        self
    }

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

#[cfg(test)]
mod tests {
    use super::fixture::core;
    use super::*;

    #[test]
    fn a_session_read_again_keeps_its_history_only_if_nothing_was_written_since() {
        // The same session read again from the store: its row, nothing loaded beside it.
        let read_again = |earlier: &Core| Core {
            history: Vec::new(),
            history_loaded: false,
            artifact_versions: HashMap::new(),
            cost_usd: None,
            ..core_like(earlier)
        };
        let mut earlier = core();
        earlier.cost_usd = Some(0.25);
        earlier.artifact_versions.insert("a.txt".into(), 3);
        let fresh = read_again(&earlier);
        let kept = fresh.carrying(Some(core_like(&earlier)));
        assert!(kept.history_loaded);
        assert_eq!(kept.history.len(), 1);
        assert_eq!(kept.cost_usd, Some(0.25));
        assert_eq!(kept.artifact_versions.get("a.txt"), Some(&3));

        // Another replica appended to the log (a run, a compaction): everything is read again.
        let mut moved = read_again(&earlier);
        moved.record.last_seq += 5;
        moved.record.message_count += 2;
        let reloaded = moved.carrying(Some(core_like(&earlier)));
        assert!(!reloaded.history_loaded);
        assert!(reloaded.history.is_empty());
        assert_eq!(reloaded.cost_usd, None);

        // An earlier load without its history has nothing to keep.
        let mut bare = core_like(&earlier);
        bare.history_loaded = false;
        assert!(!read_again(&earlier).carrying(Some(bare)).history_loaded);
    }

    fn core_like(c: &Core) -> Core {
        Core {
            record: c.record.clone(),
            next_seq: c.next_seq,
            history: c.history.clone(),
            history_loaded: c.history_loaded,
            last_result: None,
            last_run: None,
            parked: None,
            artifact_versions: c.artifact_versions.clone(),
            cost_usd: c.cost_usd,
        }
    }
}

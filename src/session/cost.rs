//! A session's spend in money: the sum of its LLM steps' costs, as their records keep them.

use uuid::Uuid;

use crate::llm::providers::round_usd;
use crate::model::{AgentStep, StepKind};
use crate::store::{Store, StoreResult};

/// What the session's LLM steps cost, in US dollars; `None` when none of them had a price.
pub(super) async fn spent(store: &dyn Store, session_id: Uuid) -> StoreResult<Option<f64>> {
    let steps = store.steps(session_id, None, i64::MAX).await?;
    let costs = steps
        .into_iter()
        .filter(|step| step.kind == StepKind::Llm)
        .filter_map(|step| match AgentStep::from(step) {
            AgentStep::Llm { cost_usd, .. } => cost_usd,
            _ => None,
        });
    Ok(costs.fold(None, |total, cost| {
        Some(round_usd(total.unwrap_or(0.0) + cost))
    }))
}

/// Whose cap bounds a session's spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CapSource {
    /// The session's own `max_cost_usd`.
    Session,
    /// Its agent's `max_cost_usd` (the session set none of its own).
    Agent,
}

/// The caps in money a run is bounded by, checked before each of its LLM steps. A step's cost
/// is known only once it is done, so a run stops at the first step boundary at or over a cap:
/// the last step may take the spend past it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(in crate::session) struct CostCaps {
    /// The session's cap (its own, else its agent's), on everything it has spent.
    pub session: Option<(f64, CapSource)>,
    /// The cap of a schedule's fire, on what this run spends.
    pub run: Option<f64>,
}

impl CostCaps {
    /// The caps of a run of a session: its own cap, else its agent's, and the fire's.
    pub fn new(own: Option<f64>, agent: Option<f64>, fire: Option<f64>) -> CostCaps {
        let session = match (own, agent) {
            (Some(cap), _) => Some((cap, CapSource::Session)),
            (None, Some(cap)) => Some((cap, CapSource::Agent)),
            (None, None) => None,
        };
        CostCaps { session, run: fire }
    }

    /// Why the run may not start another LLM step, in words: the first cap its spend is at or
    /// over (`session`: what the session has spent, `run`: what this run has), or `None`.
    pub fn reached(&self, session: Option<f64>, run: f64) -> Option<String> {
        if let Some(cap) = self.run {
            if run >= cap {
                return Some(format!(
                    "cost budget reached: this run, started by a schedule, has spent {} \
                     (the schedule's max_cost_usd={cap})",
                    usd(run)
                ));
            }
        }
        let (cap, source) = self.session?;
        let spent = session.unwrap_or(0.0);
        (spent >= cap).then(|| {
            let whose = match source {
                CapSource::Session => "the session's max_cost_usd",
                CapSource::Agent => "its agent's max_cost_usd",
            };
            format!(
                "cost budget reached: the session has spent {} ({whose}={cap}); raise it \
                 with POST /v1/sessions/{{id}} {{\"max_cost_usd\": …}}, then resume",
                usd(spent)
            )
        })
    }
}

/// A dollar amount as the reasons show it.
pub(super) fn usd(amount: f64) -> String {
    format!("${}", round_usd(amount))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_s_own_cap_wins_over_its_agent_s() {
        let caps = CostCaps::new(Some(0.5), Some(0.1), None);
        assert_eq!(caps.session, Some((0.5, CapSource::Session)));
        assert_eq!(caps.reached(Some(0.2), 0.2), None);
        let why = caps.reached(Some(0.5), 0.0).expect("at the cap");
        assert!(why.contains("the session's max_cost_usd=0.5"), "{why}");
        let inherited = CostCaps::new(None, Some(0.1), None);
        let why = inherited.reached(Some(0.1000001), 0.0).expect("over");
        assert!(why.contains("its agent's max_cost_usd=0.1"), "{why}");
        assert!(why.contains("$0.1000001"), "{why}");
    }

    #[test]
    fn a_fire_s_cap_bounds_what_its_run_spends() {
        let caps = CostCaps::new(None, None, Some(0.01));
        assert_eq!(caps.reached(Some(5.0), 0.009), None);
        let why = caps.reached(Some(5.0), 0.01).expect("at the cap");
        assert!(why.contains("the schedule's max_cost_usd=0.01"), "{why}");
    }

    #[test]
    fn no_cap_and_no_price_never_stop() {
        assert_eq!(CostCaps::default().reached(Some(1e9), 1e9), None);
        let caps = CostCaps::new(Some(0.01), None, None);
        assert_eq!(caps.reached(None, 0.0), None);
    }
}

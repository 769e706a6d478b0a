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

//! Rebuilding the exact request an LLM step sent, from the descriptor it stored: the stored
//! history up to `upto`, projected with the system prompt and budget that were in force, and
//! the tools that were offered.

use serde_json::{json, Value};
use uuid::Uuid;

use super::lineage;
use crate::agent::context;
use crate::model::{
    client_tools_of, AgentStep, AgentTag, LlmRequestDescriptor, StepKind, ToolSchema,
};
use crate::session::deps::SessionDeps;
use crate::store::{StoreError, StoreResult};
use crate::tools::{client::ClientSide, Tool};

/// One step as served: an LLM step also shows its `projection` (the descriptor) and the
/// `request` rebuilt from it.
pub(super) async fn with_request(
    deps: &SessionDeps,
    session_id: Uuid,
    step_id: Uuid,
) -> StoreResult<Option<Value>> {
    let Some(step) = deps.store.step(session_id, step_id).await? else {
        return Ok(None);
    };
    // Plain data: serialising it cannot fail.
    let mut view = serde_json::to_value(AgentStep::from(step.clone())).unwrap_or(Value::Null);
    if step.kind == StepKind::Llm {
        let descriptor: LlmRequestDescriptor = serde_json::from_value(step.request.clone())
            .map_err(|e| {
                StoreError::Corrupt(format!("the request descriptor of step {step_id}: {e}"))
            })?;
        let history = deps
            .store
            .messages(session_id, -1, descriptor.upto as i64)
            .await?;
        let (messages, _) =
            context::prepare_context(&history, &descriptor.system_prompt, descriptor.budget);
        let tools: Vec<_> = offered(deps, session_id, step.run_id, descriptor.agent.as_ref())
            .await?
            .into_iter()
            .filter(|t| descriptor.tools.contains(&t.name))
            .collect();
        view["projection"] = step.request;
        view["request"] = json!({
            "model": descriptor.model,
            "messages": messages,
            "tools": tools,
        });
    }
    Ok(Some(view))
}

/// Every tool a step of the run may have offered: the server's, its MCP servers' (as they are
/// now), `task`, and the client tools (the run's own, then the session's, then those of the
/// agent version that made the step).
async fn offered(
    deps: &SessionDeps,
    session_id: Uuid,
    run_id: Uuid,
    agent: Option<&AgentTag>,
) -> StoreResult<Vec<ToolSchema>> {
    let mut tools: Vec<ToolSchema> = deps.agent.tools.schemas().into_iter().cloned().collect();
    tools.extend(deps.mcp.tools(None).iter().map(|t| t.schema()));
    tools.push(lineage::task_schema());
    if let Some(record) = deps.store.session(session_id).await? {
        let run = deps.store.run(session_id, run_id).await?;
        let mut client: Vec<_> = match &run {
            Some(run) => client_tools_of(&record, run).cloned().collect(),
            None => record.options.client_tools.clone(),
        };
        let version = match (agent.and_then(|a| a.id.stored()), deps.store.agents()) {
            (Some(id), Some(agents)) => agents.agent(id, agent.map(|a| a.version)).await?,
            _ => None,
        };
        if let Some(version) = version {
            let own = version.spec.client_tools.into_iter();
            let own: Vec<_> = own
                .filter(|t| !client.iter().any(|c| c.name == t.name))
                .collect();
            client.extend(own);
        }
        tools.extend(client.into_iter().map(|t| ClientSide(t).schema()));
    }
    Ok(tools)
}

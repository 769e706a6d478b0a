//! `task {description, prompt, agent}` delegates to one of the parent agent's `subagents` (by
//! name or id): the child session runs that agent, with its own prompt and tools. Any other
//! `agent` fails the call with an error naming the allowed entries, and starts no child.
//!
//! The mock model calls a tool with the input "call `TOOL` with {JSON}".

use serde_json::{json, Value};

use super::*;

fn task_input(agent: &str) -> String {
    let arguments =
        json!({"description": "a look around", "prompt": "look around", "agent": agent});
    format!("call `task` with {arguments}")
}

/// A helper agent and a lead agent that may delegate to it (by `entry`, a function of the
/// helper's view); returns `(lead id, helper id)`.
async fn lead_and_helper(server: &TestServer, entry: fn(&Value) -> Value) -> (String, String) {
    let helper = mock_agent(server, "helper", "You help.", &["list_files"]).await;
    let lead = create_agent(
        server,
        &json!({
            "name": "lead",
            "model": "mock",
            "system_prompt": "You lead.",
            "tools": ["list_files", "read_file", "task"],
            "tool_policy": [{"tool": "task", "action": "allow"}],
            "subagents": [entry(&helper)],
        }),
    )
    .await;
    // Entries are kept as given, or as the id they name (names need not be unique).
    assert!(
        lead["subagents"] == json!([entry(&helper)]) || lead["subagents"] == json!([helper["id"]]),
        "{lead}"
    );
    (id_of(&lead), id_of(&helper))
}

#[tokio::test]
async fn task_runs_a_named_subagent_in_the_child_session() {
    let server = TestServer::start(ServerOptions::new()).await;
    let (lead, helper) = lead_and_helper(&server, |h| h["name"].clone()).await;
    let session = id_of(&session_on(&server, json!({"agent": lead})).await);
    let result = server.run_wait(&session, &task_input("helper")).await;
    assert_eq!(result["status"], "completed", "{result}");

    let children = server.children(&session).await;
    assert_eq!(children.len(), 1, "{children:?}");
    let child = &children[0];
    assert_eq!(child["agent"]["id"], helper.as_str(), "{child}");
    assert_eq!(child["agent"]["version"], 1, "{child}");
    assert_eq!(child["agent"]["name"], "helper", "{child}");
    let child_id = id_of(child);
    let views = server.llm_step_views(&child_id).await;
    assert_steps_ran(&views, &helper, 1, "You help.", &["list_files"]);
    // The parent ran its own agent.
    let views = server.llm_step_views(&session).await;
    assert_steps_ran(
        &views,
        &lead,
        1,
        "You lead.",
        &["list_files", "read_file", "task"],
    );
}

#[tokio::test]
async fn task_takes_a_subagent_by_id_and_refuses_any_other() {
    let server = TestServer::start(ServerOptions::new()).await;
    let (lead, helper) = lead_and_helper(&server, |h| h["id"].clone()).await;
    let stranger = mock_agent(&server, "stranger", "Not allowed.", &["list_files"]).await;
    let session = id_of(&session_on(&server, json!({"agent": lead})).await);

    let result = server.run_wait(&session, &task_input(&helper)).await;
    assert_eq!(result["status"], "completed", "{result}");
    let children = server.children(&session).await;
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(
        children[0]["agent"]["id"],
        helper.as_str(),
        "{}",
        children[0]
    );

    let result = server
        .run_wait(&session, &task_input(&id_of(&stranger)))
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        server.children(&session).await.len(),
        1,
        "a refused task started a child"
    );
    let events = server.events(&session).await;
    let finished = events
        .iter()
        .rfind(|e| e["type"] == "tool.finished")
        .unwrap_or_else(|| panic!("no tool.finished: {}", describe(&events)));
    assert_eq!(finished["data"]["is_error"], true, "{finished}");
    let output = finished["data"]["output"].as_str().unwrap_or("");
    assert!(
        output.contains(&helper) || output.contains("helper"),
        "the error does not name the allowed entries: {output}"
    );
}

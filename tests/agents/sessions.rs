//! Sessions on agents: `agent` as an id pins the version current at creation, `{id, version}`
//! pins that one, `{id, version: "latest"}` follows updates at each run. What a run used shows
//! in the session view (`agent {id, version, name}`), in `session.created` (agent and model)
//! and in every LLM step: its descriptor names the agent version, its rebuilt request starts
//! with that version's system prompt and offers that version's tools. Forks keep the agent
//! unless their body names another.

use serde_json::{json, Value};

use super::*;

const V1_PROMPT: &str = "You are version one.";
const V2_PROMPT: &str = "Tu es la version deux.";
const V1_TOOLS: [&str; 2] = ["list_files", "read_file"];
const V2_TOOLS: [&str; 1] = ["list_files"];

/// An agent at version 1, and a function that makes its version 2 (another prompt and fewer
/// tools).
async fn versioned_agent(server: &TestServer, name: &str) -> String {
    let agent = mock_agent(server, name, V1_PROMPT, &V1_TOOLS).await;
    id_of(&agent)
}

async fn make_v2(server: &TestServer, id: &str) {
    let v2 = updated(
        server,
        id,
        &json!({"system_prompt": V2_PROMPT, "tools": V2_TOOLS}),
    )
    .await;
    assert_eq!(v2["version"], 2, "{v2}");
}

/// Runs a turn that must complete; returns its LLM step views.
async fn turn(server: &TestServer, session: &str, input: &str) -> Vec<Value> {
    let result = server.run_wait(session, input).await;
    assert_eq!(result["status"], "completed", "{result}");
    run_step_views(server, session, &result["run_id"]).await
}

#[tokio::test]
async fn an_agent_id_pins_the_version_current_at_creation() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = versioned_agent(&server, "pinned agent").await;
    let session = session_on(&server, json!({"agent": id})).await;
    let sid = id_of(&session);
    assert_eq!(session["agent"]["id"], id.as_str(), "{session}");
    assert_eq!(session["agent"]["version"], 1, "{session}");
    assert_eq!(session["agent"]["name"], "pinned agent", "{session}");
    assert!(
        session["agent"]
            .get("follows_latest")
            .is_none_or(|f| f == false),
        "{session}"
    );
    let views = turn(&server, &sid, "first turn").await;
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);
    assert_eq!(
        views[0]["projection"]["provider"], "default",
        "{}",
        views[0]
    );

    make_v2(&server, &id).await;
    let views = turn(&server, &sid, "second turn").await;
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);
    let session = server.session(&sid).await;
    assert_eq!(session["agent"]["version"], 1, "{session}");
    // The stored history starts with the prompt of the version it runs.
    let messages = server.messages(&sid).await;
    assert_eq!(messages[0]["content"], V1_PROMPT, "{messages:?}");
    // The first turn's steps still show what they sent.
    let all = server.llm_step_views(&sid).await;
    assert_steps_ran(&all, &id, 1, V1_PROMPT, &V1_TOOLS);
}

#[tokio::test]
async fn latest_follows_updates_at_each_run() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = versioned_agent(&server, "follower").await;
    let session = session_on(&server, json!({"agent": {"id": id, "version": "latest"}})).await;
    let sid = id_of(&session);
    assert_eq!(
        session["agent"],
        json!({"id": id, "version": 1, "name": "follower", "follows_latest": true}),
        "{session}"
    );
    let views = turn(&server, &sid, "first turn").await;
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);

    make_v2(&server, &id).await;
    let views = turn(&server, &sid, "second turn").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);
    // The first run's steps still show version 1.
    let all = server.llm_step_views(&sid).await;
    let versions: Vec<&Value> = all
        .iter()
        .map(|v| &v["projection"]["agent"]["version"])
        .collect();
    assert_eq!(versions.first(), Some(&&json!(1)), "{versions:?}");
    assert_eq!(versions.last(), Some(&&json!(2)), "{versions:?}");
    // The view shows the version its last run used.
    let session = server.session(&sid).await;
    assert_eq!(
        session["agent"],
        json!({"id": id, "version": 2, "name": "follower", "follows_latest": true}),
        "{session}"
    );
}

#[tokio::test]
async fn an_explicit_version_runs_that_version() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = versioned_agent(&server, "explicit").await;
    make_v2(&server, &id).await;
    let old = session_on(&server, json!({"agent": {"id": id, "version": 1}})).await;
    let new = session_on(&server, json!({"agent": {"id": id, "version": 2}})).await;
    let current = session_on(&server, json!({"agent": id})).await;
    assert_eq!(old["agent"]["version"], 1, "{old}");
    assert_eq!(new["agent"]["version"], 2, "{new}");
    assert_eq!(current["agent"]["version"], 2, "{current}");
    let views = turn(&server, &id_of(&old), "on version one").await;
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);
    let views = turn(&server, &id_of(&new), "on version two").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);
    let views = turn(&server, &id_of(&current), "on the current one").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);
}

#[tokio::test]
async fn session_created_records_the_agent_and_its_model() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = versioned_agent(&server, "recorded").await;
    let session = session_on(&server, json!({"agent": id, "title": "on an agent"})).await;
    let sid = id_of(&session);
    let events = server.events(&sid).await;
    assert_eq!(events[0]["type"], "session.created", "{events:?}");
    let data = &events[0]["data"];
    assert_eq!(data["session_id"], sid.as_str(), "{data}");
    assert_eq!(
        data["agent"],
        json!({"id": id, "version": 1, "name": "recorded"}),
        "{data}"
    );
    assert_eq!(data["model"], "default/mock", "{data}");

    let plain = server.create_session().await;
    let events = server.events(&plain).await;
    let data = &events[0]["data"];
    assert_eq!(data["agent"]["id"], "default", "{data}");
    assert_eq!(data["agent"]["name"], "default", "{data}");
    assert_eq!(data["model"], "default/mock", "{data}");
    // The session lists show the agent too.
    let listed = server.sessions().await;
    let shown = listed
        .iter()
        .find(|s| id_of(s) == sid)
        .unwrap_or_else(|| panic!("{sid} is not listed: {listed:?}"));
    assert_eq!(shown["agent"], session["agent"], "{shown}");
}

#[tokio::test]
async fn the_agents_tools_are_what_the_model_is_offered_and_a_session_may_narrow_them() {
    let server = TestServer::start(ServerOptions::new()).await;
    let reader = mock_agent(
        &server,
        "reader",
        "Read only.",
        &["list_files", "read_file"],
    )
    .await;
    let reader = id_of(&reader);
    let all_tools = create_agent(
        &server,
        &json!({"name": "everything", "model": "mock", "system_prompt": "All."}),
    )
    .await;
    let all_tools = id_of(&all_tools);

    let on_reader = session_on(&server, json!({"agent": reader})).await;
    let views = turn(&server, &id_of(&on_reader), "look").await;
    assert_steps_ran(
        &views,
        &reader,
        1,
        "Read only.",
        &["list_files", "read_file"],
    );
    for view in &views {
        assert_eq!(
            view["projection"]["tools"]
                .as_array()
                .map(|t| t.len())
                .unwrap_or(0),
            2,
            "{view}"
        );
    }

    let narrowed = session_on(&server, json!({"agent": reader, "tools": ["list_files"]})).await;
    let views = turn(&server, &id_of(&narrowed), "look again").await;
    assert_steps_ran(&views, &reader, 1, "Read only.", &["list_files"]);

    // An agent without `tools` offers every built-in tool of the server and `task`.
    let on_all = session_on(&server, json!({"agent": all_tools})).await;
    let views = turn(&server, &id_of(&on_all), "look everywhere").await;
    let offered = offered_tool_names(&views[0]);
    for tool in [
        "list_files",
        "read_file",
        "glob",
        "grep",
        "write_file",
        "edit_file",
        "task",
    ] {
        assert!(
            offered.iter().any(|t| t == tool),
            "{tool} is not offered: {offered:?}"
        );
    }

    // A session's system_prompt replaces the agent's for that session.
    let own_prompt = session_on(
        &server,
        json!({"agent": reader, "system_prompt": "The session's own prompt."}),
    )
    .await;
    let views = turn(&server, &id_of(&own_prompt), "look").await;
    assert_steps_ran(
        &views,
        &reader,
        1,
        "The session's own prompt.",
        &["list_files", "read_file"],
    );
}

#[tokio::test]
async fn a_fork_keeps_the_agent_unless_its_body_names_another() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = versioned_agent(&server, "parent agent").await;
    let other = mock_agent(&server, "other agent", "The other one.", &["list_files"]).await;
    let other = id_of(&other);
    let pinned = id_of(&session_on(&server, json!({"agent": id})).await);
    let following =
        id_of(&session_on(&server, json!({"agent": {"id": id, "version": "latest"}})).await);
    turn(&server, &pinned, "before the fork").await;
    turn(&server, &following, "before the fork").await;
    make_v2(&server, &id).await;

    let fork = |source: &str, body: Value| {
        let path = format!("/v1/sessions/{source}/fork");
        let server = &server;
        async move {
            server
                .post_json(&path, &body)
                .await
                .expect_json(reqwest::StatusCode::CREATED, &format!("POST {path} {body}"))
        }
    };

    let kept = fork(&pinned, json!({})).await;
    assert_eq!(kept["agent"]["id"], id.as_str(), "{kept}");
    assert_eq!(kept["agent"]["version"], 1, "{kept}");
    let views = turn(&server, &id_of(&kept), "on the fork").await;
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);

    let kept_following = fork(&following, json!({})).await;
    assert_eq!(
        kept_following["agent"]["follows_latest"], true,
        "{kept_following}"
    );
    let views = turn(&server, &id_of(&kept_following), "on the fork").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);

    let switched = fork(&pinned, json!({"agent": other})).await;
    assert_eq!(
        switched["agent"],
        json!({"id": other, "version": 1, "name": "other agent"}),
        "{switched}"
    );
    let views = turn(&server, &id_of(&switched), "on the other agent").await;
    assert_steps_ran(&views, &other, 1, "The other one.", &["list_files"]);

    let to_latest = fork(&pinned, json!({"agent": {"id": id, "version": "latest"}})).await;
    assert_eq!(to_latest["agent"]["follows_latest"], true, "{to_latest}");
    let views = turn(&server, &id_of(&to_latest), "on the latest").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);

    // The sources are unchanged.
    assert_eq!(server.session(&pinned).await["agent"]["version"], 1);
    let unknown = uuid::Uuid::now_v7();
    let reply = server
        .post_json(
            &format!("/v1/sessions/{pinned}/fork"),
            &json!({"agent": unknown.to_string()}),
        )
        .await;
    reply.expect_problem(
        reqwest::StatusCode::NOT_FOUND,
        "a fork onto an unknown agent",
    );
}

#[tokio::test]
async fn the_agents_client_tools_and_limits_apply_to_its_sessions() {
    let server = TestServer::start(ServerOptions::new()).await;
    let agent = create_agent(
        &server,
        &json!({
            "name": "brief",
            "model": "mock",
            "system_prompt": "Be brief.",
            "tools": ["list_files", "read_file"],
            "client_tools": [{"name": "pick_colour", "description": "Asks the user for a colour.",
                              "input_schema": {"type": "object"}}],
            "max_steps": 1,
        }),
    )
    .await;
    let id = id_of(&agent);
    let session = id_of(&session_on(&server, json!({"agent": id})).await);
    let limited = server.run_wait(&session, "too many steps").await;
    assert_eq!(limited["finish_reason"], "max_steps", "{limited}");
    assert_eq!(limited["status"], "failed", "{limited}");
    assert_eq!(limited["steps"], 1, "{limited}");
    let views = run_step_views(&server, &session, &limited["run_id"]).await;
    assert_steps_ran(
        &views,
        &id,
        1,
        "Be brief.",
        &["list_files", "read_file", "pick_colour"],
    );
    // Another agent's sessions are not limited by it.
    let free = mock_agent(&server, "free", "Free.", &["list_files", "read_file"]).await;
    let free_session = id_of(&session_on(&server, json!({"agent": id_of(&free)})).await);
    let result = server
        .run_wait(&free_session, "as many steps as needed")
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["steps"], 3, "{result}");
}

#[tokio::test]
async fn a_call_of_the_agents_client_tool_waits_for_the_clients_result() {
    let server = TestServer::start(ServerOptions::new()).await;
    let agent = create_agent(
        &server,
        &json!({
            "name": "asker",
            "model": "mock",
            "tools": ["list_files"],
            "client_tools": [{"name": "pick_colour", "description": "Asks the user for a colour.",
                              "input_schema": {"type": "object"}}],
        }),
    )
    .await;
    let session = id_of(&session_on(&server, json!({"agent": id_of(&agent)})).await);
    // The mock calls the first tool that is not a built-in one: the agent's client tool.
    server
        .start_run(&session, "ask the client for a colour")
        .await;
    let waiting = server
        .poll_session(
            &session,
            "waiting_tool",
            std::time::Duration::from_secs(10),
            |s| s["state"] == "waiting_tool" || s["state"] == "completed",
        )
        .await;
    assert_eq!(waiting["state"], "waiting_tool", "{waiting}");
    let events = server.events(&session).await;
    let requested = events
        .iter()
        .find(|e| e["type"] == "tool.client-requested")
        .unwrap_or_else(|| panic!("no tool.client-requested: {events:?}"));
    assert_eq!(requested["data"]["tool"], "pick_colour");
    let call_id = requested["data"]["call_id"].as_str().unwrap().to_string();
    let reply = server
        .post_json(
            &format!("/v1/sessions/{session}/tool-results/{call_id}"),
            &json!({"output": "teal"}),
        )
        .await;
    reply.expect_json(reqwest::StatusCode::OK, "the client's result");
    let done = server
        .poll_session(
            &session,
            "completed",
            std::time::Duration::from_secs(10),
            |s| s["state"] == "completed",
        )
        .await;
    assert_eq!(done["state"], "completed");
    let messages = server.messages(&session).await;
    assert!(
        messages.iter().any(|m| m.to_string().contains("teal")),
        "the result reached the history: {messages:?}"
    );
}

#[tokio::test]
async fn a_run_keeps_the_version_it_started_with_when_the_agent_changes_mid_run() {
    // Asked to think, the mock streams reasoning before each of its three replies, slowly.
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(25)).await;
    let id = versioned_agent(&server, "steady").await;
    let session = session_on(&server, json!({"agent": {"id": id, "version": "latest"}})).await;
    let sid = id_of(&session);
    let run = server.start_run(&sid, "think, then look").await;
    let run_id = id_of(&run);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.llm_step_count(&sid).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no LLM step began");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let v2 = updated(
        &server,
        &id,
        &json!({"system_prompt": V2_PROMPT, "tools": V2_TOOLS}),
    )
    .await;
    let ended = server.wait_run(&sid, &run_id).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    let views = run_step_views(&server, &sid, &json!(run_id)).await;
    assert_eq!(views.len(), 3, "list, read, answer: {views:?}");
    let changed: chrono::DateTime<chrono::Utc> = v2["updated_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("updated_at");
    let last_began: chrono::DateTime<chrono::Utc> = views[2]["created_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("created_at of the last step");
    assert!(
        changed < last_began,
        "the update came after the run's last LLM step began ({changed} ≥ {last_began}); \
         the test proves nothing: slow the mock down"
    );
    assert_steps_ran(&views, &id, 1, V1_PROMPT, &V1_TOOLS);
    // The next run starts on the new version.
    let views = turn(&server, &sid, "again").await;
    assert_steps_ran(&views, &id, 2, V2_PROMPT, &V2_TOOLS);
}

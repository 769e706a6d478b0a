//! The agent resource: create (201, Location, ETag, a UUID v7, version 1, the fields echoed),
//! get, list (newest first, paged, archived ones only when asked), versions, updates (a new
//! version; conditional with `If-Match`; none for a body that changes nothing; `null` clears a
//! field), archiving (idempotent; new sessions refused while a running one goes on), and the
//! `default` agent built from the flags, which cannot be changed.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::json;

use super::*;

fn is_uuid_v7(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|u| u.get_version_num() == 7)
        && id.len() == 36
        && id == id.to_lowercase()
}

#[tokio::test]
async fn create_answers_the_agent_at_version_1_and_get_reads_it() {
    let server = TestServer::start(ServerOptions::new()).await;
    let body = json!({
        "name": "codeur à lunettes",
        "description": "reads the code",
        "model": "mock",
        "system_prompt": "You read code.\nOnly that.",
        "tools": ["list_files", "read_file"],
        "tool_policy": [{"tool": "read_file", "action": "allow"}],
        "max_steps": 4,
        "metadata": {"team": "docs", "n": [1, 2]},
    });
    let reply = server.post_json("/v1/agents", &body).await;
    let agent = reply.expect_json(StatusCode::CREATED, "POST /v1/agents");
    let id = id_of(&agent);
    assert!(is_uuid_v7(&id), "the id is not a UUID v7: {agent}");
    assert_eq!(
        reply.headers.get("location").and_then(|v| v.to_str().ok()),
        Some(format!("/v1/agents/{id}").as_str()),
        "{:?}",
        reply.headers
    );
    assert_eq!(etag(&reply), "1");
    assert_eq!(agent["version"], 1, "{agent}");
    for field in [
        "name",
        "description",
        "model",
        "system_prompt",
        "tools",
        "tool_policy",
        "max_steps",
        "metadata",
    ] {
        assert_eq!(agent[field], body[field], "{field} is not echoed: {agent}");
    }
    assert_eq!(agent["provider"], "default", "{agent}");
    assert!(agent["archived_at"].is_null(), "{agent}");
    let created: chrono::DateTime<chrono::Utc> = agent["created_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no created_at: {agent}"));
    assert!((chrono::Utc::now() - created).num_seconds().abs() < 60);
    let updated: chrono::DateTime<chrono::Utc> = agent["updated_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no updated_at: {agent}"));
    assert!(
        updated >= created,
        "version 1 is older than its agent: {agent}"
    );
    // Optional fields that were not given are left out.
    for absent in ["mcp_servers", "client_tools", "subagents", "context_chars"] {
        assert!(agent.get(absent).is_none(), "{absent} is shown: {agent}");
    }

    assert_eq!(server.get_ok(&format!("/v1/agents/{id}")).await, agent);
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}/versions/1")).await,
        agent
    );
    // A second agent of the same name is another agent.
    let twin = create_agent(&server, &json!({"name": body["name"], "model": "mock"})).await;
    assert_ne!(id_of(&twin), id);
}

#[tokio::test]
async fn the_list_is_newest_first_paged_and_hides_archived_agents_unless_asked() {
    let server = TestServer::start(ServerOptions::new()).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let agent = create_agent(&server, &json!({"name": format!("a{n}"), "model": "mock"})).await;
        ids.push(id_of(&agent));
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();

    let listed: Vec<String> = server
        .all_pages("/v1/agents", "cursor", 2)
        .await
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(listed, newest_first, "paged by 2");
    let first_page = server.get_ok("/v1/agents?limit=2").await;
    assert_eq!(first_page["data"].as_array().map(Vec::len), Some(2));
    assert!(
        first_page["next_cursor"].is_string(),
        "a first page of 2 of 5 has a next cursor: {first_page}"
    );
    let whole = server.get_ok("/v1/agents").await;
    let whole: Vec<String> = whole["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(whole, newest_first, "the default agent is not listed");

    let archived = archive(&server, &ids[2])
        .await
        .expect_json(StatusCode::OK, "DELETE an agent");
    assert_eq!(id_of(&archived), ids[2]);
    assert!(archived["archived_at"].is_string(), "{archived}");
    let listed: Vec<String> = server
        .all_pages("/v1/agents", "cursor", 2)
        .await
        .iter()
        .map(id_of)
        .collect();
    let visible: Vec<String> = newest_first
        .iter()
        .filter(|id| **id != ids[2])
        .cloned()
        .collect();
    assert_eq!(listed, visible, "an archived agent is hidden");
    let with_archived = server
        .all_pages("/v1/agents?include_archived=true", "cursor", 2)
        .await;
    let listed: Vec<String> = with_archived.iter().map(id_of).collect();
    assert_eq!(listed, newest_first, "include_archived=true shows it");
    let shown = with_archived.iter().find(|a| id_of(a) == ids[2]).unwrap();
    assert_eq!(shown["archived_at"], archived["archived_at"], "{shown}");
    // It still answers by id, with archived_at; archiving again changes nothing.
    let got = server.get_ok(&format!("/v1/agents/{}", ids[2])).await;
    assert_eq!(got["archived_at"], archived["archived_at"], "{got}");
    let again = archive(&server, &ids[2])
        .await
        .expect_json(StatusCode::OK, "DELETE it again");
    assert_eq!(again, archived, "archiving is idempotent");
    // An archived agent cannot be updated.
    let reply = update_agent(&server, &ids[2], &json!({"description": "x"}), None).await;
    reply.expect_problem(StatusCode::CONFLICT, "update an archived agent");
    let got_after = server.get_ok(&format!("/v1/agents/{}", ids[2])).await;
    assert_eq!(got_after, got, "a refused update changed the agent");
}

#[tokio::test]
async fn an_update_is_a_new_version_and_the_old_one_stays_readable() {
    let server = TestServer::start(ServerOptions::new()).await;
    let v1 = mock_agent(&server, "writer", "Version one.", &["list_files"]).await;
    let id = id_of(&v1);

    let reply = update_agent(
        &server,
        &id,
        &json!({"system_prompt": "Version two.", "tools": ["list_files", "read_file"]}),
        None,
    )
    .await;
    let v2 = reply.expect_json(StatusCode::OK, "update");
    assert_eq!(etag(&reply), "2");
    assert_eq!(id_of(&v2), id);
    assert_eq!(v2["version"], 2, "{v2}");
    assert_eq!(v2["system_prompt"], "Version two.");
    assert_eq!(v2["tools"], json!(["list_files", "read_file"]));
    assert_eq!(v2["name"], "writer", "unchanged fields are kept: {v2}");
    assert_eq!(v2["model"], "mock", "{v2}");
    assert_eq!(v2["created_at"], v1["created_at"], "{v2}");
    let (t1, t2) = (
        v1["updated_at"].as_str().unwrap_or(""),
        v2["updated_at"].as_str().unwrap_or(""),
    );
    let (t1, t2): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) = (
        t1.parse().expect("updated_at of v1"),
        t2.parse().expect("updated_at of v2"),
    );
    assert!(t2 >= t1, "v2 was made before v1: {v1} {v2}");

    assert_eq!(server.get_ok(&format!("/v1/agents/{id}")).await, v2);
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}/versions/1")).await,
        v1,
        "the old version is unchanged"
    );
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}/versions/2")).await,
        v2
    );
    let versions = server.get_ok(&format!("/v1/agents/{id}/versions")).await;
    assert_eq!(versions["data"], json!([v2, v1]), "newest version first");
    let paged = server
        .all_pages(&format!("/v1/agents/{id}/versions"), "cursor", 1)
        .await;
    assert_eq!(paged, vec![v2.clone(), v1.clone()], "versions paged by 1");
    server
        .get(&format!("/v1/agents/{id}/versions/3"))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "a version that does not exist");

    // A body that changes nothing makes no version.
    let reply = update_agent(
        &server,
        &id,
        &json!({"system_prompt": "Version two."}),
        None,
    )
    .await;
    let same = reply.expect_json(StatusCode::OK, "an update that changes nothing");
    assert_eq!(same, v2);
    assert_eq!(etag(&reply), "2");
    let versions = server.get_ok(&format!("/v1/agents/{id}/versions")).await;
    assert_eq!(
        versions["data"].as_array().map(Vec::len),
        Some(2),
        "{versions}"
    );

    // `null` clears an optional field.
    let v3 = updated(&server, &id, &json!({"system_prompt": null})).await;
    assert_eq!(v3["version"], 3, "{v3}");
    assert!(v3.get("system_prompt").is_none(), "{v3}");
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}/versions/2")).await["system_prompt"],
        "Version two."
    );
}

#[tokio::test]
async fn if_match_makes_an_update_conditional() {
    let server = TestServer::start(ServerOptions::new()).await;
    let v1 = mock_agent(&server, "careful", "One.", &["list_files"]).await;
    let id = id_of(&v1);
    let v2 = updated(&server, &id, &json!({"system_prompt": "Two."})).await;

    let stale = update_agent(
        &server,
        &id,
        &json!({"system_prompt": "Lost."}),
        Some("\"1\""),
    )
    .await;
    stale.expect_problem(StatusCode::PRECONDITION_FAILED, "If-Match a stale version");
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}")).await,
        v2,
        "a refused update changed the agent"
    );
    let versions = server.get_ok(&format!("/v1/agents/{id}/versions")).await;
    assert_eq!(versions["data"], json!([v2, v1]));

    let reply = update_agent(
        &server,
        &id,
        &json!({"system_prompt": "Three."}),
        Some("\"2\""),
    )
    .await;
    let v3 = reply.expect_json(StatusCode::OK, "If-Match the current version");
    assert_eq!(v3["version"], 3);
    assert_eq!(etag(&reply), "3");
    // The quotes are optional.
    let v4 = update_agent(&server, &id, &json!({"system_prompt": "Four."}), Some("3"))
        .await
        .expect_json(StatusCode::OK, "If-Match 3 without quotes");
    assert_eq!(v4["version"], 4);
    assert_eq!(v4["system_prompt"], "Four.");
}

#[tokio::test]
async fn the_default_agent_is_built_from_the_flags_and_cannot_be_changed() {
    let server = TestServer::start(ServerOptions::new().args(&["--system-prompt", "Flags."])).await;
    let default = server.get_ok("/v1/agents/default").await;
    assert_eq!(default["id"], "default", "{default}");
    assert_eq!(default["version"], 1, "{default}");
    assert_eq!(default["name"], "default", "{default}");
    assert_eq!(default["model"], "default/mock", "{default}");
    assert_eq!(default["provider"], "default", "{default}");
    assert_eq!(default["system_prompt"], "Flags.", "{default}");

    let reply = update_agent(&server, "default", &json!({"system_prompt": "No."}), None).await;
    reply.expect_problem(StatusCode::CONFLICT, "update the default agent");
    archive(&server, "default")
        .await
        .expect_problem(StatusCode::CONFLICT, "archive the default agent");
    assert_eq!(server.get_ok("/v1/agents/default").await, default);
    let listed = server.get_ok("/v1/agents").await;
    assert_eq!(listed["data"], json!([]), "the default agent is not listed");

    // A session without an agent runs the default one.
    let session = session_on(&server, json!({})).await;
    assert_eq!(session["agent"]["id"], "default", "{session}");
    assert_eq!(session["agent"]["name"], "default", "{session}");
    assert_eq!(session["agent"]["version"], 1, "{session}");
    let named = session_on(&server, json!({"agent": "default"})).await;
    assert_eq!(named["agent"], session["agent"], "{named}");
}

#[tokio::test]
async fn an_archived_agent_takes_no_new_session_while_a_running_one_goes_on() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(40)).await;
    let agent = mock_agent(
        &server,
        "retiring",
        "Retiring.",
        &["list_files", "read_file"],
    )
    .await;
    let id = id_of(&agent);
    let pinned = session_on(&server, json!({"agent": id})).await;
    let following = session_on(&server, json!({"agent": {"id": id, "version": "latest"}})).await;
    let (pinned, following) = (id_of(&pinned), id_of(&following));
    let run = server.start_run(&pinned, &words(30)).await;
    let run_id = id_of(&run);

    let archived = archive(&server, &id)
        .await
        .expect_json(StatusCode::OK, "DELETE the agent");
    assert!(archived["archived_at"].is_string(), "{archived}");
    assert_eq!(
        server
            .get_ok(&format!("/v1/sessions/{pinned}/runs/{run_id}"))
            .await["status"],
        "running",
        "the run ended before the agent was archived; slow the mock down"
    );
    for body in [
        json!({"agent": id}),
        json!({"agent": {"id": id, "version": 1}}),
        json!({"agent": {"id": id, "version": "latest"}}),
    ] {
        let reply = server.post_json("/v1/sessions", &body).await;
        reply.expect_problem(StatusCode::CONFLICT, &format!("a new session {body}"));
    }

    let ended = server.wait_run(&pinned, &run_id).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    // Sessions already on it go on with later runs.
    for session in [&pinned, &following] {
        let result = server.run_wait(session, "after the archive").await;
        assert_eq!(result["status"], "completed", "{result}");
        let views = run_step_views(&server, session, &result["run_id"]).await;
        assert_steps_ran(&views, &id, 1, "Retiring.", &["list_files", "read_file"]);
    }
    let sessions: HashSet<String> = server.sessions().await.iter().map(id_of).collect();
    assert_eq!(
        sessions.len(),
        2,
        "a refused session was created: {sessions:?}"
    );
}

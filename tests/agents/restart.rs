//! A session pinned to an agent version keeps it across a restart on the same database, and
//! one that follows the latest version picks up an update made before the restart; the
//! agents and their versions survive unchanged.

use serde_json::json;

use super::*;

#[tokio::test]
async fn a_pinned_session_keeps_its_agent_version_across_a_restart() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let agent = mock_agent(&server, "durable", "Before.", &["list_files", "read_file"]).await;
    let id = id_of(&agent);
    let pinned = id_of(&session_on(&server, json!({"agent": id})).await);
    let following =
        id_of(&session_on(&server, json!({"agent": {"id": id, "version": "latest"}})).await);
    for session in [&pinned, &following] {
        let result = server.run_wait(session, "before the restart").await;
        assert_eq!(result["status"], "completed", "{result}");
    }
    let v2 = updated(
        &server,
        &id,
        &json!({"system_prompt": "After.", "tools": ["list_files"]}),
    )
    .await;
    let versions = server.get_ok(&format!("/v1/agents/{id}/versions")).await;
    let pinned_view = server.session(&pinned).await;

    server.restart().await;

    assert_eq!(server.get_ok(&format!("/v1/agents/{id}")).await, v2);
    assert_eq!(
        server.get_ok(&format!("/v1/agents/{id}/versions")).await,
        versions
    );
    assert_eq!(server.session(&pinned).await["agent"], pinned_view["agent"]);

    let result = server.run_wait(&pinned, "after the restart").await;
    assert_eq!(result["status"], "completed", "{result}");
    let views = run_step_views(&server, &pinned, &result["run_id"]).await;
    assert_steps_ran(&views, &id, 1, "Before.", &["list_files", "read_file"]);

    let result = server.run_wait(&following, "after the restart").await;
    assert_eq!(result["status"], "completed", "{result}");
    let views = run_step_views(&server, &following, &result["run_id"]).await;
    assert_steps_ran(&views, &id, 2, "After.", &["list_files"]);
    // The steps of the runs before the restart still show what they sent.
    let all = server.llm_step_views(&pinned).await;
    assert_steps_ran(&all, &id, 1, "Before.", &["list_files", "read_file"]);
    // The view shows the version its last run used.
    assert_eq!(
        server.session(&following).await["agent"],
        json!({"id": id, "version": 2, "name": "durable", "follows_latest": true})
    );
}

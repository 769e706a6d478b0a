//! MCP servers an agent defines for itself: its stdio server starts at the first run of the
//! agent, its tools are offered to that agent's sessions only, and the model's calls reach it.

use serde_json::json;

use crate::{allow_all, call, model_calling, offered, outcome, scratch, start, stdio_server, strs};

pub async fn an_agent_s_own_server_serves_its_sessions_only() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![call(
        "echo",
        "mcp__own__echo",
        json!({"text": "hello from the agent's server"}),
    )])
    .await;
    let args = vec!["--tool-policy".to_string(), policy];
    let server = start(&model, &strs(&args)).await;
    let mut own = stdio_server(json!({}));
    own["name"] = json!("own");
    let created = server
        .post_json(
            "/v1/agents",
            &json!({"name": "with-own-server", "model": "fake", "mcp_servers": [own]}),
        )
        .await
        .expect_json(
            reqwest::StatusCode::CREATED,
            "an agent with its own MCP server",
        );
    let agent = created["id"].as_str().expect("an id").to_string();

    let session = server.create_session_with(&json!({"agent": agent})).await;
    let id = session["id"].as_str().expect("an id").to_string();
    let result = server.run_wait(&id, "use the tools").await;
    assert_eq!(result["status"], "completed", "{result}");
    let asked = offered(&model.body(0));
    assert!(asked.iter().any(|t| t == "mcp__own__echo"), "{asked:?}");
    assert!(asked.iter().any(|t| t == "read_file"), "{asked:?}");
    let events = server.events(&id).await;
    assert_eq!(
        outcome(&events, "echo"),
        ("hello from the agent's server".to_string(), false)
    );

    // A session on the default agent is not offered the agent's server.
    let plain = server.create_session().await;
    let result = server.run_wait(&plain, "answer").await;
    assert_eq!(result["status"], "completed", "{result}");
    let asked = offered(&model.body(model.request_count() - 1));
    assert!(!asked.is_empty());
    assert!(
        !asked.iter().any(|t| t.starts_with("mcp__own__")),
        "{asked:?}"
    );
}

//! A secret an agent's own MCP server gets from a vault (`${vault:VAULT/NAME}` in its `env`,
//! whole or inside a value): the server has the value, and what the server answers with it is
//! recorded as `[secret VAULT/NAME]` everywhere (the tool's output, every event, step and
//! message, the model's next request, the log). A reference to a secret that does not exist
//! fails the run, naming the reference.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::TestServer;
use crate::{allow_all, call, model_calling, options, outcome, scratch, stdio_server, strs};

/// The variable of the master key, and the key (32 bytes, hex).
const KEY_VAR: &str = "TAH_TEST_VAULT_MASTER_KEY";
const KEY_HEX: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";
const VALUE: &str = "ghp-vaulted-6d1f0c2b9e";

pub async fn a_vault_secret_reaches_the_server_and_never_the_record() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let env = |id: &str, name: &str| call(id, "mcp__own__env", json!({ "name": name }));
    let model = model_calling(vec![env("token", "TOKEN"), env("auth", "AUTH")]).await;
    let args = vec![
        "--tool-policy".to_string(),
        policy,
        "--master-key-env".to_string(),
        KEY_VAR.to_string(),
    ];
    let launch = options(&model, &strs(&args))
        .process()
        .env(KEY_VAR, KEY_HEX);
    let server = TestServer::start(launch).await;
    server
        .call(
            Method::PUT,
            "/v1/vaults/prod/secrets/token",
            Some(&json!({ "value": VALUE })),
        )
        .await
        .expect("PUT")
        .expect_json(StatusCode::OK, "the secret");

    let agent = |name: &str, secret: &str| {
        let mut own = stdio_server(json!({
            "TOKEN": format!("${{vault:prod/{secret}}}"),
            "AUTH": format!("Bearer ${{vault:prod/{secret}}}!"),
        }));
        own["name"] = json!("own");
        json!({ "name": name, "model": "fake", "mcp_servers": [own] })
    };
    let created = server
        .post_json("/v1/agents", &agent("vaulted", "token"))
        .await
        .expect_json(StatusCode::CREATED, "an agent with a vaulted env");
    assert!(
        created.to_string().contains("${vault:prod/token}"),
        "the agent keeps the reference: {created}"
    );
    let session = server
        .create_session_with(&json!({ "agent": created["id"] }))
        .await;
    let id = session["id"].as_str().expect("an id").to_string();
    let result = server.run_wait(&id, "read the env").await;
    assert_eq!(result["status"], "completed", "{result}");

    let events = server.events(&id).await;
    assert_eq!(outcome(&events, "token").0, "[secret prod/token]");
    assert_eq!(outcome(&events, "auth").0, "Bearer [secret prod/token]!");
    let recorded = [
        serde_json::to_string(&events).unwrap_or_default(),
        serde_json::to_string(&server.steps(&id).await).unwrap_or_default(),
        serde_json::to_string(&server.messages(&id).await).unwrap_or_default(),
        model.body(1).to_string(),
        server.log(),
    ];
    for (what, text) in [
        "events",
        "steps",
        "messages",
        "the model's request",
        "the log",
    ]
    .iter()
    .zip(recorded)
    {
        assert!(!text.contains(VALUE), "{what} show the value");
    }
    assert!(model.body(1).to_string().contains("[secret prod/token]"));

    // A reference to a secret that does not exist: the run fails, saying which.
    let created = server
        .post_json("/v1/agents", &agent("missing", "nope"))
        .await
        .expect_json(StatusCode::CREATED, "an agent with a missing secret");
    let session = server
        .create_session_with(&json!({ "agent": created["id"] }))
        .await;
    let id = session["id"].as_str().expect("an id").to_string();
    let result = server.run_wait(&id, "read the env").await;
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result.to_string().contains("${vault:prod/nope}"),
        "{result}"
    );
}

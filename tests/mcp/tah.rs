//! One tah server as another's MCP server: the outer server's `--mcp-config` names the inner
//! one's `/mcp`, and the outer agent's `tah_run` call runs a turn of an agent on the inner
//! server; its answer comes back as the call's output.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::server::ServerOptions;
use crate::support::TestServer;
use crate::{allow_all, config_args, scratch, strs, wait_tool};

const READY: Duration = Duration::from_secs(20);

pub async fn another_tah_serves_its_agents_as_mcp_tools() {
    let inner = TestServer::start(ServerOptions::new().named("inner")).await;
    let (dir, _) = scratch();
    let mut args = config_args(
        dir.path(),
        json!({"inner": {"type": "http", "url": inner.url("/mcp")}}),
    );
    args.extend(["--tool-policy".into(), allow_all(dir.path())]);
    let outer = TestServer::start(ServerOptions::new().named("outer").args(&strs(&args))).await;
    for tool in ["tah_run", "tah_answer", "tah_sessions", "tah_session"] {
        wait_tool(&outer, &format!("mcp__inner__{tool}"), true, READY).await;
    }

    let id = outer.create_session().await;
    let input = r#"call `mcp__inner__tah_run` with {"input": "greetings from the outer tah"}"#;
    let result = outer.run_wait(&id, input).await;
    assert_eq!(result["status"], "completed", "{result}");

    // The inner server made one session for the call, ran the turn, and finished it.
    let listed = inner.get_ok("/v1/sessions").await;
    let sessions = listed["data"].as_array().expect("a list");
    assert_eq!(sessions.len(), 1, "{listed}");
    let inner_id = sessions[0]["id"].as_str().expect("an id").to_string();
    let inner_events = inner.events(&inner_id).await;
    let user = inner_events
        .iter()
        .find(|e| e["type"] == "user.message")
        .expect("the inner turn's input");
    assert_eq!(
        user["data"]["message"]["content"],
        "greetings from the outer tah"
    );
    let answer = inner_events
        .iter()
        .find(|e| e["type"] == "agent.finished")
        .expect("the inner run finished");
    let answer = answer["data"]["text"].as_str().expect("its text");

    // The outer call's output is the inner run's answer.
    let outer_events = outer.events(&id).await;
    let finished: Vec<&Value> = outer_events
        .iter()
        .filter(|e| e["type"] == "tool.finished")
        .collect();
    assert_eq!(finished.len(), 1, "{outer_events:?}");
    let output = finished[0]["data"]["output"].as_str().expect("text output");
    assert_eq!(finished[0]["data"]["is_error"], false, "{output}");
    assert!(output.contains(answer), "{output} does not carry {answer}");
}

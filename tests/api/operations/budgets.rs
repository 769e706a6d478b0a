//! Token budgets: a run, or a whole session, stops before the step that would start over its
//! budget, as `failed` with `finish_reason: budget`; the session's own limits win over the
//! server's defaults.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

/// Input plus output tokens of a usage object.
fn tokens(usage: &Value) -> u64 {
    usage["input_tokens"].as_u64().unwrap_or(0) + usage["output_tokens"].as_u64().unwrap_or(0)
}

/// Checks a run that a budget stopped, in its result, its session and its event log.
async fn assert_budget_stop(server: &TestServer, id: &str, result: &Value, limit: &str) {
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["finish_reason"], "budget", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains(limit), "the error names {limit}: {result}");
    let session = server.session(id).await;
    assert_eq!(session["state"], "failed", "{session}");
    assert_eq!(session["error"], result["error"], "{session}");
    let log = server.events(id).await;
    let run_id = result["run_id"].as_str().unwrap_or("?");
    let terminal = terminal_events_of(&log, run_id);
    assert_eq!(terminal.len(), 1, "{:?}", types(&log));
    assert_eq!(terminal[0]["type"], "agent.finished", "{:?}", terminal[0]);
    assert_eq!(terminal[0]["data"]["finish_reason"], "budget");
    assert_tool_calls_answered(&server.messages(id).await);
}

#[tokio::test]
async fn a_run_stops_before_the_step_that_would_start_over_its_run_budget() {
    let server = TestServer::start(ServerOptions::new()).await;
    let session = server
        .create_session_with(&json!({"max_run_tokens": 1}))
        .await;
    assert_eq!(session["max_run_tokens"], 1, "{session}");
    let id = id_of(&session);
    let result = server.run_wait(&id, "use one step at most").await;
    // The first step starts with nothing used; after it the run is over its budget.
    assert_eq!(result["steps"], 1, "{result}");
    assert!(tokens(&result["usage"]) >= 1, "{result}");
    assert_budget_stop(&server, &id, &result, "max_run_tokens=1").await;
    let llm_steps = server.llm_step_count(&id).await;
    assert_eq!(llm_steps, 1, "no LLM step started over the budget");

    // The next run has a budget of its own, and a session in `failed` accepts it.
    let next = server.run_wait(&id, "again").await;
    assert_eq!(next["finish_reason"], "budget", "{next}");
    assert_eq!(next["steps"], 1, "{next}");
}

#[tokio::test]
async fn the_session_budget_counts_every_run_of_the_session() {
    let server = TestServer::start(ServerOptions::new()).await;
    // What one full turn costs with the mock model (deterministic for the same input).
    let probe = server.create_session().await;
    let full = server.run_wait(&probe, "same words").await;
    assert_eq!(full["status"], "completed", "{full}");
    let turn = tokens(&full["usage"]);
    assert!(turn > 0 && full["steps"].as_u64() > Some(1), "{full}");

    let limit = turn + 1;
    let session = server
        .create_session_with(&json!({"max_tokens": limit}))
        .await;
    assert_eq!(session["max_tokens"], limit, "{session}");
    let id = id_of(&session);
    let first = server.run_wait(&id, "same words").await;
    assert_eq!(first["status"], "completed", "within the budget: {first}");
    assert_eq!(tokens(&first["usage"]), turn, "{first}");
    let second = server.run_wait(&id, "same words").await;
    assert_eq!(second["steps"], 1, "{second}");
    assert_budget_stop(&server, &id, &second, &format!("max_tokens={limit}")).await;
    let session = server.session(&id).await;
    assert!(tokens(&session["usage"]) >= limit, "{session}");
    // Nothing is left: the next run stops before its first step.
    let third = server.run_wait(&id, "more").await;
    assert_eq!(third["steps"], 0, "{third}");
    assert_eq!(third["finish_reason"], "budget", "{third}");
}

#[tokio::test]
async fn the_server_defaults_apply_unless_the_session_sets_its_own() {
    let server = TestServer::start(
        ServerOptions::new()
            .arg("--max-run-tokens")
            .arg("1")
            .arg("--max-session-tokens")
            .arg("1000000"),
    )
    .await;
    let id = server.create_session().await;
    let limited = server.run_wait(&id, "the server's default").await;
    assert_eq!(limited["steps"], 1, "{limited}");
    assert_budget_stop(&server, &id, &limited, "max_run_tokens=1").await;

    let own = server
        .create_session_with(&json!({"max_run_tokens": 1_000_000}))
        .await;
    let own_id = id_of(&own);
    let result = server.run_wait(&own_id, "my own budget").await;
    assert_eq!(result["status"], "completed", "{result}");

    let tight = server.create_session_with(&json!({"max_tokens": 2})).await;
    let tight_id = id_of(&tight);
    let result = server.run_wait(&tight_id, "the session's own").await;
    assert_budget_stop(&server, &tight_id, &result, "max_tokens=2").await;
}

#[tokio::test]
async fn bad_budgets_are_refused() {
    let server = TestServer::start(ServerOptions::new()).await;
    for body in [
        json!({"max_tokens": 0}),
        json!({"max_run_tokens": 0}),
        json!({"max_tokens": -5}),
        json!({"max_run_tokens": "many"}),
        json!({"max_tokens": 1.5}),
    ] {
        let reply = server.post_json("/v1/sessions", &body).await;
        assert!(
            reply.status.is_client_error(),
            "{body}: {} {}",
            reply.status,
            reply.text()
        );
        check_problem(&reply).unwrap_or_else(|e| panic!("{body}: {e}"));
    }
    assert!(server.sessions().await.is_empty(), "nothing was created");
    let reply = server
        .post_json("/v1/sessions", &json!({"max_tokens": 10}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
}

//! Tools a client runs itself: the model calls one, the session waits for the client's result
//! (durably, across a restart), and a result that does not come in time is an error result.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fakes::start_openai;
use crate::support::TestServer;
use crate::tools::{asks, call, finished, kill9_and_restart, model_calling, options, says, start};

/// A session with the client tool `pick_color`, whose result is awaited `timeout_s` (by
/// default the approval timeout); returns its id.
async fn session_with_client_tool(server: &TestServer, timeout_s: Option<u64>) -> String {
    let mut tool = json!({
        "name": "pick_color",
        "description": "Asks the user to pick a color.",
        "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}}
    });
    if let Some(t) = timeout_s {
        tool["timeout_s"] = json!(t);
    }
    let session = server
        .create_session_with(&json!({"client_tools": [tool]}))
        .await;
    session["id"].as_str().unwrap().to_string()
}

/// Waits until the session has completed.
async fn completed(server: &TestServer, id: &str) {
    let session = server
        .poll_session(id, "completed", Duration::from_secs(10), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(session["state"], "completed");
}

async fn until_requested(server: &TestServer, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events = server.events(id).await;
        if let Some(e) = events.iter().find(|e| e["type"] == "tool.client-requested") {
            return e.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no tool.client-requested"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_result_continues_the_run_and_is_idempotent() {
    let model = model_calling(vec![call(
        "k1",
        "pick_color",
        json!({"question": "which?"}),
    )])
    .await;
    let server = start(&model, &[]).await;
    let id = session_with_client_tool(&server, None).await;
    // The model is offered the client tool.
    server.start_run(&id, "choose").await;
    let requested = until_requested(&server, &id).await;
    assert_eq!(requested["data"]["tool"], "pick_color");
    assert_eq!(requested["data"]["input"], json!({"question": "which?"}));
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    let first = model.requests();
    assert!(first[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["function"]["name"] == "pick_color"));

    let path = format!("/v1/sessions/{id}/tool-results/k1");
    let reply = server.post_json(&path, &json!({"output": "teal"})).await;
    let result = reply.expect_json(StatusCode::OK, "the result");
    assert_eq!(
        result,
        json!({"call_id": "k1", "output": "teal", "is_error": false})
    );
    completed(&server, &id).await;
    let events = server.events(&id).await;
    assert_eq!(finished(&events, "k1")["data"]["output"], "teal");
    let again = server.post_json(&path, &json!({"output": "teal"})).await;
    assert_eq!(again.expect_json(StatusCode::OK, "repeat"), result);
    let other = server.post_json(&path, &json!({"output": "red"})).await;
    other.expect_problem(StatusCode::CONFLICT, "another result");
    let unknown = server
        .post_json(
            &format!("/v1/sessions/{id}/tool-results/nope"),
            &json!({"output": "x"}),
        )
        .await;
    unknown.expect_problem(StatusCode::NOT_FOUND, "unknown call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_answer_in_time_gets_an_error_result() {
    let model = model_calling(vec![call("k2", "pick_color", json!({}))]).await;
    let server = start(&model, &[]).await;
    let id = session_with_client_tool(&server, Some(1)).await;
    let result = server.run_wait(&id, "choose").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let done = finished(&events, "k2");
    assert_eq!(done["data"]["is_error"], true);
    assert!(done["data"]["output"]
        .as_str()
        .unwrap()
        .contains("did not send this call's result in time"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_call_waits_across_a_restart() {
    let model = model_calling(vec![call("k3", "pick_color", json!({}))]).await;
    let mut server = TestServer::start(options(&model, &[]).process()).await;
    let id = session_with_client_tool(&server, None).await;
    server.start_run(&id, "choose").await;
    until_requested(&server, &id).await;
    kill9_and_restart(&mut server, &id).await;
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/tool-results/k3"),
            &json!({"output": {"color": "blue"}, "is_error": false}),
        )
        .await;
    reply.expect_json(StatusCode::OK, "result after a restart");
    completed(&server, &id).await;
    let events = server.events(&id).await;
    assert_eq!(
        finished(&events, "k3")["data"]["output"],
        "{\"color\":\"blue\"}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_client_lists_what_waits_for_it_and_late_results_are_checked() {
    let model = model_calling(vec![call(
        "k4",
        "pick_color",
        json!({"question": "which?"}),
    )])
    .await;
    let server = start(&model, &[]).await;
    let id = session_with_client_tool(&server, None).await;
    let waiting = format!("/v1/sessions/{id}/tool-results");
    assert_eq!(server.get_ok(&waiting).await, json!({"data": []}));
    server.start_run(&id, "choose").await;
    let requested = until_requested(&server, &id).await;
    // A client that missed the event finds the call it is to answer.
    let listed = server.get_ok(&waiting).await;
    assert_eq!(
        listed,
        json!({"data": [{
            "call_id": "k4",
            "step_id": requested["data"]["step_id"],
            "tool": "pick_color",
            "input": {"question": "which?"},
            "expires_at": requested["data"]["expires_at"],
        }]}),
    );
    assert!(listed["data"][0]["expires_at"].is_string(), "{listed}");
    // It is no approval.
    let approvals = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
    assert_eq!(approvals, json!({"data": []}));

    let path = format!("{waiting}/k4");
    let result = server
        .post_json(&path, &json!({"output": "teal"}))
        .await
        .expect_json(StatusCode::OK, "the result");
    server
        .poll_session(&id, "completed", Duration::from_secs(10), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(server.get_ok(&waiting).await, json!({"data": []}));

    // A run later, the result of the older run's call is still checked against the log.
    let next = server.run_wait(&id, "thanks").await;
    assert_eq!(next["status"], "completed", "{next}");
    let count = server.events(&id).await.len();
    let again = server.post_json(&path, &json!({"output": "teal"})).await;
    assert_eq!(again.expect_json(StatusCode::OK, "a late repeat"), result);
    let other = server.post_json(&path, &json!({"output": "red"})).await;
    let problem = other.expect_problem(StatusCode::CONFLICT, "a late other result");
    assert_eq!(problem["resolution"], result);
    // A client call is no approval.
    server
        .post_json(
            &format!("/v1/sessions/{id}/approvals/k4"),
            &json!({"decision": "allow"}),
        )
        .await
        .expect_problem(StatusCode::NOT_FOUND, "a client call as an approval");
    assert_eq!(server.events(&id).await.len(), count);
}

/// An AG-UI run's `tools` are client tools of that run only: offered to its model calls,
/// shown in its steps' requests, waited for across a restart, and not offered to later runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_own_client_tools_wait_across_a_restart_and_end_with_it() {
    let model = start_openai(vec![
        asks(&[call("k5", "ask_user", json!({"question": "colour?"}))]),
        says("green it is"),
        says("plain"),
    ])
    .await;
    let mut server = TestServer::start(options(&model, &[]).process()).await;
    let id = server.create_session().await;
    let tool = json!({"name": "ask_user", "description": "Ask the user",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}}});
    let input = json!({"threadId": id, "runId": "r1", "tools": [tool],
        "messages": [{"id": "u1", "role": "user", "content": "ask me"}]});
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/ag-ui"), &input)
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let body = reply.text();
    assert!(
        body.contains(r#""pendingToolCallIds":["k5"]"#),
        "the AG-UI run ends waiting for the client's result: {body}"
    );
    let offered = |request: &Value| {
        request["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "ask_user"))
    };
    assert!(offered(&model.requests()[0].body));
    let runs = server.get_ok(&format!("/v1/sessions/{id}/runs")).await;
    assert_eq!(runs["data"][0]["client_tools"][0]["name"], "ask_user");
    let step = server
        .steps(&id)
        .await
        .into_iter()
        .find(|s| s["type"] == "llm")
        .expect("an LLM step");
    let shown = server
        .get_ok(&format!(
            "/v1/sessions/{id}/steps/{}",
            step["id"].as_str().unwrap()
        ))
        .await;
    assert!(shown["request"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "ask_user"));

    // On PostgreSQL a killed server's lease holds until it expires: stop it instead.
    if !crate::support::is_postgres() {
        server.kill9().await;
    }
    server.restart().await;
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    let result = server
        .post_json(
            &format!("/v1/sessions/{id}/tool-results/k5"),
            &json!({"output": "green"}),
        )
        .await;
    result.expect_json(StatusCode::OK, "the result after a restart");
    completed(&server, &id).await;
    assert_eq!(
        finished(&server.events(&id).await, "k5")["data"]["output"],
        "green"
    );

    server.run_wait(&id, "anything else?").await;
    let last = model.requests().pop().expect("a request");
    assert!(
        !offered(&last.body),
        "a later run is not offered the run's tools"
    );
}

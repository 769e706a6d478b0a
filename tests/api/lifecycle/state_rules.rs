//! What a session's state allows: of two simultaneous runs exactly one starts, `max_steps`
//! fails a run (and the configuration of the restarted server is the one that counts), and a
//! delete removes a session and ends its streams.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn of_two_simultaneous_runs_exactly_one_starts() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let id = server.create_session().await;
    let path = format!("/v1/sessions/{id}/runs");
    for round in 0..3 {
        let body_a = json!({"input": format!("a{round}")});
        let body_b = json!({"input": format!("b{round}")});
        let (a, b) = tokio::join!(
            server.post_json(&path, &body_a),
            server.post_json(&path, &body_b),
        );
        let mut statuses = [a.status, b.status];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::ACCEPTED, StatusCode::CONFLICT],
            "round {round}: {} / {}",
            a.text(),
            b.text()
        );
        let (winner, loser) = if a.status == StatusCode::ACCEPTED {
            (a, b)
        } else {
            (b, a)
        };
        assert_conflict(&loser, &format!("round {round}: the losing run"));
        let run_id = id_of(&winner.json());
        assert_eq!(server.cancel(&id).await["run_id"], run_id.as_str());
        server.wait_run(&id, &run_id).await;
    }
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    let started: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "agent.started")
        .collect();
    assert_eq!(started.len(), 3, "{:?}", types(&log));
    for event in started {
        let run_id = event["data"]["run_id"].as_str().unwrap_or("?");
        assert_eq!(terminal_events_of(&log, run_id).len(), 1, "run {run_id}");
    }
    assert_eq!(
        log.iter().filter(|e| e["type"] == "user.message").count(),
        3,
        "only the runs that started recorded their input"
    );
    let result = server.run_wait(&id, "the last word").await;
    assert_eq!(result["status"], "completed", "{result}");
}

#[tokio::test]
async fn max_steps_fails_the_run_and_the_current_configuration_wins_after_a_restart() {
    let mut server =
        TestServer::start(ServerOptions::new().arg("--max-steps").arg("1").process()).await;
    let id = server.create_session().await;
    let limited = server.run_wait(&id, "too many steps").await;
    assert_eq!(limited["finish_reason"], "max_steps", "{limited}");
    assert_eq!(limited["status"], "failed", "{limited}");
    assert_eq!(limited["steps"], 1, "{limited}");
    let named = "stopped after 1 LLM steps (max_steps=1)";
    assert_eq!(limited["error"], named, "{limited}");
    let session = server.session(&id).await;
    assert_eq!(session["state"], "failed", "{session}");
    assert_eq!(session["error"], named, "{session}");
    let log = server.events(&id).await;
    let limited_id = limited["run_id"].as_str().unwrap_or("?");
    assert_eq!(
        terminal_events_of(&log, limited_id).len(),
        1,
        "{:?}",
        types(&log)
    );
    let llm_steps = server.llm_step_count(&id).await;
    assert_eq!(llm_steps, 1, "at most one LLM call");

    let prompt = "You are a test prompt.";
    server
        .restart_with(
            ServerOptions::new()
                .arg("--max-steps")
                .arg("0")
                .arg("--system-prompt")
                .arg(prompt),
        )
        .await;
    let result = server.run_wait(&id, "now without a limit").await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["finish_reason"], "stop", "{result}");
    assert_eq!(result["steps"], 3, "{result}");
    assert_eq!(server.session(&id).await["state"], "completed");

    let steps = server.steps(&id).await;
    let new_llm_steps: Vec<&Value> = steps
        .iter()
        .filter(|s| s["type"] == "llm" && s["run_id"] == result["run_id"])
        .collect();
    assert_eq!(new_llm_steps.len(), 3);
    for step in new_llm_steps {
        let view = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(step)))
            .await;
        let first = &view["request"]["messages"][0];
        assert_eq!(first["role"], "system", "{view}");
        assert_eq!(
            first["content"], prompt,
            "the current system prompt was sent: {view}"
        );
    }
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
}

#[tokio::test]
async fn delete_removes_a_session_and_ends_its_streams() {
    let server = TestServer::start(ServerOptions::new()).await;
    let keep = server.create_session().await;
    let id = server.create_session().await;
    server.run_wait(&id, "soon gone").await;
    let mut sse = server.sse(&id, SseFrom::Start).await;
    let frames = sse.until_type("agent.finished").await;
    assert_eq!(frames.last().expect("frames").event, "agent.finished");

    let path = format!("/v1/sessions/{id}");
    let reply = server
        .send(server.request(reqwest::Method::DELETE, &path))
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    match sse.next_within(Duration::from_secs(5)).await {
        Next::End => {}
        other => panic!("a deleted session's stream goes on: {other:?}"),
    }
    for path in [
        format!("/v1/sessions/{id}"),
        format!("/v1/sessions/{id}/events"),
        format!("/v1/sessions/{id}/messages"),
        format!("/v1/sessions/{id}/runs"),
    ] {
        server
            .get(&path)
            .await
            .expect_problem(StatusCode::NOT_FOUND, &path);
    }
    let reply = server
        .send(server.request(reqwest::Method::DELETE, &path))
        .await;
    reply.expect_problem(StatusCode::NOT_FOUND, "DELETE twice");
    let listed: Vec<String> = server.sessions().await.iter().map(id_of).collect();
    assert_eq!(listed, [keep]);
}

//! Steering a running turn: `POST /runs?if_busy=` while a run is active — `reject` (the
//! default, 409), `queue` (the input joins the active run at its next step boundary, logged as
//! `user.message {queued: true}`) and `interrupt` (the active run is cancelled, then the new
//! one starts).

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

fn runs_path(id: &str, query: &str) -> String {
    format!("/v1/sessions/{id}/runs{query}")
}

#[tokio::test]
async fn reject_is_the_default_and_answers_409() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let (id, run_id, mut sse) = server.watched_run("the first").await;
    sse.until_type("tool.started").await;
    for query in ["", "?if_busy=reject"] {
        let reply = server
            .post_json(&runs_path(&id, query), &json!({"input": "refused"}))
            .await;
        assert_conflict(&reply, &format!("if_busy {query:?}"));
    }
    let run = server.wait_run(&id, &run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let log = server.events(&id).await;
    assert!(
        !log.iter()
            .any(|e| e["type"] == "user.message" && e["data"]["message"]["content"] == "refused"),
        "a refused input is not recorded"
    );
}

#[tokio::test]
async fn a_queued_input_joins_the_active_run_at_its_next_step_boundary() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let (id, run_id, mut sse) = server.watched_run("the first question").await;
    sse.until_type("tool.started").await;
    let reply = server
        .post_json(
            &runs_path(&id, "?if_busy=queue"),
            &json!({"input": "and the second"}),
        )
        .await;
    let answered = reply.expect_json(StatusCode::ACCEPTED, "POST /runs?if_busy=queue");
    assert_eq!(
        answered["id"],
        run_id.as_str(),
        "answered with the active run"
    );
    assert_eq!(answered["status"], "running", "{answered}");

    let run = server.wait_run(&id, &run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let text = run["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("and the second"),
        "the answer covers it: {run}"
    );

    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    let inputs: Vec<&Value> = log.iter().filter(|e| e["type"] == "user.message").collect();
    assert_eq!(inputs.len(), 2, "{:?}", types(&log));
    assert!(inputs[0]["data"].get("queued").is_none(), "{}", inputs[0]);
    assert_eq!(inputs[1]["data"]["queued"], true, "{}", inputs[1]);
    assert_eq!(inputs[1]["data"]["message"]["content"], "and the second");
    assert_eq!(
        log.iter().filter(|e| e["type"] == "agent.started").count(),
        1,
        "no new run: {:?}",
        types(&log)
    );
    assert_eq!(terminal_events_of(&log, &run_id).len(), 1);
    // It came in at a step boundary: after the tool results the model had asked for, before
    // the next LLM step.
    let at = log
        .iter()
        .position(|e| e["data"]["queued"] == true)
        .unwrap_or(0);
    assert_eq!(log[at + 1]["type"], "llm.started", "{:?}", types(&log));
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
    let queued = messages
        .iter()
        .position(|m| m["content"] == "and the second")
        .expect("the queued message is in the history");
    assert_eq!(messages[queued]["role"], "user");
    assert_ne!(messages[queued - 1]["role"], "user", "{messages:?}");
}

#[tokio::test]
async fn a_queued_input_that_waits_gets_the_active_run_s_result() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let (id, run_id, mut sse) = server.watched_run("first").await;
    sse.until_type("tool.started").await;
    let result = server
        .post_json(
            &runs_path(&id, "?if_busy=queue&wait=true"),
            &json!({"input": "second, waited for"}),
        )
        .await
        .expect_json(StatusCode::OK, "POST /runs?if_busy=queue&wait=true");
    assert_eq!(result["run_id"], run_id.as_str(), "{result}");
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        result["text"]
            .as_str()
            .is_some_and(|t| t.contains("second, waited for")),
        "{result}"
    );
}

#[tokio::test]
async fn queue_on_an_idle_session_starts_a_run() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server
        .post_json(
            &runs_path(&id, "?if_busy=queue&wait=true"),
            &json!({"input": "nothing runs"}),
        )
        .await
        .expect_json(StatusCode::OK, "POST /runs?if_busy=queue&wait=true");
    assert_eq!(result["status"], "completed", "{result}");
    let log = server.events(&id).await;
    let input = log
        .iter()
        .find(|e| e["type"] == "user.message")
        .expect("user.message");
    assert!(input["data"].get("queued").is_none(), "{input}");
}

#[tokio::test]
async fn interrupt_cancels_the_active_run_and_starts_the_new_one() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let (id, first, mut sse) = server.watched_run("the old plan").await;
    sse.until_type("tool.started").await;
    let reply = server
        .post_json(
            &runs_path(&id, "?if_busy=interrupt"),
            &json!({"input": "the new plan"}),
        )
        .await;
    let second = reply.expect_json(StatusCode::ACCEPTED, "POST /runs?if_busy=interrupt");
    let second_id = id_of(&second);
    assert_ne!(second_id, first, "a new run");

    let old = server.wait_run(&id, &first).await;
    assert_eq!(old["status"], "cancelled", "{old}");
    let new = server.wait_run(&id, &second_id).await;
    assert_eq!(new["status"], "completed", "{new}");
    assert!(
        new["text"]
            .as_str()
            .is_some_and(|t| t.contains("the new plan")),
        "{new}"
    );
    assert_eq!(server.session(&id).await["state"], "completed");

    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    let old_end = terminal_events_of(&log, &first);
    assert_eq!(old_end.len(), 1, "{:?}", types(&log));
    assert_eq!(old_end[0]["type"], "agent.cancelled");
    let new_start = log
        .iter()
        .position(|e| e["type"] == "agent.started" && e["data"]["run_id"] == second_id.as_str())
        .expect("the new run started");
    let old_end_at = log
        .iter()
        .position(|e| e["type"] == "agent.cancelled")
        .unwrap_or(usize::MAX);
    assert!(
        old_end_at < new_start,
        "the old run ended first: {:?}",
        types(&log)
    );
    assert_tool_calls_answered(&server.messages(&id).await);
}

#[tokio::test]
async fn bad_if_busy_values_are_400() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    for query in [
        "?if_busy=later",
        "?if_busy=",
        "?if_busy=QUEUEX",
        "?if_busy=queue&if_busy=reject",
    ] {
        let reply = server
            .post_json(&runs_path(&id, query), &json!({"input": "x"}))
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            reply.text()
        );
        check_problem(&reply).unwrap_or_else(|e| panic!("{query}: {e}"));
    }
    let reply = server
        .post_empty(&format!("/v1/sessions/{id}/resume?if_busy=queue"))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    check_problem(&reply).unwrap_or_else(|e| panic!("resume: {e}"));
    assert!(server
        .events(&id)
        .await
        .iter()
        .all(|e| e["type"] != "agent.started"));
}

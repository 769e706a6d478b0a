//! Resume: after a kill -9 mid-turn the interrupted run is recorded and its resume completes the
//! turn without repeating or losing a step; what resume answers in each state.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn kill_9_mid_turn_then_resume_completes_the_turn() {
    let mut server = TestServer::start(ServerOptions::new().mock_delay_ms(50).process()).await;
    let (id, run_id, mut sse) = server.watched_run("survive a crash").await;
    let mut deltas = 0;
    let seen = sse
        .until(|f| {
            deltas += usize::from(f.event == "agent.assistant-stream");
            deltas == 3
        })
        .await;

    server.kill9().await;
    drop(sse);
    server.restart().await;

    // SQLite records the interruption at start; PostgreSQL once the dead process's lease
    // expired (the restarted process is another replica).
    server.wait_interrupted(&id).await;
    let stored = server
        .get_ok(&format!("/v1/sessions/{id}/runs/{run_id}"))
        .await;
    assert_eq!(stored["status"], "failed", "{stored}");
    assert_eq!(stored["error"], "interrupted", "{stored}");

    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    // Every event a client saw before the crash is still there, unchanged.
    assert_eq!(
        log[..seen.len()],
        frame_events(&seen)[..],
        "events seen before the crash"
    );
    assert_interrupted(&log, &run_id);

    let resumed = server.resume_wait(&id).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(resumed["finish_reason"], "stop", "{resumed}");
    assert_ne!(resumed["run_id"], run_id.as_str());
    assert!(
        resumed["text"]
            .as_str()
            .unwrap_or("")
            .contains("survive a crash"),
        "{resumed}"
    );

    let after = server.events(&id).await;
    assert_contiguous_from_one(&after);
    assert_eq!(after[..log.len()], log[..], "resume only appends");
    let started = &after[log.len()];
    assert_eq!(started["type"], "agent.started", "{started}");
    assert_eq!(started["data"]["kind"], "resume");
    assert_eq!(after.last().expect("events")["type"], "agent.finished");
    let resumed_id = resumed["run_id"].as_str().unwrap_or("?");
    assert_eq!(terminal_events_of(&after, resumed_id).len(), 1);

    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
    let roles = roles(&messages);
    assert_eq!(
        roles, MOCK_TURN_ROLES,
        "the resumed turn neither repeats nor loses a step"
    );
    assert_eq!(messages[6]["content"], resumed["text"]);
    assert_eq!(server.session(&id).await["state"], "completed");
}

#[tokio::test]
async fn resume_answers_by_state() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(50)).await;

    // Never run: nothing to resume.
    let fresh = server.create_session().await;
    let reply = server
        .post_empty(&format!("/v1/sessions/{fresh}/resume"))
        .await;
    assert_conflict(&reply, "resume of a session that never ran");
    let reply = server
        .post_empty(&format!("/v1/sessions/{fresh}/resume?wait=true"))
        .await;
    assert_conflict(&reply, "resume?wait=true of a session that never ran");
    assert_eq!(types(&server.events(&fresh).await), ["session.created"]);

    // Completed: the last result, as is.
    let id = server.create_session().await;
    let result = server.run_wait(&id, "finish").await;
    let log = server.events(&id).await;
    for path in [
        format!("/v1/sessions/{id}/resume"),
        format!("/v1/sessions/{id}/resume?wait=true"),
    ] {
        let again = server
            .post_empty(&path)
            .await
            .expect_json(StatusCode::OK, &path);
        assert_eq!(again["run_id"], result["run_id"], "{path}: {again}");
        assert_eq!(again["status"], "completed", "{path}: {again}");
        assert_eq!(again["text"], result["text"], "{path}: {again}");
    }
    assert_eq!(
        server.events(&id).await,
        log,
        "resuming a completed session writes nothing"
    );

    // Running: a conflict, for resume and for another run.
    let run = server.start_run(&id, "busy").await;
    let run_id = id_of(&run);
    let reply = server
        .post_empty(&format!("/v1/sessions/{id}/resume"))
        .await;
    assert_conflict(&reply, "resume while running");
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/runs"),
            &json!({"input": "me too"}),
        )
        .await;
    assert_conflict(&reply, "a second run while one is active");
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/runs?wait=true"),
            &json!({"input": "me too"}),
        )
        .await;
    assert_conflict(&reply, "a second run (wait) while one is active");
    let streamed = server
        .send(
            server
                .request(reqwest::Method::POST, &format!("/v1/sessions/{id}/runs"))
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .json(&json!({"input": "me too"})),
        )
        .await;
    assert_conflict(
        &streamed,
        "a second run (Accept: text/event-stream) while one is active",
    );
    let reply = server
        .send(server.request(reqwest::Method::DELETE, &format!("/v1/sessions/{id}")))
        .await;
    assert_conflict(&reply, "DELETE while running");
    assert_eq!(server.cancel(&id).await["cancelled"], true);
    let stored = server.wait_run(&id, &run_id).await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
    let log = server.events(&id).await;
    assert_eq!(
        log.iter().filter(|e| e["type"] == "agent.started").count(),
        2,
        "{:?}",
        types(&log)
    );
    assert!(
        !log.iter()
            .any(|e| e["type"] == "user.message" && e["data"]["message"]["content"] == "me too"),
        "a refused run left its input behind"
    );
}

//! Graceful shutdown: SIGTERM during a run ends the open streams cleanly, answers the clients
//! that wait, records the run as interrupted, and the run resumes after the restart.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn sigterm_during_a_slow_run_stops_gracefully_and_the_run_resumes() {
    let mut server = TestServer::start(ServerOptions::new().mock_delay_ms(50).process()).await;
    let (id, run_id, mut sse) = server.watched_run("stop the server").await;
    sse.until_type("agent.assistant-stream").await;
    // A client blocked on ?wait=true in another session when the signal comes.
    let other = server.create_session().await;
    let waiting = server
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{other}/runs?wait=true"),
        )
        .json(&json!({"input": "waiting through the stop"}))
        .send();
    let waiting = tokio::spawn(waiting);
    let mut other_sse = server.sse(&other, SseFrom::Start).await;
    other_sse.until_type("agent.assistant-stream").await;

    let asked = Instant::now();
    let status = server.stop().await;
    let took = asked.elapsed();
    eprintln!("SIGTERM → exit: {took:?}");
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    assert_eq!(status.code(), Some(0), "exit status {status}");

    // The open SSE stream ends cleanly (not cut mid-frame).
    loop {
        match sse.next_within(Duration::from_secs(5)).await {
            Next::Frame(_) => continue,
            Next::End => break,
            other => panic!("the SSE stream did not end cleanly: {other:?}"),
        }
    }

    // The blocked client got an answer, not a reset connection.
    let answer = waiting
        .await
        .expect("the waiting task")
        .unwrap_or_else(|e| panic!("the ?wait=true request in flight got no answer: {e}"));
    let answer_status = answer.status();
    let answer: Value = answer
        .json()
        .await
        .expect("a JSON answer to the waiting request");
    assert!(
        answer_status == StatusCode::OK || answer_status == StatusCode::SERVICE_UNAVAILABLE,
        "the waiting request got {answer_status}: {answer}"
    );
    if answer_status == StatusCode::OK {
        assert_eq!(
            answer["status"], "failed",
            "a run stopped by shutdown: {answer}"
        );
        assert_eq!(answer["error"], "interrupted", "{answer}");
    }

    server.restart().await;
    let session = server.session(&id).await;
    assert_eq!(session["state"], "failed", "{session}");
    assert_eq!(session["error"], "interrupted", "{session}");
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_interrupted(&log, &run_id);
    assert_eq!(server.session(&other).await["state"], "failed");

    let resumed = server.resume_wait(&id).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert!(
        resumed["text"]
            .as_str()
            .unwrap_or("")
            .contains("stop the server"),
        "{resumed}"
    );
    assert_contiguous_from_one(&server.events(&id).await);
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
}

//! Cancel: a run cancelled mid-stream ends `cancelled` at once and can be resumed, over and over;
//! a cancel right after the run was posted cancels that run; with nothing running it is a no-op
//! that writes nothing.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

#[tokio::test]
async fn cancel_during_a_slow_stream_ends_the_run_cancelled() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(50)).await;
    let (id, run_id, mut sse) = server.watched_run("cancel me").await;

    sse.until_type("agent.assistant-stream").await;
    let asked = Instant::now();
    let outcome = server.cancel(&id).await;
    assert_eq!(outcome["cancelled"], true, "{outcome}");
    assert_eq!(outcome["run_id"], run_id.as_str(), "{outcome}");
    assert_eq!(
        outcome["state"], "cancelled",
        "the answer says what the cancel leads to: {outcome}"
    );
    let rest = sse.until(|f| is_terminal(&f.data)).await;
    let latency = asked.elapsed();
    let terminal = rest.last().expect("frames");
    assert_eq!(terminal.event, "agent.cancelled", "{terminal:?}");
    assert_eq!(terminal.data["data"]["run_id"], run_id.as_str());
    eprintln!("cancel → agent.cancelled: {latency:?}");
    assert!(latency < Duration::from_secs(2), "cancel took {latency:?}");

    let stored = server.wait_run(&id, &run_id).await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
    let session = server.session(&id).await;
    assert_eq!(session["state"], "cancelled", "{session}");
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_eq!(terminal_types(&log, &run_id), ["agent.cancelled"]);
    assert_eq!(
        log.last().expect("log")["type"],
        "agent.cancelled",
        "{:?}",
        types(&log)
    );
    assert!(
        log.iter()
            .any(|e| e["type"] == "session.state" && e["data"]["to"] == "cancelled"),
        "{:?}",
        types(&log)
    );

    // Cancelling again is a no-op that says so.
    let again = server.cancel(&id).await;
    assert_eq!(again["cancelled"], false, "{again}");
    assert_eq!(
        server.events(&id).await.len(),
        log.len(),
        "a no-op cancel writes nothing"
    );

    // The cancelled turn can be resumed to its end…
    let resumed = server.resume_wait(&id).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert!(
        resumed["text"].as_str().unwrap_or("").contains("cancel me"),
        "{resumed}"
    );

    // …and the session takes the next run.
    let result = server.run_wait(&id, "after the cancel").await;
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        result["text"]
            .as_str()
            .unwrap_or("")
            .contains("after the cancel"),
        "{result}"
    );
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
    assert_contiguous_from_one(&server.events(&id).await);
}

#[tokio::test]
async fn cancel_latency_over_five_runs() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(50)).await;
    let id = server.create_session().await;
    let mut sse = server.sse(&id, SseFrom::Start).await;
    let mut latencies = Vec::new();
    for round in 0..5 {
        let run = server.start_run(&id, &format!("round {round}")).await;
        let run_id = id_of(&run);
        sse.until_type("agent.assistant-stream").await;
        let asked = Instant::now();
        let outcome = server.cancel(&id).await;
        assert_eq!(outcome["cancelled"], true, "round {round}: {outcome}");
        let terminal = sse
            .until(|f| is_terminal(&f.data))
            .await
            .pop()
            .expect("a terminal frame");
        let latency = asked.elapsed();
        assert_eq!(
            terminal.event, "agent.cancelled",
            "round {round}: {terminal:?}"
        );
        assert_eq!(terminal.data["data"]["run_id"], run_id.as_str());
        assert!(
            latency < Duration::from_secs(2),
            "round {round}: cancel took {latency:?}"
        );
        latencies.push(latency);
    }
    eprintln!(
        "cancel request → agent.cancelled over 5 runs: median {:?}, all {:?}",
        median(latencies.clone()),
        latencies
    );
    assert_contiguous_from_one(&server.events(&id).await);
}

#[tokio::test]
async fn cancel_with_nothing_running_is_a_no_op() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;

    let idle = server.cancel(&id).await;
    assert_eq!(idle["cancelled"], false, "{idle}");
    assert!(idle.get("run_id").is_none_or(Value::is_null), "{idle}");
    assert_eq!(server.session(&id).await["state"], "idle");
    assert_eq!(types(&server.events(&id).await), ["session.created"]);

    server.run_wait(&id, "done").await;
    let before = server.events(&id).await;
    let done = server.cancel(&id).await;
    assert_eq!(done["cancelled"], false, "{done}");
    assert_eq!(server.session(&id).await["state"], "completed");
    assert_eq!(
        server.events(&id).await,
        before,
        "a no-op cancel writes nothing"
    );
}

#[tokio::test]
async fn cancel_right_after_post_runs_cancels_that_run() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(50)).await;
    let id = server.create_session().await;
    for round in 0..3 {
        let run = server
            .start_run(&id, &format!("stop at once {round}"))
            .await;
        let run_id = id_of(&run);
        let outcome = server.cancel(&id).await;
        assert_eq!(outcome["cancelled"], true, "round {round}: {outcome}");
        assert_eq!(
            outcome["run_id"],
            run_id.as_str(),
            "round {round}: {outcome}"
        );

        let stored = server.wait_run(&id, &run_id).await;
        assert_eq!(stored["status"], "cancelled", "round {round}: {stored}");
        let log = server.events(&id).await;
        assert_eq!(
            terminal_types(&log, &run_id),
            ["agent.cancelled"],
            "round {round}"
        );
        assert_eq!(server.session(&id).await["state"], "cancelled");
    }

    let result = server.run_wait(&id, "now finish").await;
    assert_eq!(result["status"], "completed", "{result}");
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_eq!(
        log.iter().filter(|e| e["type"] == "agent.started").count(),
        4
    );
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
}

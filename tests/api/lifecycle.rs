//! The life of a run (SPEC §4 and the seed's lifecycle): cancel, resume after a crash or a
//! stop, fork, conflicting runs, `max_steps`, the current configuration winning after a
//! restart, and graceful shutdown.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

#[tokio::test]
async fn cancel_during_a_slow_stream_ends_the_run_cancelled() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(50)).await;
    let id = server.create_session().await;
    let mut sse = server.sse(&id, SseFrom::Start).await;
    let run = server.start_run(&id, "cancel me").await;
    let run_id = id_of(&run);

    sse.until_type("agent.assistant-stream").await;
    let asked = Instant::now();
    let outcome = server.cancel(&id).await;
    assert_eq!(outcome["cancelled"], true, "{outcome}");
    assert_eq!(outcome["run_id"], run_id.as_str(), "{outcome}");
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
    let terminals = terminal_events_of(&log, &run_id);
    assert_eq!(
        types(&terminals.into_iter().cloned().collect::<Vec<_>>()),
        ["agent.cancelled"]
    );
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
    let path = format!("/v1/sessions/{id}/resume?wait=true");
    let resumed = server
        .post_empty(&path)
        .await
        .expect_json(StatusCode::OK, &path);
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
        let terminals: Vec<Value> = terminal_events_of(&log, &run_id)
            .into_iter()
            .cloned()
            .collect();
        assert_eq!(types(&terminals), ["agent.cancelled"], "round {round}");
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

#[tokio::test]
async fn kill_9_mid_turn_then_resume_completes_the_turn() {
    let mut server = TestServer::start(ServerOptions::new().mock_delay_ms(50).process()).await;
    let id = server.create_session().await;
    let mut sse = server.sse(&id, SseFrom::Start).await;
    let run = server.start_run(&id, "survive a crash").await;
    let run_id = id_of(&run);
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
    let terminals: Vec<Value> = terminal_events_of(&log, &run_id)
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(types(&terminals), ["agent.failed"], "{:?}", types(&log));
    assert_eq!(terminals[0]["data"]["error"], "interrupted");

    let path = format!("/v1/sessions/{id}/resume?wait=true");
    let resumed = server
        .post_empty(&path)
        .await
        .expect_json(StatusCode::OK, &path);
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
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ],
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

#[tokio::test]
async fn fork_copies_the_requested_turns() {
    let server = TestServer::start(ServerOptions::new()).await;
    let source = server
        .create_session_with(&json!({"title": "source"}))
        .await;
    let source = id_of(&source);
    server.run_wait(&source, "turn one").await;
    server.run_wait(&source, "turn two").await;
    let source_messages = server.messages(&source).await;
    let source_events = server.events(&source).await;
    assert_eq!(source_messages.len(), 13);

    let mut forks = Vec::new();
    for (body, expected_len) in [
        (Some(json!({"turns": 0})), 1),
        (Some(json!({"turns": 1})), 7),
        (Some(json!({"turns": 2})), 13),
        (Some(json!({"turns": 50})), 13),
        (Some(json!({})), 13),
        (None, 13),
    ] {
        let path = format!("/v1/sessions/{source}/fork");
        let reply = match &body {
            Some(body) => server.post_json(&path, body).await,
            None => server.post_empty(&path).await,
        };
        let what = format!("fork with {body:?}");
        let fork = reply.expect_json(StatusCode::CREATED, &what);
        let fork_id = id_of(&fork);
        assert_ne!(fork_id, source);
        assert_eq!(fork["parent_id"], source.as_str(), "{what}: {fork}");
        assert_eq!(fork["state"], "idle", "{what}: {fork}");
        assert_eq!(fork["message_count"], expected_len, "{what}: {fork}");

        let messages = server.messages(&fork_id).await;
        let shapes: Vec<Value> = messages.iter().map(message_shape).collect();
        let expected: Vec<Value> = source_messages[..expected_len]
            .iter()
            .map(message_shape)
            .collect();
        assert_eq!(shapes, expected, "{what}: the fork's messages");

        let events = server.events(&fork_id).await;
        assert_eq!(
            types(&events),
            ["session.created", "session.forked"],
            "{what}"
        );
        assert_contiguous_from_one(&events);
        assert_eq!(events[1]["data"]["parent_id"], source.as_str(), "{what}");
        let turns = body
            .as_ref()
            .and_then(|b| b.get("turns"))
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(events[1]["data"]["turns"], turns, "{what}");
        forks.push((fork_id, expected_len));
    }

    // A run on a fork works, and the source does not change.
    let (one_turn, _) = &forks[1];
    let result = server.run_wait(one_turn, "turn on the fork").await;
    assert_eq!(result["status"], "completed", "{result}");
    let messages = server.messages(one_turn).await;
    assert_eq!(messages.len(), 13);
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
    assert_eq!(messages[7]["content"], "turn on the fork");
    let events = server.events(one_turn).await;
    assert_contiguous_from_one(&events);
    assert_eq!(events[2]["type"], "agent.started");

    let (empty, _) = &forks[0];
    let result = server.run_wait(empty, "from scratch").await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(server.messages(empty).await.len(), 7);

    assert_eq!(
        server.messages(&source).await,
        source_messages,
        "the source's messages"
    );
    assert_eq!(
        server.events(&source).await,
        source_events,
        "the source's events"
    );
    let listed: Vec<String> = server.sessions().await.iter().map(id_of).collect();
    for (fork_id, _) in &forks {
        assert!(listed.contains(fork_id), "fork {fork_id} is listed");
    }
}

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
    let session = server.session(&id).await;
    assert_eq!(session["state"], "failed", "{session}");
    let log = server.events(&id).await;
    let limited_id = limited["run_id"].as_str().unwrap_or("?");
    assert_eq!(
        terminal_events_of(&log, limited_id).len(),
        1,
        "{:?}",
        types(&log)
    );
    let llm_steps = server
        .steps(&id)
        .await
        .iter()
        .filter(|s| s["kind"] == "llm")
        .count();
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
        .filter(|s| s["kind"] == "llm" && s["run_id"] == result["run_id"])
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
async fn sigterm_during_a_slow_run_stops_gracefully_and_the_run_resumes() {
    let mut server = TestServer::start(ServerOptions::new().mock_delay_ms(50).process()).await;
    let id = server.create_session().await;
    let mut sse = server.sse(&id, SseFrom::Start).await;
    let run = server.start_run(&id, "stop the server").await;
    let run_id = id_of(&run);
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
    let terminals: Vec<Value> = terminal_events_of(&log, &run_id)
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(types(&terminals), ["agent.failed"], "{:?}", types(&log));
    assert_eq!(terminals[0]["data"]["error"], "interrupted");
    assert_eq!(server.session(&other).await["state"], "failed");

    let path = format!("/v1/sessions/{id}/resume?wait=true");
    let resumed = server
        .post_empty(&path)
        .await
        .expect_json(StatusCode::OK, &path);
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

/// Figures for the issue: what an LLM step stores does not grow with the history. Its
/// `request` is the projection descriptor (how to rebuild the request), not the request, so a
/// 30-turn session without `--context-chars` stores about as much per step at the end as at
/// the start.
#[tokio::test]
async fn the_storage_of_an_llm_step_does_not_grow_with_the_history() {
    const TURNS: usize = 30;
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    for turn in 1..=TURNS {
        let result = server
            .run_wait(&id, &format!("turn {turn}: what is in this workspace?"))
            .await;
        assert_eq!(result["status"], "completed", "turn {turn}: {result}");
    }

    let steps = server.steps(&id).await;
    let llm: Vec<&Value> = steps.iter().filter(|s| s["kind"] == "llm").collect();
    assert_eq!(llm.len(), 3 * TURNS, "3 LLM steps per turn");
    let sizes: Vec<usize> = llm
        .iter()
        .map(|step| {
            let request = &step["request"];
            assert!(
                request.is_object() && request.get("messages").is_none(),
                "an LLM step stores the projection descriptor, not the request: {step}"
            );
            serde_json::to_string(request)
                .expect("the request as JSON")
                .len()
        })
        .collect();
    let average = |s: &[usize]| s.iter().sum::<usize>() as f64 / s.len() as f64;
    let first = average(&sizes[..5]);
    let last = average(&sizes[sizes.len() - 5..]);
    let messages = server.messages(&id).await;
    let history_chars: usize = messages
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").chars().count())
        .sum();
    // For comparison: the size of the requests rebuilt from those descriptors.
    let mut rebuilt = Vec::new();
    for step in [llm[0], llm[llm.len() - 1]] {
        let view = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(step)))
            .await;
        rebuilt.push(
            serde_json::to_string(&view["request"])
                .expect("the request as JSON")
                .len(),
        );
    }
    eprintln!(
        "bytes per LLM step ({}, {TURNS} turns, {} LLM steps, {} messages, {history_chars} \
         history chars): stored request first 5 average {first:.1} B, last 5 average {last:.1} \
         B; the rebuilt request of the first LLM step {} B, of the last {} B; all {sizes:?}",
        Backend::current().name(),
        llm.len(),
        messages.len(),
        rebuilt[0],
        rebuilt[1],
    );
    assert!(
        last <= first + 64.0,
        "the stored request of an LLM step grows with the history: first 5 average {first:.1} \
         bytes, last 5 average {last:.1} bytes"
    );
}

//! Approvals through HTTP: what policy asks about waits for a human, and every answer (allow,
//! always, deny with a reason, an edited input, a repeat, a conflicting answer, none in time,
//! a cancel, a new message) is recorded once and continues the run, also after a restart.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fakes::{start_openai, FakeServer, FakeToolCall};
use crate::support::{is_postgres, TestServer};
use crate::tools::{
    answer, asks, call, ended, finished, kill9_and_restart, model_calling, options, output_of,
    pending_within, policed, says, start,
};

/// A run on a server with the default policy whose model asks for `call`, waiting for the
/// call's approval: the fake model (it stops when dropped, so keep it bound), the server, the
/// session id and the pending approval.
async fn waiting_on(call: FakeToolCall) -> (FakeServer, TestServer, String, Value) {
    let model = model_calling(vec![call]).await;
    let server = start(&model, &[]).await;
    let (id, pending) = until_pending(&server).await;
    (model, server, id, pending)
}

/// Starts a run and waits until its first approval is requested; returns the session id and
/// the pending approval.
async fn until_pending(server: &TestServer) -> (String, Value) {
    let id = server.create_session().await;
    (id.clone(), run_until_pending(server, &id).await)
}

/// Starts a run of session `id` and waits until its first approval is requested.
async fn run_until_pending(server: &TestServer, id: &str) -> Value {
    server.start_run(id, "please do it").await;
    wait_pending(server, id, 1).await[0].clone()
}

async fn wait_pending(server: &TestServer, id: &str, n: usize) -> Vec<Value> {
    pending_within(server, id, n, Duration::from_secs(10)).await
}

/// The first `tool.approval-resolved` event.
fn resolution(events: &[Value]) -> &Value {
    events
        .iter()
        .find(|e| e["type"] == "tool.approval-resolved")
        .expect("a tool.approval-resolved event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_runs_and_the_answer_is_idempotent() {
    let (_model, server, id, pending) = waiting_on(call(
        "w1",
        "write_file",
        json!({"path": "a.txt", "content": "A"}),
    ))
    .await;
    assert_eq!(pending["call_id"], "w1");
    assert_eq!(pending["tool"], "write_file");
    assert_eq!(pending["subject"], "a.txt");
    assert!(pending["expires_at"].is_string(), "{pending}");
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    assert!(
        !server.workspace().join("a.txt").exists(),
        "ran before it was allowed"
    );

    let asked = Instant::now();
    let reply = answer(&server, &id, "w1", json!({"decision": "allow"})).await;
    let resolution = reply.expect_json(StatusCode::OK, "allow");
    assert_eq!(
        resolution,
        json!({"call_id": "w1", "decision": "allow", "by": "user", "answered_by": "operator"})
    );
    let session = ended(&server, &id).await;
    assert_eq!(session["state"], "completed", "{session}");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("a.txt")).unwrap(),
        "A"
    );
    let events = server.events(&id).await;
    let started_at = events
        .iter()
        .find(|e| e["type"] == "tool.started")
        .and_then(|e| e["created_at"].as_str())
        .unwrap()
        .to_string();
    eprintln!(
        "approval answered → tool started: {} ms (answer to end of run {:?})",
        millis_between(&resolved_at(&events, "w1"), &started_at),
        asked.elapsed()
    );
    // The same answer again: 200 and nothing new; another one: 409 with the stored answer.
    let count = events.len();
    let again = answer(&server, &id, "w1", json!({"decision": "allow"})).await;
    assert_eq!(again.expect_json(StatusCode::OK, "repeat"), resolution);
    let other = answer(&server, &id, "w1", json!({"decision": "deny"})).await;
    let problem = other.expect_problem(StatusCode::CONFLICT, "another answer");
    assert_eq!(problem["resolution"], resolution);
    assert_eq!(server.events(&id).await.len(), count);
}

fn resolved_at(events: &[Value], call_id: &str) -> String {
    events
        .iter()
        .find(|e| e["type"] == "tool.approval-resolved" && e["data"]["call_id"] == call_id)
        .and_then(|e| e["created_at"].as_str())
        .unwrap()
        .to_string()
}

fn millis_between(a: &str, b: &str) -> i64 {
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
    (t(b) - t(a)).num_milliseconds()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_reaches_the_model_with_its_reason_and_the_run_goes_on() {
    let (model, server, id, _) =
        waiting_on(call("d1", "shell", json!({"command": "rm -rf /"}))).await;
    let reply = answer(
        &server,
        &id,
        "d1",
        json!({"decision": "deny", "reason": "never do that"}),
    )
    .await;
    reply.expect_json(StatusCode::OK, "deny");
    assert_eq!(ended(&server, &id).await["state"], "completed");
    let events = server.events(&id).await;
    let output: Value = serde_json::from_str(&output_of(&events, "d1")).unwrap();
    assert_eq!(
        output,
        json!({"error": "the user denied this call", "reason": "never do that"})
    );
    assert!(!events.iter().any(|e| e["type"] == "tool.started"));
    // The model saw the denial as the call's result.
    let requests = model.requests();
    let last = requests.last().unwrap();
    let tool_message = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    assert!(tool_message["content"]
        .as_str()
        .unwrap()
        .contains("the user denied this call"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_adds_a_session_rule_and_the_same_call_then_runs_unasked() {
    let first = call(
        "a1",
        "write_file",
        json!({"path": "log.txt", "content": "1"}),
    );
    let second = call(
        "a2",
        "write_file",
        json!({"path": "log.txt", "content": "2"}),
    );
    let other = call(
        "a3",
        "write_file",
        json!({"path": "other.txt", "content": "3"}),
    );
    let model = start_openai(vec![
        asks(&[first]),
        says("ok"),
        asks(&[second, other]),
        says("ok"),
    ])
    .await;
    let server = start(&model, &[]).await;
    let (id, _) = until_pending(&server).await;
    answer(&server, &id, "a1", json!({"decision": "always"}))
        .await
        .expect_json(StatusCode::OK, "always");
    ended(&server, &id).await;
    let events = server.events(&id).await;
    let updated = events
        .iter()
        .find(|e| e["type"] == "tool.policy-updated")
        .expect("a policy-updated event");
    assert_eq!(
        updated["data"]["rule"],
        json!({"tool": "write_file", "match": "log.txt", "action": "allow"})
    );
    let session = server.session(&id).await;
    assert_eq!(session["tool_policy"][0]["match"], "log.txt", "{session}");
    // Next turn: the same tool and subject runs without asking; another subject asks.
    server.start_run(&id, "again").await;
    let pending = wait_pending(&server, &id, 1).await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["call_id"], "a3");
    let events = server.events(&id).await;
    assert!(events
        .iter()
        .any(|e| e["type"] == "tool.started" && e["data"]["call"]["id"] == "a2"));
    answer(&server, &id, "a3", json!({"decision": "deny"})).await;
    ended(&server, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_input_is_checked_and_runs_instead() {
    let (_model, server, id, _) = waiting_on(call(
        "e1",
        "write_file",
        json!({"path": "x.txt", "content": "model"}),
    ))
    .await;
    let bad = answer(
        &server,
        &id,
        "e1",
        json!({"decision": "allow", "input": {"path": 7}}),
    )
    .await;
    bad.expect_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "an input that does not fit",
    );
    // Still waiting, nothing recorded.
    assert_eq!(wait_pending(&server, &id, 1).await.len(), 1);
    let edited = json!({"path": "y.txt", "content": "human"});
    let reply = answer(
        &server,
        &id,
        "e1",
        json!({"decision": "allow", "input": edited}),
    )
    .await;
    assert_eq!(reply.expect_json(StatusCode::OK, "edited")["input"], edited);
    ended(&server, &id).await;
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("y.txt")).unwrap(),
        "human"
    );
    assert!(!server.workspace().join("x.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_answering_in_time_fails_closed_and_says_so() {
    let model = model_calling(vec![call("t1", "shell", json!({"command": "true"}))]).await;
    let server = start(&model, &["--approval-timeout-s", "1"]).await;
    let id = server.create_session().await;
    server.start_run(&id, "wait for me").await;
    assert_eq!(ended(&server, &id).await["state"], "completed");
    let events = server.events(&id).await;
    assert_eq!(resolution(&events)["data"]["by"], "timeout");
    let output = output_of(&events, "t1");
    assert!(output.contains("nobody answered"), "{output}");
    assert!(!output.contains("denied"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_resolves_what_waits_before_the_run_ends() {
    let (_model, server, id, _) = waiting_on(call("k1", "shell", json!({"command": "true"}))).await;
    let outcome = server.cancel(&id).await;
    assert_eq!(outcome["cancelled"], true, "{outcome}");
    assert_eq!(outcome["state"], "cancelled", "{outcome}");
    assert_eq!(ended(&server, &id).await["state"], "cancelled");
    let events = server.events(&id).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let resolved = kinds
        .iter()
        .position(|k| *k == "tool.approval-resolved")
        .unwrap();
    let cancelled = kinds.iter().position(|k| *k == "agent.cancelled").unwrap();
    assert!(resolved < cancelled, "{kinds:?}");
    assert_eq!(events[resolved]["data"]["by"], "cancel");
    // The next run starts cleanly: the call has its result.
    let result = server.run_wait(&id, "next").await;
    assert_eq!(result["status"], "completed", "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_is_refused_while_calls_wait_unless_it_denies_them() {
    let (_model, server, id, _) = waiting_on(call("p1", "shell", json!({"command": "true"}))).await;
    let refused = server
        .post_json(
            &format!("/v1/sessions/{id}/runs"),
            &json!({"input": "hello?"}),
        )
        .await;
    let problem = refused.expect_problem(StatusCode::CONFLICT, "a run while calls wait");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("approvals-pending"),
        "{problem}"
    );
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/runs?pending=deny&wait=true"),
            &json!({"input": "never mind"}),
        )
        .await;
    let result = reply.expect_json(StatusCode::OK, "pending=deny");
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let resolved = resolution(&events);
    assert_eq!(resolved["data"]["by"], "user");
    assert_eq!(resolved["data"]["reason"], "superseded by a new message");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let at = |k: &str| kinds.iter().rposition(|x| *x == k).unwrap();
    assert!(
        at("tool.approval-resolved") < at("user.message"),
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_survives_kill_9_and_the_answer_continues_it() {
    let model = model_calling(vec![call(
        "r1",
        "write_file",
        json!({"path": "r.txt", "content": "R"}),
    )])
    .await;
    let mut server = TestServer::start(options(&model, &[]).process()).await;
    let (id, _) = until_pending(&server).await;
    kill9_and_restart(&mut server, &id).await;
    let session = server.session(&id).await;
    assert_eq!(session["state"], "waiting_tool", "{session}");
    let pending = wait_pending(&server, &id, 1).await;
    assert_eq!(pending[0]["call_id"], "r1");
    answer(&server, &id, "r1", json!({"decision": "allow"}))
        .await
        .expect_json(StatusCode::OK, "allow after a restart");
    assert_eq!(ended(&server, &id).await["state"], "completed");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("r.txt")).unwrap(),
        "R"
    );
    // One run, never interrupted.
    let runs = server.runs(&id).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "completed");
    assert!(!server
        .events(&id)
        .await
        .iter()
        .any(|e| e["type"] == "agent.failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_expired_while_the_server_was_down_is_resolved_when_it_starts() {
    if is_postgres() {
        return;
    }
    let model = model_calling(vec![call("x1", "shell", json!({"command": "true"}))]).await;
    let mut server =
        TestServer::start(options(&model, &["--approval-timeout-s", "1"]).process()).await;
    let (id, _) = until_pending(&server).await;
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server
        .restart_with(options(&model, &["--approval-timeout-s", "1"]).process())
        .await;
    assert_eq!(ended(&server, &id).await["state"], "completed");
    let events = server.events(&id).await;
    assert_eq!(resolution(&events)["data"]["by"], "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_policy_wins_over_the_session_and_approval_mode_deny_needs_no_human() {
    let (_dir, _model, server_options) = policed(
        json!([{"tool": "shell", "match": "rm *", "action": "deny"}]),
        vec![
            call("q1", "shell", json!({"command": "rm -rf build"})),
            call("q2", "write_file", json!({"path": "n.txt", "content": "n"})),
        ],
        &["--approval-mode", "deny"],
    )
    .await;
    let server = TestServer::start(server_options).await;
    // The session tries to loosen both: the server's deny stands; its allow for writes holds.
    let session = server
        .create_session_with(&json!({"tool_policy": [
            {"tool": "shell", "action": "allow"},
            {"tool": "write_file", "action": "allow"}
        ]}))
        .await;
    let id = session["id"].as_str().unwrap().to_string();
    let result = server.run_wait(&id, "clean up").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    assert_eq!(finished(&events, "q1")["data"]["is_error"], true);
    let resolved: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.approval-resolved")
        .collect();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["data"]["by"], "policy");
    assert!(resolved[0]["data"]["reason"]
        .as_str()
        .unwrap()
        .contains("server"));
    assert_eq!(finished(&events, "q2")["data"]["is_error"], false);
    // With approval mode deny, what would ask is refused by the policy.
    let model = model_calling(vec![call(
        "m1",
        "edit_file",
        json!({"path": "README.md", "old_string": "a", "new_string": "b"}),
    )])
    .await;
    let server = TestServer::start(options(&model, &["--approval-mode", "deny"])).await;
    let id = server.create_session().await;
    server.run_wait(&id, "edit").await;
    let events = server.events(&id).await;
    assert_eq!(resolution(&events)["data"]["by"], "policy");
    assert!(!events
        .iter()
        .any(|e| e["type"] == "tool.approval-requested"));
}

/// The `type` of a problem, without its `urn:tah:problem:` prefix.
fn kind(problem: &Value) -> &str {
    problem["type"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("urn:tah:problem:")
}

fn resolved_count(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["type"] == "tool.approval-resolved")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_input_the_policy_denies_is_refused_and_always_remembers_what_ran() {
    let (_dir, _model, server_options) = policed(
        json!([{"tool": "write_file", "match": "secret/**", "action": "deny"}]),
        vec![call(
            "e2",
            "write_file",
            json!({"path": "notes.md", "content": "model"}),
        )],
        &[],
    )
    .await;
    let server = TestServer::start(server_options).await;
    let session = server
        .create_session_with(&json!({"tool_policy": [
            {"tool": "write_file", "match": "private/*", "action": "deny"}
        ]}))
        .await;
    let id = session["id"].as_str().unwrap().to_string();
    let pending = run_until_pending(&server, &id).await;
    assert_eq!(pending["subject"], "notes.md");

    // What the server's rule denies, and what the session's rule denies, does not run
    // whatever the human answers; the approval goes on waiting for another answer.
    for (decision, path, origin) in [
        ("always", "secret/x.md", "server"),
        ("allow", "secret/deep/y.md", "server"),
        ("allow", "private/z.md", "session"),
    ] {
        let body = json!({"decision": decision, "input": {"path": path, "content": "human"}});
        let reply = answer(&server, &id, "e2", body).await;
        let problem = reply.expect_problem(StatusCode::FORBIDDEN, path);
        assert_eq!(kind(&problem), "edited-input-denied", "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(path), "{detail}");
        assert!(detail.contains(origin), "{detail}");
        assert!(
            !server.workspace().join(path).exists(),
            "{path} was written"
        );
    }
    let pending = wait_pending(&server, &id, 1).await;
    assert_eq!(pending[0]["call_id"], "e2");
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    assert_eq!(resolved_count(&server.events(&id).await), 0);

    // An input whose call would itself be asked about is what the human approves.
    let edited = json!({"path": "public/ok.md", "content": "human"});
    let reply = answer(
        &server,
        &id,
        "e2",
        json!({"decision": "always", "input": edited}),
    )
    .await;
    assert_eq!(reply.expect_json(StatusCode::OK, "always")["input"], edited);
    assert_eq!(ended(&server, &id).await["state"], "completed");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("public/ok.md")).unwrap(),
        "human"
    );
    assert!(!server.workspace().join("notes.md").exists());
    // `always` remembers the subject of the call that ran, not of the one asked about.
    let events = server.events(&id).await;
    let updated = events
        .iter()
        .find(|e| e["type"] == "tool.policy-updated")
        .expect("a policy-updated event");
    let rule = json!({"tool": "write_file", "match": "public/ok.md", "action": "allow"});
    assert_eq!(updated["data"]["rule"], rule);
    let session = server.session(&id).await;
    assert_eq!(
        session["tool_policy"].as_array().unwrap().last(),
        Some(&rule),
        "{session}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_input_is_checked_against_the_policy_after_a_restart_too() {
    let (_dir, _model, server_options) = policed(
        json!([{"tool": "write_file", "match": "secret/**", "action": "deny"}]),
        vec![call(
            "e3",
            "write_file",
            json!({"path": "notes.md", "content": "model"}),
        )],
        &[],
    )
    .await;
    let mut server = TestServer::start(server_options.process()).await;
    let (id, _) = until_pending(&server).await;
    kill9_and_restart(&mut server, &id).await;
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    let body = json!({"decision": "allow", "input": {"path": "secret/x.md", "content": "h"}});
    let problem = answer(&server, &id, "e3", body)
        .await
        .expect_problem(StatusCode::FORBIDDEN, "denied after a restart");
    assert_eq!(kind(&problem), "edited-input-denied", "{problem}");
    assert_eq!(wait_pending(&server, &id, 1).await[0]["call_id"], "e3");
    answer(&server, &id, "e3", json!({"decision": "deny"}))
        .await
        .expect_json(StatusCode::OK, "deny");
    assert_eq!(ended(&server, &id).await["state"], "completed");
    assert!(!server.workspace().join("secret/x.md").exists());
    assert!(!server.workspace().join("notes.md").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_to_a_call_of_an_older_run_is_a_repeat_or_a_conflict() {
    let write = |id: &str, path: &str| call(id, "write_file", json!({"path": path, "content": id}));
    let model = start_openai(vec![
        asks(&[write("o1", "one.txt")]),
        says("ok"),
        asks(&[write("o2", "two.txt")]),
        says("ok"),
    ])
    .await;
    let mut server = TestServer::start(options(&model, &[]).process()).await;
    let (id, _) = until_pending(&server).await;
    let first = answer(&server, &id, "o1", json!({"decision": "allow"}))
        .await
        .expect_json(StatusCode::OK, "allow o1");
    ended(&server, &id).await;

    // While the next run waits for its own call, an answer to the older run's call is
    // looked up in the log: the same answer is a repeat, another one a conflict.
    assert_eq!(run_until_pending(&server, &id).await["call_id"], "o2");
    let again = answer(&server, &id, "o1", json!({"decision": "allow"})).await;
    assert_eq!(
        again.expect_json(StatusCode::OK, "repeat while busy"),
        first
    );
    let other = answer(&server, &id, "o1", json!({"decision": "deny"})).await;
    let problem = other.expect_problem(StatusCode::CONFLICT, "conflict while busy");
    assert_eq!(kind(&problem), "already-resolved", "{problem}");
    assert_eq!(problem["resolution"], first);
    let unknown = answer(&server, &id, "never-made", json!({"decision": "allow"})).await;
    let problem = unknown.expect_problem(StatusCode::NOT_FOUND, "unknown while busy");
    assert_eq!(kind(&problem), "no-such-call", "{problem}");
    // The waiting call is not disturbed.
    assert_eq!(wait_pending(&server, &id, 1).await[0]["call_id"], "o2");
    // The same after a restart, with the run waiting and nobody driving it.
    kill9_and_restart(&mut server, &id).await;
    let again = answer(&server, &id, "o1", json!({"decision": "allow"})).await;
    assert_eq!(
        again.expect_json(StatusCode::OK, "repeat when parked"),
        first
    );
    let other = answer(&server, &id, "o1", json!({"decision": "always"})).await;
    let problem = other.expect_problem(StatusCode::CONFLICT, "conflict when parked");
    assert_eq!(problem["resolution"], first);
    answer(&server, &id, "never-made", json!({"decision": "allow"}))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "unknown when parked");
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    let second = answer(&server, &id, "o2", json!({"decision": "deny"}))
        .await
        .expect_json(StatusCode::OK, "deny o2");
    ended(&server, &id).await;

    // Two runs later, with nothing running, both are still answered from the log.
    let result = server.run_wait(&id, "anything else?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let count = server.events(&id).await.len();
    let repeat = answer(&server, &id, "o1", json!({"decision": "allow"})).await;
    assert_eq!(
        repeat.expect_json(StatusCode::OK, "repeat when idle"),
        first
    );
    let repeat = answer(&server, &id, "o2", json!({"decision": "deny"})).await;
    assert_eq!(
        repeat.expect_json(StatusCode::OK, "repeat when idle"),
        second
    );
    let other = answer(&server, &id, "o2", json!({"decision": "always"})).await;
    let problem = other.expect_problem(StatusCode::CONFLICT, "conflict when idle");
    assert_eq!(problem["resolution"], second);
    let unknown = answer(&server, &id, "never-made", json!({"decision": "deny"})).await;
    unknown.expect_problem(StatusCode::NOT_FOUND, "unknown when idle");
    // An approval's call is no client tool's call.
    let result = server
        .post_json(
            &format!("/v1/sessions/{id}/tool-results/o1"),
            &json!({"output": "x"}),
        )
        .await;
    result.expect_problem(StatusCode::NOT_FOUND, "an approval's call as a client call");
    assert_eq!(
        server.events(&id).await.len(),
        count,
        "an answer changed the log"
    );
    assert_eq!(server.session(&id).await["state"], "completed");
}

/// The JSON of every `data:` line of an SSE body.
fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| {
            serde_json::from_str(data.trim())
                .unwrap_or_else(|e| panic!("a data line that is not JSON ({e}): {data}"))
        })
        .collect()
}

/// Posts an AG-UI run input and reads the whole stream, which must end by itself.
async fn ag_ui_stream(server: &TestServer, id: &str, input: &Value) -> Vec<Value> {
    let path = format!("/v1/sessions/{id}/ag-ui");
    let reply = tokio::time::timeout(Duration::from_secs(10), server.post_json(&path, input))
        .await
        .unwrap_or_else(|_| panic!("the AG-UI stream of {input} did not end"));
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    sse_data(&reply.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ag_ui_reconnect_to_a_run_that_waits_ends_with_its_interrupt() {
    let model = model_calling(vec![call(
        "g1",
        "write_file",
        json!({"path": "g.txt", "content": "G"}),
    )])
    .await;
    let server = start(&model, &[]).await;
    let id = server.create_session().await;
    let user = json!({"id": "u1", "role": "user", "content": "write g.txt"});
    let first = ag_ui_stream(
        &server,
        &id,
        &json!({"threadId": id, "runId": "r1", "messages": [user]}),
    )
    .await;
    let interrupt = first.last().expect("frames").clone();
    assert_eq!(interrupt["type"], "RUN_FINISHED", "{first:?}");
    assert_eq!(interrupt["outcome"]["type"], "interrupt", "{interrupt}");
    assert_eq!(interrupt["outcome"]["interrupts"][0]["toolCallId"], "g1");

    // The client comes back with what it has and nothing new, twice: each stream opens with
    // the snapshot and ends with the same interrupt, at once.
    let assistant = json!({"id": "a1", "role": "assistant", "content": "",
        "toolCalls": [{"id": "g1", "type": "function",
            "function": {"name": "write_file", "arguments": "{}"}}]});
    for run_id in ["r2", "r3"] {
        let started = Instant::now();
        let again = ag_ui_stream(
            &server,
            &id,
            &json!({"threadId": id, "runId": run_id, "messages": [user, assistant]}),
        )
        .await;
        eprintln!(
            "AG-UI reconnect to a waiting run: {} frames in {:?}",
            again.len(),
            started.elapsed()
        );
        let kinds: Vec<&str> = again.iter().filter_map(|f| f["type"].as_str()).collect();
        assert_eq!(kinds.first(), Some(&"RUN_STARTED"), "{kinds:?}");
        assert_eq!(kinds.get(1), Some(&"MESSAGES_SNAPSHOT"), "{kinds:?}");
        let end = again.last().expect("frames");
        assert_eq!(end["type"], "RUN_FINISHED", "{kinds:?}");
        assert_eq!(end["runId"], run_id);
        assert_eq!(end["outcome"], interrupt["outcome"], "{end}");
    }
    assert_eq!(server.session(&id).await["state"], "waiting_tool");
    assert_eq!(wait_pending(&server, &id, 1).await[0]["call_id"], "g1");

    // The interrupt is still answered by the next run's resume.
    let resume = json!({"threadId": id, "runId": "r4", "messages": [user, assistant],
        "resume": [{"interruptId": "g1", "status": "resolved", "payload": {"approved": true}}]});
    let last = ag_ui_stream(&server, &id, &resume).await;
    let end = last.last().expect("frames");
    assert_eq!(end["outcome"]["type"], "success", "{end}");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("g.txt")).unwrap(),
        "G"
    );
}

/// Waits until the session's run has ended, failing at once if it asks about `call_id`
/// again; returns the session.
async fn ended_without_asking_again(server: &TestServer, id: &str, call_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pending = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        assert!(
            !pending["data"]
                .as_array()
                .is_some_and(|p| p.iter().any(|a| a["call_id"] == call_id)),
            "{call_id} was asked about again after its allow: {pending}"
        );
        let session = server.session(id).await;
        if !matches!(session["state"].as_str(), Some("running" | "waiting_tool")) {
            return session;
        }
        assert!(Instant::now() < deadline, "the run never ended: {session}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_acknowledged_before_kill_9_is_honoured_by_the_resume() {
    // The first call is killed while it runs (the resume runs it again); the others are killed
    // as soon as their allow is acknowledged, wherever the run is then.
    let calls = [
        call("k0", "shell", json!({"command": "sleep 1; echo slept"})),
        call(
            "k1",
            "write_file",
            json!({"path": "k1.txt", "content": "1"}),
        ),
        call(
            "k2",
            "write_file",
            json!({"path": "k2.txt", "content": "2"}),
        ),
        call(
            "k3",
            "write_file",
            json!({"path": "k3.txt", "content": "3"}),
        ),
    ];
    let mut paths = Vec::new();
    for (n, fake_call) in calls.into_iter().enumerate() {
        let call_id = format!("k{n}");
        let model = model_calling(vec![fake_call]).await;
        let mut server = TestServer::start(options(&model, &[]).process()).await;
        let (id, pending) = until_pending(&server).await;
        assert_eq!(pending["call_id"], call_id.as_str());
        answer(&server, &id, &call_id, json!({"decision": "allow"}))
            .await
            .expect_json(StatusCode::OK, "allow");
        if n == 0 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !server
                .events(&id)
                .await
                .iter()
                .any(|e| e["type"] == "tool.started")
            {
                assert!(Instant::now() < deadline, "the allowed call never started");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        kill9_and_restart(&mut server, &id).await;
        let state = server.session(&id).await["state"].clone();
        let path = match state.as_str() {
            Some("failed") => {
                server
                    .post_empty(&format!("/v1/sessions/{id}/resume"))
                    .await
                    .expect_json(StatusCode::ACCEPTED, "resume");
                "interrupted, then resumed"
            }
            Some("completed") => "finished before the kill",
            _ => "still waiting, continued by the restart",
        };
        paths.push(format!("{call_id}: {path}"));
        let session = ended_without_asking_again(&server, &id, &call_id).await;
        assert_eq!(
            session["state"], "completed",
            "{call_id} ({path}): {session}"
        );
        let events = server.events(&id).await;
        let asked = events
            .iter()
            .filter(|e| e["type"] == "tool.approval-requested")
            .count();
        assert_eq!(asked, 1, "{call_id} ({path}) was asked about again");
        let results: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "tool.finished" && e["data"]["call_id"] == call_id.as_str())
            .collect();
        let last = results
            .last()
            .unwrap_or_else(|| panic!("{call_id} never ran"));
        assert_eq!(
            last["data"]["is_error"], false,
            "{call_id} ({path}): {last}"
        );
        if n == 0 {
            assert_eq!(path, "interrupted, then resumed");
            let output = last["data"]["output"].as_str().unwrap_or_default();
            assert!(output.starts_with("slept"), "{last}");
        }
    }
    eprintln!("allow then kill -9, per call: {paths:?}");
}

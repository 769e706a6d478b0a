//! Replay as evaluation (`POST /v1/sessions/{id}/replay`, `GET …/replay-report`), black-box,
//! on both backends: a real multi-turn session on the (priced) mock model whose turns write
//! and read files of the workspace, replayed `recorded` (every turn equal, the same messages,
//! no model call and no tool run: the metrics and the workspace tell) and `live` on another
//! agent (the report shows what differs); a replay of a replay; `turns`; a divergence the
//! policy causes; approvals answered as the source's were; the report of a replay still
//! running, and of one a restart cut short (a stop, a kill with auto-resume): complete, with
//! its error, and not going on; bad input; another tenant's source.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::agents::cost::priced_providers;
use crate::agents::create_agent;
use crate::principals::{create_key, operated};
use crate::support::*;
use crate::tools::{answer, pending_within};

/// The tools of the source's agent: it lists, reads and writes files.
const FILE_TOOLS: [&str; 3] = ["list_files", "read_file", "write_file"];

/// The source's turns: a note written, the workspace listed and read, a thought.
const INPUTS: [&str; 3] = [
    "write a note about replays",
    "What is in this workspace?",
    "think about the notes, then sum them up",
];

fn replay_path(session: &str) -> String {
    format!("/v1/sessions/{session}/replay")
}

fn report_path(session: &str) -> String {
    format!("/v1/sessions/{session}/replay-report")
}

/// `POST …/replay` that must answer 201; the new session.
async fn replay(api: &Api, source: &str, body: Value) -> Value {
    let made = api
        .post_json(&replay_path(source), &body)
        .await
        .expect_json(StatusCode::CREATED, &format!("replay {body}"));
    assert_eq!(made["replay_of"]["session"], json!(source), "{made}");
    made
}

/// The replay's report once it is complete (at most 30 s).
async fn finished_report(api: &Api, replay: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = api.get_ok(&report_path(replay)).await;
        if report["complete"] == true {
            return report;
        }
        assert!(Instant::now() < deadline, "replay not complete: {report:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Requests the server made to models of `provider`, by its metrics.
async fn model_requests(api: &Api, provider: &str) -> f64 {
    let text = api.get("/metrics").await.text();
    let label = format!("provider=\"{provider}\"");
    text.lines()
        .filter(|l| l.starts_with("tah_llm_requests_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An agent on the priced mock with `tools` (writes allowed without an approval) and `more`
/// fields; its id.
async fn agent(api: &Api, name: &str, tools: &[&str], more: Value) -> String {
    let mut body = json!({"name": name, "model": "priced/mock", "tools": tools,
                          "tool_policy": [{"tool": "write_file", "action": "allow"}]});
    for (k, v) in more.as_object().expect("an object") {
        body[k] = v.clone();
    }
    id_of(&create_agent(api, &body).await)
}

/// A session on `agent` that ran [`INPUTS`], each turn completed; its id.
async fn source_session(server: &TestServer, api: &Api, agent: &str) -> String {
    std::fs::write(
        server.workspace().join("README.md"),
        "# Replays\nA workspace for replays.\n",
    )
    .expect("write README.md");
    let id = id_of(&api.create_session_with(&json!({"agent": agent})).await);
    for input in INPUTS {
        let result = api.run_wait(&id, input).await;
        assert_eq!(result["status"], "completed", "{input}: {result}");
    }
    id
}

/// A server on the priced mock (a process: its metrics are its own).
async fn priced_server() -> (TestServer, tempfile::TempDir) {
    let (dir, path) = priced_providers();
    let server =
        TestServer::start(ServerOptions::new().process().args(&["--providers", &path])).await;
    (server, dir)
}

/// The messages of a session as a replay must reproduce them: no indexes, no times.
fn shapes(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            json!([
                m["role"],
                m["content"],
                m["tool_calls"],
                m["tool_call_id"],
                m["thinking"]
            ])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_replay_repeats_every_turn_with_no_model_call_and_no_tool_run() {
    let (server, _dir) = priced_server().await;
    let api = server.api.clone();
    let writer = agent(&api, "writer", &FILE_TOOLS, json!({})).await;
    let source = source_session(&server, &api, &writer).await;
    let source_tools = api
        .steps(&source)
        .await
        .iter()
        .filter(|s| s["type"] == "tool")
        .count();
    assert!(source_tools >= 4, "the source ran tools");
    // Nothing a tool ran is redone: the note it wrote is gone and stays gone.
    let note = server.workspace().join("notes.md");
    assert!(note.exists(), "the source wrote its note");
    std::fs::remove_file(&note).expect("remove the note");
    let mock_before = model_requests(&api, "mock").await;
    assert!(mock_before >= 6.0, "{mock_before} model requests");

    let made = replay(&api, &source, json!({"mode": "recorded"})).await;
    assert_eq!(made["replay_of"]["mode"], "recorded");
    assert_eq!(made["replay_of"]["turns"], 3);
    assert_eq!(made["replay_of"]["agent"], json!(format!("{writer}@1")));
    assert_eq!(made["agent"]["id"], json!(writer), "{made}");
    let id = id_of(&made);
    let report = finished_report(&api, &id).await;
    println!(
        "replay report (recorded):\n{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    assert_eq!(report["turns_done"], 3, "{report:#}");
    assert_eq!(report["messages_equal"], true, "{report:#}");
    for turn in report["turns"].as_array().expect("turns") {
        assert_eq!(turn["final_text_equal"], true, "{turn:#}");
        assert_eq!(turn["tool_calls_equal"], true, "{turn:#}");
        assert_eq!(turn["replay"]["status"], "completed", "{turn:#}");
        for side in ["input_tokens", "output_tokens", "cost_usd", "model_calls"] {
            assert_eq!(
                turn["source"][side], turn["replay"][side],
                "{side}: {turn:#}"
            );
        }
        let diff = turn["tool_call_diff"].as_array().expect("a diff");
        assert!(diff.iter().all(|d| d["change"] == "equal"), "{turn:#}");
    }
    assert_eq!(
        report["turns"][1]["input"], INPUTS[1],
        "the inputs in order"
    );
    let totals = &report["totals"];
    assert_eq!(totals["final_text_equal"], 3);
    assert_eq!(totals["tool_calls_equal"], 3);
    assert_eq!(totals["source"]["tool_calls"], json!(source_tools));
    assert_eq!(totals["source"]["cost_usd"], totals["replay"]["cost_usd"]);
    assert!(totals["replay"]["cost_usd"].as_f64().unwrap_or(0.0) > 0.0);

    // The same messages, no model called, no tool run.
    assert_eq!(
        shapes(&api.messages(&id).await),
        shapes(&api.messages(&source).await)
    );
    assert_eq!(model_requests(&api, "mock").await, mock_before);
    assert_eq!(
        model_requests(&api, "recorded").await,
        totals["source"]["model_calls"].as_f64().unwrap_or(-1.0)
    );
    assert!(!note.exists(), "a recorded replay wrote the note again");
    // The replay's steps show the recorded results as the source's did.
    let replay_tools: Vec<Value> = api
        .steps(&id)
        .await
        .into_iter()
        .filter(|s| s["type"] == "tool")
        .map(|s| json!([s["tool"], s["input"], s["output"]]))
        .collect();
    let source_tools: Vec<Value> = api
        .steps(&source)
        .await
        .into_iter()
        .filter(|s| s["type"] == "tool")
        .map(|s| json!([s["tool"], s["input"], s["output"]]))
        .collect();
    assert_eq!(replay_tools, source_tools);

    // A replay of the replay: its source is the replay, and it repeats it as well.
    let again = replay(&api, &id, json!({"mode": "recorded"})).await;
    let second = finished_report(&api, &id_of(&again)).await;
    assert_eq!(second["replay_of"]["session"], json!(id));
    assert_eq!(second["messages_equal"], true, "{second:#}");
    assert_eq!(second["totals"]["final_text_equal"], 3, "{second:#}");
    assert_eq!(model_requests(&api, "mock").await, mock_before);

    // A source session is no replay.
    let not = api.get(&report_path(&source)).await;
    let problem = not.expect_problem(StatusCode::NOT_FOUND, "a report of no replay");
    assert!(problem["detail"]
        .as_str()
        .unwrap_or("")
        .contains("not a replay"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_replay_on_another_agent_shows_the_differences_and_turns_limits_it() {
    let (server, _dir) = priced_server().await;
    let api = server.api.clone();
    let writer = agent(&api, "writer", &FILE_TOOLS, json!({})).await;
    let source = source_session(&server, &api, &writer).await;
    // Without list_files the mock answers with an echo and calls no tool.
    let echo = agent(&api, "echo", &["read_file"], json!({})).await;
    let before = model_requests(&api, "mock").await;

    let made = replay(
        &api,
        &source,
        json!({"mode": "live", "agent": format!("{echo}@1"), "turns": 2}),
    )
    .await;
    assert_eq!(made["replay_of"]["turns"], 2);
    assert_eq!(made["replay_of"]["agent"], json!(format!("{echo}@1")));
    let id = id_of(&made);
    let report = finished_report(&api, &id).await;
    println!(
        "replay report (live, another agent):\n{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    let turns = report["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 2, "turns limits the replay: {report:#}");
    assert_eq!(api.runs(&id).await.len(), 2);
    assert_eq!(report["messages_equal"], false);
    for turn in turns {
        assert_eq!(turn["final_text_equal"], false, "{turn:#}");
        assert_eq!(turn["tool_calls_equal"], false, "{turn:#}");
        let input = turn["input"].as_str().unwrap_or_default();
        assert_eq!(
            turn["replay"]["final_text"],
            json!(format!("Echo: {input}"))
        );
        assert_eq!(turn["replay"]["tool_calls"], json!([]));
        let diff = turn["tool_call_diff"].as_array().expect("a diff");
        assert!(!diff.is_empty() && diff.iter().all(|d| d["change"] == "removed"));
        assert!(diff[0]["source"]["name"].is_string() && diff[0].get("replay").is_none());
    }
    let first = &turns[0]["tool_call_diff"][0]["source"];
    assert_eq!(first["name"], "write_file", "{report:#}");
    assert_eq!(first["input"]["path"], "notes.md");
    assert_eq!(report["totals"]["final_text_equal"], 0);
    assert_eq!(report["totals"]["replay"]["tool_calls"], 0);
    // Live: the model was called, once per turn.
    assert_eq!(model_requests(&api, "mock").await, before + 2.0);

    // Live on the source's own agent, in the source's workspace: the note is there already.
    let made = replay(&api, &source, json!({"mode": "live", "turns": 1})).await;
    let report = finished_report(&api, &id_of(&made)).await;
    assert_eq!(report["turns"][0]["tool_calls_equal"], true, "{report:#}");
    let text = report["turns"][0]["replay"]["final_text"]
        .as_str()
        .unwrap_or("");
    assert!(text.contains("overwrote notes.md"), "{report:#}");
    assert_eq!(report["turns"][0]["final_text_equal"], false, "{report:#}");
    // In a workspace of its own, the first turn is the source's again.
    let body = json!({"mode": "live", "turns": 1, "workspace": "replay-1"});
    let made = replay(&api, &source, body).await;
    assert_eq!(made["workspace"], "replay-1", "{made}");
    let report = finished_report(&api, &id_of(&made)).await;
    assert_eq!(report["turns"][0]["tool_calls_equal"], true, "{report:#}");
    assert_eq!(report["turns"][0]["final_text_equal"], true, "{report:#}");
    assert!(server.workspace().join("replay-1/notes.md").exists());
    assert!(model_requests(&api, "mock").await > before + 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_replay_that_the_policy_makes_diverge_fails_that_turn_and_says_why() {
    let (server, _dir) = priced_server().await;
    let api = server.api.clone();
    let writer = agent(&api, "writer", &FILE_TOOLS, json!({})).await;
    let source = source_session(&server, &api, &writer).await;
    let strict = agent(
        &api,
        "strict",
        &FILE_TOOLS,
        json!({"tool_policy": [{"tool": "write_file", "action": "deny"}]}),
    )
    .await;
    let made = replay(&api, &source, json!({"mode": "recorded", "agent": strict})).await;
    let report = finished_report(&api, &id_of(&made)).await;
    let first = &report["turns"][0];
    assert_eq!(first["replay"]["status"], "failed", "{report:#}");
    let error = first["replay"]["error"].as_str().unwrap_or_default();
    println!("the diverged turn's error: {error}");
    assert!(
        error.contains("diverged") && error.contains("turn 1, step 2"),
        "{error}"
    );
    assert_eq!(first["final_text_equal"], false);
    // The other turns go on, served from the log.
    assert_eq!(report["turns_done"], 3, "{report:#}");
    assert_eq!(report["turns"][1]["replay"]["status"], "completed");
}

#[tokio::test]
async fn bad_replays_are_refused_naming_the_field() {
    let server = TestServer::start(ServerOptions::new()).await;
    let api = server.api.clone();
    let empty = api.create_session().await;
    let source = api.create_session().await;
    let result = api.run_wait(&source, "hello").await;
    assert_eq!(result["status"], "completed", "{result}");
    let sessions_before = api.sessions().await.len();
    let cases = [
        (json!({}), "mode"),
        (json!({"mode": "replayed"}), "mode"),
        (json!({"mode": 1}), "mode"),
        (json!({"mode": "live", "turns": 0}), "turns"),
        (json!({"mode": "live", "turns": -1}), "turns"),
        (json!({"mode": "live", "turns": 1.5}), "turns"),
        (json!({"mode": "live", "turns": "2"}), "turns"),
        (json!({"mode": "live", "turns": 2}), "turns"),
        (json!({"mode": "live", "agent": 7}), "agent"),
        (json!({"mode": "live", "agent": "default@x"}), "agent"),
        (json!({"mode": "live", "agent": "coder"}), "agent"),
    ];
    for (body, field) in cases {
        let reply = api.post_json(&replay_path(&source), &body).await;
        let problem = reply.expect_problem(StatusCode::BAD_REQUEST, &body.to_string());
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(field), "{body}: {detail}");
    }
    let reply = api
        .post_json(
            &replay_path(&source),
            &json!({"mode": "live", "speed": "fast"}),
        )
        .await;
    let problem = reply.expect_problem(StatusCode::UNPROCESSABLE_ENTITY, "an unknown field");
    assert!(problem["detail"].as_str().unwrap_or("").contains("speed"));
    // No turn to replay.
    let reply = api
        .post_json(&replay_path(&empty), &json!({"mode": "recorded"}))
        .await;
    reply.expect_problem(StatusCode::BAD_REQUEST, "a source with no turn");
    // No such source, no such agent.
    let missing = uuid::Uuid::now_v7();
    let reply = api
        .post_json(&replay_path(&missing.to_string()), &json!({"mode": "live"}))
        .await;
    reply.expect_problem(StatusCode::NOT_FOUND, "no such source");
    let reply = api
        .post_json(
            &replay_path(&source),
            &json!({"mode": "live", "agent": missing.to_string()}),
        )
        .await;
    reply.expect_problem(StatusCode::NOT_FOUND, "no such agent");
    assert_eq!(api.sessions().await.len(), sessions_before, "nothing made");
    // The default agent, pinned by `@`.
    let made = replay(
        &api,
        &source,
        json!({"mode": "live", "agent": "default@1", "turns": 1}),
    )
    .await;
    let report = finished_report(&api, &id_of(&made)).await;
    assert_eq!(report["turns"][0]["final_text_equal"], true, "{report:#}");
}

#[tokio::test]
async fn another_tenants_source_or_replay_is_not_found() {
    let server = TestServer::start(operated()).await;
    let op = server.api.clone();
    let acme = create_key(&op, "acme", "member").await.client(&op);
    let zeta = create_key(&op, "zeta", "admin").await.client(&op);
    let viewer = create_key(&op, "acme", "viewer").await.client(&op);
    let source = acme.create_session().await;
    let result = acme.run_wait(&source, "hello").await;
    assert_eq!(result["status"], "completed", "{result}");
    let body = json!({"mode": "recorded"});
    zeta.post_json(&replay_path(&source), &body)
        .await
        .expect_problem(StatusCode::NOT_FOUND, "another tenant's source");
    let refused = viewer.post_json(&replay_path(&source), &body).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "a viewer replays");
    let made = replay(&acme, &source, body).await;
    assert_eq!(made["tenant"], "acme");
    let id = id_of(&made);
    let report = finished_report(&acme, &id).await;
    assert_eq!(report["messages_equal"], true, "{report:#}");
    zeta.get(&report_path(&id))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "another tenant's replay");
    // The operator sees every tenant's.
    assert_eq!(op.get_ok(&report_path(&id)).await["complete"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_replay_answers_approvals_as_the_source_did() {
    let (server, _dir) = priced_server().await;
    let api = server.api.clone();
    // Its writes wait for an approval (the default policy).
    let body = json!({"name": "asking", "model": "priced/mock", "tools": FILE_TOOLS});
    let asking = id_of(&create_agent(&api, &body).await);
    let source = id_of(&api.create_session_with(&json!({"agent": asking})).await);
    let run = api.start_run(&source, INPUTS[0]).await;
    let pending = pending_within(&server, &source, 1, Duration::from_secs(10)).await;
    let call = pending[0]["call_id"].as_str().expect("a call id");
    answer(&server, &source, call, json!({"decision": "allow"}))
        .await
        .expect_json(StatusCode::OK, "an approval");
    let ended = api.wait_run(&source, &id_of(&run)).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    let made = replay(&api, &source, json!({"mode": "recorded"})).await;
    let id = id_of(&made);
    let report = finished_report(&api, &id).await;
    assert_eq!(report["messages_equal"], true, "{report:#}");
    assert_eq!(report["turns"][0]["replay"]["status"], "completed");
    let events = api.events(&id).await;
    let resolved = events
        .iter()
        .find(|e| e["type"] == "tool.approval-resolved")
        .expect("the replay's approval");
    assert_eq!(resolved["data"]["decision"], "allow", "{resolved}");
    assert_eq!(resolved["data"]["answered_by"], "replay", "{resolved}");

    // A call the source ran with no approval is denied when the replay's policy asks: the
    // turn diverges, and ends.
    let writer = agent(&api, "writer", &FILE_TOOLS, json!({})).await;
    let free = id_of(&api.create_session_with(&json!({"agent": writer})).await);
    let result = api.run_wait(&free, INPUTS[0]).await;
    assert_eq!(result["status"], "completed", "{result}");
    let made = replay(&api, &free, json!({"mode": "recorded", "agent": asking})).await;
    let report = finished_report(&api, &id_of(&made)).await;
    let error = report["turns"][0]["replay"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("diverged") && error.contains("without an approval"),
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_of_a_running_replay_says_which_turns_are_done_and_a_restart_ends_it_interrupted(
) {
    let mut server = TestServer::start(ServerOptions::new().process().mock_delay_ms(20)).await;
    let source = server.create_session().await;
    for input in ["What is here?", "And now?", "Once more?"] {
        let result = server.run_wait(&source, input).await;
        assert_eq!(result["status"], "completed", "{input}: {result}");
    }
    let id = id_of(&replay(&server, &source, json!({"mode": "live"})).await);
    let running = server.get_ok(&report_path(&id)).await;
    assert_eq!(running["complete"], false, "{running:#}");
    let turns = running["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 3);
    let done = turns.iter().filter(|t| t["done"] == true).count();
    assert_eq!(running["turns_done"], json!(done));
    assert!(done < 3, "{running:#}");
    for turn in turns.iter().filter(|t| t["done"] == false) {
        assert!(
            turn["replay"].is_null() && turn["source"].is_object(),
            "{turn:#}"
        );
    }
    // Cut short by a stop: after the restart it is complete, with the error that says so,
    // its turns so far reported, and it does not go on.
    server.restart().await;
    let stopped = finished_report(&server, &id).await;
    assert_interrupted(&server, &id, &stopped).await;
}

/// A replay whose process is killed while a turn runs, restarted with auto-resume: the turn's
/// run is not resumed (it would run outside the replay), and the replay ends interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_mid_turn_ends_interrupted_and_is_not_resumed() {
    let options = ServerOptions::new()
        .process()
        .mock_delay_ms(200)
        .args(&["--auto-resume=true"]);
    let mut server = TestServer::start(options).await;
    let source = server.create_session().await;
    for input in ["What is here?", "And now?"] {
        let result = server.run_wait(&source, input).await;
        assert_eq!(result["status"], "completed", "{input}: {result}");
    }
    // Live: its turns run on the slow mock (a recorded replay serves its steps at once).
    let id = id_of(&replay(&server, &source, json!({"mode": "live"})).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .runs(&id)
        .await
        .iter()
        .any(|r| r["status"] == "running")
    {
        assert!(Instant::now() < deadline, "no turn of the replay runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill9().await;
    server.spawn().await;
    let report = finished_report(&server, &id).await;
    assert_interrupted(&server, &id, &report).await;
    let runs = server.runs(&id).await;
    assert!(
        runs.iter().all(|r| r["kind"] == "run"),
        "no resume: {runs:#?}"
    );
    assert!(
        runs.iter().any(|r| r["error"] == "interrupted"),
        "the turn's run was cut short: {runs:#?}"
    );
}

/// The report of a replay a restart cut short: complete, with `error` saying so, a turn not
/// done or not completed; and the replay does not go on.
async fn assert_interrupted(server: &TestServer, id: &str, report: &Value) {
    eprintln!("the report of a replay cut short: {report:#}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("interrupted by a restart"), "{report:#}");
    let turns = report["turns"].as_array().expect("turns");
    assert!(
        turns
            .iter()
            .any(|t| t["done"] == false || t["replay"]["status"] != "completed"),
        "not every turn completed: {report:#}"
    );
    let runs = server.runs(id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = server.runs(id).await;
    assert_eq!(later.len(), runs.len(), "the replay went on: {later:#?}");
    assert!(later.iter().all(|r| r["status"] != "running"), "{later:#?}");
}

//! One turn with the mock model, seen the ways a user sees it: the RunResult, the message
//! history, the steps (with the rebuilt LLM request), the event log; the default run mode;
//! Unicode; a second turn; and the session list.

use std::time::Duration;

use reqwest::header::LOCATION;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

const INPUT: &str = "What is in this workspace?";

#[tokio::test]
async fn wait_mode_returns_the_run_result() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;

    let result = server.run_wait(&id, INPUT).await;

    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["finish_reason"], "stop", "{result}");
    assert_eq!(result["session_id"], id.as_str());
    assert!(result["run_id"].is_string(), "{result}");
    let text = result["text"].as_str().expect("text");
    assert!(text.contains(INPUT), "the answer quotes the input: {text}");
    assert!(
        text.contains(README_FIRST_SENTENCE),
        "the answer quotes the README's first sentence: {text}"
    );
    assert_eq!(
        result["steps"], 3,
        "list_files, read_file, answer: {result}"
    );
    assert!(
        result["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0,
        "{result}"
    );
    assert!(
        result["usage"]["output_tokens"].as_u64().unwrap_or(0) > 0,
        "{result}"
    );
    assert!(result.get("error").is_none_or(Value::is_null), "{result}");

    let session = server.session(&id).await;
    assert_eq!(session["state"], "completed", "{session}");
    assert_eq!(session["last_run_id"], result["run_id"], "{session}");
    assert_eq!(session["message_count"], 7, "{session}");
    assert_eq!(
        session["usage"], result["usage"],
        "one run: the session's usage is the run's"
    );
}

#[tokio::test]
async fn a_turn_records_the_whole_history() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, INPUT).await;

    let messages = server.messages(&id).await;
    let roles = roles(&messages);
    assert_eq!(roles, MOCK_TURN_ROLES, "{messages:#?}");
    assert_indexes_contiguous(&messages);
    assert_eq!(messages[1]["content"], INPUT);

    let call = |m: &Value| m["tool_calls"][0].clone();
    assert_eq!(call(&messages[2])["name"], "list_files", "{}", messages[2]);
    assert_eq!(messages[2]["tool_calls"].as_array().map(Vec::len), Some(1));
    assert_eq!(messages[3]["tool_call_id"], call(&messages[2])["id"]);
    assert!(
        messages[3]["content"]
            .as_str()
            .unwrap_or("")
            .contains("README.md"),
        "the listing names the README: {}",
        messages[3]
    );
    assert_eq!(call(&messages[4])["name"], "read_file", "{}", messages[4]);
    assert_eq!(call(&messages[4])["arguments"]["path"], "README.md");
    assert_eq!(messages[5]["tool_call_id"], call(&messages[4])["id"]);
    assert!(
        messages[5]["content"]
            .as_str()
            .unwrap_or("")
            .contains(README_FIRST_SENTENCE),
        "the tool result is the README: {}",
        messages[5]
    );
    assert_eq!(messages[6]["content"], result["text"]);
    assert!(
        messages[6]
            .get("tool_calls")
            .is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)),
        "the answer calls no tool: {}",
        messages[6]
    );
    assert_tool_calls_answered(&messages);
}

#[tokio::test]
async fn steps_are_recorded_and_an_llm_step_shows_its_exact_request() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, INPUT).await;

    let steps = server.steps(&id).await;
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| s["type"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(kinds, ["llm", "tool", "llm", "tool", "llm"], "{steps:#?}");
    for step in &steps {
        assert_eq!(step["status"], "completed", "{step}");
        assert_eq!(step["run_id"], result["run_id"], "{step}");
    }
    assert_eq!(steps[1]["tool"], "list_files", "{}", steps[1]);
    assert_eq!(steps[3]["tool"], "read_file", "{}", steps[3]);
    // What each step answered: a tool its output, an LLM step the message it recorded and why
    // the reply ended.
    for tool in [&steps[1], &steps[3]] {
        assert!(
            tool["output"].as_str().is_some_and(|o| !o.is_empty()),
            "{tool}"
        );
        assert_eq!(tool["is_error"], false, "{tool}");
    }
    let recorded = server.messages(&id).await;
    for (llm, at) in [(&steps[0], 2), (&steps[2], 4), (&steps[4], 6)] {
        let reply = &llm["response"];
        assert_eq!(reply["message"]["role"], "assistant", "{llm}");
        assert_eq!(
            reply["message"]["content"], recorded[at]["content"],
            "{llm}"
        );
        assert!(reply["finish_reason"].is_string(), "{llm}");
    }
    let last = &steps[4]["response"];
    assert_eq!(last["message"]["content"], result["text"], "{last}");

    // The step ids are those the events announced, in the same order.
    let events = server.events(&id).await;
    let announced: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "llm.started")
        .map(|e| &e["data"]["step_id"])
        .collect();
    let llm_ids: Vec<&Value> = steps
        .iter()
        .filter(|s| s["type"] == "llm")
        .map(|s| &s["id"])
        .collect();
    assert_eq!(announced, llm_ids);

    // Each LLM step shows the request it sent: the system prompt, then the history so far.
    let messages = server.messages(&id).await;
    for (n, (step, upto)) in steps
        .iter()
        .filter(|s| s["type"] == "llm")
        .zip([2usize, 4, 6])
        .enumerate()
    {
        let step_id = id_of(step);
        let view = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{step_id}"))
            .await;
        let sent = view["request"]["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("LLM step {n} has no request.messages: {view}"));
        assert_eq!(sent[0]["role"], "system", "LLM step {n}: {view}");
        assert_eq!(sent[0]["content"], messages[0]["content"], "LLM step {n}");
        assert!(
            sent[0]["content"].as_str().is_some_and(|c| !c.is_empty()),
            "LLM step {n}: an empty system prompt"
        );
        let sent_shapes: Vec<Value> = sent.iter().map(message_shape).collect();
        let expected: Vec<Value> = messages[..upto].iter().map(message_shape).collect();
        assert_eq!(sent_shapes, expected, "LLM step {n}: the rebuilt request");
        let tools: Vec<&str> = view["request"]["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(
            tools.contains(&"list_files") && tools.contains(&"read_file"),
            "LLM step {n} offered the tools: {view}"
        );
    }
}

#[tokio::test]
async fn the_events_of_a_turn_come_in_order() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, INPUT).await;
    let run_id = result["run_id"].as_str().expect("run_id");

    let events = server.events(&id).await;
    assert_contiguous_from_one(&events);
    let kinds = types(&events);
    assert_eq!(kinds[0], "session.created");
    assert_eq!(
        kinds[1..11],
        [
            "agent.started",
            "session.state",
            "user.message",
            "llm.started",
            "llm.completed",
            "session.usage",
            "storage.checkpoint",
            "session.state",
            "tool.started",
            "tool.finished",
        ],
        "the start of the turn; all: {kinds:?}"
    );
    assert_eq!(events[1]["data"]["run_id"], run_id);
    assert_eq!(events[1]["data"]["kind"], "run");
    assert_eq!(events[2]["data"], json!({"from": "idle", "to": "running"}));
    assert_eq!(events[3]["data"]["message"]["content"], INPUT);
    assert_eq!(events[3]["data"]["message"]["role"], "user");
    assert_eq!(events[5]["data"]["finish_reason"], "tool_calls");
    assert_eq!(
        events[5]["data"]["message"]["tool_calls"][0]["name"],
        "list_files"
    );
    assert_eq!(
        events[6]["data"]["input_tokens"], events[5]["data"]["usage"]["input_tokens"],
        "the usage of the LLM step"
    );
    assert_eq!(
        events[7]["data"]["step_id"], events[5]["data"]["step_id"],
        "checkpoint of the LLM step"
    );
    assert_eq!(
        events[8]["data"],
        json!({"from": "running", "to": "waiting_tool"})
    );
    assert_eq!(events[9]["data"]["call"]["name"], "list_files");
    assert_eq!(
        events[10]["data"]["call_id"],
        events[9]["data"]["call"]["id"]
    );
    assert_eq!(events[10]["data"]["is_error"], false);

    // Later: the README is read, then the answer streams.
    let read_started = events
        .iter()
        .position(|e| e["type"] == "tool.started" && e["data"]["call"]["name"] == "read_file")
        .unwrap_or_else(|| panic!("no read_file call: {kinds:?}"));
    let first_delta = events
        .iter()
        .position(|e| e["type"] == "agent.assistant-stream")
        .unwrap_or_else(|| panic!("no agent.assistant-stream: {kinds:?}"));
    assert!(read_started > 10 && first_delta > read_started, "{kinds:?}");
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "agent.assistant-stream")
        .map(|e| e["data"]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        streamed,
        result["text"].as_str().unwrap_or("?"),
        "the deltas rebuild the answer"
    );

    // The end: running → completed, then agent.finished, last.
    let n = events.len();
    assert_eq!(kinds[n - 2], "session.state", "{kinds:?}");
    assert_eq!(
        events[n - 2]["data"],
        json!({"from": "running", "to": "completed"})
    );
    assert_eq!(kinds[n - 1], "agent.finished", "{kinds:?}");
    let finished = &events[n - 1]["data"];
    assert_eq!(finished["run_id"], run_id);
    assert_eq!(finished["text"], result["text"]);
    assert_eq!(finished["finish_reason"], "stop");
    assert_eq!(finished["usage"], result["usage"]);
    assert_eq!(terminal_events_of(&events, run_id).len(), 1, "{kinds:?}");
    for event in &events {
        assert_eq!(event["session_id"], id.as_str(), "{event}");
        assert!(event["created_at"].is_string(), "{event}");
    }
    let session = server.session(&id).await;
    assert_eq!(session["last_seq"], n as i64, "{session}");
}

#[tokio::test]
async fn default_mode_answers_202_and_the_run_completes() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;

    let path = format!("/v1/sessions/{id}/runs");
    let reply = server.post_json(&path, &json!({ "input": INPUT })).await;
    let run = reply.expect_json(StatusCode::ACCEPTED, &path);
    let run_id = id_of(&run);
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(run["session_id"], id.as_str());
    assert_eq!(run["kind"], "run");
    let location = reply
        .headers
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no Location header: {:?}", reply.headers))
        .to_string();
    assert!(
        location.ends_with(&format!("/v1/sessions/{id}/runs/{run_id}")),
        "Location {location}"
    );

    let location_path = location.trim_start_matches(&server.base).to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let current = server.get_ok(&location_path).await;
        if current["status"] != "running" {
            break current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended: {current}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["finish_reason"], "stop", "{done}");
    assert_eq!(done["steps"], 3, "{done}");
    assert!(
        done["text"].as_str().unwrap_or("").contains(INPUT),
        "{done}"
    );
    assert!(done["finished_at"].is_string(), "{done}");

    let runs = server.runs(&id).await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0], done);
    let session = server.session(&id).await;
    assert_eq!(session["state"], "completed");
    assert_eq!(session["last_run"]["id"], run_id.as_str(), "{session}");
}

#[tokio::test]
async fn unicode_input_round_trips() {
    let input = "héllo 世界 🎉 مرحبا";
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;

    let result = server.run_wait(&id, input).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        result["text"].as_str().unwrap_or("").contains(input),
        "{result}"
    );

    let messages = server.messages(&id).await;
    assert_eq!(messages[1]["role"], "user");
    assert_eq!(messages[1]["content"], input);
    assert!(messages.last().expect("messages")["content"]
        .as_str()
        .unwrap_or("")
        .contains(input));

    let events = server.events(&id).await;
    let user = events
        .iter()
        .find(|e| e["type"] == "user.message")
        .expect("user.message");
    assert_eq!(user["data"]["message"]["content"], input);
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "agent.assistant-stream")
        .map(|e| e["data"]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(streamed, result["text"].as_str().unwrap_or("?"));

    // A user message object is accepted too.
    let path = format!("/v1/sessions/{id}/runs?wait=true");
    let second = server
        .post_json(
            &path,
            &json!({"input": {"role": "user", "content": "ünïcødé ✓"}}),
        )
        .await
        .expect_json(StatusCode::OK, &path);
    assert!(
        second["text"].as_str().unwrap_or("").contains("ünïcødé ✓"),
        "{second}"
    );
}

#[tokio::test]
async fn a_second_turn_continues_the_session() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let first = server.run_wait(&id, "first question").await;
    let after_first = server.events(&id).await;

    let second = server.run_wait(&id, "second question").await;
    assert_eq!(second["status"], "completed", "{second}");
    assert_ne!(second["run_id"], first["run_id"]);
    assert!(
        second["text"]
            .as_str()
            .unwrap_or("")
            .contains("second question"),
        "{second}"
    );
    assert_eq!(second["steps"], 3, "{second}");

    let events = server.events(&id).await;
    assert_contiguous_from_one(&events);
    assert_eq!(
        events[..after_first.len()],
        after_first[..],
        "the first turn's events are unchanged"
    );
    let next = &events[after_first.len()];
    assert_eq!(next["type"], "agent.started", "{next}");
    assert_eq!(next["data"]["run_id"], second["run_id"]);
    assert_eq!(
        events[after_first.len() + 1]["data"],
        json!({"from": "completed", "to": "running"})
    );
    assert_eq!(events.last().expect("events")["type"], "agent.finished");

    let messages = server.messages(&id).await;
    assert_eq!(messages.len(), 13, "{messages:#?}");
    assert_indexes_contiguous(&messages);
    assert_eq!(messages[7]["role"], "user");
    assert_eq!(messages[7]["content"], "second question");
    assert_tool_calls_answered(&messages);

    let runs = server.runs(&id).await;
    let run_ids: Vec<&Value> = runs.iter().map(|r| &r["id"]).collect();
    assert_eq!(run_ids, [&first["run_id"], &second["run_id"]]);
    let session = server.session(&id).await;
    assert_eq!(session["last_run_id"], second["run_id"]);
    assert_eq!(session["message_count"], 13);
    let total_in = first["usage"]["input_tokens"].as_u64().unwrap_or(0)
        + second["usage"]["input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        session["usage"]["input_tokens"].as_u64(),
        Some(total_in),
        "{session}"
    );
}

#[tokio::test]
async fn sessions_are_listed_newest_first_with_paging_and_a_state_filter() {
    let server = TestServer::start(ServerOptions::new()).await;
    let mut created = Vec::new();
    for n in 0..4 {
        let session = server
            .create_session_with(&json!({"title": format!("session {n}"), "metadata": {"n": n}}))
            .await;
        assert_eq!(session["state"], "idle");
        assert_eq!(session["title"], format!("session {n}"));
        assert_eq!(session["metadata"], json!({"n": n}));
        created.push(id_of(&session));
    }
    server.run_wait(&created[1], INPUT).await;
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let all = server.get_ok("/v1/sessions").await;
    let ids: Vec<&str> = all["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, newest_first, "newest first");

    // limit=1 and the cursor walk the same list one by one.
    let mut walked = Vec::new();
    let mut url = "/v1/sessions?limit=1".to_string();
    loop {
        let page = server.get_ok(&url).await;
        let data = page["data"].as_array().expect("data");
        assert!(data.len() <= 1, "limit=1 gave {page}");
        walked.extend(data.iter().map(id_of));
        match page["next_cursor"].as_str() {
            Some(cursor) => url = format!("/v1/sessions?limit=1&cursor={cursor}"),
            None => break,
        }
        assert!(walked.len() <= 10, "paging does not end");
    }
    assert_eq!(walked, newest_first);

    let completed = server.get_ok("/v1/sessions?state=completed").await;
    let completed: Vec<String> = completed["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(completed, [created[1].clone()]);
    let idle = server.get_ok("/v1/sessions?state=idle").await;
    let idle: Vec<String> = idle["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(
        idle,
        [created[3].clone(), created[2].clone(), created[0].clone()]
    );
    let failed = server.get_ok("/v1/sessions?state=failed").await;
    assert_eq!(failed["data"], json!([]), "{failed}");
}

//! Tests of the shared test support itself (`support::tests`, run once): the checks catch what
//! they are there to catch, the fakes refuse unanswered tool calls, and both launchers start a
//! server that answers. A check that passes everything would make every suite vacuous.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::fakes::{tool_call_violation, Flavor};
use crate::support::postgres::with_database;
use crate::support::*;

#[test]
fn with_database_replaces_the_last_path_segment() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/tah_test", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u@h:5432/tah_test", "x"),
        "postgres://u@h:5432/x"
    );
    assert_eq!(
        with_database("postgresql://u:p@h/db?sslmode=disable", "x"),
        "postgresql://u:p@h/x?sslmode=disable"
    );
    assert_eq!(
        with_database("postgresql://u:p@h/tah_test?sslmode=disable", "x"),
        "postgresql://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
    assert_eq!(with_database("postgres://h:1/", "x"), "postgres://h:1/x");
    assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
}

fn msg(index: i64, role: &str, extra: Value) -> Value {
    let mut m = json!({"index": index, "role": role, "content": ""});
    if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
        m.extend(extra.clone());
    }
    m
}

fn call(index: i64, ids: &[&str]) -> Value {
    let calls: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "name": "list_files"}))
        .collect();
    msg(index, "assistant", json!({"tool_calls": calls}))
}

fn result(index: i64, id: &str) -> Value {
    msg(index, "tool", json!({"tool_call_id": id}))
}

#[test]
fn tool_call_pairing_is_checked_turn_by_turn() {
    let sound = vec![
        msg(0, "system", json!({})),
        msg(1, "user", json!({})),
        call(2, &["a", "b"]),
        result(3, "a"),
        result(4, "b"),
        msg(5, "assistant", json!({})),
    ];
    assert!(tool_call_problems(&sound, false).is_empty());
    assert_tool_calls_answered(&sound);

    let mut missing = sound.clone();
    missing.remove(4);
    assert_eq!(
        tool_call_problems(&missing, false).len(),
        1,
        "b is unanswered"
    );
    let open = vec![msg(0, "user", json!({})), call(1, &["a"])];
    assert!(
        tool_call_problems(&open, true).is_empty(),
        "an interrupted last turn"
    );
    assert_eq!(tool_call_problems(&open, false).len(), 1);

    let mut twice = sound.clone();
    twice.push(result(6, "a"));
    assert!(!tool_call_problems(&twice, false).is_empty(), "two results");
    let early = vec![msg(0, "user", json!({})), result(1, "a"), call(2, &["a"])];
    assert!(
        !tool_call_problems(&early, false).is_empty(),
        "a result before its call"
    );
    let mut other_turn = sound.clone();
    other_turn.push(msg(6, "user", json!({})));
    other_turn.push(result(7, "a"));
    assert!(
        !tool_call_problems(&other_turn, false).is_empty(),
        "a result in another turn"
    );
    let mut reused = sound.clone();
    reused.extend([msg(6, "user", json!({})), call(7, &["a"]), result(8, "a")]);
    assert!(
        !tool_call_problems(&reused, false).is_empty(),
        "a call id used twice"
    );
}

#[test]
fn seq_breaks_and_differences_are_found() {
    let log: Vec<Value> = (1..=4)
        .map(|seq| json!({"seq": seq, "type": "x"}))
        .collect();
    assert_eq!(seq_break(&log, 1), None);
    assert!(seq_break(&log[1..], 1).is_some(), "starts at 2");
    assert_eq!(seq_break(&log[1..], 2), None);
    let mut gap = log.clone();
    gap.remove(2);
    assert!(seq_break(&gap, 1).is_some());
    assert_eq!(first_difference(&log, &log), None);
    assert_eq!(first_difference(&log, &gap), Some(2));
    assert_eq!(first_difference(&log, &log[..3]), Some(3));
}

#[test]
fn percentiles_use_the_nearest_rank() {
    let values: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&values, 50.0), 50.0);
    assert_eq!(percentile(&values, 99.0), 99.0);
    assert_eq!(percentile(&values, 100.0), 100.0);
    assert_eq!(percentile(&[7.0], 1.0), 7.0);
}

#[test]
fn the_fakes_refuse_unanswered_tool_calls() {
    let openai =
        |messages: Value| tool_call_violation(Flavor::OpenAi, &json!({"messages": messages}));
    let assistant = json!({"role": "assistant", "content": null,
        "tool_calls": [{"id": "c1", "type": "function"}, {"id": "c2", "type": "function"}]});
    let tool = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "x"});
    let user = json!({"role": "user", "content": "hi"});
    assert_eq!(
        openai(json!([user, assistant, tool("c1"), tool("c2"), user])),
        None
    );
    assert!(openai(json!([user, assistant, tool("c1"), user])).is_some());
    assert!(
        openai(json!([user, assistant, tool("c1")])).is_some(),
        "open at the end"
    );
    assert!(
        openai(json!([user, tool("c1")])).is_some(),
        "a result without a call"
    );

    let anthropic =
        |messages: Value| tool_call_violation(Flavor::Anthropic, &json!({"messages": messages}));
    let uses = json!({"role": "assistant", "content": [
        {"type": "text", "text": "looking"},
        {"type": "tool_use", "id": "t1", "name": "list_files", "input": {}},
        {"type": "tool_use", "id": "t2", "name": "read_file", "input": {}}]});
    let results = |ids: &[&str]| {
        let blocks: Vec<Value> = ids
            .iter()
            .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "x"}))
            .collect();
        json!({"role": "user", "content": blocks})
    };
    let ask = json!({"role": "user", "content": "hi"});
    assert_eq!(anthropic(json!([ask, uses, results(&["t1", "t2"])])), None);
    assert!(anthropic(json!([ask, uses, results(&["t1"])])).is_some());
    assert!(anthropic(json!([ask, uses])).is_some(), "open at the end");
    assert!(
        anthropic(json!([ask, uses, ask])).is_some(),
        "no results at all"
    );
    assert!(
        anthropic(json!([ask, results(&["t9"])])).is_some(),
        "a result without a call"
    );
}

#[tokio::test]
async fn an_in_process_server_answers_and_stops_cleanly() {
    let mut server = TestServer::start(ServerOptions::new()).await;
    let health = server.get_ok("/healthz").await;
    assert_eq!(health["status"], "ok");
    let id = server.create_session().await;
    assert_eq!(server.run_wait(&id, "hello").await["status"], "completed");
    let status = server.stop().await;
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn the_binary_is_found_by_its_ready_line_and_restarts_on_its_database() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    server.restart().await;
    let reply = server.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(
        server.log().contains("listening on http://"),
        "{}",
        server.log()
    );
    let status = server.stop().await;
    assert!(status.success(), "{status}");
}

//! The AI SDK face's history, `GET /v1/sessions/{id}/ai-sdk/messages`: every turn of the
//! session as `UIMessage`s, each run under the id its chat stream gave it, the same on every
//! call; a run that waits for an approval as far as it got, then with the answer; bad requests
//! as problems. (The SDK's own client reads it in tests/protocols/ai-sdk.test.mjs.)

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

/// One turn through `POST …/ai-sdk/chat`: the chunks of its stream, read to its end.
async fn chat(server: &TestServer, id: &str, text: &str) -> Vec<Value> {
    let body = json!({
        "id": id,
        "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": text}]}],
    });
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/ai-sdk/chat"), &body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply
        .text()
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON chunk"))
        .collect()
}

/// The history, asserted to be a `200` JSON array; and its size in bytes.
async fn history(server: &TestServer, id: &str) -> (Vec<Value>, usize) {
    let reply = server
        .get(&format!("/v1/sessions/{id}/ai-sdk/messages"))
        .await;
    let body = reply.expect_json(StatusCode::OK, "GET …/ai-sdk/messages");
    let messages = body.as_array().expect("an array").clone();
    (messages, reply.bytes.len())
}

fn of_type<'c>(chunks: &'c [Value], kind: &str) -> Vec<&'c Value> {
    chunks.iter().filter(|c| c["type"] == kind).collect()
}

fn tool_parts(message: &Value) -> Vec<&Value> {
    message["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"].as_str().is_some_and(|t| t.starts_with("tool-")))
        .collect()
}

/// A part's tool call id, and its tool's name from its type.
fn call_of(part: &Value) -> (String, String) {
    let name = part["type"].as_str().unwrap_or_default();
    (
        part["toolCallId"].as_str().unwrap_or_default().to_string(),
        name.trim_start_matches("tool-").to_string(),
    )
}

#[tokio::test]
async fn the_history_holds_every_turn_under_the_ids_its_streams_gave() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let (empty, _) = history(&server, &id).await;
    assert!(empty.is_empty(), "a session with no turn: {empty:?}");
    let inputs = ["what is in this workspace?", "and now?"];
    let mut streams = Vec::new();
    for input in inputs {
        streams.push(chat(&server, &id, input).await);
    }

    let (messages, bytes) = history(&server, &id).await;
    let again = server
        .get(&format!("/v1/sessions/{id}/ai-sdk/messages"))
        .await;
    assert_eq!(
        again.json(),
        Value::Array(messages.clone()),
        "ids and parts are stable"
    );
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);

    let runs = server.runs(&id).await;
    for (turn, (input, chunks)) in inputs.iter().zip(&streams).enumerate() {
        let user = &messages[2 * turn];
        assert_eq!(user["parts"], json!([{"type": "text", "text": input}]));
        assert!(user["id"].as_str().is_some_and(|i| !i.is_empty()));
        let assistant = &messages[2 * turn + 1];
        // The message is the run, under the id its stream started with.
        assert_eq!(assistant["id"], chunks[0]["messageId"], "{assistant}");
        assert_eq!(assistant["id"], runs[turn]["id"]);
        // Its text is what the stream sent, its calls are the stream's with their outputs.
        let streamed: String = of_type(chunks, "text-delta")
            .iter()
            .map(|c| c["delta"].as_str().unwrap())
            .collect();
        let texts: String = assistant["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "text")
            .map(|p| p["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, streamed);
        assert_eq!(texts, runs[turn]["text"].as_str().unwrap());
        let inputs = of_type(chunks, "tool-input-available");
        let outputs = of_type(chunks, "tool-output-available");
        let parts = tool_parts(assistant);
        assert_eq!(parts.len(), inputs.len());
        for ((part, input), output) in parts.iter().zip(&inputs).zip(&outputs) {
            assert_eq!(
                call_of(part),
                (
                    input["toolCallId"].as_str().unwrap().to_string(),
                    input["toolName"].as_str().unwrap().to_string()
                )
            );
            assert_eq!(part["state"], "output-available", "{part}");
            assert_eq!(part["input"], input["input"]);
            assert_eq!(part["output"], output["output"]);
        }
        let steps = of_type(chunks, "start-step").len();
        let step_parts = assistant["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["type"] == "step-start")
            .count();
        assert_eq!(step_parts, steps);
    }
    eprintln!(
        "ai-sdk history: {} messages, {} parts, {bytes} bytes for 2 turns",
        messages.len(),
        messages
            .iter()
            .map(|m| m["parts"].as_array().unwrap().len())
            .sum::<usize>()
    );
}

/// Starts a turn whose `write_file` call waits for an approval; returns the call's id.
async fn waiting_turn(server: &TestServer, id: &str) -> String {
    server.start_run(id, "write a note about approvals").await;
    server
        .poll_session(id, "waiting_tool", Duration::from_secs(10), |s| {
            s["state"] == "waiting_tool"
        })
        .await;
    let pending = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
    pending["data"][0]["call_id"]
        .as_str()
        .expect("a pending approval")
        .to_string()
}

#[tokio::test]
async fn a_run_that_waits_shows_as_far_as_it_got_then_with_the_answer() {
    let server = TestServer::start(ServerOptions::new()).await;
    for (decision, reason) in [("allow", None), ("deny", Some("not today"))] {
        let id = server.create_session().await;
        let call = waiting_turn(&server, &id).await;
        let run_id = server.session(&id).await["last_run_id"].clone();
        let (waiting, _) = history(&server, &id).await;
        assert_eq!(waiting.len(), 2, "{waiting:?}");
        assert_eq!(waiting[1]["id"], run_id);
        let asked = tool_parts(&waiting[1]);
        let asked = asked.last().expect("the call that waits");
        assert_eq!(asked["toolCallId"], call.as_str());
        assert_eq!(asked["state"], "approval-requested", "{asked}");
        assert_eq!(asked["approval"], json!({"id": call}));

        let mut answer = json!({"decision": decision});
        if let Some(reason) = reason {
            answer["reason"] = json!(reason);
        }
        let reply = server
            .post_json(&format!("/v1/sessions/{id}/approvals/{call}"), &answer)
            .await;
        assert!(reply.status.is_success(), "{}", reply.text());
        server
            .poll_session(&id, "completed", Duration::from_secs(10), |s| {
                s["state"] == "completed"
            })
            .await;

        let (ended, _) = history(&server, &id).await;
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[1]["id"], run_id, "the same message, now whole");
        // What the run had while it waited is where it was.
        let before = waiting[1]["parts"].as_array().unwrap();
        let after = ended[1]["parts"].as_array().unwrap();
        let at = before.len() - 1;
        assert_eq!(before[..at], after[..at]);
        let part = &after[at];
        match decision {
            "allow" => {
                assert_eq!(part["state"], "output-available", "{part}");
                assert_eq!(part["approval"], json!({"id": call, "approved": true}));
            }
            _ => {
                assert_eq!(part["state"], "output-denied", "{part}");
                assert_eq!(
                    part["approval"],
                    json!({"id": call, "approved": false, "reason": "not today"})
                );
            }
        }
        for part in tool_parts(&ended[1]) {
            let state = part["state"].as_str().unwrap();
            assert!(
                ["output-available", "output-error", "output-denied"].contains(&state),
                "{part}"
            );
        }
    }
}

#[tokio::test]
async fn bad_requests_for_the_history_are_problems() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let other = "01900000-0000-7000-8000-000000000000";
    let cases = [
        (
            format!("/v1/sessions/{other}/ai-sdk/messages"),
            StatusCode::NOT_FOUND,
        ),
        // A malformed id is answered like an unknown one, as on every route.
        (
            "/v1/sessions/not-a-uuid/ai-sdk/messages".to_string(),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("/v1/sessions/{id}/ai-sdk/messages?limit=3"),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (path, status) in cases {
        let reply = server.get(&path).await;
        reply.expect_problem(status, &path);
    }
    let posted = server
        .post_json(&format!("/v1/sessions/{id}/ai-sdk/messages"), &json!([]))
        .await;
    posted.expect_problem(StatusCode::METHOD_NOT_ALLOWED, "POST …/ai-sdk/messages");
}

/// `POST …/fork` with `body`: the new session's id.
async fn fork(server: &TestServer, id: &str, body: Value) -> String {
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/fork"), &body)
        .await;
    let fork = reply.expect_json(StatusCode::CREATED, "POST …/fork");
    fork["id"].as_str().expect("the fork's id").to_string()
}

#[tokio::test]
async fn a_fork_shows_the_turns_it_copied_then_its_own() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    chat(&server, &id, "what is in this workspace?").await;
    chat(&server, &id, "and now?").await;
    let (parent, _) = history(&server, &id).await;
    assert_eq!(parent.len(), 4);

    let first = fork(&server, &id, json!({"turns": 1})).await;
    let all = fork(&server, &id, json!({})).await;
    assert_eq!(history(&server, &first).await.0, parent[..2]);
    assert_eq!(history(&server, &all).await.0, parent);

    // What the parent does later is not the fork's.
    chat(&server, &id, "and later?").await;
    assert_eq!(history(&server, &all).await.0, parent);

    // A fork's own turn follows the copied ones, under its own run's id.
    let chunks = chat(&server, &first, "something else?").await;
    let (own, _) = history(&server, &first).await;
    assert_eq!(own.len(), 4, "{own:?}");
    assert_eq!(own[..2], parent[..2]);
    assert_eq!(
        own[2]["parts"],
        json!([{"type": "text", "text": "something else?"}])
    );
    assert_eq!(own[3]["id"], chunks[0]["messageId"]);
    // A fork of a fork: its grandparent's turn, then its parent's.
    let second = fork(&server, &first, json!({})).await;
    assert_eq!(history(&server, &second).await.0, own);
}

/// A client that reconnects (`GET …/ai-sdk/chat/{chatId}/stream`) while the run waits for an
/// approval gets the run from its start up to the question, then the stream's end: it does not
/// hang on a run that goes nowhere until somebody answers.
#[tokio::test]
async fn a_reconnect_to_a_run_that_waits_ends_at_the_question() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let call = waiting_turn(&server, &id).await;
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        server.get(&format!("/v1/sessions/{id}/ai-sdk/chat/{id}/stream")),
    )
    .await
    .expect("the reconnected stream ends while the run waits");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let text = reply.text();
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON chunk"))
        .collect();
    assert_eq!(chunks.first().map(|c| &c["type"]), Some(&json!("start")));
    let asked = of_type(&chunks, "tool-approval-request");
    assert_eq!(asked.len(), 1, "{text}");
    assert_eq!(asked[0]["toolCallId"], call.as_str());
    assert_eq!(
        chunks.last().map(|c| &c["type"]),
        Some(&json!("finish")),
        "{text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

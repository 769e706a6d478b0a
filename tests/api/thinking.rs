//! Thinking with the mock model, which reasons before each move when the input asks it to
//! think: the reasoning streams as `agent.thinking-stream`, is kept in `message.thinking`
//! (messages, `llm.completed`), shows as a `thinking` step after each LLM step, survives a
//! restart and is copied by a fork; an input that does not ask has none of it.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

const INPUT: &str = "Think it over: what is in this workspace?";

/// The readable text of a message's thinking (one block per paragraph).
fn thinking_text(message: &Value) -> String {
    let blocks = message["thinking"].as_array().expect("thinking blocks");
    let texts: Vec<&str> = blocks
        .iter()
        .filter_map(|b| b["thinking"].as_str())
        .collect();
    texts.join("\n\n")
}

#[tokio::test]
async fn a_turn_that_thinks_streams_keeps_and_shows_its_reasoning() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, INPUT).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["steps"], 3, "{result}");
    let run_id = result["run_id"].as_str().expect("run_id");

    // Every reply thought about its move; the other messages carry no thinking.
    let messages = server.messages(&id).await;
    assert_eq!(roles(&messages), MOCK_TURN_ROLES);
    let replies: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    let quoted = format!("The user asked: \"{INPUT}\".");
    for (reply, next) in replies.iter().zip([
        "Before I answer I call list_files.",
        "Before I answer I call read_file.",
        "I have what I need, so I answer now.",
    ]) {
        assert_eq!(
            reply["thinking"],
            json!([{"type": "thinking", "thinking": format!("{quoted} {next}")}]),
            "{reply}"
        );
    }
    for m in messages.iter().filter(|m| m["role"] != "assistant") {
        assert!(m.get("thinking").is_none(), "{m}");
    }

    // Events: per LLM step, the reasoning streams in pieces before the text, then
    // `llm.completed` carries it.
    let events = server.events(&id).await;
    let run = run_events(&events, run_id);
    let started: Vec<&Value> = run
        .iter()
        .filter(|e| e["type"] == "llm.started")
        .map(|e| &e["data"]["step_id"])
        .collect();
    assert_eq!(started.len(), 3);
    for (step_id, reply) in started.iter().zip(&replies) {
        let of_step = |kind: &str| -> Vec<usize> {
            run.iter()
                .enumerate()
                .filter(|(_, e)| e["type"] == kind && &e["data"]["step_id"] == *step_id)
                .map(|(at, _)| at)
                .collect()
        };
        let pieces = of_step("agent.thinking-stream");
        assert!(pieces.len() > 1, "{step_id}: streamed in pieces");
        let streamed: String = pieces
            .iter()
            .map(|at| run[*at]["data"]["text"].as_str().expect("text"))
            .collect();
        assert_eq!(streamed, thinking_text(reply), "{step_id}");
        let completed = of_step("llm.completed");
        assert_eq!(completed.len(), 1);
        assert!(pieces.iter().all(|at| *at < completed[0]));
        if let Some(first_text) = of_step("agent.assistant-stream").first() {
            assert!(pieces.iter().all(|at| at < first_text), "{step_id}");
        }
        assert_eq!(
            run[completed[0]]["data"]["message"]["thinking"],
            reply["thinking"]
        );
    }

    // Steps: a thinking step after each LLM step, naming it.
    let steps = server.steps(&id).await;
    let types: Vec<&str> = steps.iter().filter_map(|s| s["type"].as_str()).collect();
    assert_eq!(
        types,
        ["llm", "thinking", "tool", "llm", "thinking", "tool", "llm", "thinking"],
        "{steps:#?}"
    );
    let thinking: Vec<&Value> = steps.iter().filter(|s| s["type"] == "thinking").collect();
    for ((step, llm_id), reply) in thinking.iter().zip(&started).zip(&replies) {
        assert_eq!(&step["llm_step_id"], *llm_id, "{step}");
        assert_eq!(step["content"], thinking_text(reply), "{step}");
        assert_eq!(step["run_id"], run_id);
        assert!(step.get("redacted").is_none(), "{step}");
        let detail = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(step)))
            .await;
        assert_eq!(detail["type"], "thinking");
        assert_eq!(detail["content"], step["content"]);
    }
}

#[tokio::test]
async fn thinking_survives_a_restart_and_goes_with_a_fork() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    server.run_wait(&id, INPUT).await;
    let messages = server.messages(&id).await;
    let steps = server.steps(&id).await;
    assert!(messages[2]["thinking"].is_array(), "{}", messages[2]);

    let status = server.stop().await;
    assert!(status.success(), "{status}");
    server.restart().await;
    assert_eq!(server.messages(&id).await, messages);
    assert_eq!(server.steps(&id).await, steps);

    let fork = server
        .post_json(&format!("/v1/sessions/{id}/fork"), &json!({}))
        .await
        .expect_json(StatusCode::CREATED, "fork");
    let fork_messages = server.messages(&id_of(&fork)).await;
    let thinking =
        |ms: &[Value]| -> Vec<Value> { ms.iter().map(|m| m["thinking"].clone()).collect() };
    assert_eq!(thinking(&fork_messages), thinking(&messages));

    // The fork's next turn thinks too, and its earlier reasoning is still there.
    let result = server.run_wait(&id_of(&fork), "think again").await;
    assert_eq!(result["status"], "completed", "{result}");
    let after = server.messages(&id_of(&fork)).await;
    assert_eq!(thinking(&after[..messages.len()]), thinking(&messages));
    assert!(thinking_text(after.last().expect("a reply")).contains("think again"));
}

#[tokio::test]
async fn an_input_that_does_not_ask_has_no_thinking() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "What is in this workspace?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let messages = server.messages(&id).await;
    assert!(messages.iter().all(|m| m.get("thinking").is_none()));
    let steps = server.steps(&id).await;
    assert!(steps.iter().all(|s| s["type"] != "thinking"), "{steps:#?}");
    let events = server.events(&id).await;
    assert!(events
        .iter()
        .all(|e| e["type"] != "agent.thinking-stream"
            && e["data"]["message"].get("thinking").is_none()));
}

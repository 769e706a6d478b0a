//! Fork: a fork copies the requested turns, runs on its own, and leaves its source unchanged.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

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

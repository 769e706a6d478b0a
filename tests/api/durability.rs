//! Restarts lose nothing: after SIGTERM, and after kill -9 right after a turn completed, every
//! read of the API answers byte for byte as before, and the event sequence goes on with no gap.

use crate::support::*;

/// Every read a client can make of these sessions, as raw response bodies.
async fn snapshot(server: &TestServer, ids: &[String]) -> Vec<(String, Vec<bytes::Bytes>)> {
    let mut out = vec![(
        "/v1/sessions".to_string(),
        server.raw_pages("/v1/sessions", "cursor", 2).await,
    )];
    for id in ids {
        let one = format!("/v1/sessions/{id}");
        out.push((one.clone(), vec![server.get(&one).await.bytes]));
        for (what, cursor, limit) in [
            ("messages", "after", 5),
            ("events", "after", 7),
            ("runs", "cursor", 1),
            ("steps", "cursor", 3),
        ] {
            let path = format!("/v1/sessions/{id}/{what}");
            let pages = server.raw_pages(&path, cursor, limit).await;
            out.push((path, pages));
        }
    }
    out
}

fn assert_same(before: &[(String, Vec<bytes::Bytes>)], after: &[(String, Vec<bytes::Bytes>)]) {
    assert_eq!(before.len(), after.len());
    for ((path, a), (_, b)) in before.iter().zip(after) {
        assert_eq!(a.len(), b.len(), "{path}: a different number of pages");
        for (n, (a, b)) in a.iter().zip(b).enumerate() {
            assert!(
                a == b,
                "{path} page {n} changed across the restart:\nbefore: {}\nafter:  {}",
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b)
            );
        }
    }
}

#[tokio::test]
async fn a_sigterm_restart_keeps_everything_byte_for_byte() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let two_turns = server.create_session().await;
    server.run_wait(&two_turns, "first turn").await;
    server.run_wait(&two_turns, "second turn").await;
    let one_turn = server
        .create_session_with(&serde_json::json!({"title": "tïtle", "metadata": {"k": [1, 2]}}))
        .await;
    let one_turn = id_of(&one_turn);
    server.run_wait(&one_turn, "only turn").await;
    let idle = server.create_session().await;
    let ids = vec![two_turns.clone(), one_turn, idle];

    let before = snapshot(&server, &ids).await;
    let status = server.stop().await;
    assert!(status.success(), "SIGTERM exit status {status}");
    server.restart().await;
    let after = snapshot(&server, &ids).await;
    assert_same(&before, &after);

    // A new turn continues the sequence with no gap.
    let log_before = server.events(&two_turns).await;
    let result = server.run_wait(&two_turns, "after the restart").await;
    assert_eq!(result["status"], "completed", "{result}");
    let log = server.events(&two_turns).await;
    assert_contiguous_from_one(&log);
    assert_eq!(log[..log_before.len()], log_before[..]);
    assert_eq!(log[log_before.len()]["type"], "agent.started");
    let messages = server.messages(&two_turns).await;
    assert_eq!(
        messages.len(),
        19,
        "the system message and three turns of six messages"
    );
    assert_indexes_contiguous(&messages);
}

#[tokio::test]
async fn kill_9_right_after_a_completed_turn_loses_nothing() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "remember this").await;
    assert_eq!(result["status"], "completed", "{result}");
    let before = snapshot(&server, std::slice::from_ref(&id)).await;

    server.kill9().await;
    server.restart().await;

    let after = snapshot(&server, std::slice::from_ref(&id)).await;
    assert_same(&before, &after);
    let session = server.session(&id).await;
    assert_eq!(session["state"], "completed", "{session}");
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_eq!(log.last().expect("log")["type"], "agent.finished");
    let resumed = server.resume_wait(&id).await;
    assert_eq!(resumed["run_id"], result["run_id"], "{resumed}");
}

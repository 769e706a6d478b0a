//! The session list with a row it cannot read, a fork taken during a run, and where paging
//! ends.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{is_postgres, ServerOptions, TestServer};

#[tokio::test]
async fn a_session_row_with_an_unknown_state_does_not_break_the_list() {
    if is_postgres() {
        // The row is written straight into the SQLite file.
        return;
    }
    let server = TestServer::start(ServerOptions::new()).await;
    let good = server.create_session().await;
    let bad = server.create_session().await;
    {
        let conn = rusqlite::Connection::open(server.database_path()).expect("open the database");
        let changed = conn
            .execute(
                "UPDATE sessions SET state = 'hibernating' WHERE id = ?1",
                [&bad],
            )
            .expect("update");
        assert_eq!(changed, 1);
    }
    let reply = server.get("/v1/sessions").await;
    let page = reply.expect_json(StatusCode::OK, "the list");
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, [good.as_str()], "{page}");
}

#[tokio::test]
async fn a_running_session_cannot_be_forked_whole_but_its_ended_turns_can() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(40)).await;
    let id = server.create_session().await;
    server.run_wait(&id, "first turn").await;
    let run = server.start_run(&id, "second turn").await;
    let run_id = run["id"].as_str().unwrap().to_string();
    // Wait until the second turn is visibly under way.
    server
        .poll_session(&id, "running", std::time::Duration::from_secs(10), |s| {
            s["state"] == "running" || s["state"] == "waiting_tool"
        })
        .await;
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/fork"), &json!({}))
        .await;
    let problem = reply.expect_problem(StatusCode::CONFLICT, "fork of a running session");
    assert!(
        problem["type"]
            .as_str()
            .unwrap_or("")
            .ends_with("run-active"),
        "{problem}"
    );
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/fork"), &json!({"turns": 1}))
        .await;
    let fork = reply.expect_json(StatusCode::CREATED, "fork of the first turn");
    let fork_id = fork["id"].as_str().unwrap();
    let messages = server.messages(fork_id).await;
    let users: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(users, ["first turn"]);
    // The last message of the fork ends the first turn: an answer, not a dangling call.
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "assistant", "{last}");
    assert!(last.get("tool_calls").is_none(), "{last}");
    server.wait_run(&id, &run_id).await;
}

#[tokio::test]
async fn paging_ends_on_the_last_full_page() {
    let server = TestServer::start(ServerOptions::new()).await;
    for _ in 0..4 {
        server.create_session().await;
    }
    let first = server.get_ok("/v1/sessions?limit=2").await;
    assert_eq!(first["data"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a cursor: more follow");
    let second = server
        .get_ok(&format!("/v1/sessions?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second["data"].as_array().unwrap().len(), 2);
    assert!(
        second["next_cursor"].is_null(),
        "the last page names a cursor to an empty page: {second}"
    );
    let events = server
        .get_ok(&format!(
            "/v1/sessions/{}/events?limit=1",
            first["data"][0]["id"].as_str().unwrap()
        ))
        .await;
    assert!(events["next_cursor"].is_null(), "{events}");
}

//! `Idempotency-Key` on the POST routes that make something: a retry with the same key and
//! body gets the first response and starts nothing, also under concurrency, after a restart
//! and (PostgreSQL) on another replica; the same key with another body is a `422`.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;

const KEY: &str = "idempotency-key";

async fn post_keyed(api: &Api, path: &str, key: &str, body: &Value) -> Reply {
    api.send(api.request(Method::POST, path).header(KEY, key).json(body))
        .await
}

fn replayed(reply: &Reply) -> bool {
    reply
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn a_retried_create_returns_the_first_session() {
    let server = TestServer::start(ServerOptions::new()).await;
    let body = json!({"title": "once"});
    let first = post_keyed(&server, "/v1/sessions", "create-1", &body).await;
    let session = first.expect_json(StatusCode::CREATED, "first create");
    assert!(!replayed(&first));
    let again = post_keyed(&server, "/v1/sessions", "create-1", &body).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert!(replayed(&again), "{:?}", again.headers);
    assert_eq!(again.bytes, first.bytes, "the same body, byte for byte");
    assert_eq!(again.headers.get("location"), first.headers.get("location"));
    assert_eq!(again.content_type(), first.content_type());
    assert_eq!(server.sessions().await.len(), 1, "one session: {session}");

    // Another key is another request.
    post_keyed(&server, "/v1/sessions", "create-2", &body)
        .await
        .expect_json(StatusCode::CREATED, "second key");
    assert_eq!(server.sessions().await.len(), 2);
}

#[tokio::test]
async fn the_same_key_with_another_request_is_422() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let runs = format!("/v1/sessions/{id}/runs?wait=true");
    let first = post_keyed(&server, &runs, "k", &json!({"input": "one"})).await;
    let result = first.expect_json(StatusCode::OK, "first run");
    for (path, body) in [
        (runs.clone(), json!({"input": "two"})),
        (format!("/v1/sessions/{id}/runs"), json!({"input": "one"})),
        ("/v1/sessions".to_string(), json!({})),
    ] {
        let reply = post_keyed(&server, &path, "k", &body).await;
        let problem = reply.expect_problem(StatusCode::UNPROCESSABLE_ENTITY, &path);
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("idempotency-key-reused")),
            "{problem}"
        );
    }
    let runs_now = server.runs(&id).await;
    assert_eq!(runs_now.len(), 1, "nothing new started: {runs_now:?}");
    assert_eq!(runs_now[0]["id"], result["run_id"]);
}

#[tokio::test]
async fn concurrent_duplicates_wait_for_the_first_and_start_one_run() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(5)).await;
    let id = server.create_session().await;
    let path = format!("/v1/sessions/{id}/runs?wait=true");
    let body = json!({"input": "exactly once"});
    let replies =
        futures::future::join_all((0..6).map(|_| post_keyed(&server, &path, "run-once", &body)))
            .await;
    let first = &replies[0];
    let result = first.expect_json(StatusCode::OK, "a duplicate");
    assert_eq!(result["status"], "completed", "{result}");
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json()["run_id"], result["run_id"], "{}", reply.text());
    }
    assert_eq!(
        replies.iter().filter(|r| !replayed(r)).count(),
        1,
        "one ran, the others were answered with its response"
    );
    let log = server.events(&id).await;
    assert_eq!(
        log.iter().filter(|e| e["type"] == "agent.started").count(),
        1,
        "{:?}",
        types(&log)
    );
    assert_eq!(server.runs(&id).await.len(), 1);
}

#[tokio::test]
async fn every_route_of_the_contract_takes_a_key() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    server.run_wait(&id, "a turn to fork and compact").await;
    for (path, body, status) in [
        (
            format!("/v1/sessions/{id}/fork"),
            json!({}),
            StatusCode::CREATED,
        ),
        (
            format!("/v1/sessions/{id}/compact"),
            json!({}),
            StatusCode::OK,
        ),
        (
            format!("/v1/sessions/{id}/resume?wait=true"),
            json!({}),
            StatusCode::OK,
        ),
        (
            format!("/v1/sessions/{id}/runs"),
            json!({"input": "202 mode"}),
            StatusCode::ACCEPTED,
        ),
    ] {
        let key = format!("key-for-{path}");
        let first = post_keyed(&server, &path, &key, &body).await;
        assert_eq!(first.status, status, "{path}: {}", first.text());
        let again = post_keyed(&server, &path, &key, &body).await;
        assert_eq!(again.status, status, "{path}: {}", again.text());
        assert!(replayed(&again), "{path}");
        assert_eq!(again.bytes, first.bytes, "{path}");
        if status == StatusCode::ACCEPTED {
            server.wait_run(&id, &id_of(&first.json())).await;
        }
    }
    // One fork, one summary, one new run: nothing twice.
    let children = server.get_ok(&format!("/v1/sessions?parent_id={id}")).await;
    assert_eq!(
        children["data"].as_array().map(Vec::len),
        Some(1),
        "{children}"
    );
    let log = server.events(&id).await;
    let compactions = log
        .iter()
        .filter(|e| e["type"] == "agent.context.compacted")
        .count();
    assert_eq!(compactions, 1, "{:?}", types(&log));
    assert_eq!(
        server.runs(&id).await.len(),
        2,
        "the first turn and one 202 run"
    );
}

#[tokio::test]
async fn a_refusal_frees_the_key_for_a_retry() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let (id, run_id, _sse) = server.watched_run("busy").await;
    let path = format!("/v1/sessions/{id}/runs");
    let body = json!({"input": "after the busy one"});
    let refused = post_keyed(&server, &path, "retry-me", &body).await;
    assert_conflict(&refused, "while a run is active");
    server.wait_run(&id, &run_id).await;
    let started = post_keyed(&server, &path, "retry-me", &body).await;
    let run = started.expect_json(StatusCode::ACCEPTED, "the retry");
    assert!(!replayed(&started));
    assert_ne!(id_of(&run), run_id);
    server.wait_run(&id, &id_of(&run)).await;
}

#[tokio::test]
async fn bad_keys_and_streams_are_refused() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let path = format!("/v1/sessions/{id}/runs");
    let long = "k".repeat(256);
    for key in ["with space", long.as_str(), "tab\there"] {
        let reply = server
            .send(
                server
                    .request(Method::POST, &path)
                    .header(KEY, key)
                    .json(&json!({"input": "x"})),
            )
            .await;
        reply.expect_problem(StatusCode::BAD_REQUEST, key);
    }
    let reply = server
        .send(
            server
                .request(Method::POST, &path)
                .header(KEY, "stream")
                .header("accept", "text/event-stream")
                .json(&json!({"input": "x"})),
        )
        .await;
    reply.expect_problem(StatusCode::BAD_REQUEST, "a key with a stream");
    assert!(server.runs(&id).await.is_empty(), "nothing started");
    // A key on a route that does not take one changes nothing.
    let reply = server
        .send(
            server
                .request(Method::POST, &format!("/v1/sessions/{id}/cancel"))
                .header(KEY, "ignored"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}

#[tokio::test]
async fn a_key_outlives_a_restart() {
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    let path = format!("/v1/sessions/{id}/runs?wait=true");
    let body = json!({"input": "before the restart"});
    let first = post_keyed(&server, &path, "durable", &body).await;
    first.expect_json(StatusCode::OK, "first");
    server.kill9().await;
    server.spawn().await;
    let again = post_keyed(&server, &path, "durable", &body).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert!(replayed(&again));
    assert_eq!(again.bytes, first.bytes);
    assert_eq!(server.runs(&id).await.len(), 1);
}

#[tokio::test]
async fn a_key_is_shared_by_replicas() {
    if !is_postgres() {
        return; // Replicas share a PostgreSQL database only.
    }
    let one = TestServer::start(ServerOptions::new()).await;
    let two = TestServer::start(ServerOptions::new().database_url(one.database_url())).await;
    let body = json!({"title": "made once"});
    let first = post_keyed(&one, "/v1/sessions", "replicated", &body).await;
    first.expect_json(StatusCode::CREATED, "on replica one");
    let again = post_keyed(&two, "/v1/sessions", "replicated", &body).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.text());
    assert!(replayed(&again));
    assert_eq!(again.bytes, first.bytes);
    assert_eq!(two.sessions().await.len(), 1);
}

//! Bad requests of every kind get a 4xx `application/problem+json` with a `detail`, and none
//! of them leaves anything behind: the server still answers and no session is half-written.

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::*;

/// One bad request and the status it must get (`None`: any 4xx).
struct Case {
    what: String,
    request: reqwest::RequestBuilder,
    status: Option<StatusCode>,
}

#[tokio::test]
async fn bad_requests_get_problem_details_and_change_nothing() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let unknown = uuid::Uuid::now_v7();
    let runs = format!("/v1/sessions/{id}/runs");
    let json_body = |body: &str| {
        server
            .request(Method::POST, &runs)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string())
    };
    let bad = StatusCode::BAD_REQUEST;
    let not_found = StatusCode::NOT_FOUND;
    let mut cases: Vec<Case> = Vec::new();
    let mut case = |what: &str, request: reqwest::RequestBuilder, status: Option<StatusCode>| {
        cases.push(Case {
            what: what.to_string(),
            request,
            status,
        })
    };

    case("malformed JSON", json_body(r#"{"input": "hi""#), Some(bad));
    case("not JSON at all", json_body("input=hi"), Some(bad));
    case(
        "input of the wrong type",
        json_body(r#"{"input": 5}"#),
        None,
    );
    case("input null", json_body(r#"{"input": null}"#), None);
    case("a JSON array body", json_body(r#"["hi"]"#), None);
    case("missing input", json_body("{}"), None);
    case(
        "an unknown field",
        json_body(r#"{"input": "hi", "bogus": 1}"#),
        None,
    );
    case("empty input", json_body(r#"{"input": ""}"#), None);
    case("blank input", json_body(r#"{"input": "   \n "}"#), None);
    case(
        "a user message object with the wrong role",
        json_body(r#"{"input": {"role": "system", "content": "hi"}}"#),
        None,
    );
    case(
        "no content type on POST /runs",
        server
            .request(Method::POST, &runs)
            .body(r#"{"input": "hi"}"#),
        Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
    );
    case(
        "a text/plain body on POST /runs",
        server
            .request(Method::POST, &runs)
            .header(CONTENT_TYPE, "text/plain")
            .body(r#"{"input": "hi"}"#),
        Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
    );
    let huge = format!(r#"{{"input": "{}"}}"#, "a".repeat(1024 * 1024 + 100));
    case(
        "a body over 1 MiB on POST /runs",
        json_body(&huge),
        Some(StatusCode::PAYLOAD_TOO_LARGE),
    );
    case(
        "a body over 1 MiB on POST /v1/sessions",
        server
            .request(Method::POST, "/v1/sessions")
            .header(CONTENT_TYPE, "application/json")
            .body(format!(
                r#"{{"title": "{}"}}"#,
                "t".repeat(1024 * 1024 + 100)
            )),
        Some(StatusCode::PAYLOAD_TOO_LARGE),
    );
    case(
        "malformed JSON on POST /v1/sessions",
        server
            .request(Method::POST, "/v1/sessions")
            .header(CONTENT_TYPE, "application/json")
            .body("{"),
        Some(bad),
    );
    case(
        "a title of the wrong type",
        server
            .request(Method::POST, "/v1/sessions")
            .json(&json!({"title": 5})),
        None,
    );
    case(
        "metadata that is not an object",
        server
            .request(Method::POST, "/v1/sessions")
            .json(&json!({"metadata": [1]})),
        None,
    );
    case(
        "an unknown field on POST /v1/sessions",
        server
            .request(Method::POST, "/v1/sessions")
            .json(&json!({"colour": "red"})),
        None,
    );
    for path in [
        format!("/v1/sessions/{unknown}"),
        format!("/v1/sessions/{unknown}/messages"),
        format!("/v1/sessions/{unknown}/events"),
        format!("/v1/sessions/{unknown}/steps"),
        format!("/v1/sessions/{unknown}/runs"),
        format!("/v1/sessions/{id}/runs/{unknown}"),
        format!("/v1/sessions/{id}/steps/{unknown}"),
    ] {
        case(
            &format!("GET {path} (unknown)"),
            server.request(Method::GET, &path),
            Some(not_found),
        );
    }
    case(
        "SSE on an unknown session",
        server
            .request(Method::GET, &format!("/v1/sessions/{unknown}/events"))
            .header(ACCEPT, "text/event-stream"),
        Some(not_found),
    );
    for (suffix, body) in [
        ("runs", Some(json!({"input": "hi"}))),
        ("runs?wait=true", Some(json!({"input": "hi"}))),
        ("resume", None),
        ("cancel", None),
        ("fork", Some(json!({}))),
    ] {
        let path = format!("/v1/sessions/{unknown}/{suffix}");
        let mut request = server.request(Method::POST, &path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        case(
            &format!("POST {path} (unknown session)"),
            request,
            Some(not_found),
        );
    }
    case(
        "DELETE an unknown session",
        server.request(Method::DELETE, &format!("/v1/sessions/{unknown}")),
        Some(not_found),
    );
    for path in [
        "/v1/sessions/not-a-uuid".to_string(),
        "/v1/sessions/not-a-uuid/events".to_string(),
        "/v1/sessions/12345/messages".to_string(),
        format!("/v1/sessions/{id}/runs/not-a-uuid"),
        format!("/v1/sessions/{id}/steps/zz"),
    ] {
        case(
            &format!("GET {path} (malformed id)"),
            server.request(Method::GET, &path),
            Some(not_found),
        );
    }
    case(
        "POST runs on a malformed id",
        server
            .request(Method::POST, "/v1/sessions/not-a-uuid/runs")
            .json(&json!({"input": "hi"})),
        Some(not_found),
    );
    case(
        "an unknown route",
        server.request(Method::GET, "/v2/nothing"),
        Some(not_found),
    );
    case(
        "an unknown route under /v1",
        server.request(Method::GET, "/v1/sessionz"),
        Some(not_found),
    );
    case(
        "PUT /v1/sessions",
        server.request(Method::PUT, "/v1/sessions").json(&json!({})),
        Some(StatusCode::METHOD_NOT_ALLOWED),
    );
    case(
        "DELETE /healthz",
        server.request(Method::DELETE, "/healthz"),
        Some(StatusCode::METHOD_NOT_ALLOWED),
    );
    case(
        "GET /cancel",
        server.request(Method::GET, &format!("/v1/sessions/{id}/cancel")),
        Some(StatusCode::METHOD_NOT_ALLOWED),
    );
    for query in [
        "/v1/sessions?limit=abc",
        "/v1/sessions?limit=0",
        "/v1/sessions?limit=-3",
        "/v1/sessions?state=bogus",
        "/v1/sessions?cursor=not-a-cursor",
        "/v1/sessions?bogus=1",
    ] {
        case(
            &format!("GET {query}"),
            server.request(Method::GET, query),
            Some(bad),
        );
    }
    for query in ["after=-1", "after=abc", "limit=abc", "limit=0"] {
        let path = format!("/v1/sessions/{id}/events?{query}");
        case(
            &format!("GET {path}"),
            server.request(Method::GET, &path),
            Some(bad),
        );
    }
    case(
        "SSE with ?after=-1",
        server
            .request(Method::GET, &format!("/v1/sessions/{id}/events?after=-1"))
            .header(ACCEPT, "text/event-stream"),
        Some(bad),
    );
    for query in ["limit=abc", "after=xyz"] {
        let path = format!("/v1/sessions/{id}/messages?{query}");
        case(
            &format!("GET {path}"),
            server.request(Method::GET, &path),
            Some(bad),
        );
    }
    case(
        "POST /runs?wait=maybe",
        server
            .request(Method::POST, &format!("{runs}?wait=maybe"))
            .json(&json!({"input": "hi"})),
        Some(bad),
    );
    for header in ["abc", "-5", "1.5"] {
        case(
            &format!("Last-Event-ID: {header:?}"),
            server
                .request(Method::GET, &format!("/v1/sessions/{id}/events"))
                .header(ACCEPT, "text/event-stream")
                .header("Last-Event-ID", header),
            Some(bad),
        );
    }
    for turns in [json!(-1), json!(1.5), json!("x"), json!([1]), json!(true)] {
        case(
            &format!("fork with turns {turns}"),
            server
                .request(Method::POST, &format!("/v1/sessions/{id}/fork"))
                .json(&json!({ "turns": turns })),
            Some(bad),
        );
    }
    case(
        "fork with malformed JSON",
        server
            .request(Method::POST, &format!("/v1/sessions/{id}/fork"))
            .header(CONTENT_TYPE, "application/json")
            .body("{turns"),
        Some(bad),
    );

    let mut failures = Vec::new();
    let total = cases.len();
    for Case {
        what,
        request,
        status,
    } in cases
    {
        let reply = match server.try_send(request).await {
            Ok(reply) => reply,
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        let status_ok = match status {
            Some(expected) => reply.status == expected,
            None => reply.status.is_client_error(),
        };
        if !status_ok {
            failures.push(format!(
                "{what}: expected {}, got {} {}",
                status.map_or("a 4xx".to_string(), |s| s.to_string()),
                reply.status,
                reply.text()
            ));
            continue;
        }
        if let Err(e) = check_problem(&reply) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} bad requests were not answered as they should be:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );

    // The server is fine and nothing was half-written.
    let health = server.get("/healthz").await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    let sessions = server.sessions().await;
    let ids: Vec<String> = sessions.iter().map(id_of).collect();
    assert_eq!(
        ids,
        [id.as_str()],
        "only the session the test created exists"
    );
    let session = server.session(&id).await;
    assert_eq!(session["state"], "idle", "{session}");
    assert_eq!(session["message_count"], 1, "{session}");
    assert_eq!(session["last_seq"], 1, "{session}");
    assert!(session["last_run_id"].is_null(), "{session}");
    assert_eq!(types(&server.events(&id).await), ["session.created"]);
    let messages = server.messages(&id).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["role"], "system");
    assert!(server.runs(&id).await.is_empty());

    // And it still works.
    let result = server.run_wait(&id, "still alive?").await;
    assert_eq!(result["status"], "completed", "{result}");
}

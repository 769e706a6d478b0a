//! Drive-by requests a web page could make: another host name (DNS rebinding), a foreign
//! origin, form-style bodies; and the bearer scheme in any case.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Reply, ServerOptions, TestServer};

/// `method path` with the header `name: value` and no body.
async fn send_with(
    server: &TestServer,
    method: Method,
    path: &str,
    name: &str,
    value: &str,
) -> Reply {
    server
        .send(server.request(method, path).header(name, value))
        .await
}

#[tokio::test]
async fn a_foreign_host_name_is_refused_unless_allowed() {
    let server = TestServer::start(ServerOptions::new()).await;
    let port = server.api.base.rsplit(':').next().unwrap_or("").to_string();
    for host in ["attacker.example", &format!("attacker.example:{port}")] {
        let reply = server
            .send(
                server
                    .request(Method::POST, "/v1/sessions")
                    .header("host", host)
                    .json(&json!({})),
            )
            .await;
        let problem = reply.expect_problem(StatusCode::FORBIDDEN, host);
        assert!(
            problem["type"]
                .as_str()
                .unwrap_or("")
                .ends_with("host-not-allowed"),
            "{problem}"
        );
        let reply = send_with(&server, Method::GET, "/v1/sessions", "host", host).await;
        reply.expect_problem(StatusCode::FORBIDDEN, host);
    }
    // Nothing was created by the refused requests.
    assert!(server.sessions().await.is_empty());
    // Probes answer any name (a pod's address).
    let reply = send_with(&server, Method::GET, "/healthz", "host", "10.1.2.3:8080").await;
    assert_eq!(reply.status, StatusCode::OK);
    for host in ["localhost", "127.0.0.1", "[::1]:9"] {
        let reply = send_with(&server, Method::GET, "/v1/sessions", "host", host).await;
        assert_eq!(reply.status, StatusCode::OK, "{host}");
    }

    let allowed =
        TestServer::start(ServerOptions::new().args(&["--allowed-host", "tah.internal"])).await;
    let reply = send_with(
        &allowed,
        Method::GET,
        "/v1/sessions",
        "host",
        "tah.internal:8080",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn cross_site_requests_that_change_state_are_refused() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let evil = "https://evil.example";
    let routes = [
        "/v1/sessions".to_string(),
        format!("/v1/sessions/{id}/cancel"),
        format!("/v1/sessions/{id}/fork"),
        format!("/v1/sessions/{id}/compact"),
        format!("/v1/sessions/{id}/runs"),
    ];
    for path in &routes {
        // Form-style bodies a page can send without a preflight, and JSON.
        for (content_type, body) in [
            (None, ""),
            (Some("text/plain"), "{\"input\":\"hi\"}"),
            (Some("application/x-www-form-urlencoded"), "input=hi"),
            (Some("multipart/form-data; boundary=x"), "--x--"),
            (Some("application/json"), "{\"input\":\"hi\"}"),
        ] {
            let mut request = server
                .request(Method::POST, path)
                .header("origin", evil)
                .body(body);
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let reply = server.send(request).await;
            let problem = reply.expect_problem(StatusCode::FORBIDDEN, path);
            assert!(
                problem["type"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with("origin-not-allowed"),
                "{path}: {problem}"
            );
        }
    }
    let reply = send_with(
        &server,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        "origin",
        evil,
    )
    .await;
    reply.expect_problem(StatusCode::FORBIDDEN, "delete");
    // Nothing happened: still one session, never run, nothing forked.
    let sessions = server.sessions().await;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["state"], "idle");

    // The server's own page may, and so may an origin allowed with --cors-origin.
    let own = server.api.base.clone();
    let reply = server
        .send(
            server
                .request(Method::POST, "/v1/sessions")
                .header("origin", &own)
                .json(&json!({})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let cors =
        TestServer::start(ServerOptions::new().args(&["--cors-origin", "http://localhost:5173/"]))
            .await;
    let reply = cors
        .send(
            cors.request(Method::POST, "/v1/sessions")
                .header("origin", "http://localhost:5173")
                .json(&json!({})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
}

#[tokio::test]
async fn bodies_of_another_type_are_415_and_empty_posts_still_work() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    for (path, content_type) in [
        ("/v1/sessions".to_string(), "text/plain"),
        (format!("/v1/sessions/{id}/cancel"), "text/plain"),
        (
            format!("/v1/sessions/{id}/fork"),
            "application/x-www-form-urlencoded",
        ),
        (
            format!("/v1/sessions/{id}/resume"),
            "multipart/form-data; boundary=x",
        ),
    ] {
        let reply = send_with(&server, Method::POST, &path, "content-type", content_type).await;
        reply.expect_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, &path);
    }
    // curl -X POST …/cancel: no body, no content type.
    let reply = server
        .post_empty(&format!("/v1/sessions/{id}/cancel"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["cancelled"], false);
    let reply = server
        .send(
            server
                .request(Method::POST, &format!("/v1/sessions/{id}/runs"))
                .header("content-type", "application/json; charset=utf-8")
                .body("{\"input\":\"hi\"}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let token = "a-token-of-sixteen-or-more";
    let server = TestServer::start(ServerOptions::new().args(&["--api-token", token])).await;
    for scheme in ["Bearer", "bearer", "BEARER", "BeArEr"] {
        let reply = send_with(
            &server,
            Method::GET,
            "/v1/sessions",
            "authorization",
            &format!("{scheme} {token}"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{scheme}: {}", reply.body);
    }
    let reply = send_with(
        &server,
        Method::GET,
        "/v1/sessions",
        "authorization",
        &format!("Basic {token}"),
    )
    .await;
    reply.expect_problem(StatusCode::UNAUTHORIZED, "basic");
}

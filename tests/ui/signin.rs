//! Sign-in for the page: a token exchanged for an HttpOnly, SameSite=Strict cookie that every
//! `/v1` route accepts like the bearer header (SSE included), signed out by `DELETE`, with the
//! Secure flag when the page came over https, and no state changed by a cookie request that
//! does not come from the server's own page. The cookie is a random credential of its own, not
//! the token: signing out revokes it, and so does removing its token from the configuration.

use std::time::Instant;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{median, Reply, ServerOptions, SseStream, TestServer};

const TOKEN: &str = "ui-test-token-7f3a9c21e5";

async fn with_token() -> TestServer {
    TestServer::start(ServerOptions::new().args(&["--api-token", TOKEN])).await
}

fn set_cookie(reply: &Reply) -> String {
    reply
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The `name=value` part of a Set-Cookie header (what the browser sends back).
fn cookie_pair(set_cookie: &str) -> String {
    set_cookie
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn attributes(set_cookie: &str) -> Vec<String> {
    set_cookie
        .split(';')
        .skip(1)
        .map(|a| a.trim().to_ascii_lowercase())
        .collect()
}

/// `POST /v1/auth/cookie {token}` as the page sends it (with its own Origin unless `headers`
/// name another), with extra headers.
async fn sign_in(server: &TestServer, token: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = server
        .request(Method::POST, "/v1/auth/cookie")
        .json(&json!({ "token": token }));
    if !headers.iter().any(|(name, _)| *name == "origin") {
        request = request.header("origin", server.api.base.as_str());
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    server.send(request).await
}

async fn signed_in(server: &TestServer) -> String {
    let reply = sign_in(server, TOKEN, &[]).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    cookie_pair(&set_cookie(&reply))
}

#[tokio::test]
async fn a_token_becomes_an_http_only_strict_cookie_that_routes_accept() {
    let server = with_token().await;
    // The page itself needs no token: it must load to show its sign-in form.
    assert_eq!(server.get("/").await.status, StatusCode::OK);
    let status = server.get_ok("/v1/auth/cookie").await;
    assert_eq!(status, json!({"required": true, "signed_in": false}));
    server
        .get("/v1/sessions")
        .await
        .expect_problem(StatusCode::UNAUTHORIZED, "no token");

    let reply = sign_in(&server, TOKEN, &[]).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    let header = set_cookie(&reply);
    let attrs = attributes(&header);
    for must in ["httponly", "samesite=strict", "path=/"] {
        assert!(attrs.iter().any(|a| a == must), "{must} missing: {header}");
    }
    assert!(attrs.iter().any(|a| a.starts_with("max-age=")), "{header}");
    // Plain http on loopback: a Secure cookie would be dropped by some browsers, and nothing
    // crosses a network.
    assert!(!attrs.iter().any(|a| a == "secure"), "{header}");
    let cookie = cookie_pair(&header);
    assert!(cookie.starts_with("tah_token="), "{header}");
    assert!(!cookie.contains(TOKEN), "the token is not in it: {header}");
    assert_eq!(
        reply.headers.get("cache-control").map(|v| v.as_bytes()),
        Some(&b"no-store"[..])
    );

    let status = server
        .send(
            server
                .request(Method::GET, "/v1/auth/cookie")
                .header("cookie", &cookie),
        )
        .await;
    assert_eq!(status.body, json!({"required": true, "signed_in": true}));
    let list = server
        .send(
            server
                .request(Method::GET, "/v1/sessions")
                .header("cookie", &cookie),
        )
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);

    // From the page (its own Origin) the cookie changes state like the bearer header.
    let created = server
        .send(
            server
                .request(Method::POST, "/v1/sessions")
                .header("cookie", &cookie)
                .header("origin", server.api.base.as_str())
                .json(&json!({ "title": "by cookie" })),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = created.body["id"].as_str().unwrap().to_string();
    let run = server
        .send(
            server
                .request(Method::POST, &format!("/v1/sessions/{id}/runs?wait=true"))
                .header("cookie", &cookie)
                .header("origin", server.api.base.as_str())
                .json(&json!({ "input": "hello from the page" })),
        )
        .await;
    assert_eq!(run.status, StatusCode::OK, "{}", run.body);

    // SSE too, so the page never puts a token in a URL.
    let response = server
        .http
        .get(server.url(&format!("/v1/sessions/{id}/events")))
        .header("accept", "text/event-stream")
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::from_response(response, "SSE by cookie")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let frames = stream.until_type("agent.finished").await;
    assert_eq!(frames[0].seq(), 1);
}

/// `GET path` with `cookie` and nothing else.
async fn with_cookie(server: &TestServer, path: &str, cookie: &str) -> Reply {
    server
        .send(server.request(Method::GET, path).header("cookie", cookie))
        .await
}

/// Asserts that `cookie` signs in no more (`why`): a route refuses it and says to sign in
/// again, and the sign-in status reads signed out.
async fn assert_signed_out(server: &TestServer, cookie: &str, why: &str) {
    let problem = with_cookie(server, "/v1/sessions", cookie)
        .await
        .expect_problem(StatusCode::UNAUTHORIZED, why);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or("")
            .contains("sign in again"),
        "{problem}"
    );
    let status = with_cookie(server, "/v1/auth/cookie", cookie).await;
    assert_eq!(status.body, json!({"required": true, "signed_in": false}));
}

/// A cookie's value as hex bytes.
fn cookie_bytes(cookie: &str) -> Vec<u8> {
    let hex = cookie
        .strip_prefix("tah_token=")
        .expect("a tah_token cookie");
    assert_eq!(hex.len() % 2, 0, "{cookie}");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

#[tokio::test]
async fn the_cookie_is_a_random_credential_not_the_token() {
    let server = with_token().await;
    let cookies: Vec<String> = [signed_in(&server).await, signed_in(&server).await].into();
    eprintln!("two sign-ins with one token: {cookies:?}");
    assert_ne!(
        cookies[0], cookies[1],
        "each sign-in has a cookie of its own"
    );
    for cookie in &cookies {
        let bytes = cookie_bytes(cookie);
        assert_eq!(bytes.len(), 32, "32 random bytes: {cookie}");
        assert!(
            !String::from_utf8_lossy(&bytes).contains(TOKEN) && !cookie.contains(TOKEN),
            "{cookie}"
        );
        let token_hex: String = TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(
            !cookie.contains(&token_hex),
            "not the token in hex: {cookie}"
        );
        // The cookie is not a bearer token, and the token is not a cookie.
        let bearer = server
            .send(
                server
                    .request(Method::GET, "/v1/sessions")
                    .bearer_auth(cookie.trim_start_matches("tah_token=")),
            )
            .await;
        bearer.expect_problem(StatusCode::UNAUTHORIZED, "the cookie as a bearer token");
        assert_eq!(
            with_cookie(&server, "/v1/sessions", cookie).await.status,
            StatusCode::OK
        );
    }
    // What looking the sign-in up costs a request, against the bearer header.
    let mut by_bearer = Vec::new();
    let mut by_cookie = Vec::new();
    for _ in 0..100 {
        let started = Instant::now();
        let reply = server
            .send(
                server
                    .request(Method::GET, "/v1/auth/cookie")
                    .bearer_auth(TOKEN),
            )
            .await;
        by_bearer.push(started.elapsed());
        assert_eq!(reply.status, StatusCode::OK);
        let started = Instant::now();
        let reply = with_cookie(&server, "/v1/auth/cookie", &cookies[0]).await;
        by_cookie.push(started.elapsed());
        assert_eq!(reply.body["signed_in"], true);
    }
    eprintln!(
        "GET /v1/auth/cookie, median of 100: {:?} with the bearer header (no lookup), {:?} \
         with the cookie (one lookup)",
        median(by_bearer),
        median(by_cookie)
    );
    let token_as_cookie = format!(
        "tah_token={}",
        TOKEN
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    with_cookie(&server, "/v1/sessions", &token_as_cookie)
        .await
        .expect_problem(
            StatusCode::UNAUTHORIZED,
            "the token in hex, as the cookie was",
        );
}

#[tokio::test]
async fn a_cookie_replayed_after_sign_out_is_refused() {
    let server = with_token().await;
    let cookie = signed_in(&server).await;
    let other = signed_in(&server).await;
    assert_eq!(
        with_cookie(&server, "/v1/sessions", &cookie).await.status,
        StatusCode::OK
    );
    let reply = server
        .send(
            server
                .request(Method::DELETE, "/v1/auth/cookie")
                .header("cookie", &cookie)
                .header("origin", server.api.base.as_str()),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    assert!(set_cookie(&reply).starts_with("tah_token=;"));
    // A copy of the cookie kept from before (a stolen one, say) is refused everywhere.
    assert_signed_out(&server, &cookie, "replayed after sign-out").await;
    let events = server
        .send(
            server
                .request(
                    Method::GET,
                    "/v1/sessions/00000000-0000-0000-0000-000000000000/events",
                )
                .header("accept", "text/event-stream")
                .header("cookie", &cookie),
        )
        .await;
    events.expect_problem(StatusCode::UNAUTHORIZED, "SSE after sign-out");
    // Signing out of one browser leaves the other signed in.
    assert_eq!(
        with_cookie(&server, "/v1/sessions", &other).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_cookie_ends_with_its_token_in_the_configuration() {
    const OTHER: &str = "ui-test-other-token-5d18b2";
    const THIRD: &str = "ui-test-third-token-90ce4a";
    let mut server = TestServer::start(ServerOptions::new().process().args(&[
        "--api-token",
        TOKEN,
        "--api-token",
        OTHER,
    ]))
    .await;
    let by_token = signed_in(&server).await;
    let by_other = cookie_pair(&set_cookie(&sign_in(&server, OTHER, &[]).await));
    // Sign-ins outlive a restart while their token is configured.
    server
        .restart_with(ServerOptions::new().args(&["--api-token", OTHER, "--api-token", THIRD]))
        .await;
    assert_signed_out(&server, &by_token, "its token was removed").await;
    assert_eq!(
        with_cookie(&server, "/v1/sessions", &by_other).await.status,
        StatusCode::OK,
        "a cookie of a token still configured keeps working"
    );
}

#[tokio::test]
async fn a_cookie_request_that_changes_state_must_come_from_the_page() {
    let server = with_token().await;
    let cookie = signed_in(&server).await;
    let attempts = [
        (None, "origin-required"),
        (Some("https://evil.example"), "origin-not-allowed"),
        (Some("null"), "origin-not-allowed"),
    ];
    for (origin, kind) in attempts {
        let mut request = server
            .request(Method::POST, "/v1/sessions")
            .header("cookie", &cookie)
            .json(&json!({}));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let reply = server.send(request).await;
        let problem = reply.expect_problem(StatusCode::FORBIDDEN, &format!("{origin:?}"));
        assert!(
            problem["type"].as_str().unwrap_or("").ends_with(kind),
            "{origin:?}: {problem}"
        );
    }
    // The same rule holds for DELETE; reads need no Origin.
    let id = server
        .send(
            server
                .request(Method::POST, "/v1/sessions")
                .bearer_auth(TOKEN)
                .json(&json!({})),
        )
        .await
        .body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = server
        .send(
            server
                .request(Method::DELETE, &format!("/v1/sessions/{id}"))
                .header("cookie", &cookie),
        )
        .await;
    reply.expect_problem(StatusCode::FORBIDDEN, "DELETE without Origin");
    let read = server
        .send(
            server
                .request(Method::GET, &format!("/v1/sessions/{id}"))
                .header("cookie", &cookie),
        )
        .await;
    assert_eq!(read.status, StatusCode::OK);
    // Nothing was created by the refused requests (the bearer one made the only session).
    let all = server
        .send(
            server
                .request(Method::GET, "/v1/sessions")
                .bearer_auth(TOKEN),
        )
        .await;
    assert_eq!(all.body["data"].as_array().map(Vec::len), Some(1));
    // A client with the bearer header needs no Origin.
    let reply = server
        .send(
            server
                .request(Method::DELETE, &format!("/v1/sessions/{id}"))
                .bearer_auth(TOKEN),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
}

#[tokio::test]
async fn wrong_tokens_and_stale_cookies_are_refused() {
    let server = with_token().await;
    for token in ["wrong-token-of-some-length", "", &"x".repeat(10_000)] {
        let reply = sign_in(&server, token, &[]).await;
        reply.expect_problem(StatusCode::UNAUTHORIZED, "wrong token");
        assert!(set_cookie(&reply).is_empty());
    }
    for cookie in [
        "tah_token=00ff",
        "tah_token=not-hex",
        "tah_token=",
        &format!("tah_token={TOKEN}"),
    ] {
        with_cookie(&server, "/v1/sessions", cookie)
            .await
            .expect_problem(StatusCode::UNAUTHORIZED, cookie);
    }
    // Bad bodies are the usual 4xx problems.
    let no_type = server
        .send(
            server
                .request(Method::POST, "/v1/auth/cookie")
                .body(format!("{{\"token\":\"{TOKEN}\"}}")),
        )
        .await;
    no_type.expect_problem(StatusCode::UNSUPPORTED_MEDIA_TYPE, "no content type");
    for body in [
        "{".to_string(),
        "{}".to_string(),
        "{\"token\": 5}".to_string(),
        format!("{{\"token\":\"{TOKEN}\",\"extra\":1}}"),
    ] {
        let reply = server
            .send(
                server
                    .request(Method::POST, "/v1/auth/cookie")
                    .header("content-type", "application/json")
                    .body(body.clone()),
            )
            .await;
        assert!(reply.status.is_client_error(), "{body}: {}", reply.status);
        crate::support::check_problem(&reply).unwrap_or_else(|e| panic!("{body}: {e}"));
    }
    // Another site's page cannot sign a browser in (login CSRF).
    let reply = sign_in(&server, TOKEN, &[("origin", "https://evil.example")]).await;
    reply.expect_problem(StatusCode::FORBIDDEN, "foreign origin");
}

#[tokio::test]
async fn the_cookie_is_secure_over_https_and_refused_over_plain_http_elsewhere() {
    let server = with_token().await;
    for headers in [
        vec![("x-forwarded-proto", "https")],
        vec![("forwarded", "for=192.0.2.1;proto=https")],
    ] {
        let reply = sign_in(&server, TOKEN, &headers).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{headers:?}");
        let attrs = attributes(&set_cookie(&reply));
        assert!(
            attrs.iter().any(|a| a == "secure"),
            "{headers:?}: {attrs:?}"
        );
    }
    // The page was loaded from https://tah.example (a proxy in front): the browser's Origin
    // says so.
    let reply = server
        .send(
            server
                .request(Method::POST, "/v1/auth/cookie")
                .header("host", "tah.example")
                .header("origin", "https://tah.example")
                .json(&json!({ "token": TOKEN })),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    assert!(attributes(&set_cookie(&reply))
        .iter()
        .any(|a| a == "secure"));
    // Plain http to a name that is not loopback: refused, with the way out.
    let reply = server
        .send(
            server
                .request(Method::POST, "/v1/auth/cookie")
                .header("host", "tah.example")
                .header("origin", "http://tah.example")
                .json(&json!({ "token": TOKEN })),
        )
        .await;
    let problem = reply.expect_problem(StatusCode::FORBIDDEN, "plain http");
    assert!(
        problem["type"]
            .as_str()
            .unwrap_or("")
            .ends_with("insecure-sign-in"),
        "{problem}"
    );
    assert!(set_cookie(&reply).is_empty());
}

#[tokio::test]
async fn signing_out_clears_the_cookie_and_a_server_without_tokens_has_no_sign_in() {
    let server = with_token().await;
    let reply = server
        .send(
            server
                .request(Method::DELETE, "/v1/auth/cookie")
                .header("origin", server.api.base.as_str()),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    let header = set_cookie(&reply);
    assert!(header.starts_with("tah_token=;"), "{header}");
    assert!(
        attributes(&header).iter().any(|a| a == "max-age=0"),
        "{header}"
    );

    let open = TestServer::start(ServerOptions::new()).await;
    assert_eq!(
        open.get_ok("/v1/auth/cookie").await,
        json!({"required": false, "signed_in": false})
    );
    let reply = sign_in(&open, TOKEN, &[]).await;
    crate::support::assert_conflict(&reply, "no tokens");
}

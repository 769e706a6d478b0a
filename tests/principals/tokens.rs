//! Who answered an approval, session tokens (scopes, the event stream by `?access_token=`,
//! expiry), and keys that stop working.

use std::time::Duration;

use reqwest::header::ACCEPT;
use reqwest::{Method, StatusCode};
use serde_json::json;

use super::{
    assert_unauthorized, create_key, operated, revoke_key, session_token, session_token_of,
    OPERATOR,
};
use crate::support::fakes::start_openai;
use crate::support::scripted::{asks, call, ended, says};
use crate::support::*;
use crate::tools::pending_within;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_by_names_the_approvers_key_or_the_tokens_issuer() {
    let write = |id: &str| {
        call(
            id,
            "write_file",
            json!({"path": format!("{id}.txt"), "content": id}),
        )
    };
    let model = start_openai(vec![
        asks(&[write("w1")]),
        says("one"),
        asks(&[write("w2")]),
        says("done"),
    ])
    .await;
    let server =
        TestServer::start(crate::support::scripted::options(&model, &[]).operator_token(OPERATOR))
            .await;
    let admin = create_key(&server, "a", "admin").await;
    let m1 = create_key(&server, "a", "member").await;
    let owner = m1.client(&server);
    let id = owner.create_session().await;

    // The owner answers with its key.
    owner.start_run(&id, "write w1").await;
    pending_within(&server, &id, 1, Duration::from_secs(10)).await;
    let path = format!("/v1/sessions/{id}/approvals/w1");
    let resolution = owner
        .post_json(&path, &json!({"decision": "allow"}))
        .await
        .expect_json(StatusCode::OK, &path);
    assert_eq!(resolution["answered_by"], m1.id.as_str(), "{resolution}");
    ended(&server, &id).await;

    // A browser answers with an interact token the admin made: its issuer answered.
    let token = session_token(&admin.client(&server), &id, "interact", None).await;
    owner.start_run(&id, "write w2").await;
    pending_within(&server, &id, 1, Duration::from_secs(10)).await;
    let path = format!("/v1/sessions/{id}/approvals/w2");
    let browser = server.with_bearer(&token);
    let resolution = browser
        .post_json(&path, &json!({"decision": "deny", "reason": "not now"}))
        .await
        .expect_json(StatusCode::OK, &path);
    assert_eq!(resolution["answered_by"], admin.id.as_str(), "{resolution}");
    ended(&server, &id).await;

    let events = owner.events(&id).await;
    let answered: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["type"] == "tool.approval-resolved")
        .map(|e| {
            (
                e["data"]["call_id"].as_str().unwrap_or("?").to_string(),
                e["data"]["answered_by"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    assert_eq!(
        answered,
        vec![
            ("w1".to_string(), m1.id.clone()),
            ("w2".to_string(), admin.id.clone())
        ],
        "the tool.approval-resolved events"
    );
}

/// `GET /v1/sessions/{id}/events?access_token=TOKEN` as an SSE stream, with no other
/// credential; the whole answer when it is not `200`, else its first bytes.
async fn stream_by_query(server: &TestServer, id: &str, token: &str) -> (StatusCode, String) {
    let url = server.url(&format!("/v1/sessions/{id}/events?access_token={token}"));
    let mut response = server
        .http
        .get(url)
        .header(ACCEPT, "text/event-stream")
        .send()
        .await
        .expect("open the event stream");
    let status = response.status();
    let first = tokio::time::timeout(Duration::from_secs(10), response.chunk())
        .await
        .expect("the stream's first bytes within 10 s")
        .expect("read the stream");
    let text = String::from_utf8_lossy(&first.unwrap_or_default()).into_owned();
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_token_opens_its_event_stream_by_query_and_nothing_else() {
    let server = TestServer::start(operated()).await;
    let m1 = create_key(&server, "a", "member").await;
    let owner = m1.client(&server);
    let id = owner.create_session().await;
    owner.run_wait(&id, "hello").await;
    let other = owner.create_session().await;
    let made = session_token_of(&owner, &id, "read", None).await;
    let token = made["token"].as_str().unwrap().to_string();
    let expires = chrono::DateTime::parse_from_rfc3339(made["expires_at"].as_str().unwrap())
        .expect("expires_at is RFC 3339");
    let left = expires
        .signed_duration_since(chrono::Utc::now())
        .num_seconds();
    assert!(
        (3500..=3600).contains(&left),
        "a token lasts 3600 s by default: {made}"
    );

    let (status, first) = stream_by_query(&server, &id, &token).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(
        first.contains("data:") || first.contains("id:") || first.contains("event:"),
        "the stream's first bytes are SSE: {first:?}"
    );
    let (status, body) = stream_by_query(&server, &other, &token).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a token on another session's stream: {body}"
    );

    // As a bearer: its session's reads only.
    let reader = server.with_bearer(&token);
    assert_eq!(reader.session(&id).await["id"], id.as_str());
    let mut stream = reader.sse(&id, SseFrom::Start).await;
    assert!(matches!(
        stream.next_within(Duration::from_secs(10)).await,
        Next::Frame(_)
    ));
    for (method, path, body) in [
        (Method::GET, format!("/v1/sessions/{other}"), None),
        (Method::GET, "/v1/sessions".to_string(), None),
        (Method::GET, "/v1/agents".to_string(), None),
        (
            Method::POST,
            format!("/v1/sessions/{id}/runs"),
            Some(json!({"input": "no"})),
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/tokens"),
            Some(json!({"scope": "read"})),
        ),
    ] {
        let mut request = reader.request(method.clone(), &path);
        if let Some(body) = &body {
            request = request.json(body);
        }
        reader.send(request).await.expect_problem(
            StatusCode::FORBIDDEN,
            &format!("a read token: {method} {path}"),
        );
    }

    // What a token request may ask for.
    for body in [
        json!({"scope": "write"}),
        json!({"scope": "read", "ttl_s": 0}),
        json!({"scope": "read", "ttl_s": 86_401}),
    ] {
        owner
            .post_json(&format!("/v1/sessions/{id}/tokens"), &body)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &format!("a token of {body}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_token_is_401_saying_expired() {
    let server = TestServer::start(operated()).await;
    let id = server.create_session().await;
    let token = session_token(&server, &id, "interact", Some(1)).await;
    let fresh = server.with_bearer(&token);
    assert_eq!(fresh.session(&id).await["id"], id.as_str());
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let detail = assert_unauthorized(
        &fresh.get(&format!("/v1/sessions/{id}")).await,
        "an expired token",
    );
    assert!(
        detail.contains("expired"),
        "the detail says the token expired: {detail}"
    );
    let (status, body) = stream_by_query(&server, &id, &token).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "an expired token on the stream: {body}"
    );
    assert!(body.contains("expired"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_401_at_once_and_keys_stay_in_their_tenant() {
    let server = TestServer::start(operated()).await;
    let a_admin = create_key(&server, "a", "admin").await;
    let b_admin = create_key(&server, "b", "admin").await;
    let m1 = create_key(&server, "a", "member").await;
    let admin = a_admin.client(&server);
    let member = m1.client(&server);
    let id = member.create_session().await;
    member.get_ok("/v1/sessions").await;

    // Keys: an admin makes and lists its own tenant's only; others may not.
    let listed = super::ids(&admin.pages("/v1/keys", "cursor").await);
    assert!(
        listed.contains(&m1.id) && !listed.contains(&b_admin.id),
        "{listed:?}"
    );
    admin
        .post_json("/v1/keys", &json!({"tenant": "b", "role": "member"}))
        .await
        .expect_problem(StatusCode::FORBIDDEN, "A's admin makes a key of b");
    member
        .post_json("/v1/keys", &json!({"role": "member"}))
        .await
        .expect_problem(StatusCode::FORBIDDEN, "a member makes a key");
    for body in [
        json!({"tenant": "a", "role": "owner"}),
        json!({"tenant": "a b", "role": "member"}),
    ] {
        server
            .post_json("/v1/keys", &body)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &format!("a key of {body}"));
    }
    // Without a tenant: the operator's key goes to `default`, an admin's to its own.
    let made = server
        .post_json("/v1/keys", &json!({"role": "viewer"}))
        .await
        .expect_json(StatusCode::CREATED, "the operator's key without a tenant");
    assert_eq!(made["tenant"], "default", "{made}");
    let made = admin
        .post_json("/v1/keys", &json!({"role": "viewer"}))
        .await
        .expect_json(StatusCode::CREATED, "A's admin's key without a tenant");
    assert_eq!(made["tenant"], "a", "{made}");
    let b = b_admin.client(&server);
    b.send(b.request(Method::DELETE, &format!("/v1/keys/{}", m1.id)))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "B's admin revokes A's key");
    member.get_ok("/v1/sessions").await;

    revoke_key(&admin, &m1.id).await;
    assert_unauthorized(&member.get("/v1/sessions").await, "a revoked key");
    assert_unauthorized(
        &member.get(&format!("/v1/sessions/{id}")).await,
        "a revoked key on its own session",
    );
    let unknown = server.with_bearer(&format!("tah_{}", "0".repeat(64)));
    assert_unauthorized(&unknown.get("/v1/sessions").await, "an unknown key");
    let unknown = server.with_bearer(&format!("tahs_{}", "0".repeat(64)));
    assert_unauthorized(
        &unknown.get(&format!("/v1/sessions/{id}")).await,
        "an unknown session token",
    );
    // The session stays, and its tenant's admin still reaches it.
    assert_eq!(admin.session(&id).await["owner"], m1.id.as_str());
}

#[tokio::test]
async fn the_page_signs_in_with_a_key_as_its_member_until_the_key_is_revoked() {
    let server = TestServer::start(operated()).await;
    let m1 = create_key(&server, "a", "member").await;
    let m2 = create_key(&server, "a", "member").await;
    let own = m1.client(&server).create_session().await;
    let others = m2.client(&server).create_session().await;

    // The page's sign-in, from its own origin, with the key instead of a deployment token.
    let anonymous = server.anonymous();
    let signed = anonymous
        .send(
            anonymous
                .request(Method::POST, "/v1/auth/cookie")
                .header("origin", anonymous.base.as_str())
                .json(&json!({ "token": m1.key })),
        )
        .await;
    assert_eq!(signed.status, StatusCode::NO_CONTENT, "{}", signed.text());
    let set_cookie = signed.headers["set-cookie"].to_str().unwrap().to_string();
    let cookie = set_cookie.split(';').next().unwrap().to_string();
    assert!(!cookie.contains(&m1.key[4..]), "the cookie is not the key");
    let with_cookie = |path: &str| {
        let request = anonymous
            .request(Method::GET, path)
            .header("cookie", &cookie);
        anonymous.send(request)
    };

    // The cookie acts as the member: its own session, not the other member's, and only its
    // own in the list.
    assert_eq!(
        with_cookie(&format!("/v1/sessions/{own}")).await.status,
        StatusCode::OK
    );
    with_cookie(&format!("/v1/sessions/{others}"))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "another member's session by cookie");
    let listed = with_cookie("/v1/sessions").await;
    assert_eq!(
        super::ids(listed.body["data"].as_array().unwrap()),
        vec![own.clone()]
    );
    // A key that is not valid signs nobody in.
    let refused = anonymous
        .send(
            anonymous
                .request(Method::POST, "/v1/auth/cookie")
                .header("origin", anonymous.base.as_str())
                .json(&json!({ "token": format!("tah_{}", "0".repeat(64)) })),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        refused.text()
    );

    // Revoking the key ends the sign-in at once.
    revoke_key(&server, &m1.id).await;
    let after = with_cookie(&format!("/v1/sessions/{own}")).await;
    assert_unauthorized(&after, "a cookie of a revoked key");
}

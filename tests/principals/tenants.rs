//! Tenants and owners: what each principal lists, reads, runs and makes.

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::{create_key, ids, operated, Key, OPERATOR};
use crate::agents::create_agent;
use crate::support::*;

/// `POST /v1/sessions/{id}/fork` by `by`, whatever it answers.
async fn fork(by: &Api, id: &str) -> Reply {
    by.post_json(&format!("/v1/sessions/{id}/fork"), &json!({}))
        .await
}

/// Every agent `by` lists.
async fn agents(by: &Api) -> Vec<String> {
    ids(&by.pages("/v1/agents", "cursor").await)
}

/// Asserts that `listed` holds every id of `present` and none of `absent`.
#[track_caller]
fn assert_lists(what: &str, listed: &[String], present: &[&str], absent: &[&str]) {
    for id in present {
        assert!(
            listed.iter().any(|l| l == id),
            "{what} does not list {id}: {listed:?}"
        );
    }
    for id in absent {
        assert!(
            !listed.iter().any(|l| l == id),
            "{what} lists {id}, which it must not see: {listed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_never_show_another_tenants_sessions_or_agents() {
    let server = TestServer::start(operated()).await;
    let a_admin = create_key(&server, "a", "admin").await;
    let b_admin = create_key(&server, "b", "admin").await;
    let m1 = create_key(&server, "a", "member").await;
    let (a, b, member) = (
        a_admin.client(&server),
        b_admin.client(&server),
        m1.client(&server),
    );

    let a_agent = id_of(&create_agent(&a, &json!({"name": "a-agent", "model": "mock"})).await);
    let b_agent = id_of(&create_agent(&b, &json!({"name": "b-agent", "model": "mock"})).await);
    let a_session = member.create_session_with(&json!({"agent": a_agent})).await;
    assert_eq!(
        (&a_session["tenant"], &a_session["owner"]),
        (&json!("a"), &json!(m1.id)),
        "a member's session is in its tenant and owned by its key: {a_session}"
    );
    let a_session = id_of(&a_session);
    let b_session = b.create_session_with(&json!({"agent": b_agent})).await;
    assert_eq!(b_session["tenant"], "b", "{b_session}");
    let b_session = id_of(&b_session);

    for (who, api, own, other) in [
        ("A's admin", &a, &a_session, &b_session),
        ("A's member", &member, &a_session, &b_session),
        ("B's admin", &b, &b_session, &a_session),
    ] {
        let listed = ids(&api.sessions().await);
        assert_lists(&format!("{who}'s sessions"), &listed, &[own], &[other]);
        let shown = api.get(&format!("/v1/sessions/{other}")).await;
        shown.expect_problem(
            StatusCode::NOT_FOUND,
            &format!("{who} reads another tenant's session"),
        );
    }
    for (who, api, own, other) in [
        ("A's admin", &a, &a_agent, &b_agent),
        ("A's member", &member, &a_agent, &b_agent),
        ("B's admin", &b, &b_agent, &a_agent),
    ] {
        let listed = agents(api).await;
        assert_lists(&format!("{who}'s agents"), &listed, &[own], &[other]);
        let shown = api.get(&format!("/v1/agents/{other}")).await;
        shown.expect_problem(
            StatusCode::NOT_FOUND,
            &format!("{who} reads another tenant's agent"),
        );
    }
    // A session on another tenant's agent is refused as if the agent did not exist.
    b.post_json("/v1/sessions", &json!({"agent": a_agent}))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "B's admin on A's agent");
    // Operators see every tenant.
    let everything = ids(&server.sessions().await);
    assert_lists(
        "the operator's sessions",
        &everything,
        &[&a_session, &b_session],
        &[],
    );
    let every_agent = agents(&server).await;
    assert_lists(
        "the operator's agents",
        &every_agent,
        &[&a_agent, &b_agent],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lists_only_its_own_sessions_and_admins_and_viewers_the_tenants() {
    let server = TestServer::start(operated()).await;
    let admin = create_key(&server, "a", "admin").await;
    let m1 = create_key(&server, "a", "member").await;
    let m2 = create_key(&server, "a", "member").await;
    let viewer = create_key(&server, "a", "viewer").await;
    let made = |key: &Key| {
        let api = key.client(&server);
        async move { api.create_session_with(&json!({})).await }
    };
    let (s1, s2, s_admin) = (made(&m1).await, made(&m2).await, made(&admin).await);
    for (session, key) in [(&s1, &m1), (&s2, &m2), (&s_admin, &admin)] {
        assert_eq!(
            (&session["tenant"], &session["owner"]),
            (&json!("a"), &json!(key.id)),
            "{session}"
        );
    }
    let (s1, s2, s_admin) = (id_of(&s1), id_of(&s2), id_of(&s_admin));
    let operators = server.create_session_with(&json!({})).await;
    assert_eq!(
        (&operators["tenant"], &operators["owner"]),
        (&json!("default"), &json!("operator")),
        "{operators}"
    );
    let operators = id_of(&operators);

    let lists = |key: &Key| {
        let api = key.client(&server);
        async move { ids(&api.sessions().await) }
    };
    let mine = lists(&m1).await;
    assert_eq!(mine, vec![s1.clone()], "m1 lists only its own session");
    let mine = lists(&m2).await;
    assert_eq!(mine, vec![s2.clone()], "m2 lists only its own session");
    for key in [&admin, &viewer] {
        let listed = lists(key).await;
        assert_lists(
            &format!("A's {}", key.role),
            &listed,
            &[&s1, &s2, &s_admin],
            &[&operators],
        );
        assert_eq!(listed.len(), 3, "{listed:?}");
    }
    // A member does not read another member's session, even by its id.
    m2.client(&server)
        .get(&format!("/v1/sessions/{s1}"))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "m2 reads m1's session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_reads_but_cannot_run_or_create() {
    let server = TestServer::start(operated()).await;
    let m1 = create_key(&server, "a", "member").await;
    let viewer = create_key(&server, "a", "viewer").await;
    let owner = m1.client(&server);
    let id = owner.create_session().await;
    owner.run_wait(&id, "hello").await;

    let reader = viewer.client(&server);
    assert_eq!(reader.session(&id).await["id"], id.as_str());
    assert!(!reader.events(&id).await.is_empty());
    assert!(!reader.messages(&id).await.is_empty());
    assert_eq!(reader.runs(&id).await.len(), 1);
    reader.get_ok("/v1/agents").await;

    let refused = [
        reader.post_run(&id, "may I?").await,
        reader.post_run_wait(&id, "may I?").await,
        reader.post_json("/v1/sessions", &json!({})).await,
        reader
            .post_empty(&format!("/v1/sessions/{id}/cancel"))
            .await,
        reader
            .send(reader.request(Method::DELETE, &format!("/v1/sessions/{id}")))
            .await,
        fork(&reader, &id).await,
        reader
            .post_json(
                &format!("/v1/sessions/{id}/tokens"),
                &json!({"scope": "read"}),
            )
            .await,
        reader
            .post_json("/v1/agents", &json!({"name": "v", "model": "mock"}))
            .await,
    ];
    for (n, reply) in refused.iter().enumerate() {
        reply.expect_problem(StatusCode::FORBIDDEN, &format!("the viewer's request {n}"));
    }
    assert_eq!(
        owner.runs(&id).await.len(),
        1,
        "a refused run started nothing"
    );
    assert_eq!(ids(&owner.sessions().await), vec![id.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_keeps_the_tenant_and_belongs_to_whoever_forked() {
    let server = TestServer::start(operated()).await;
    let admin = create_key(&server, "a", "admin").await;
    let m1 = create_key(&server, "a", "member").await;
    let m2 = create_key(&server, "a", "member").await;
    let owner = m1.client(&server);
    let id = owner.create_session().await;
    owner.run_wait(&id, "hello").await;

    let forked = fork(&owner, &id)
        .await
        .expect_json(StatusCode::CREATED, "the owner forks");
    assert_eq!(
        (&forked["tenant"], &forked["owner"]),
        (&json!("a"), &json!(m1.id)),
        "{forked}"
    );
    let by_admin = fork(&admin.client(&server), &id)
        .await
        .expect_json(StatusCode::CREATED, "A's admin forks");
    assert_eq!(
        (&by_admin["tenant"], &by_admin["owner"]),
        (&json!("a"), &json!(admin.id)),
        "{by_admin}"
    );
    fork(&m2.client(&server), &id)
        .await
        .expect_problem(StatusCode::NOT_FOUND, "another member forks");
    // The owner reads its fork's history; the admin's fork is not the owner's.
    assert!(!owner.messages(&id_of(&forked)).await.is_empty());
    owner
        .get(&format!("/v1/sessions/{}", id_of(&by_admin)))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "the admin's fork, read by m1");
    let listed = ids(&owner.sessions().await);
    assert_lists(
        "m1's sessions",
        &listed,
        &[&id, forked["id"].as_str().unwrap()],
        &[by_admin["id"].as_str().unwrap()],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_made_before_any_key_stay_in_default_for_the_operators() {
    // A server as it ran before keys: no token at all, every request an operator.
    let mut server = TestServer::start(ServerOptions::new()).await;
    let old = server.create_session().await;
    server.run_wait(&old, "before keys").await;

    // Upgraded: a deployment token, and keys.
    server.restart_with(operated()).await;
    let session = server.session(&old).await;
    assert_eq!(session["tenant"], "default", "{session}");
    assert_eq!(
        server.run_wait(&old, "after keys").await["status"],
        "completed"
    );
    let a_admin = create_key(&server, "a", "admin").await;
    let default_admin = create_key(&server, "default", "admin").await;
    assert_eq!(server.session(&old).await["tenant"], "default");
    assert!(ids(&server.sessions().await).contains(&old));

    a_admin
        .client(&server)
        .get(&format!("/v1/sessions/{old}"))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "tenant a reads a default session");
    assert!(!ids(&a_admin.client(&server).sessions().await).contains(&old));
    let admin = default_admin.client(&server);
    assert_eq!(admin.session(&old).await["id"], old.as_str());
    assert!(ids(&admin.sessions().await).contains(&old));
    let anonymous = server.anonymous();
    super::assert_unauthorized(
        &anonymous.get("/v1/sessions").await,
        "no credential, with deployment tokens",
    );
    assert_eq!(
        server.with_bearer(OPERATOR).session(&old).await["id"],
        old.as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_key_ends_requests_without_a_credential() {
    // No deployment token: a request without a credential is an operator until a key exists.
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let member = create_key(&server, "default", "member").await;
    super::assert_unauthorized(
        &server.get(&format!("/v1/sessions/{id}")).await,
        "no credential once a key exists",
    );
    let api = member.client(&server);
    api.get_ok("/v1/agents").await;
    api.get(&format!("/v1/sessions/{id}")).await.expect_problem(
        StatusCode::NOT_FOUND,
        "a member reads the operator's session",
    );
    let own = api.create_session().await;
    assert_eq!(ids(&api.sessions().await), vec![own]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_replays_only_for_the_principal_that_sent_it() {
    let server = TestServer::start(operated()).await;
    let m1 = create_key(&server, "a", "member").await;
    let m2 = create_key(&server, "a", "member").await;
    let b = create_key(&server, "b", "admin").await;
    let create = |key: &Key| {
        let api = key.client(&server);
        async move {
            let request = api
                .request(Method::POST, "/v1/sessions")
                .header("Idempotency-Key", "one-key-for-all")
                .json(&json!({"title": "keyed"}));
            let reply = api.send(request).await;
            let replayed = reply
                .headers
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            (
                id_of(&reply.expect_json(StatusCode::CREATED, "a keyed create")),
                replayed,
            )
        }
    };
    let (first, replayed) = create(&m1).await;
    assert!(!replayed);
    let (again, replayed) = create(&m1).await;
    assert_eq!(
        (again, replayed),
        (first.clone(), true),
        "m1's retry replays"
    );
    for key in [&m2, &b] {
        let (theirs, replayed) = create(key).await;
        assert!(
            theirs != first && !replayed,
            "the same Idempotency-Key from another principal ({} of {}) is its own request",
            key.role,
            key.id
        );
        let session = key.client(&server).session(&theirs).await;
        assert_eq!(session["owner"], key.id.as_str(), "{session}");
    }
}

//! `/v1/environments` as a tenant's resource: who may create, read and delete one; names
//! unique per tenant; `local` built in; agents and sessions that name one.

use reqwest::StatusCode;
use serde_json::json;

use super::{key, OPERATOR};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environments_are_a_tenants_resource() {
    let server = TestServer::start(ServerOptions::new().operator_token(OPERATOR)).await;
    let admin = server
        .anonymous()
        .with_bearer(&key(&server, "a", "admin").await);
    let member = server
        .anonymous()
        .with_bearer(&key(&server, "a", "member").await);
    let other = server
        .anonymous()
        .with_bearer(&key(&server, "b", "admin").await);

    let made = admin
        .post_json(
            "/v1/environments",
            &json!({"name": "gpu", "type": "workers"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "an environment");
    assert_eq!(
        (&made["name"], &made["type"], &made["tenant"]),
        (&json!("gpu"), &json!("workers"), &json!("a")),
        "{made}"
    );
    assert!(made["id"].as_str().unwrap().starts_with("env_"), "{made}");
    assert!(made["created_at"].is_string(), "{made}");
    let again = admin
        .post_json("/v1/environments", &json!({"name": "gpu", "type": "local"}))
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text());
    let local = admin
        .post_json(
            "/v1/environments",
            &json!({"name": "local", "type": "local"}),
        )
        .await;
    assert_eq!(local.status, StatusCode::CONFLICT, "{}", local.text());
    // Another tenant may use the same name.
    other
        .post_json(
            "/v1/environments",
            &json!({"name": "gpu", "type": "workers"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "the same name in another tenant");

    for (body, field, status) in [
        (json!({"name": "gpu2", "type": "cloud"}), "type", 400),
        (json!({"name": "a b", "type": "workers"}), "name", 400),
        (json!({"name": "", "type": "workers"}), "name", 400),
        (json!({"type": "workers"}), "name", 422),
        (
            json!({"name": "x", "type": "workers", "extra": 1}),
            "extra",
            422,
        ),
    ] {
        let status = StatusCode::from_u16(status).unwrap();
        let problem = admin
            .post_json("/v1/environments", &body)
            .await
            .expect_problem(status, &body.to_string());
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains(field),
            "{body}: {problem}"
        );
    }

    let refused = member
        .post_json("/v1/environments", &json!({"name": "m", "type": "workers"}))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text());
    let listed = member.pages("/v1/environments", "cursor").await;
    let names: Vec<&str> = listed.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["local", "gpu"], "{listed:?}");
    let id = made["id"].as_str().unwrap();
    for path in [
        format!("/v1/environments/{id}"),
        "/v1/environments/gpu".into(),
    ] {
        let shown = member.get_ok(&path).await;
        assert_eq!(shown["id"], made["id"], "{shown}");
    }
    let shown = member.get_ok("/v1/environments/local").await;
    assert_eq!(shown["type"], "local", "{shown}");
    // Another tenant's environment is not found, by id; by name it finds its own.
    let hidden = other.get(&format!("/v1/environments/{id}")).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{}", hidden.text());

    // Sessions: their own choice, else their agent's, else local; unknown is a 404.
    let session = member
        .post_json("/v1/sessions", &json!({"environment": "gpu"}))
        .await
        .expect_json(StatusCode::CREATED, "a session in gpu");
    assert_eq!(session["environment"], "gpu", "{session}");
    let plain = member
        .post_json("/v1/sessions", &json!({}))
        .await
        .expect_json(StatusCode::CREATED, "a plain session");
    assert_eq!(plain["environment"], "local", "{plain}");
    let unknown = member
        .post_json("/v1/sessions", &json!({"environment": "nowhere"}))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "an unknown environment");
    assert!(unknown["detail"].as_str().unwrap().contains("nowhere"));
    let agent = admin
        .post_json(
            "/v1/agents",
            &json!({"name": "remote", "model": "mock", "environment": "gpu"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "an agent in gpu");
    assert_eq!(agent["environment"], "gpu", "{agent}");
    let on_agent = member
        .post_json("/v1/sessions", &json!({"agent": {"id": agent["id"]}}))
        .await
        .expect_json(StatusCode::CREATED, "a session on the agent");
    assert_eq!(on_agent["environment"], "gpu", "{on_agent}");
    let own = member
        .post_json(
            "/v1/sessions",
            &json!({"agent": {"id": agent["id"]}, "environment": "local"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "a session on the agent, locally");
    assert_eq!(own["environment"], "local", "{own}");
    let stranger_agent = other
        .post_json(
            "/v1/agents",
            &json!({"name": "x", "model": "mock", "environment": "nowhere"}),
        )
        .await;
    assert_eq!(stranger_agent.status, StatusCode::NOT_FOUND);

    // Deleting: admins only; local is built in.
    let refused = member
        .call(reqwest::Method::DELETE, "/v1/environments/gpu", None)
        .await;
    assert_eq!(refused.unwrap().status, StatusCode::FORBIDDEN);
    let local = admin
        .call(reqwest::Method::DELETE, "/v1/environments/local", None)
        .await
        .unwrap();
    assert_eq!(local.status, StatusCode::BAD_REQUEST, "{}", local.text());
    let deleted = admin
        .call(reqwest::Method::DELETE, "/v1/environments/gpu", None)
        .await
        .unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    let gone = member.get("/v1/environments/gpu").await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    // The other tenant's of the same name is untouched.
    other.get_ok("/v1/environments/gpu").await;
}

//! Per-tenant limits (`--tenant-max-concurrent-runs`, `--tenant-max-tokens-per-day`): a run
//! of a tenant at one of its limits is refused with `429` problem `tenant-limit` and
//! `Retry-After`, while other tenants run as before. Two tenants, each with an admin key made
//! by the operator (`POST /v1/keys`, the principals suite's helpers), on the mock model.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::principals::{create_key, OPERATOR};
use crate::support::{id_of, Api, Reply, ServerOptions, TestServer};

const TENANT_LIMIT: &str = "urn:tah:problem:tenant-limit";

/// A server with the principals suite's operator token (its client is an operator) and
/// `args`.
async fn server(options: ServerOptions, args: &[&str]) -> TestServer {
    TestServer::start(options.operator_token(OPERATOR).args(args)).await
}

/// A client acting with a new admin key of `tenant`.
async fn tenant(server: &TestServer, tenant: &str) -> Api {
    create_key(&server.api, tenant, "admin")
        .await
        .client(&server.api)
}

/// The problem of a `429 tenant-limit`, and its `Retry-After` in seconds.
fn tenant_limit(reply: &Reply, what: &str) -> (Value, u64) {
    let problem = reply.expect_problem(StatusCode::TOO_MANY_REQUESTS, what);
    assert_eq!(problem["type"], TENANT_LIMIT, "{what}: {problem}");
    assert_eq!(problem["status"], 429, "{what}: {problem}");
    let retry_after = reply
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{what}: no Retry-After in seconds: {:?}", reply.headers));
    (problem, retry_after)
}

fn tokens(usage: &Value) -> u64 {
    usage["input_tokens"].as_u64().expect("input_tokens")
        + usage["output_tokens"].as_u64().expect("output_tokens")
}

#[tokio::test]
async fn a_tenant_at_its_run_limit_is_refused_while_another_runs_and_runs_again_after() {
    let server = server(
        ServerOptions::new().mock_delay_ms(200),
        &["--tenant-max-concurrent-runs", "1"],
    )
    .await;
    let (a, b) = (tenant(&server, "acme").await, tenant(&server, "bolt").await);
    let (a1, a2) = (a.create_session().await, a.create_session().await);
    let b1 = b.create_session().await;

    let running = a.start_run(&a1, "hello").await;
    let refused = a.post_run(&a2, "hello").await;
    let (problem, retry_after) = tenant_limit(&refused, "a second run of acme");
    assert_eq!(retry_after, 2, "{problem}");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(
        detail.contains("\"acme\" has 1 runs in progress") && detail.contains("limit is 1"),
        "{detail}"
    );
    assert_eq!(a.session(&a2).await["state"], "idle", "nothing started");

    let other = b.start_run(&b1, "hello").await;
    assert_eq!(other["status"], "running", "{other}");

    a.cancel(&a1).await;
    let ended = a.wait_run(&a1, &id_of(&running)).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    let again = a.start_run(&a2, "hello").await;
    assert_eq!(again["status"], "running", "{again}");
    a.cancel(&a2).await;
    a.wait_run(&a2, &id_of(&again)).await;
    b.cancel(&b1).await;
    b.wait_run(&b1, &id_of(&other)).await;

    // A sub-agent tree is one run: a parent delegating two children finishes at limit 1.
    let parent = a
        .create_session_with(&json!({"tool_policy": [{"tool": "task", "action": "allow"}]}))
        .await;
    let result = a.run_wait(&id_of(&parent), "delegate 2 things").await;
    assert_eq!(result["status"], "completed", "{result}");
    let children = a
        .get_ok(&format!("/v1/sessions?parent_id={}", id_of(&parent)))
        .await;
    assert_eq!(
        children["data"].as_array().map(Vec::len),
        Some(2),
        "{children}"
    );
    let after = a.run_wait(&a2, "hello").await;
    assert_eq!(after["status"], "completed", "{after}");
}

#[tokio::test]
async fn a_tenant_over_its_tokens_of_the_day_is_refused_until_midnight_and_others_are_not() {
    let server = server(ServerOptions::new(), &["--tenant-max-tokens-per-day", "1"]).await;
    let (a, b) = (tenant(&server, "acme").await, tenant(&server, "bolt").await);
    let a1 = a.create_session().await;

    // Under the limit (nothing used yet): the run starts and finishes, over the limit.
    let first = a.run_wait(&a1, "hello").await;
    assert_eq!(first["status"], "completed", "{first}");
    let used = tokens(&first["usage"]);
    assert!(used > 1, "the mock's run used tokens: {first}");

    let refused = a.post_run(&a1, "again").await;
    let (problem, retry_after) = tenant_limit(&refused, "acme over its tokens");
    assert!(
        (1..=86_400).contains(&retry_after),
        "Retry-After is the time to 00:00 UTC: {retry_after}"
    );
    let now = chrono::Utc::now();
    let midnight = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let expected = (midnight - now).num_seconds().unsigned_abs();
    assert!(
        retry_after.abs_diff(expected) <= 5,
        "Retry-After {retry_after} s, {expected} s to midnight"
    );
    let detail = problem["detail"].as_str().expect("detail");
    assert!(
        detail.contains(&format!("\"acme\" has used {used} tokens today"))
            && detail.contains("limit is 1 a day"),
        "{detail}"
    );
    // Another session of the tenant is refused as well.
    let a2 = a.create_session().await;
    tenant_limit(&a.post_run(&a2, "hello").await, "another acme session");

    // The other tenant is not affected.
    let b1 = b.create_session().await;
    let other = b.run_wait(&b1, "hello").await;
    assert_eq!(other["status"], "completed", "{other}");
    assert_eq!(
        tokens(&a.session(&a1).await["usage"]),
        used,
        "the refused run used nothing"
    );
}

#[tokio::test]
async fn a_run_that_waits_for_an_approval_holds_its_place_and_its_answer_is_never_refused() {
    let server = server(ServerOptions::new(), &["--tenant-max-concurrent-runs", "1"]).await;
    let a = tenant(&server, "acme").await;
    let (waits, other) = (a.create_session().await, a.create_session().await);
    let run = a.start_run(&waits, "write a note about limits").await;
    a.poll_session(&waits, "waiting_tool", Duration::from_secs(10), |s| {
        s["state"] == "waiting_tool"
    })
    .await;
    tenant_limit(&a.post_run(&other, "hello").await, "while one waits");

    let pending = a.get_ok(&format!("/v1/sessions/{waits}/approvals")).await;
    let call = pending["data"][0]["call_id"]
        .as_str()
        .expect("a call waits");
    let path = format!("/v1/sessions/{waits}/approvals/{call}");
    let answered = a.post_json(&path, &json!({"decision": "allow"})).await;
    assert!(answered.status.is_success(), "{}", answered.text());
    let ended = a.wait_run(&waits, &id_of(&run)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    let after = a.run_wait(&other, "hello").await;
    assert_eq!(after["status"], "completed", "{after}");
}

//! Caps in money (SPEC §21): `max_cost_usd` on a session, inherited from its agent, given by a
//! schedule to the sessions and runs of its fires, and `--tenant-max-cost-usd-per-day`. A cap
//! reached pauses the run at the next step boundary (`failed`, `finish_reason: budget`, a
//! reason naming the cap); raising it (`POST /v1/sessions/{id}`) and `/resume` continue the
//! same turn with its history. All on the priced mock of `cost`.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::cost::{check_log, close, expected_cost, priced_providers};
use super::*;
use crate::principals::{create_key, operated};

/// Smaller than any step's cost: the run stops after its first LLM step.
const TINY: f64 = 1e-9;

/// A priced agent that lists files before it answers (two LLM steps a turn at least).
async fn priced_agent(api: &Api, name: &str, extra: Value) -> String {
    let mut body = json!({"name": name, "model": "priced/mock", "system_prompt": "Be brief.",
                          "tools": ["list_files", "read_file"]});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    id_of(&create_agent(api, &body).await)
}

/// `POST /v1/sessions/{id}` (the session update).
async fn update(api: &Api, id: &str, body: Value) -> Reply {
    api.post_json(&format!("/v1/sessions/{id}"), &body).await
}

/// A run a cap in money stopped: failed with `budget`, the reason naming `cap`, one
/// `agent.finished`, every tool call answered, the session `failed` with the same reason.
async fn assert_paused(api: &Api, id: &str, result: &Value, cap: &str) {
    assert_eq!(result["status"], "failed", "{result}");
    assert_eq!(result["finish_reason"], "budget", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("cost budget reached"), "{result}");
    assert!(error.contains(cap), "the reason names {cap}: {result}");
    let session = api.session(id).await;
    assert_eq!(session["state"], "failed", "{session}");
    assert_eq!(session["error"], result["error"], "{session}");
    let log = api.events(id).await;
    let run_id = result["run_id"].as_str().unwrap_or("?");
    let terminal = terminal_events_of(&log, run_id);
    assert_eq!(terminal.len(), 1, "{:?}", types(&log));
    assert_eq!(terminal[0]["type"], "agent.finished", "{:?}", terminal[0]);
    assert_eq!(terminal[0]["data"]["finish_reason"], "budget");
    assert_tool_calls_answered(&api.messages(id).await);
}

fn user_messages(messages: &[Value]) -> usize {
    messages.iter().filter(|m| m["role"] == "user").count()
}

#[tokio::test]
async fn a_session_cap_pauses_the_run_and_raising_it_then_resume_finishes_the_turn() {
    let (_dir, path) = priced_providers();
    let server = TestServer::start(ServerOptions::new().args(&["--providers", &path])).await;
    let agent = priced_agent(&server, "capped", json!({})).await;
    let session = session_on(&server, json!({"agent": agent, "max_cost_usd": TINY})).await;
    assert_eq!(session["max_cost_usd"], TINY, "{session}");
    let id = id_of(&session);

    let result = server.run_wait(&id, "What is in this workspace?").await;
    // The first step starts with nothing spent; after it the session is over its cap, so
    // the run stops at that step boundary (its tool calls ran and were answered first).
    assert_eq!(result["steps"], 1, "{result}");
    assert_paused(
        &server,
        &id,
        &result,
        &format!("the session's max_cost_usd={TINY}"),
    )
    .await;
    assert_eq!(
        server.llm_step_count(&id).await,
        1,
        "no step started over the cap"
    );

    // The spend is the first step's cost, checked by hand: the mock's first step of this
    // turn reads 9 input tokens and writes 3 output tokens, at $2.50 and $10.00 per million:
    // 9 × 2.5 = 22.5 and 3 × 10 = 30, together 52.5 per million, $0.0000525 (over the cap
    // of $0.000000001, so no second step).
    let steps = server.steps(&id).await;
    let first = steps
        .iter()
        .find(|s| s["type"] == "llm")
        .expect("an LLM step");
    let (input, output) = (
        first["usage"]["input_tokens"].as_u64().unwrap_or(0),
        first["usage"]["output_tokens"].as_u64().unwrap_or(0),
    );
    let by_hand = (input as f64 * 2.5 + output as f64 * 10.0) / 1e6;
    println!(
        "first step: {input} input tokens × $2.50/M + {output} output tokens × $10.00/M = \
         ${by_hand}"
    );
    let shown = server.session(&id).await;
    let spent = shown["total_cost_usd"].as_f64().expect("total_cost_usd");
    assert!(close(spent, expected_cost(&first["usage"])), "{shown}");
    assert!((spent - by_hand).abs() < 1e-12, "{spent} vs {by_hand}");
    assert_eq!((input, output), (9, 3), "the mock's usage of this step");
    assert!(close(spent, 0.0000525), "{shown}");
    assert_eq!(shown["max_cost_usd"], TINY, "{shown}");

    // Resuming without raising the cap stops again before any step.
    let again = server.resume_wait(&id).await;
    assert_eq!(again["finish_reason"], "budget", "{again}");
    assert_eq!(again["steps"], 0, "{again}");
    assert_eq!(server.llm_step_count(&id).await, 1);

    // Raised, then resumed: the same turn goes on from its history and completes.
    let raised = update(&server, &id, json!({"max_cost_usd": 1.0}))
        .await
        .expect_json(StatusCode::OK, "raise the cap");
    assert_eq!(raised["max_cost_usd"], 1.0, "{raised}");
    assert_eq!(
        raised["total_cost_usd"], shown["total_cost_usd"],
        "{raised}"
    );
    let before = server.messages(&id).await;
    let done = server.resume_wait(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["steps"].as_u64().unwrap_or(0) >= 1, "{done}");
    let after = server.messages(&id).await;
    assert_eq!(after[..before.len()], before[..], "the history is intact");
    assert_eq!(user_messages(&after), 1, "no new input: the same turn");
    assert_eq!(after.last().expect("a reply")["role"], "assistant");
    let events = server.events(&id).await;
    let total = check_log(&events, 0.0);
    let shown = server.session(&id).await;
    assert!(close(
        shown["total_cost_usd"].as_f64().unwrap_or(-1.0),
        total
    ));
    assert_eq!(shown["state"], "completed", "{shown}");
}

#[tokio::test]
async fn an_agent_cap_applies_unless_the_session_sets_its_own_and_null_clears_that() {
    let (_dir, path) = priced_providers();
    let server = TestServer::start(ServerOptions::new().args(&["--providers", &path])).await;
    let agent = priced_agent(&server, "thrifty", json!({"max_cost_usd": TINY})).await;

    let inherits = id_of(&session_on(&server, json!({"agent": agent})).await);
    let result = server
        .run_wait(&inherits, "What is in this workspace?")
        .await;
    assert_eq!(result["steps"], 1, "{result}");
    assert_paused(&server, &inherits, &result, "its agent's max_cost_usd").await;

    let own = session_on(&server, json!({"agent": agent, "max_cost_usd": 5})).await;
    let own = id_of(&own);
    let result = server.run_wait(&own, "What is in this workspace?").await;
    assert_eq!(result["status"], "completed", "{result}");

    // `null` clears the session's own cap: its agent's applies again.
    let cleared = update(&server, &own, json!({"max_cost_usd": null}))
        .await
        .expect_json(StatusCode::OK, "clear the cap");
    assert!(cleared.get("max_cost_usd").is_none(), "{cleared}");
    let result = server.run_wait(&own, "And now?").await;
    assert_eq!(result["steps"], 0, "{result}");
    assert_paused(&server, &own, &result, "its agent's max_cost_usd").await;
}

#[tokio::test]
async fn the_session_update_refuses_bad_input_naming_the_field() {
    let server = TestServer::start(operated()).await;
    let admin = create_key(&server, "acme", "admin").await.client(&server);
    let id = admin.create_session().await;
    for (body, field) in [
        (json!({"max_cost_usd": -1}), "max_cost_usd"),
        (json!({"max_cost_usd": 0}), "max_cost_usd"),
        (json!({"max_cost_usd": "1.5"}), "max_cost_usd"),
        (json!({"max_cost_usd": true}), "max_cost_usd"),
        (json!({"budget": 1}), "budget"),
        (json!({"title": 7}), "title"),
        (json!({"metadata": [1]}), "metadata"),
    ] {
        let reply = update(&admin, &id, body.clone()).await;
        let what = format!("POST /v1/sessions/{{id}} {body}");
        if let Some(fault) = refusal_fault(&reply, StatusCode::BAD_REQUEST, &[field], &what) {
            panic!("{fault}");
        }
    }
    for body in [
        json!({"max_cost_usd": -0.5}),
        json!({"max_cost_usd": "cheap"}),
        json!({"max_cost_usd": 0}),
    ] {
        let reply = admin.post_json("/v1/sessions", &body).await;
        let what = format!("POST /v1/sessions {body}");
        if let Some(fault) =
            refusal_fault(&reply, StatusCode::BAD_REQUEST, &["max_cost_usd"], &what)
        {
            panic!("{fault}");
        }
    }
    let reply = update(&admin, &id, json!([1])).await;
    reply.expect_problem(StatusCode::UNPROCESSABLE_ENTITY, "a body that is no object");
    let untouched = admin.session(&id).await;
    assert!(untouched.get("max_cost_usd").is_none(), "{untouched}");

    // Another tenant's admin cannot see the session, let alone raise its cap.
    let other = create_key(&server, "globex", "admin").await.client(&server);
    let reply = update(&other, &id, json!({"max_cost_usd": 100})).await;
    reply.expect_problem(StatusCode::NOT_FOUND, "another tenant's session");
    assert!(admin.session(&id).await.get("max_cost_usd").is_none());

    // Title and metadata change with the cap, or alone.
    let changed = update(
        &admin,
        &id,
        json!({"max_cost_usd": 2.5, "title": "nightly", "metadata": {"team": "a"}}),
    )
    .await
    .expect_json(StatusCode::OK, "update");
    assert_eq!(
        (
            &changed["max_cost_usd"],
            &changed["title"],
            &changed["metadata"]
        ),
        (&json!(2.5), &json!("nightly"), &json!({"team": "a"})),
        "{changed}"
    );
    let titled = update(&admin, &id, json!({"title": null}))
        .await
        .expect_json(StatusCode::OK, "clear the title");
    assert!(titled["title"].is_null(), "{titled}");
    assert_eq!(titled["max_cost_usd"], 2.5, "{titled}");
    assert_eq!(titled["metadata"], json!({"team": "a"}), "{titled}");
    let missing = format!("/v1/sessions/{}", uuid::Uuid::now_v7());
    admin
        .post_json(&missing, &json!({"max_cost_usd": 1}))
        .await
        .expect_problem(StatusCode::NOT_FOUND, "no such session");
}

/// Triggers schedule `id` and waits for its fire's run to end: the fire and the run.
async fn trigger_and_wait(api: &Api, id: &str) -> (Value, Value) {
    let fire = api
        .post_empty(&format!("/v1/schedules/{id}/trigger"))
        .await
        .expect_json(StatusCode::CREATED, "a manual fire");
    assert_eq!(fire["outcome"], "started", "{fire}");
    let session = fire["session"].as_str().expect("a session");
    let run = api
        .wait_run(session, fire["run"].as_str().expect("a run"))
        .await;
    (fire, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_cap_bounds_its_new_sessions_and_its_runs_on_a_reused_one() {
    let (_dir, path) = priced_providers();
    let server = TestServer::start(ServerOptions::new().args(&["--providers", &path])).await;
    let agent = priced_agent(&server, "nightly", json!({})).await;
    let input = "What is in this workspace?";

    // A new session per fire: it gets the schedule's cap as its own.
    let body = json!({"agent": agent, "cron": "0 0 1 1 *", "timezone": "UTC", "input": input,
                      "max_cost_usd": TINY});
    let schedule = server
        .post_json("/v1/schedules", &body)
        .await
        .expect_json(StatusCode::CREATED, "a schedule");
    let (fire, run) = trigger_and_wait(&server, &id_of(&schedule)).await;
    let session = fire["session"].as_str().expect("its session");
    assert_eq!(run["finish_reason"], "budget", "{run}");
    assert_eq!(run["steps"], 1, "{run}");
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.contains("the schedule's max_cost_usd"), "{run}");
    assert_eq!(server.session(session).await["max_cost_usd"], TINY);

    // One reused session: the fire's run may spend the cap itself; the session keeps no cap,
    // and a run started by hand on it is not bounded by the schedule.
    let own = id_of(&session_on(&server, json!({"agent": agent})).await);
    let first = server.run_wait(&own, "Hello").await;
    assert_eq!(first["status"], "completed", "{first}");
    let body = json!({"agent": agent, "cron": "0 0 1 1 *", "timezone": "UTC", "input": input,
                      "session": own, "max_cost_usd": TINY});
    let schedule = server
        .post_json("/v1/schedules", &body)
        .await
        .expect_json(StatusCode::CREATED, "a schedule on a session");
    let (fire, run) = trigger_and_wait(&server, &id_of(&schedule)).await;
    assert_eq!(fire["session"], json!(own), "{fire}");
    assert_eq!(run["finish_reason"], "budget", "{run}");
    assert_eq!(
        run["steps"], 1,
        "spent nothing before its first step: {run}"
    );
    let error = run["error"].as_str().unwrap_or_default();
    assert!(error.contains("the schedule's max_cost_usd"), "{run}");
    assert!(server.session(&own).await.get("max_cost_usd").is_none());
    let by_hand = server.resume_wait(&own).await;
    assert_eq!(by_hand["status"], "completed", "{by_hand}");
}

#[tokio::test]
async fn the_tenant_day_cap_counts_every_session_and_a_raised_flag_lets_them_resume() {
    let (_dir, path) = priced_providers();
    let capped = |cap: &str| {
        ServerOptions::new().process().args(&[
            "--providers",
            &path,
            "--tenant-max-cost-usd-per-day",
            cap,
        ])
    };
    let mut server = TestServer::start(capped("0.000000001")).await;
    let agent = priced_agent(&server, "shared", json!({})).await;
    let a = id_of(&session_on(&server, json!({"agent": agent})).await);
    let b = id_of(&session_on(&server, json!({"agent": agent})).await);

    // The first session's step takes the tenant over its cap; the second, another session
    // of the same tenant, then starts no step at all.
    let result = server.run_wait(&a, "What is in this workspace?").await;
    assert_eq!(result["steps"], 1, "{result}");
    assert_paused(&server, &a, &result, "--tenant-max-cost-usd-per-day").await;
    let result = server.run_wait(&b, "What is in this workspace?").await;
    assert_eq!(result["steps"], 0, "{result}");
    assert_paused(&server, &b, &result, "tenant \"default\" has spent").await;
    assert_eq!(server.llm_step_count(&b).await, 0);

    // The spend of the day is read from the database after a restart: still over the cap.
    server.restart().await;
    let again = server.resume_wait(&a).await;
    assert_eq!(
        (&again["finish_reason"], &again["steps"]),
        (&json!("budget"), &json!(0))
    );

    // A raised flag: both resume and finish their turns.
    server.restart_with(capped("5")).await;
    for id in [&a, &b] {
        let done = server.resume_wait(id).await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(user_messages(&server.messages(id).await), 1);
    }
}

#[tokio::test]
async fn the_cap_does_not_change_under_a_running_run() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(40)).await;
    let id = server.create_session().await;
    let run = server.start_run(&id, "What is in this workspace?").await;
    let reply = update(&server, &id, json!({"max_cost_usd": 1})).await;
    assert_conflict(&reply, "a cap changed while a run is active");
    let ended = server.wait_run(&id, &id_of(&run)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert!(server.session(&id).await.get("max_cost_usd").is_none());
    let set = update(&server, &id, json!({"max_cost_usd": 1}))
        .await
        .expect_json(StatusCode::OK, "once the run has ended");
    assert_eq!(set["max_cost_usd"], 1.0, "{set}");
}

//! Spend in money: a providers file gives the mock model a price; every LLM step of a session
//! on it records `cost_usd` (its record and its `llm.completed`), a `session.usage` event with
//! the session's running total follows each step, and the total carries on across a restart.
//! A step of a model without a price records no cost, and its `session.usage` carries its
//! tokens with no cost and the session's total as it was.

use serde_json::{json, Value};
use tempfile::TempDir;

use super::*;

/// Dollars per million input and output tokens of the priced mock.
const INPUT_PER_MTOK: f64 = 2.5;
const OUTPUT_PER_MTOK: f64 = 10.0;

/// A providers file with `priced`, a mock provider whose model `mock` has a price.
pub fn priced_providers() -> (TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("providers.json");
    let text = json!({"providers": {"priced": {
        "type": "mock",
        "prices": {"mock": {"input_per_mtok": INPUT_PER_MTOK, "output_per_mtok": OUTPUT_PER_MTOK}},
    }}});
    std::fs::write(&path, text.to_string()).expect("write the providers file");
    (dir, path.display().to_string())
}

/// A step's cost by the formula, rounded to the nano-dollar as the server rounds.
pub(super) fn expected_cost(usage: &Value) -> f64 {
    let input = usage["input_tokens"].as_u64().expect("input_tokens") as f64;
    let output = usage["output_tokens"].as_u64().expect("output_tokens") as f64;
    let usd = (input * INPUT_PER_MTOK + output * OUTPUT_PER_MTOK) / 1e6;
    (usd * 1e9).round() / 1e9
}

pub(super) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// Checks every priced step of the log: its `llm.completed` has the cost of its usage, the
/// next event is its `session.usage`, and the totals add up from `start`. Answers the total.
pub(super) fn check_log(events: &[Value], start: f64) -> f64 {
    let mut total = start;
    let mut steps = 0;
    for (at, event) in events.iter().enumerate() {
        if event["type"] != "llm.completed" {
            continue;
        }
        steps += 1;
        let data = &event["data"];
        let cost = data["cost_usd"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cost: {event}"));
        assert!(close(cost, expected_cost(&data["usage"])), "{event}");
        assert!(cost > 0.0, "{event}");
        let usage = &events[at + 1];
        assert_eq!(usage["type"], "session.usage", "after {event}: {usage}");
        assert_eq!(usage["data"]["input_tokens"], data["usage"]["input_tokens"]);
        assert_eq!(
            usage["data"]["output_tokens"],
            data["usage"]["output_tokens"]
        );
        assert_eq!(usage["data"]["cost_usd"], data["cost_usd"], "{usage}");
        total += cost;
        let running = usage["data"]["total_cost_usd"]
            .as_f64()
            .expect("total_cost_usd");
        assert!(
            close(running, total),
            "running total {running}, summed {total}"
        );
    }
    assert!(steps >= 2, "the turn made {steps} LLM steps");
    total
}

#[tokio::test]
async fn priced_steps_record_their_cost_and_the_session_total_survives_a_restart() {
    let (_dir, path) = priced_providers();
    let mut server =
        TestServer::start(ServerOptions::new().process().args(&["--providers", &path])).await;
    let agent = create_agent(
        &server,
        &json!({"name": "priced", "model": "priced/mock", "system_prompt": "Be brief.",
                "tools": ["list_files", "read_file"]}),
    )
    .await;
    let session = id_of(&session_on(&server, json!({"agent": id_of(&agent)})).await);
    let result = server
        .run_wait(&session, "What is in this workspace?")
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&session).await;
    let total = check_log(&events, 0.0);

    // The step records carry the same costs.
    let steps = server.steps(&session).await;
    let llm: Vec<&Value> = steps.iter().filter(|s| s["type"] == "llm").collect();
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "llm.completed")
        .collect();
    assert_eq!(llm.len(), completed.len(), "{steps:?}");
    for (step, event) in llm.iter().zip(&completed) {
        assert_eq!(step["id"], event["data"]["step_id"]);
        assert_eq!(step["cost_usd"], event["data"]["cost_usd"], "{step}");
        assert!(close(
            step["cost_usd"].as_f64().unwrap_or(-1.0),
            expected_cost(&step["usage"])
        ));
    }

    // After a restart the running total goes on from what the steps cost.
    server.restart().await;
    let seen = events.len();
    let result = server.run_wait(&session, "And now?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&session).await;
    let later = check_log(&events[seen..], total);
    assert!(later > total, "{later} after {total}");
}

/// Checks every step of the log made by a model without a price: its `llm.completed` has no
/// cost, and the next event is its `session.usage` with its tokens, no `cost_usd` and the
/// session's total cost as it stood (`total`: absent while no step had a price). Answers
/// the tokens the steps used, summed.
fn check_unpriced_log(events: &[Value], total: Option<f64>) -> (u64, u64) {
    let (mut input, mut output) = (0, 0);
    for (at, event) in events.iter().enumerate() {
        if event["type"] != "llm.completed" {
            continue;
        }
        let data = &event["data"];
        assert!(data.get("cost_usd").is_none(), "{event}");
        let usage = &events[at + 1];
        assert_eq!(usage["type"], "session.usage", "after {event}: {usage}");
        assert_eq!(usage["data"]["input_tokens"], data["usage"]["input_tokens"]);
        assert_eq!(
            usage["data"]["output_tokens"],
            data["usage"]["output_tokens"]
        );
        assert!(usage["data"]["cost_usd"].is_null(), "{usage}");
        match total {
            None => assert!(usage["data"]["total_cost_usd"].is_null(), "{usage}"),
            Some(total) => assert!(
                close(
                    usage["data"]["total_cost_usd"].as_f64().unwrap_or(-1.0),
                    total
                ),
                "{usage}: the total stays {total}"
            ),
        }
        input += data["usage"]["input_tokens"]
            .as_u64()
            .expect("input_tokens");
        output += data["usage"]["output_tokens"]
            .as_u64()
            .expect("output_tokens");
    }
    (input, output)
}

#[tokio::test]
async fn a_model_without_a_price_records_no_cost() {
    let server = TestServer::start(ServerOptions::new()).await;
    let session = server.create_session().await;
    let result = server
        .run_wait(&session, "What is in this workspace?")
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&session).await;
    let completed = events
        .iter()
        .filter(|e| e["type"] == "llm.completed")
        .count();
    let usages = events
        .iter()
        .filter(|e| e["type"] == "session.usage")
        .count();
    assert!(completed >= 2, "the turn made {completed} LLM steps");
    assert_eq!(usages, completed, "one session.usage per LLM step");
    let (input, output) = check_unpriced_log(&events, None);
    for step in server.steps(&session).await {
        assert!(step.get("cost_usd").is_none(), "{step}");
    }
    // The session's token totals advance with the steps; its cost stays absent.
    let shown = server.session(&session).await;
    assert_eq!(shown["usage"]["input_tokens"], input, "{shown}");
    assert_eq!(shown["usage"]["output_tokens"], output, "{shown}");
    assert!(shown["total_cost_usd"].is_null(), "{shown}");
}

#[tokio::test]
async fn an_unpriced_step_keeps_the_session_total_as_it_was() {
    let (_dir, path) = priced_providers();
    let server = TestServer::start(ServerOptions::new().args(&["--providers", &path])).await;
    let agent = create_agent(
        &server,
        &json!({"name": "switching", "model": "priced/mock", "tools": ["list_files"]}),
    )
    .await;
    let agent_id = id_of(&agent);
    let session = id_of(
        &session_on(
            &server,
            json!({"agent": {"id": agent_id, "version": "latest"}}),
        )
        .await,
    );
    let result = server
        .run_wait(&session, "What is in this workspace?")
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&session).await;
    let total = check_log(&events, 0.0);

    // The agent moves to the default provider's mock, which has no price.
    updated(&server, &agent_id, &json!({"model": "mock"})).await;
    let seen = events.len();
    let result = server.run_wait(&session, "And now?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&session).await;
    let later = &events[seen..];
    assert!(
        later.iter().any(|e| e["type"] == "session.usage"),
        "{later:?}"
    );
    check_unpriced_log(later, Some(total));
    let shown = server.session(&session).await;
    assert!(
        close(shown["total_cost_usd"].as_f64().unwrap_or(-1.0), total),
        "{shown}"
    );
}

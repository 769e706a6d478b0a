//! Agents as versioned resources and several model providers at once (`/v1/agents`,
//! `/v1/providers`, `--providers FILE`), through HTTP only:
//!
//! - `resources`: create, get, list and page, versions, updates (conditional, empty),
//!   archiving (with a session still running on the agent), the `default` agent.
//! - `bad_input`: every refused agent or agent choice is a 4xx problem naming what is wrong,
//!   and creates nothing.
//! - `sessions`: sessions on an agent, pinned to a version or following the latest; what
//!   their steps record and send (prompt, tools); `session.created`; forks.
//! - `providers`: two providers of a providers file (JSON and TOML) serving two sessions at
//!   once, each on its own path with its own model, key and header; `GET /v1/providers`; a bad
//!   file stops the start.
//! - `subagents`: `task` delegating to one of the agent's `subagents`.
//! - `restart`: a session pinned to an agent version keeps it across a restart.
//! - `cost`: the cost of steps at a price from the providers file, and `session.usage`.
//! - `spend`: caps in money (`max_cost_usd` of sessions, agents and schedules, and
//!   `--tenant-max-cost-usd-per-day`) that pause a run, raised and resumed.
//!
//! Most tests run on the mock model, whose provider is `default` (model `mock`).

mod bad_input;
pub mod cost;
mod providers;
mod resources;
mod restart;
mod sessions;
mod spend;
mod subagents;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;

/// `POST /v1/agents` that must answer 201; returns the agent view.
pub async fn create_agent(api: &Api, body: &Value) -> Value {
    api.post_json("/v1/agents", body)
        .await
        .expect_json(StatusCode::CREATED, &format!("POST /v1/agents {body}"))
}

/// An agent on the mock model with this system prompt and these built-in tools.
pub async fn mock_agent(api: &Api, name: &str, prompt: &str, tools: &[&str]) -> Value {
    create_agent(
        api,
        &json!({"name": name, "model": "mock", "system_prompt": prompt, "tools": tools}),
    )
    .await
}

/// `POST /v1/agents/{id}` (an update) with an optional `If-Match`; the whole answer.
pub async fn update_agent(api: &Api, id: &str, body: &Value, if_match: Option<&str>) -> Reply {
    let mut request = api
        .request(Method::POST, &format!("/v1/agents/{id}"))
        .json(body);
    if let Some(version) = if_match {
        request = request.header("If-Match", version);
    }
    api.send(request).await
}

/// An update that must answer 200; returns the agent view.
pub async fn updated(api: &Api, id: &str, body: &Value) -> Value {
    update_agent(api, id, body, None)
        .await
        .expect_json(StatusCode::OK, &format!("POST /v1/agents/{id} {body}"))
}

/// `DELETE /v1/agents/{id}`, whatever it answers.
pub async fn archive(api: &Api, id: &str) -> Reply {
    api.send(api.request(Method::DELETE, &format!("/v1/agents/{id}")))
        .await
}

/// A session created with this body, which must be accepted; returns its view.
pub async fn session_on(api: &Api, body: Value) -> Value {
    api.create_session_with(&body).await
}

/// What is wrong with a refusal, if anything: it must have `status`, be a problem+json with a
/// detail, and the detail must name one of `names` (the field or the thing at fault).
pub fn refusal_fault(
    reply: &Reply,
    status: StatusCode,
    names: &[&str],
    what: &str,
) -> Option<String> {
    if reply.status != status {
        return Some(format!(
            "{what}: expected {status}, got {} with {}",
            reply.status,
            reply.text()
        ));
    }
    let problem = match check_problem(reply) {
        Ok(problem) => problem,
        Err(e) => return Some(format!("{what}: {e}")),
    };
    let detail = problem["detail"].as_str().unwrap_or("");
    (!names.iter().any(|name| detail.contains(name)))
        .then(|| format!("{what}: the detail names none of {names:?}: {problem}"))
}

/// Asserts that no refusal was wrong, listing every one that was.
#[track_caller]
pub fn assert_no_faults(faults: &[String]) {
    assert!(
        faults.is_empty(),
        "{} refusals are wrong:\n- {}",
        faults.len(),
        faults.join("\n- ")
    );
}

/// The ETag header's value without its quotes.
pub fn etag(reply: &Reply) -> String {
    reply
        .headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no ETag header: {:?}", reply.headers))
        .trim_matches('"')
        .to_string()
}

/// The LLM step views of one run of a session.
pub async fn run_step_views(api: &Api, session: &str, run_id: &Value) -> Vec<Value> {
    let views: Vec<Value> = api
        .llm_step_views(session)
        .await
        .into_iter()
        .filter(|v| &v["run_id"] == run_id)
        .collect();
    assert!(
        !views.is_empty(),
        "run {run_id} of session {session} has no LLM step"
    );
    views
}

/// Asserts that every LLM step of a run was built from agent `id` at `version`, with
/// `prompt` as its first (system) message and `tools` offered (in any order).
#[track_caller]
pub fn assert_steps_ran(views: &[Value], id: &str, version: u64, prompt: &str, tools: &[&str]) {
    let mut expected_tools: Vec<&str> = tools.to_vec();
    expected_tools.sort_unstable();
    for view in views {
        let agent = &view["projection"]["agent"];
        assert_eq!(
            (&agent["id"], &agent["version"]),
            (&json!(id), &json!(version)),
            "the step's descriptor names another agent version: {view}"
        );
        let first = &view["request"]["messages"][0];
        assert_eq!(first["role"], "system", "{view}");
        assert_eq!(
            first["content"], prompt,
            "the step sent another system prompt: {view}"
        );
        let mut offered = offered_tool_names(view);
        offered.sort_unstable();
        assert_eq!(offered, expected_tools, "the tools offered: {view}");
    }
}

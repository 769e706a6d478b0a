//! Compaction and trimming with `--context-chars`: automatic compaction before a turn's first
//! request, the summary message in the history, every rebuilt LLM request within the budget,
//! manual `POST /compact` (200, then 204), and forks that stop before a summary.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

/// The budget of every model request in these tests.
const BUDGET: usize = 700;
/// How a compaction summary message starts.
const SUMMARY_PREFIX: &str = "[Summary of the earlier conversation]";

fn is_summary(message: &Value) -> bool {
    message["role"] == "system"
        && message["content"]
            .as_str()
            .is_some_and(|c| c.starts_with(SUMMARY_PREFIX))
}

/// The size of a request's messages as the budget counts it: content characters plus the
/// characters of the JSON of the tool calls (when there are any).
fn request_chars(messages: &[Value]) -> usize {
    messages
        .iter()
        .map(|m| {
            let content = m["content"].as_str().unwrap_or("").chars().count();
            let calls = match m.get("tool_calls").and_then(Value::as_array) {
                Some(calls) if !calls.is_empty() => serde_json::to_string(calls)
                    .expect("tool calls as JSON")
                    .chars()
                    .count(),
                _ => 0,
            };
            content + calls
        })
        .sum()
}

fn char_count(value: &Value) -> usize {
    value.as_str().unwrap_or("").chars().count()
}

#[tokio::test]
async fn a_budget_compacts_earlier_turns_and_keeps_every_request_within_it() {
    let server = TestServer::start(ServerOptions::new().arg("--context-chars").arg("700")).await;
    let id = server.create_session().await;
    let inputs: Vec<String> = (1..=4)
        .map(|n| format!("Turn {n}: what is in this workspace, and what is it for?"))
        .collect();
    for input in &inputs {
        let result = server.run_wait(&id, input).await;
        assert_eq!(result["status"], "completed", "{input}: {result}");
        assert_eq!(result["finish_reason"], "stop", "{input}: {result}");
        assert!(
            result["text"]
                .as_str()
                .unwrap_or("")
                .contains(input.as_str()),
            "{input}: {result}"
        );
    }

    let events = server.events(&id).await;
    assert_contiguous_from_one(&events);
    let kinds = types(&events);

    // Automatic compaction: before a turn's first request, earlier turns were summarised.
    let compacted: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agent.context.compacted")
        .collect();
    assert!(
        !compacted.is_empty(),
        "4 turns under a budget of {BUDGET} chars compacted nothing: {kinds:?}"
    );
    for event in &compacted {
        let data = &event["data"];
        assert_eq!(data["auto"], true, "{event}");
        assert_eq!(data["session_id"], id.as_str(), "{event}");
        assert!(data["turns"].as_u64().unwrap_or(0) >= 1, "{event}");
        assert!(data["chars"].as_u64().unwrap_or(0) > 0, "{event}");
    }
    // Each automatic compaction comes right before the user message of its turn.
    for (i, event) in events.iter().enumerate() {
        if event["type"] == "agent.context.compacted" {
            let next = events.get(i + 1).map(|e| &e["type"]);
            assert_eq!(
                next,
                Some(&json!("user.message")),
                "the compaction at seq {} is not followed by the turn's user message: {kinds:?}",
                event["seq"]
            );
        }
    }

    // The history: one summary message per compaction, each just before a user message; the
    // turns it summarises are all still there.
    let messages = server.messages(&id).await;
    assert_indexes_contiguous(&messages);
    assert_tool_calls_answered(&messages);
    let summaries: Vec<usize> = (0..messages.len())
        .filter(|&i| is_summary(&messages[i]))
        .collect();
    assert_eq!(
        summaries.len(),
        compacted.len(),
        "one summary message per compaction: {messages:#?}"
    );
    for (&at, event) in summaries.iter().zip(&compacted) {
        assert!(at > 0, "the summary replaced the system message");
        assert_eq!(
            messages.get(at + 1).map(|m| &m["role"]),
            Some(&json!("user")),
            "the summary at index {at} is not followed by a user message: {messages:#?}"
        );
        let chars = event["data"]["chars"].as_u64().unwrap_or(0) as usize;
        assert!(
            char_count(&messages[at]["content"]) >= SUMMARY_PREFIX.chars().count() + chars,
            "the summary message is shorter than the {chars} chars announced: {}",
            messages[at]
        );
    }
    let user_inputs: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(user_inputs, inputs, "the full history keeps every turn");

    // Trimming, where it happened, fit the budget.
    let trimmed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agent.context.trimmed")
        .collect();
    for event in &trimmed {
        let data = &event["data"];
        assert_eq!(data["budget"], BUDGET, "{event}");
        let before = data["chars"]["before"].as_u64().unwrap_or(0);
        let after = data["chars"]["after"].as_u64().unwrap_or(u64::MAX);
        assert!(
            before > BUDGET as u64,
            "trimmed although within budget: {event}"
        );
        assert!(
            after <= BUDGET as u64,
            "the trimmed request is over the budget: {event}"
        );
        assert!(
            data["dropped_turns"].as_u64().unwrap_or(0)
                + data["elided_tool_results"].as_u64().unwrap_or(0)
                > 0,
            "trimmed, but nothing was dropped or elided: {event}"
        );
    }

    // Every LLM step's rebuilt request is within the budget (and, when trimmed, exactly what
    // the trimmed event announced); after a summary, it sends the summary instead of the
    // turns it covers.
    let steps = server.steps(&id).await;
    let llm_steps: Vec<&Value> = steps.iter().filter(|s| s["type"] == "llm").collect();
    assert_eq!(llm_steps.len(), 12, "3 LLM steps per turn: {steps:#?}");
    let mut sizes = Vec::new();
    for step in llm_steps {
        let step_id = id_of(step);
        let view = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{step_id}"))
            .await;
        assert_eq!(view["projection"]["budget"], BUDGET, "{view}");
        let sent = view["request"]["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("LLM step {step_id} has no request.messages: {view}"));
        let size = request_chars(sent);
        sizes.push(size);
        let trim = trimmed
            .iter()
            .find(|e| e["data"]["step_id"] == step_id.as_str());
        if let Some(trim) = trim {
            assert_eq!(
                size as u64,
                trim["data"]["chars"]["after"].as_u64().unwrap_or(0),
                "LLM step {step_id}: the rebuilt request is not the trimmed one announced: \
                 {trim}\n{view}"
            );
        }
        assert!(
            size <= BUDGET,
            "LLM step {step_id}: the rebuilt request has {size} chars, over the budget of \
             {BUDGET}: {view}"
        );
        assert_eq!(sent[0]["role"], "system", "{view}");
        let upto = view["projection"]["upto"].as_u64().expect("upto") as usize;
        if let Some(&summary) = summaries.iter().rev().find(|&&s| s < upto) {
            let text = messages[summary]["content"]
                .as_str()
                .unwrap_or("")
                .trim_start_matches(SUMMARY_PREFIX)
                .trim();
            assert!(
                sent[0]["content"].as_str().unwrap_or("").contains(text),
                "LLM step {step_id} after the summary at {summary} does not send it: {view}"
            );
            for m in &sent[1..] {
                assert!(
                    m["index"].as_u64().unwrap_or(0) as usize > summary,
                    "LLM step {step_id} sends a message the summary at {summary} covers: {view}"
                );
            }
        }
    }
    eprintln!(
        "--context-chars {BUDGET}: {} compaction(s), {} trimmed request(s), request sizes {sizes:?}",
        compacted.len(),
        trimmed.len()
    );

    // Manual compaction: the turns since the last summary, appended at the end.
    let last_summary = *summaries.last().expect("a summary");
    let turns_since = messages[last_summary..]
        .iter()
        .filter(|m| m["role"] == "user")
        .count() as u64;
    let path = format!("/v1/sessions/{id}/compact");
    let reply = server.post_empty(&path).await;
    let manual = reply.expect_json(StatusCode::OK, "POST /compact after 4 turns");
    assert_eq!(manual["turns"], turns_since, "{manual}");
    assert!(manual["chars"].as_u64().unwrap_or(0) > 0, "{manual}");
    let after = server.messages(&id).await;
    assert_eq!(after.len(), messages.len() + 1, "one summary appended");
    assert_eq!(
        after[..messages.len()],
        messages[..],
        "compaction only appends"
    );
    let appended = after.last().expect("messages");
    assert!(is_summary(appended), "the appended message: {appended}");
    let manual_chars = manual["chars"].as_u64().unwrap_or(0) as usize;
    assert!(
        char_count(&appended["content"]) >= SUMMARY_PREFIX.chars().count() + manual_chars,
        "{appended}"
    );
    let events_after = server.events(&id).await;
    assert_contiguous_from_one(&events_after);
    assert_eq!(
        events_after[..events.len()],
        events[..],
        "compaction only appends"
    );
    let manual_events: Vec<&Value> = events_after[events.len()..]
        .iter()
        .filter(|e| e["type"] == "agent.context.compacted")
        .collect();
    assert_eq!(manual_events.len(), 1, "{:?}", types(&events_after));
    let data = &manual_events[0]["data"];
    assert_eq!(data["auto"], false, "{data}");
    assert_eq!(data["turns"], manual["turns"], "{data}");
    assert_eq!(data["chars"], manual["chars"], "{data}");
    assert_eq!(data["session_id"], id.as_str(), "{data}");

    // Nothing new to compact: 204, and nothing written.
    let again = server.post_empty(&path).await;
    assert_eq!(
        again.status,
        StatusCode::NO_CONTENT,
        "POST /compact right after a compaction: {}",
        again.text()
    );
    assert_eq!(server.messages(&id).await, after, "a 204 writes no message");
    assert_eq!(
        server.events(&id).await,
        events_after,
        "a 204 writes no event"
    );

    // The next turn starts from the manual summary and stays within the budget.
    let result = server.run_wait(&id, "Turn 5: and now?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let steps = server.steps(&id).await;
    let first_new = steps
        .iter()
        .find(|s| s["type"] == "llm" && s["run_id"] == result["run_id"])
        .expect("an LLM step of turn 5");
    let view = server
        .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(first_new)))
        .await;
    let sent = view["request"]["messages"].as_array().expect("messages");
    assert!(request_chars(sent) <= BUDGET, "{view}");
    let roles = roles(sent);
    assert_eq!(
        roles,
        ["system", "user"],
        "after a manual compaction only the system message (with the summary) and the new \
         input are sent: {view}"
    );
    let summary_text = appended["content"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches(SUMMARY_PREFIX)
        .trim();
    assert!(
        sent[0]["content"]
            .as_str()
            .unwrap_or("")
            .contains(summary_text),
        "{view}"
    );
}

#[tokio::test]
async fn compact_of_a_session_that_never_ran_is_204() {
    let server = TestServer::start(ServerOptions::new().arg("--context-chars").arg("700")).await;
    let id = server.create_session().await;
    let path = format!("/v1/sessions/{id}/compact");
    let reply = server.post_empty(&path).await;
    assert_eq!(
        reply.status,
        StatusCode::NO_CONTENT,
        "POST /compact of a new session: {}",
        reply.text()
    );
    assert!(
        reply.bytes.is_empty(),
        "a 204 has no body: {}",
        reply.text()
    );
    let reply = server.post_json(&path, &json!({})).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(types(&server.events(&id).await), ["session.created"]);
    assert_eq!(
        server.messages(&id).await.len(),
        1,
        "only the system message"
    );
    assert_eq!(server.session(&id).await["state"], "idle");
}

/// The messages of a fork of `turns` turns: the source's messages up to its next user message,
/// without the summaries right before that user message (the next turn wrote them).
fn fork_of(messages: &[Value], turns: usize) -> Vec<Value> {
    let next_user = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m["role"] == "user")
        .nth(turns)
        .map_or(messages.len(), |(i, _)| i);
    let mut end = next_user;
    while end > 0 && is_summary(&messages[end - 1]) {
        end -= 1;
    }
    messages[..end].to_vec()
}

#[tokio::test]
async fn a_fork_before_the_compaction_has_no_summary() {
    let server = TestServer::start(ServerOptions::new().arg("--context-chars").arg("700")).await;
    let id = server.create_session().await;
    // A long first input: the second turn's first request would be over the budget, so turn 1
    // is summarised before turn 2.
    let first = format!(
        "Turn 1: {} what is in this workspace, and what is it for?",
        "please look carefully, ".repeat(4)
    );
    let inputs = [
        first.as_str(),
        "Turn 2: and the docs?",
        "Turn 3: and the sources?",
        "Turn 4: anything else?",
    ];
    for input in inputs {
        let result = server.run_wait(&id, input).await;
        assert_eq!(result["status"], "completed", "{result}");
    }
    let messages = server.messages(&id).await;
    let summaries: Vec<usize> = (0..messages.len())
        .filter(|&i| is_summary(&messages[i]))
        .collect();
    let first_summary = *summaries
        .first()
        .unwrap_or_else(|| panic!("4 turns under the budget wrote no summary: {messages:#?}"));
    let turns_before = |at: usize| {
        messages[..at]
            .iter()
            .filter(|m| m["role"] == "user")
            .count()
    };
    assert_eq!(
        turns_before(first_summary),
        1,
        "the setup: turn 1 is summarised before turn 2: {messages:#?}"
    );

    // turns=1 is the fork taken before the first compaction; every other summary's turn
    // count is a fork taken right before that compaction.
    let mut cuts: Vec<usize> = summaries.iter().map(|&s| turns_before(s)).collect();
    cuts.dedup();
    for turns in cuts {
        let what = format!("fork with turns={turns} (summaries at {summaries:?})");
        let fork = server
            .post_json(&format!("/v1/sessions/{id}/fork"), &json!({"turns": turns}))
            .await
            .expect_json(StatusCode::CREATED, &what);
        let fork_id = id_of(&fork);
        let forked = server.messages(&fork_id).await;
        let expected = fork_of(&messages, turns);
        assert_eq!(
            forked.iter().filter(|m| is_summary(m)).count(),
            expected.iter().filter(|m| is_summary(m)).count(),
            "{what}: the fork carries the summary of the compaction after its last turn: \
             {forked:#?}"
        );
        let shapes: Vec<Value> = forked.iter().map(message_shape).collect();
        let expected: Vec<Value> = expected.iter().map(message_shape).collect();
        assert_eq!(shapes, expected, "{what}: the fork's messages");
        assert_eq!(fork["message_count"], expected.len(), "{what}: {fork}");
        assert_eq!(
            forked.iter().filter(|m| m["role"] == "user").count(),
            turns,
            "{what}"
        );

        // The fork runs on its own, within the budget.
        let result = server.run_wait(&fork_id, "a turn on the fork").await;
        assert_eq!(result["status"], "completed", "{what}: {result}");
        let after = server.messages(&fork_id).await;
        assert_indexes_contiguous(&after);
        assert_tool_calls_answered(&after);
    }
}

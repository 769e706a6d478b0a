//! What must hold for every session, read back through the API: a contiguous event log, one
//! start and one terminal event per run, runs that do not overlap, and messages that agree with
//! the events that announced them. Violations are collected (not panicked on), so a failing
//! test reports all of them.

use std::collections::HashSet;

use serde_json::Value;

use crate::support::{is_terminal, seq_break, tool_call_problems, Api};

/// Violations found so far, with a cap on how many are kept verbatim.
#[derive(Default)]
pub struct Problems {
    pub list: Vec<String>,
    pub total: usize,
}

impl Problems {
    pub fn push(&mut self, problem: String) {
        self.total += 1;
        if self.list.len() < 40 {
            self.list.push(problem);
        }
    }

    pub fn extend(&mut self, other: Problems) {
        self.total += other.total - other.list.len();
        for p in other.list {
            self.push(p);
        }
    }

    /// Panics with every kept violation when there is any.
    pub fn assert_none(&self, what: &str) {
        assert!(
            self.total == 0,
            "{what}: {} violation(s); the first {}:\n- {}",
            self.total,
            self.list.len(),
            self.list.join("\n- ")
        );
    }
}

/// What one session looked like when it was checked.
pub struct Facts {
    pub id: String,
    pub state: String,
    pub error: Option<String>,
    pub events: Vec<Value>,
    pub runs: Vec<Value>,
    pub messages: Vec<Value>,
}

impl Facts {
    /// Failed by a dead or stopped process: resumable.
    pub fn interrupted(&self) -> bool {
        self.state == "failed" && self.error.as_deref() == Some("interrupted")
    }
}

/// Checks that event seqs run 1, 2, 3, … ; returns the number of gaps and duplicates.
pub fn seq_breaks(events: &[Value], id: &str, problems: &mut Problems) -> usize {
    match seq_break(events, 1) {
        Some(why) => {
            problems.push(format!("session {id}: {why}"));
            1
        }
        None => 0,
    }
}

/// Reads one session's events, runs and messages and checks them. `all_answered`: every tool
/// call of every turn must have its result (false for a session still interrupted, whose
/// last turn may wait for `resume`).
pub async fn check_session(
    api: &Api,
    id: &str,
    all_answered: bool,
    problems: &mut Problems,
) -> Facts {
    let session = api.session(id).await;
    let events = api.events(id).await;
    let runs = api.runs(id).await;
    let messages = api.messages(id).await;
    let facts = Facts {
        id: id.to_string(),
        state: session["state"].as_str().unwrap_or("?").to_string(),
        error: session["error"].as_str().map(str::to_string),
        events,
        runs,
        messages,
    };
    check_facts(&session, &facts, all_answered, problems);
    facts
}

pub fn check_facts(session: &Value, facts: &Facts, all_answered: bool, problems: &mut Problems) {
    let id = facts.id.as_str();
    let events = &facts.events;

    // The log: 1..=last_seq, starting with session.created.
    seq_breaks(events, id, problems);
    if session["last_seq"].as_i64() != Some(events.len() as i64) {
        problems.push(format!(
            "session {id}: last_seq {} but {} events in the log",
            session["last_seq"],
            events.len()
        ));
    }
    if events.first().map(|e| e["type"].clone()) != Some(Value::from("session.created")) {
        problems.push(format!(
            "session {id}: the log does not open with session.created"
        ));
    }
    if matches!(facts.state.as_str(), "running" | "waiting_tool") {
        problems.push(format!(
            "session {id}: still {} with no client",
            facts.state
        ));
    }

    // Runs: one agent.started, then exactly one terminal event that matches the run's status.
    let run_ids: HashSet<&str> = facts.runs.iter().filter_map(|r| r["id"].as_str()).collect();
    for run in &facts.runs {
        let rid = run["id"].as_str().unwrap_or("?");
        let of_run = |e: &&Value| e["data"]["run_id"].as_str() == Some(rid);
        let started: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "agent.started")
            .filter(of_run)
            .collect();
        let terminals: Vec<&Value> = events
            .iter()
            .filter(|e| is_terminal(e))
            .filter(of_run)
            .collect();
        if started.len() != 1 {
            problems.push(format!(
                "session {id}: run {rid} has {} agent.started events",
                started.len()
            ));
        }
        if terminals.len() != 1 {
            problems.push(format!(
                "session {id}: run {rid} ({}, error {}) has {} terminal events: {:?}",
                run["status"],
                run["error"],
                terminals.len(),
                terminals
                    .iter()
                    .map(|e| e["type"].clone())
                    .collect::<Vec<_>>()
            ));
        }
        if let (Some(start), Some(end)) = (started.first(), terminals.first()) {
            if end["seq"].as_i64() <= start["seq"].as_i64() {
                problems.push(format!(
                    "session {id}: run {rid} ends (seq {}) before it starts (seq {})",
                    end["seq"], start["seq"]
                ));
            }
            if run["start_seq"] != start["seq"] {
                problems.push(format!(
                    "session {id}: run {rid} start_seq {} but its agent.started has seq {}",
                    run["start_seq"], start["seq"]
                ));
            }
        }
        let expected_terminal = match run["status"].as_str() {
            Some("completed") => "agent.finished",
            Some("failed") => "agent.failed",
            Some("cancelled") => "agent.cancelled",
            other => {
                problems.push(format!(
                    "session {id}: run {rid} is still {other:?} with no client"
                ));
                ""
            }
        };
        if let Some(end) = terminals.first() {
            if !expected_terminal.is_empty() && end["type"] != expected_terminal {
                problems.push(format!(
                    "session {id}: run {rid} is {} but ends with {}",
                    run["status"], end["type"]
                ));
            }
            if run["error"] == "interrupted"
                && !(end["type"] == "agent.failed" && end["data"]["error"] == "interrupted")
            {
                problems.push(format!(
                    "session {id}: run {rid} was interrupted but ends with {end}"
                ));
            }
        }
    }

    // Every run event names a known run, and runs never overlap.
    let mut open: Option<String> = None;
    for event in events {
        let kind = event["type"].as_str().unwrap_or("");
        if kind != "agent.started" && !is_terminal(event) {
            continue;
        }
        let rid = event["data"]["run_id"].as_str().unwrap_or("?").to_string();
        if !run_ids.contains(rid.as_str()) {
            problems.push(format!(
                "session {id}: {kind} (seq {}) names run {rid}, which GET /runs does not list",
                event["seq"]
            ));
        }
        if kind == "agent.started" {
            if let Some(other) = &open {
                problems.push(format!(
                    "session {id}: run {rid} starts (seq {}) while run {other} has not ended",
                    event["seq"]
                ));
            }
            open = Some(rid);
        } else {
            if open.as_deref() != Some(rid.as_str()) {
                problems.push(format!(
                    "session {id}: {kind} of run {rid} (seq {}) while the open run is {open:?}",
                    event["seq"]
                ));
            }
            open = None;
        }
    }

    // The state agrees with the last run.
    if facts.interrupted() {
        let last = session["last_run_id"].as_str();
        let last_run = facts.runs.iter().find(|r| r["id"].as_str() == last);
        if last_run.map(|r| r["error"].clone()) != Some(Value::from("interrupted")) {
            problems.push(format!(
                "session {id}: failed/interrupted, but its last run is {last_run:?}"
            ));
        }
    }

    check_messages(session, facts, all_answered, problems);
}

fn check_messages(session: &Value, facts: &Facts, all_answered: bool, problems: &mut Problems) {
    let id = facts.id.as_str();
    let messages = &facts.messages;
    for (i, m) in messages.iter().enumerate() {
        if m["index"].as_i64() != Some(i as i64) {
            problems.push(format!(
                "session {id}: message #{i} has index {}",
                m["index"]
            ));
            return;
        }
    }
    if session["message_count"].as_i64() != Some(messages.len() as i64) {
        problems.push(format!(
            "session {id}: message_count {} but {} messages",
            session["message_count"],
            messages.len()
        ));
    }
    // Each user.message / llm.completed event carries the stored message at its index.
    for event in &facts.events {
        if event["type"] != "user.message" && event["type"] != "llm.completed" {
            continue;
        }
        let message = &event["data"]["message"];
        let stored = message["index"]
            .as_u64()
            .and_then(|i| messages.get(i as usize));
        if stored != Some(message) {
            problems.push(format!(
                "session {id}: {} (seq {}) carries {message}, the stored message is {stored:?}",
                event["type"], event["seq"]
            ));
        }
    }
    // Tool results, turn by turn: every call gets exactly one result, and every result
    // answers an earlier call of its turn; the last turn of an interrupted session may wait.
    for problem in tool_call_problems(messages, /*open_last_turn*/ !all_answered) {
        problems.push(format!("session {id}: {problem}"));
    }
}

/// The checks themselves catch what they are meant to catch (a checker that passes everything
/// would make the hardening tests vacuous).
#[cfg(test)]
mod self_test {
    use serde_json::json;

    use super::*;

    fn ev(seq: i64, kind: &str, data: Value) -> Value {
        json!({"seq": seq, "type": kind, "data": data})
    }

    fn sound() -> (Value, Facts) {
        let user = json!({"index": 1, "role": "user", "content": "hi"});
        let call = json!({"index": 2, "role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "name": "list_files", "arguments": {}}]});
        let result = json!({"index": 3, "role": "tool", "content": "x", "tool_call_id": "c1"});
        let answer = json!({"index": 4, "role": "assistant", "content": "done"});
        let facts = Facts {
            id: "s".into(),
            state: "completed".into(),
            error: None,
            events: vec![
                ev(1, "session.created", json!({})),
                ev(2, "agent.started", json!({"run_id": "r1"})),
                ev(3, "user.message", json!({"message": user})),
                ev(4, "llm.completed", json!({"message": call})),
                ev(5, "llm.completed", json!({"message": answer})),
                ev(6, "agent.finished", json!({"run_id": "r1"})),
            ],
            runs: vec![json!({"id": "r1", "status": "completed", "start_seq": 2})],
            messages: vec![
                json!({"index": 0, "role": "system", "content": "sys"}),
                user,
                call,
                result,
                answer,
            ],
        };
        let session = json!({"last_seq": 6, "message_count": 5, "last_run_id": "r1"});
        (session, facts)
    }

    fn count(session: &Value, facts: &Facts) -> usize {
        let mut problems = Problems::default();
        check_facts(session, facts, true, &mut problems);
        problems.total
    }

    #[test]
    fn the_checks_accept_a_sound_session_and_reject_broken_ones() {
        let (session, facts) = sound();
        assert_eq!(count(&session, &facts), 0);

        let (session, mut facts) = sound();
        facts.events.remove(3);
        assert!(count(&session, &facts) > 0, "a gap in the log");

        let (session, mut facts) = sound();
        facts
            .events
            .push(ev(7, "agent.failed", json!({"run_id": "r1"})));
        assert!(count(&session, &facts) > 0, "two terminal events");

        let (session, mut facts) = sound();
        facts.messages.remove(3);
        facts.messages[3]["index"] = json!(3);
        facts.events[4]["data"]["message"]["index"] = json!(3);
        assert!(count(&session, &facts) > 0, "an unanswered tool call");

        let (session, mut facts) = sound();
        facts.messages[4]["content"] = json!("changed");
        assert!(
            count(&session, &facts) > 0,
            "an event that disagrees with the stored message"
        );

        let (session, mut facts) = sound();
        facts.runs[0]["error"] = json!("interrupted");
        facts.runs[0]["status"] = json!("failed");
        assert!(
            count(&session, &facts) > 0,
            "an interrupted run that ends with agent.finished"
        );
    }
}

//! What a user checks in a session's event log and history: contiguous seqs, one terminal
//! event per run, runs that do not overlap, every tool call answered once.

use std::collections::HashMap;

use serde_json::Value;

pub fn is_terminal(event: &Value) -> bool {
    matches!(
        event["type"].as_str(),
        Some("agent.finished" | "agent.failed" | "agent.cancelled")
    )
}

/// One line per event: seq, type and the interesting part of its data.
pub fn describe(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            let data = &e["data"];
            let brief = match e["type"].as_str().unwrap_or("") {
                "agent.assistant-stream" => format!("{:?}", data["text"].as_str().unwrap_or("")),
                "agent.started" => format!("run {} kind {}", data["run_id"], data["kind"]),
                "agent.failed" => format!("run {} error {}", data["run_id"], data["error"]),
                "agent.finished" | "agent.cancelled" => format!("run {}", data["run_id"]),
                "session.state" => format!("{} -> {}", data["from"], data["to"]),
                "tool.started" => format!("call {}", data["call"]["id"]),
                "tool.finished" => format!("call {}", data["call_id"]),
                _ => String::new(),
            };
            format!(
                "  {:>4} {:<24} {brief}",
                e["seq"],
                e["type"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Seqs are 1, 2, 3, … with no gap and no duplicate.
pub fn assert_contiguous(what: &str, events: &[Value]) {
    for (i, event) in events.iter().enumerate() {
        let expected = i as i64 + 1;
        if event["seq"].as_i64() != Some(expected) {
            panic!(
                "{what}: event #{i} has seq {} where {expected} was due (gap, duplicate or disorder); the events:\n{}",
                event["seq"],
                describe(events)
            );
        }
    }
}

/// A run as the log shows it.
#[derive(Debug, Clone)]
pub struct LoggedRun {
    pub run_id: String,
    pub kind: String,
    pub started_seq: i64,
    /// The terminal event (its type and data) and its seq.
    pub terminal: Value,
    pub terminal_seq: i64,
}

impl LoggedRun {
    pub fn ended_with(&self) -> &str {
        self.terminal["type"].as_str().unwrap_or("")
    }
}

/// Every `agent.started` is followed by exactly one terminal event of the same run before the
/// next run starts; no terminal event without a run; every event naming a run is inside it.
pub fn assert_runs(what: &str, events: &[Value]) -> Vec<LoggedRun> {
    let fail = |why: String| -> ! { panic!("{what}: {why}; the events:\n{}", describe(events)) };
    let mut runs: Vec<LoggedRun> = Vec::new();
    let mut open: Option<(String, String, i64)> = None;
    let mut terminals: HashMap<String, usize> = HashMap::new();
    for event in events {
        let seq = event["seq"].as_i64().unwrap_or(-1);
        let kind = event["type"].as_str().unwrap_or("");
        let run_id = event["data"]["run_id"].as_str().map(str::to_string);
        if kind == "agent.started" {
            let run_id =
                run_id.unwrap_or_else(|| fail(format!("seq {seq}: agent.started without run_id")));
            if let Some((previous, _, _)) = &open {
                fail(format!(
                    "seq {seq}: run {run_id} starts while run {previous} has no terminal event"
                ));
            }
            if runs.iter().any(|r| r.run_id == run_id) {
                fail(format!("seq {seq}: run {run_id} starts twice"));
            }
            let run_kind = event["data"]["kind"].as_str().unwrap_or("").to_string();
            open = Some((run_id, run_kind, seq));
        } else if is_terminal(event) {
            let run_id =
                run_id.unwrap_or_else(|| fail(format!("seq {seq}: {kind} without run_id")));
            *terminals.entry(run_id.clone()).or_default() += 1;
            match open.take() {
                Some((open_id, run_kind, started_seq)) if open_id == run_id => {
                    runs.push(LoggedRun {
                        run_id,
                        kind: run_kind,
                        started_seq,
                        terminal: event.clone(),
                        terminal_seq: seq,
                    });
                }
                Some((open_id, _, _)) => fail(format!(
                    "seq {seq}: {kind} of run {run_id} while run {open_id} is the active one"
                )),
                None => fail(format!(
                    "seq {seq}: {kind} of run {run_id} outside any run (a second terminal event, or a late write)"
                )),
            }
        } else if let Some(run_id) = run_id {
            // Events that name their run must be inside it.
            if open.as_ref().map(|(id, _, _)| id) != Some(&run_id) {
                fail(format!(
                    "seq {seq}: {kind} of run {run_id} outside that run"
                ));
            }
        }
    }
    if let Some((run_id, _, seq)) = open {
        fail(format!(
            "run {run_id} (started at seq {seq}) has no terminal event"
        ));
    }
    runs
}

/// Every tool call of an assistant message has exactly one tool message, and every tool
/// message answers a call.
pub fn assert_tool_calls_answered(what: &str, messages: &[Value]) {
    let mut calls: HashMap<String, usize> = HashMap::new();
    for m in messages {
        if m["role"] == "assistant" {
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                let id = call["id"].as_str().unwrap_or_default().to_string();
                if calls.insert(id.clone(), 0).is_some() {
                    panic!("{what}: tool call id {id} appears twice; messages: {messages:#?}");
                }
            }
        }
    }
    for m in messages {
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            match calls.get_mut(id) {
                Some(n) => *n += 1,
                None => panic!(
                    "{what}: tool message {} answers no call ({id:?}); messages: {messages:#?}",
                    m["index"]
                ),
            }
        }
    }
    for (id, n) in &calls {
        if *n != 1 {
            panic!("{what}: tool call {id} has {n} tool messages (want exactly 1); messages: {messages:#?}");
        }
    }
    let indexes: Vec<i64> = messages
        .iter()
        .filter_map(|m| m["index"].as_i64())
        .collect();
    let expected: Vec<i64> = (0..messages.len() as i64).collect();
    assert_eq!(indexes, expected, "{what}: message indexes are not 0..n");
}

/// The `p`-th percentile (0–100) of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// An input of `n` words: the mock quotes it, one streamed piece per word, so it sets how long
/// the final answer streams.
pub fn words(n: usize) -> String {
    let mut out = String::from("describe");
    for i in 1..n {
        out.push_str(&format!(" w{i}"));
    }
    out
}

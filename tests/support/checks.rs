//! What the suites check in an event log and a message history, written once: terminal
//! events, seq contiguity, how runs nest, tool-call pairing, message indexes; plus the small
//! figures helpers (percentiles, medians) the measuring tests print.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::sse::SseFrame;

/// The event types that end a run.
pub const TERMINAL: [&str; 3] = ["agent.finished", "agent.failed", "agent.cancelled"];

/// Whether an event ends a run.
pub fn is_terminal(event: &Value) -> bool {
    TERMINAL.contains(&event["type"].as_str().unwrap_or(""))
}

/// Terminal events (agent.finished / failed / cancelled) of one run.
pub fn terminal_events_of<'a>(events: &'a [Value], run_id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| is_terminal(e) && e["data"]["run_id"] == run_id)
        .collect()
}

/// The types of one run's terminal events, in order: exactly one for a run that ended.
pub fn terminal_types(events: &[Value], run_id: &str) -> Vec<String> {
    terminal_events_of(events, run_id)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Asserts that a run ended as interrupted (a crash or a stop cut it short): exactly one
/// terminal event, an `agent.failed` whose error is `interrupted`.
#[track_caller]
pub fn assert_interrupted(events: &[Value], run_id: &str) {
    let terminals = terminal_events_of(events, run_id);
    assert_eq!(
        terminal_types(events, run_id),
        ["agent.failed"],
        "{:?}",
        types(events)
    );
    assert_eq!(terminals[0]["data"]["error"], "interrupted");
}

/// The events of one run: its `agent.started` up to and including its terminal event (or the
/// end of the log). Panics if the run never started.
pub fn run_events<'a>(events: &'a [Value], run_id: &str) -> &'a [Value] {
    let start = events
        .iter()
        .position(|e| e["type"] == "agent.started" && e["data"]["run_id"] == run_id)
        .unwrap_or_else(|| panic!("no agent.started for run {run_id}"));
    let end = events[start..]
        .iter()
        .position(|e| is_terminal(e) && e["data"]["run_id"] == run_id)
        .map(|i| start + i + 1)
        .unwrap_or(events.len());
    &events[start..end]
}

pub fn id_of(value: &Value) -> String {
    value["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {value}"))
        .to_string()
}

/// The names of the tools an LLM step's rebuilt request offered, in the order they were sent.
pub fn offered_tool_names(step_view: &Value) -> Vec<String> {
    step_view["request"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no request.tools: {step_view}"))
        .iter()
        .map(|t| {
            t["name"]
                .as_str()
                .unwrap_or_else(|| panic!("a tool without a name: {t}"))
                .to_string()
        })
        .collect()
}

pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The roles of some messages, in order.
pub fn roles(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["role"].as_str().unwrap_or("?").to_string())
        .collect()
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

// ---- seqs ------------------------------------------------------------------------------------

/// Where the events' `seq` stop running `first`, `first + 1`, … (a gap, a duplicate or
/// disorder), said in a sentence; `None` when they do not.
pub fn seq_break(events: &[Value], first: i64) -> Option<String> {
    events.iter().enumerate().find_map(|(i, event)| {
        let expected = first + i as i64;
        (event["seq"].as_i64() != Some(expected)).then(|| {
            format!(
                "event #{i} has seq {} where {expected} belongs (gap, duplicate or disorder)",
                event["seq"]
            )
        })
    })
}

/// Asserts that the events' `seq` run 1, 2, 3, … with no gap and no duplicate.
pub fn assert_contiguous_from_one(events: &[Value]) {
    assert_contiguous_from(events, 1);
}

pub fn assert_contiguous_from(events: &[Value], first: i64) {
    if let Some(why) = seq_break(events, first) {
        panic!(
            "the sequence from {first} breaks: {why}; the events:\n{}",
            describe(events)
        );
    }
}

/// [`assert_contiguous_from_one`], saying what the events are.
pub fn assert_contiguous(what: &str, events: &[Value]) {
    if let Some(why) = seq_break(events, 1) {
        panic!("{what}: {why}; the events:\n{}", describe(events));
    }
}

/// The index of the first event where two logs differ (`None` when they are equal).
pub fn first_difference(a: &[Value], b: &[Value]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

/// Asserts the frames are the events, one to one: `id:` = seq, `event:` = type, data = event.
pub fn assert_frames_are(frames: &[SseFrame], events: &[Value], what: &str) {
    let frame_seqs: Vec<&str> = frames.iter().map(|f| f.id.as_str()).collect();
    let event_seqs: Vec<String> = events.iter().map(|e| e["seq"].to_string()).collect();
    assert_eq!(
        frame_seqs, event_seqs,
        "{what}: the frames' ids are not the expected seqs"
    );
    for (frame, event) in frames.iter().zip(events) {
        assert_eq!(
            frame.event,
            event["type"].as_str().unwrap_or("?"),
            "{what}: event: line of seq {}",
            frame.id
        );
        assert_eq!(
            &frame.data, event,
            "{what}: data of seq {} differs from the stored event",
            frame.id
        );
    }
}

/// The event JSON carried by a list of frames.
pub fn frame_events(frames: &[SseFrame]) -> Vec<Value> {
    frames.iter().map(|f| f.data.clone()).collect()
}

// ---- runs ------------------------------------------------------------------------------------

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

// ---- messages --------------------------------------------------------------------------------

/// What is wrong with how a history's tool calls are answered, turn by turn (a turn starts at
/// a user message): a call id used twice in the history, a call without exactly one tool
/// message in its turn, a tool message that answers no earlier call of its turn. With
/// `open_last_turn`, the calls of the last turn may still lack their results (a run that was
/// interrupted and waits for `resume`).
pub fn tool_call_problems(messages: &[Value], open_last_turn: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen_ids: HashSet<String> = HashSet::new();
    let mut turns: Vec<&[Value]> = Vec::new();
    let mut start = 0;
    for (i, m) in messages.iter().enumerate() {
        if m["role"] == "user" && i > start {
            turns.push(&messages[start..i]);
            start = i;
        }
    }
    turns.push(&messages[start..]);
    let last = turns.len() - 1;
    for (n, turn) in turns.into_iter().enumerate() {
        let at = turn.first().map_or(Value::Null, |m| m["index"].clone());
        // Calls of this turn so far, with how many tool messages answered each.
        let mut calls: Vec<(String, usize)> = Vec::new();
        for m in turn {
            match m["role"].as_str() {
                Some("assistant") => {
                    for call in m["tool_calls"].as_array().into_iter().flatten() {
                        let id = call["id"].as_str().unwrap_or_default().to_string();
                        if !seen_ids.insert(id.clone()) {
                            problems.push(format!(
                                "tool call id {id} is used twice (again in the turn at message {at})"
                            ));
                        }
                        calls.push((id, 0));
                    }
                }
                Some("tool") => {
                    let id = m["tool_call_id"].as_str().unwrap_or("");
                    match calls.iter_mut().find(|(call, _)| call == id) {
                        Some((_, answers)) => *answers += 1,
                        None => problems.push(format!(
                            "tool message {} answers {id:?}, no earlier call of its turn",
                            m["index"]
                        )),
                    }
                }
                _ => {}
            }
        }
        for (id, answers) in calls {
            let still_open = open_last_turn && n == last && answers == 0;
            if answers != 1 && !still_open {
                problems.push(format!(
                    "tool call {id} of the turn at message {at} has {answers} tool messages"
                ));
            }
        }
    }
    problems
}

/// Asserts that every assistant tool call has exactly one tool message answering it in its
/// turn, every tool message answers an earlier call of its turn, and no call id repeats.
pub fn assert_tool_calls_answered(messages: &[Value]) {
    let problems = tool_call_problems(messages, /*open_last_turn*/ false);
    assert!(
        problems.is_empty(),
        "tool calls are not answered one to one:\n- {}\nmessages: {messages:#?}",
        problems.join("\n- ")
    );
}

/// Asserts message indexes are 0, 1, 2, … .
pub fn assert_indexes_contiguous(messages: &[Value]) {
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["index"].as_i64(), Some(i as i64), "message #{i}: {m}");
    }
}

/// What a message is, without its timestamp: (role, content, tool call names, tool_call_id).
pub fn message_shape(m: &Value) -> Value {
    json!({
        "index": m["index"],
        "role": m["role"],
        "content": m["content"],
        "tool_calls": m.get("tool_calls").cloned().unwrap_or(json!([])),
        "tool_call_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
    })
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

// ---- figures ---------------------------------------------------------------------------------

/// The nearest-rank `p`-th percentile (0–100) of sorted, non-empty values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "a percentile of no values");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of some durations.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

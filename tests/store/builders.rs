//! The records and ops the cases are made of, and how they commit and compare.

use std::sync::Arc;

use serde_json::{json, Value};
use tah::model::{
    new_id, now, Event, EventKind, Message, Role, RunKind, RunRecord, SessionRecord, SessionState,
    StepKind, StepRecord, StepStatus, ToolCall,
};
use tah::store::{Store, WriteOp};
use uuid::Uuid;

pub fn session(state: SessionState) -> SessionRecord {
    SessionRecord {
        state,
        ..SessionRecord::new(new_id(), None, now())
    }
}

pub fn message(index: i64, role: Role, content: &str) -> Message {
    Message {
        index,
        ..Message::new(role, content)
    }
}

pub fn event(session_id: Uuid, seq: i64) -> Event {
    Event::new(
        session_id,
        seq,
        EventKind::AssistantStream {
            step_id: Uuid::nil(),
            text: format!("piece {seq}"),
        },
        now(),
    )
}

/// An event whose data carries arbitrary JSON (as a tool call's arguments).
pub fn call_event(session_id: Uuid, seq: i64, arguments: Value) -> Event {
    Event::new(
        session_id,
        seq,
        EventKind::ToolStarted {
            step_id: Uuid::nil(),
            call: ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments,
            },
        },
        now(),
    )
}

/// The arbitrary JSON `call_event` carried.
pub fn call_arguments(event: &Event) -> Value {
    match &event.kind {
        EventKind::ToolStarted { call, .. } => call.arguments.clone(),
        other => panic!("not a tool.started event: {other:?}"),
    }
}

pub fn events_op(session_id: Uuid, seqs: std::ops::RangeInclusive<i64>) -> Vec<WriteOp> {
    seqs.map(|seq| WriteOp::insert_event(event(session_id, seq)))
        .collect()
}

pub fn run(session_id: Uuid) -> RunRecord {
    let input = Some("what is in README.md?".to_string());
    RunRecord::started(session_id, RunKind::Run, input, /*start_seq*/ 3)
}

pub fn step(session_id: Uuid, run_id: Uuid, kind: StepKind) -> StepRecord {
    StepRecord {
        id: new_id(),
        session_id,
        run_id,
        kind,
        status: StepStatus::Pending,
        request: json!({ "upto": 4, "trim": { "budget": 120000 }, "tools": ["read_file"] }),
        response: None,
        usage: None,
        error: None,
        created_at: now(),
        finished_at: None,
    }
}

pub async fn commit(store: &Arc<dyn Store>, ops: Vec<WriteOp>) {
    store.commit(&[ops.as_slice()]).await.expect("commit");
}

pub async fn new_session(store: &Arc<dyn Store>, state: SessionState) -> SessionRecord {
    let s = session(state);
    commit(store, vec![WriteOp::InsertSession(s.clone())]).await;
    s
}

/// Records compare through their JSON (they do not derive `PartialEq`).
pub fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).expect("json") == serde_json::to_value(b).expect("json")
}

#[track_caller]
pub fn assert_same<T: serde::Serialize + std::fmt::Debug>(got: &T, want: &T) {
    assert!(same(got, want), "got {got:#?}\nwant {want:#?}");
}

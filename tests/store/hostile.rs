//! Data a client or a model may send: JSON of every shape (huge integers, escapes, an empty key)
//! round-trips exactly, and U+0000, which PostgreSQL cannot store, does not fail a commit.

use std::sync::Arc;

use serde_json::{json, Value};
use tah::model::{Event, Message, SessionState, ToolCall};
use tah::store::{Store, WriteOp};

use crate::store::builders::*;

conformance!(
    event_data_json_round_trips,
    nul_characters_do_not_fail_a_commit,
);

async fn event_data_json_round_trips(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    let data = json!({
        "zeta": 1, "alpha": { "b": [1, 2.5, -3, 1e-7, 12345678901234_i64], "a": null },
        "text": "héllo 世界 \"quoted\" \\ back\\u0000slash \n\t",
        "max": u64::MAX, "min": i64::MIN, "float": 0.1, "whole_float": 3.0, "bool": false,
        "empty": {}, "list": [], "emoji": "🦀🚀", "": "empty key"
    });
    let e = call_event(s.id, 1, data.clone());
    let scalar = call_event(s.id, 2, json!("just a string"));
    commit(
        &store,
        vec![
            WriteOp::insert_event(e.clone()),
            WriteOp::insert_event(scalar.clone()),
        ],
    )
    .await;
    let got = store.events(s.id, 0, 10).await.expect("read");
    assert_eq!(got, [e, scalar]);
    assert_eq!(call_arguments(&got[0]), data);
}

async fn nul_characters_do_not_fail_a_commit(store: Arc<dyn Store>) {
    // PostgreSQL cannot store U+0000 in text or jsonb; it stores U+FFFD instead, SQLite keeps
    // it. Either way the commit succeeds and everything else round-trips.
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    let mut s = session(SessionState::Idle);
    s.title = Some("nul\0title".into());
    s.metadata = json!({ "k\0": "v\0" });
    let m = Message {
        index: 0,
        tool_calls: vec![ToolCall {
            id: "c\0".into(),
            name: "read_file".into(),
            arguments: json!({ "path": "a\0b" }),
        }],
        ..Message::assistant("bin\0ary", Vec::new())
    };
    let e = call_event(s.id, 1, json!({ "output": "x\0y", "nested": ["\0"] }));
    commit(
        &store,
        vec![
            WriteOp::InsertSession(s.clone()),
            WriteOp::InsertMessage {
                session_id: s.id,
                message: m.clone(),
            },
            WriteOp::insert_event(e.clone()),
            WriteOp::insert_event(Event::new(s.id, 2, e.kind.clone(), e.created_at)),
        ],
    )
    .await;
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_eq!(got.title.as_deref().map(clean), Some(clean("nul\0title")));
    assert_eq!(clean_json(&got.metadata), clean_json(&s.metadata));
    let msgs = store.messages(s.id, -1, 10).await.expect("read");
    assert_eq!(clean(&msgs[0].content), clean("bin\0ary"));
    assert_eq!(clean(&msgs[0].tool_calls[0].id), clean("c\0"));
    let evs = store.events(s.id, 0, 10).await.expect("read");
    assert_eq!(evs.len(), 2);
    assert_eq!(
        clean_json(&call_arguments(&evs[0])),
        clean_json(&call_arguments(&e))
    );
    assert_eq!(
        clean_json(&msgs[0].tool_calls[0].arguments),
        json!({ "path": "a\u{FFFD}b" })
    );
}

/// `v` with U+0000 replaced by U+FFFD in every string and key.
fn clean_json(v: &Value) -> Value {
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    match v {
        Value::String(s) => Value::String(clean(s)),
        Value::Array(items) => Value::Array(items.iter().map(clean_json).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (clean(k), clean_json(v))).collect())
        }
        other => other.clone(),
    }
}

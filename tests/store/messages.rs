//! Messages: they round-trip and page by index, a fork copies a prefix inside the database, and
//! the user message that starts turn n is found.

use std::sync::Arc;

use serde_json::json;
use tah::model::{new_id, Message, Role, SessionState, ToolCall};
use tah::store::{Store, WriteOp};
use uuid::Uuid;

use crate::store::builders::*;

conformance!(
    messages_round_trip_and_page_by_index,
    copy_messages,
    nth_user_message,
);

async fn messages_round_trip_and_page_by_index(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    assert_eq!(store.message_count(s.id).await.expect("count"), 0);
    assert!(store.messages(s.id, -1, 10).await.expect("read").is_empty());

    let calls = vec![
        ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: json!({ "path": "README.md", "range": { "from": 1, "to": 20 } }),
        },
        ToolCall {
            id: "call_2".into(),
            name: "list_files".into(),
            arguments: json!({}),
        },
    ];
    let history = vec![
        message(
            0,
            Role::System,
            "[Summary of the earlier conversation] they said hi",
        ),
        message(1, Role::User, "héllo 世界 — read it"),
        Message {
            index: 2,
            ..Message::assistant("", calls.clone())
        },
        Message {
            index: 3,
            ..Message::tool_result("call_1", "# Demo\n\nDemo is small.\n")
        },
        Message {
            index: 4,
            ..Message::tool_result("call_2", "README.md\nsrc/")
        },
        message(5, Role::Assistant, "Demo is a small sample project."),
    ];
    let ops = history
        .iter()
        .map(|m| WriteOp::InsertMessage {
            session_id: s.id,
            message: m.clone(),
        })
        .collect();
    commit(&store, ops).await;

    assert_eq!(store.message_count(s.id).await.expect("count"), 6);
    let all = store.messages(s.id, -1, 100).await.expect("read");
    assert_eq!(all, history);
    assert_eq!(all[2].tool_calls, calls);
    assert_eq!(all[3].tool_call_id.as_deref(), Some("call_1"));
    assert!(all[0].is_summary());

    assert_eq!(
        store.messages(s.id, 1, 2).await.expect("read"),
        history[2..4]
    );
    assert_eq!(
        store.messages(s.id, 3, 100).await.expect("read"),
        history[4..]
    );
    assert!(store.messages(s.id, 5, 100).await.expect("read").is_empty());
    assert!(store.messages(s.id, -1, 0).await.expect("read").is_empty());
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_eq!(got.message_count, 6);

    // The same index twice is refused.
    let dup = WriteOp::InsertMessage {
        session_id: s.id,
        message: message(5, Role::User, "again"),
    };
    assert!(store.commit(&[&[dup]]).await.is_err());
    assert_eq!(store.message_count(s.id).await.expect("count"), 6);
}

async fn copy_messages(store: Arc<dyn Store>) {
    let from = new_session(&store, SessionState::Idle).await;
    let calls = vec![ToolCall {
        id: "c1".into(),
        name: "list_files".into(),
        arguments: json!({ "path": "." }),
    }];
    let history = vec![
        message(0, Role::User, "one"),
        Message {
            index: 1,
            ..Message::assistant("", calls)
        },
        Message {
            index: 2,
            ..Message::tool_result("c1", "README.md")
        },
        message(3, Role::Assistant, "two 世界"),
        message(4, Role::User, "three"),
    ];
    commit(
        &store,
        history
            .iter()
            .map(|m| WriteOp::InsertMessage {
                session_id: from.id,
                message: m.clone(),
            })
            .collect(),
    )
    .await;

    let all = session(SessionState::Idle);
    let part = session(SessionState::Idle);
    let none = session(SessionState::Idle);
    commit(
        &store,
        vec![
            WriteOp::InsertSession(all.clone()),
            WriteOp::CopyMessages {
                from: from.id,
                to: all.id,
                upto: None,
            },
            WriteOp::InsertSession(part.clone()),
            WriteOp::CopyMessages {
                from: from.id,
                to: part.id,
                upto: Some(3),
            },
            // A fork continues right after the copy, in the same commit.
            WriteOp::InsertMessage {
                session_id: part.id,
                message: message(3, Role::User, "a different turn"),
            },
            WriteOp::InsertSession(none.clone()),
            WriteOp::CopyMessages {
                from: from.id,
                to: none.id,
                upto: Some(0),
            },
        ],
    )
    .await;

    assert_eq!(
        store.messages(all.id, -1, 100).await.expect("read"),
        history
    );
    let got = store.messages(part.id, -1, 100).await.expect("read");
    assert_eq!(got[..3], history[..3]);
    assert_eq!(got[3].content, "a different turn");
    assert_eq!(got.len(), 4);
    assert_eq!(store.message_count(none.id).await.expect("count"), 0);
    // The source is untouched.
    assert_eq!(
        store.messages(from.id, -1, 100).await.expect("read"),
        history
    );
    // Copying from a session without messages copies nothing.
    let empty = session(SessionState::Idle);
    commit(
        &store,
        vec![
            WriteOp::InsertSession(empty.clone()),
            WriteOp::CopyMessages {
                from: new_id(),
                to: empty.id,
                upto: None,
            },
        ],
    )
    .await;
    assert_eq!(store.message_count(empty.id).await.expect("count"), 0);
}

async fn nth_user_message(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    assert_eq!(store.nth_user_message(s.id, 0).await.expect("read"), None);
    let roles = [
        Role::System,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::User,
        Role::Assistant,
        Role::User,
    ];
    commit(
        &store,
        roles
            .iter()
            .enumerate()
            .map(|(i, role)| WriteOp::InsertMessage {
                session_id: s.id,
                message: message(i as i64, *role, "x"),
            })
            .collect(),
    )
    .await;
    let got: Vec<Option<i64>> = nth_users(&store, s.id, 0..5).await;
    assert_eq!(got, [Some(1), Some(4), Some(6), None, None]);
    assert_eq!(
        store.nth_user_message(s.id, u64::MAX).await.expect("read"),
        None
    );
}

async fn nth_users(store: &Arc<dyn Store>, id: Uuid, ns: std::ops::Range<u64>) -> Vec<Option<i64>> {
    let mut out = Vec::new();
    for n in ns {
        out.push(store.nth_user_message(id, n).await.expect("read"));
    }
    out
}

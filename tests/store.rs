//! The store conformance suite: every case is a function of an `Arc<dyn Store>` and runs twice,
//! as `sqlite::<case>` on a fresh SQLite file in a tempdir and as `postgres::<case>` on a fresh
//! PostgreSQL database (created per test, dropped after) on the test PostgreSQL server: the one
//! `TAH_TEST_PG_URL` names, or a throwaway cluster this test binary starts (see
//! `tests/support`). Where PostgreSQL's server binaries are not installed, the PostgreSQL half
//! is reported as ignored.

mod support;
use support::postgres::{server_url, with_database, TestDatabase};

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use chrono::Duration;
use serde_json::{json, Value};
use sqlx::{Connection, Executor, PgConnection};
use tah::model::{
    new_id, now, Checkpoint, Event, EventKind, FinishReason, Message, Role, RunKind, RunRecord,
    RunStatus, SessionRecord, SessionState, StepKind, StepRecord, StepStatus, ToolCall, Usage,
};
use tah::store::{self, SessionQuery, Store, WriteOp};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Running each case on both backends

/// Declares each case once per backend: `sqlite::name` and `postgres::name`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::on_sqlite(super::$case).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(pg_tests),
                    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
                )]
                async fn $case() {
                    super::on_postgres(super::$case).await;
                }
            )*
        }
    };
}

conformance!(
    session_round_trip,
    session_update_writes_only_mutable_columns,
    sessions_page_newest_first_with_cursor_and_state,
    messages_round_trip_and_page_by_index,
    events_page_and_last_seq,
    event_data_json_round_trips,
    duplicate_seq_rolls_back_the_whole_commit,
    runs_upsert,
    steps_upsert_and_lookup,
    latest_checkpoint,
    copy_messages,
    nth_user_message,
    delete_session_removes_everything,
    active_sessions_are_running_or_waiting_tool,
    thousand_events_in_one_commit,
    interleaved_ops_keep_their_order,
    negative_limit_means_no_limit,
    nul_characters_do_not_fail_a_commit,
);

async fn on_sqlite<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tah.db").display());
    let store = store::open(&url, Uuid::nil())
        .await
        .expect("open sqlite store")
        .store;
    case(store).await;
}

async fn on_postgres<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDatabase::new("tah_t");
    db.create().await;
    let store = store::open(&db.url, Uuid::nil())
        .await
        .expect("open postgres store")
        .store;
    // Run the case as a task so a failing assertion still lets us drop the database.
    let outcome = tokio::spawn(case(store)).await;
    drop(db);
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

// ---------------------------------------------------------------------------------------------
// Builders

fn session(state: SessionState) -> SessionRecord {
    let t = now();
    SessionRecord {
        id: new_id(),
        parent_id: None,
        title: None,
        metadata: json!({}),
        system_prompt: None,
        state,
        error: None,
        message_count: 0,
        last_seq: 0,
        usage: Usage::default(),
        last_run_id: None,
        created_at: t,
        updated_at: t,
        options: Default::default(),
    }
}

fn message(index: i64, role: Role, content: &str) -> Message {
    Message {
        index,
        ..Message::new(role, content)
    }
}

fn event(session_id: Uuid, seq: i64) -> Event {
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
fn call_event(session_id: Uuid, seq: i64, arguments: Value) -> Event {
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
fn call_arguments(event: &Event) -> Value {
    match &event.kind {
        EventKind::ToolStarted { call, .. } => call.arguments.clone(),
        other => panic!("not a tool.started event: {other:?}"),
    }
}

fn events_op(session_id: Uuid, seqs: std::ops::RangeInclusive<i64>) -> Vec<WriteOp> {
    seqs.map(|seq| WriteOp::InsertEvent(Arc::new(event(session_id, seq))))
        .collect()
}

fn run(session_id: Uuid) -> RunRecord {
    RunRecord {
        id: new_id(),
        session_id,
        kind: RunKind::Run,
        status: RunStatus::Running,
        input: Some("what is in README.md?".into()),
        text: None,
        finish_reason: None,
        usage: Usage::default(),
        steps: 0,
        error: None,
        start_seq: 3,
        created_at: now(),
        finished_at: None,
    }
}

fn step(session_id: Uuid, run_id: Uuid, kind: StepKind) -> StepRecord {
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

async fn commit(store: &Arc<dyn Store>, ops: Vec<WriteOp>) {
    store.commit(&[ops.as_slice()]).await.expect("commit");
}

async fn new_session(store: &Arc<dyn Store>, state: SessionState) -> SessionRecord {
    let s = session(state);
    commit(store, vec![WriteOp::InsertSession(s.clone())]).await;
    s
}

/// Records compare through their JSON (they do not derive `PartialEq`).
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).expect("json") == serde_json::to_value(b).expect("json")
}

#[track_caller]
fn assert_same<T: serde::Serialize + std::fmt::Debug>(got: &T, want: &T) {
    assert!(same(got, want), "got {got:#?}\nwant {want:#?}");
}

// ---------------------------------------------------------------------------------------------
// The cases

async fn session_round_trip(store: Arc<dyn Store>) {
    let parent = new_session(&store, SessionState::Idle).await;
    let mut s = session(SessionState::WaitingTool);
    s.parent_id = Some(parent.id);
    s.title = Some("héllo 世界".into());
    s.metadata = json!({
        "owner": "ana", "tags": ["a", "b"], "nested": { "n": 1, "f": 2.5, "ok": true, "no": null },
        "big": 9007199254740993_u64, "emoji": "🦀"
    });
    s.system_prompt = Some("You are terse.\nÜber.".into());
    s.error = Some("interrupted".into());
    s.usage = Usage {
        input_tokens: 1234,
        output_tokens: 56,
    };
    s.last_run_id = Some(new_id());
    s.updated_at = s.created_at + Duration::milliseconds(1500);
    commit(&store, vec![WriteOp::InsertSession(s.clone())]).await;

    let got = store.session(s.id).await.expect("read").expect("present");
    assert_same(&got, &s);
    assert_eq!(got.title.as_deref(), Some("héllo 世界"));
    assert_eq!(got.metadata, s.metadata);
    assert_eq!(got.created_at, s.created_at);
    assert_eq!(got.updated_at, s.updated_at);

    let bare = store
        .session(parent.id)
        .await
        .expect("read")
        .expect("present");
    assert_same(&bare, &parent);
    assert!(store.session(new_id()).await.expect("read").is_none());
}

async fn session_update_writes_only_mutable_columns(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    let mut changed = s.clone();
    changed.title = Some("renamed".into());
    changed.metadata = json!({ "k": [1, 2, 3] });
    changed.state = SessionState::Failed;
    changed.error = Some("boom".into());
    changed.usage = Usage {
        input_tokens: 10,
        output_tokens: 20,
    };
    changed.last_run_id = Some(new_id());
    changed.updated_at = s.updated_at + Duration::seconds(5);
    // Not mutable: these stay as inserted.
    changed.parent_id = Some(new_id());
    changed.system_prompt = Some("ignored".into());
    changed.created_at = s.created_at + Duration::seconds(60);
    changed.message_count = 99;
    changed.last_seq = 99;
    commit(&store, vec![WriteOp::UpdateSession(changed.clone())]).await;

    let got = store.session(s.id).await.expect("read").expect("present");
    let mut want = changed.clone();
    want.parent_id = s.parent_id;
    want.system_prompt = s.system_prompt.clone();
    want.created_at = s.created_at;
    want.message_count = 0;
    want.last_seq = 0;
    assert_same(&got, &want);

    // Title and error can be cleared again.
    let mut cleared = want.clone();
    cleared.title = None;
    cleared.error = None;
    cleared.state = SessionState::Idle;
    commit(&store, vec![WriteOp::UpdateSession(cleared.clone())]).await;
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_same(&got, &cleared);

    // Updating a session that does not exist is not an error and creates nothing.
    let ghost = session(SessionState::Idle);
    commit(&store, vec![WriteOp::UpdateSession(ghost.clone())]).await;
    assert!(store.session(ghost.id).await.expect("read").is_none());
}

async fn sessions_page_newest_first_with_cursor_and_state(store: Arc<dyn Store>) {
    let states = [
        SessionState::Idle,
        SessionState::Running,
        SessionState::Completed,
        SessionState::Running,
        SessionState::Idle,
        SessionState::Running,
        SessionState::Failed,
    ];
    let mut all = Vec::new();
    for state in states {
        all.push(new_session(&store, state).await);
    }
    // Give one session a message and events: the derived counts show in the list too.
    commit(
        &store,
        [
            vec![WriteOp::InsertMessage {
                session_id: all[2].id,
                message: message(0, Role::User, "hi"),
            }],
            events_op(all[2].id, 1..=4),
        ]
        .concat(),
    )
    .await;
    all.sort_by_key(|s| std::cmp::Reverse(s.id));
    let ids = |v: &[SessionRecord]| v.iter().map(|s| s.id).collect::<Vec<_>>();

    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .sessions(&SessionQuery {
                limit: 3,
                before,
                state: None,
            })
            .await
            .expect("list");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        before = page.last().map(|s| s.id);
        pages.push(page);
    }
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 1]);
    let listed: Vec<SessionRecord> = pages.into_iter().flatten().collect();
    assert_eq!(ids(&listed), ids(&all));
    let with_history = listed
        .iter()
        .find(|s| s.message_count > 0)
        .expect("the session with history");
    assert_eq!((with_history.message_count, with_history.last_seq), (1, 4));

    let running: Vec<Uuid> = all
        .iter()
        .filter(|s| s.state == SessionState::Running)
        .map(|s| s.id)
        .collect();
    let first = store
        .sessions(&SessionQuery {
            limit: 2,
            before: None,
            state: Some(SessionState::Running),
        })
        .await
        .expect("list running");
    assert_eq!(ids(&first), running[..2]);
    let second = store
        .sessions(&SessionQuery {
            limit: 2,
            before: first.last().map(|s| s.id),
            state: Some(SessionState::Running),
        })
        .await
        .expect("list running");
    assert_eq!(ids(&second), running[2..]);
    let none = store
        .sessions(&SessionQuery {
            limit: 10,
            before: None,
            state: Some(SessionState::Cancelled),
        })
        .await
        .expect("list cancelled");
    assert!(none.is_empty());
}

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

async fn events_page_and_last_seq(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Idle).await;
    let other = new_session(&store, SessionState::Idle).await;
    assert_eq!(store.last_seq(s.id).await.expect("last"), 0);
    assert!(store.events(s.id, 0, 10).await.expect("read").is_empty());

    let first = events_op(s.id, 1..=10);
    let second = events_op(s.id, 11..=15);
    let theirs = events_op(other.id, 1..=3);
    store
        .commit(&[first.as_slice(), theirs.as_slice()])
        .await
        .expect("commit");
    // A single event on its own takes the one-row path.
    store
        .commit(&[&second[..1]])
        .await
        .expect("commit one event");
    store.commit(&[&second[1..]]).await.expect("commit rest");

    let want: Vec<Event> = first
        .iter()
        .chain(&second)
        .filter_map(|op| match op {
            WriteOp::InsertEvent(e) => Some(Event::clone(e)),
            _ => None,
        })
        .collect();
    let all = store.events(s.id, 0, 1000).await.expect("read");
    assert_eq!(all, want);
    let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=15).collect::<Vec<_>>(),
        "seq is contiguous from 1"
    );

    assert_eq!(store.events(s.id, 3, 4).await.expect("read"), want[3..7]);
    assert_eq!(store.events(s.id, 12, 100).await.expect("read"), want[12..]);
    assert!(store.events(s.id, 15, 100).await.expect("read").is_empty());
    assert_eq!(store.last_seq(s.id).await.expect("last"), 15);
    assert_eq!(store.last_seq(other.id).await.expect("last"), 3);
    assert_eq!(store.last_seq(new_id()).await.expect("last"), 0);
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_eq!(got.last_seq, 15);
    assert_eq!(store.events(other.id, 0, 100).await.expect("read").len(), 3);
}

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
            WriteOp::InsertEvent(Arc::new(e.clone())),
            WriteOp::InsertEvent(Arc::new(scalar.clone())),
        ],
    )
    .await;
    let got = store.events(s.id, 0, 10).await.expect("read");
    assert_eq!(got, [e, scalar]);
    assert_eq!(call_arguments(&got[0]), data);
}

async fn duplicate_seq_rolls_back_the_whole_commit(store: Arc<dyn Store>) {
    let a = new_session(&store, SessionState::Idle).await;
    commit(&store, events_op(a.id, 1..=3)).await;

    // Group 1 is fine on its own; group 2 repeats seq 3 of `a`: nothing of either may stick.
    let b = session(SessionState::Idle);
    let mut changed_a = a.clone();
    changed_a.title = Some("must not stick".into());
    let group1 = [
        vec![
            WriteOp::InsertSession(b.clone()),
            WriteOp::InsertMessage {
                session_id: b.id,
                message: message(0, Role::User, "hi"),
            },
            WriteOp::UpdateSession(changed_a),
        ],
        events_op(b.id, 1..=5),
    ]
    .concat();
    let group2 = [events_op(a.id, 4..=4), events_op(a.id, 3..=3)].concat();
    assert!(store
        .commit(&[group1.as_slice(), group2.as_slice()])
        .await
        .is_err());
    assert!(store.session(b.id).await.expect("read").is_none());
    assert!(store.events(b.id, 0, 100).await.expect("read").is_empty());
    assert_eq!(store.message_count(b.id).await.expect("count"), 0);
    assert_eq!(store.last_seq(a.id).await.expect("last"), 3);
    let got_a = store.session(a.id).await.expect("read").expect("present");
    assert_eq!(got_a.title, None);

    // A duplicate inside one run of events, and a single duplicate event, fail the same way.
    let twice = [events_op(a.id, 4..=5), events_op(a.id, 5..=5)].concat();
    assert!(store.commit(&[twice.as_slice()]).await.is_err());
    assert!(store.commit(&[&events_op(a.id, 2..=2)]).await.is_err());
    assert_eq!(store.last_seq(a.id).await.expect("last"), 3);

    // The store is still usable afterwards, and the seqs that failed are still free.
    commit(&store, events_op(a.id, 4..=5)).await;
    assert_eq!(store.last_seq(a.id).await.expect("last"), 5);
}

async fn runs_upsert(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    assert!(store.runs(s.id, None, 10).await.expect("runs").is_empty());
    let r = run(s.id);
    commit(&store, vec![WriteOp::UpsertRun(r.clone())]).await;
    assert_same(
        &store.run(s.id, r.id).await.expect("read").expect("present"),
        &r,
    );

    // Finishing updates the result columns, never the identity of the run.
    let mut done = r.clone();
    done.status = RunStatus::Completed;
    done.text = Some("Demo is a small sample project. 世界".into());
    done.finish_reason = Some(FinishReason::Model("stop".into()));
    done.usage = Usage {
        input_tokens: 900,
        output_tokens: 40,
    };
    done.steps = 3;
    done.finished_at = Some(r.created_at + Duration::milliseconds(2500));
    let mut attempt = done.clone();
    attempt.kind = RunKind::Resume;
    attempt.input = Some("ignored".into());
    attempt.start_seq = 99;
    attempt.created_at = r.created_at + Duration::seconds(9);
    commit(&store, vec![WriteOp::UpsertRun(attempt)]).await;
    let got = store.run(s.id, r.id).await.expect("read").expect("present");
    assert_same(&got, &done);

    let mut failed = run(s.id);
    failed.kind = RunKind::Resume;
    failed.input = None;
    commit(&store, vec![WriteOp::UpsertRun(failed.clone())]).await;
    failed.status = RunStatus::Failed;
    failed.error = Some("model unavailable".into());
    failed.finished_at = Some(now());
    commit(&store, vec![WriteOp::UpsertRun(failed.clone())]).await;

    let all = store.runs(s.id, None, 10).await.expect("runs");
    assert_eq!(all.len(), 2);
    assert_same(&all[0], &done);
    assert_same(&all[1], &failed);
    let after = store.runs(s.id, Some(r.id), 10).await.expect("runs");
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, failed.id);
    assert_eq!(store.runs(s.id, None, 1).await.expect("runs").len(), 1);
    assert!(store.run(new_id(), r.id).await.expect("read").is_none());
    assert!(store.run(s.id, new_id()).await.expect("read").is_none());
}

async fn steps_upsert_and_lookup(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    let r = run(s.id);
    let llm = step(s.id, r.id, StepKind::Llm);
    commit(
        &store,
        vec![
            WriteOp::UpsertRun(r.clone()),
            WriteOp::UpsertStep(llm.clone()),
        ],
    )
    .await;
    let got = store
        .step(s.id, llm.id)
        .await
        .expect("read")
        .expect("present");
    assert_same(&got, &llm);
    assert!(got.usage.is_none() && got.response.is_none());

    let mut streaming = llm.clone();
    streaming.status = StepStatus::Streaming;
    commit(&store, vec![WriteOp::UpsertStep(streaming.clone())]).await;
    assert_eq!(
        store
            .step(s.id, llm.id)
            .await
            .expect("read")
            .expect("present")
            .status,
        StepStatus::Streaming
    );

    let mut done = streaming.clone();
    done.status = StepStatus::Completed;
    done.response = Some(json!({
        "role": "assistant", "content": "",
        "tool_calls": [{ "id": "call_1", "name": "read_file", "arguments": { "path": "README.md" } }]
    }));
    done.usage = Some(Usage {
        input_tokens: 321,
        output_tokens: 12,
    });
    done.finished_at = Some(llm.created_at + Duration::milliseconds(800));
    // The request is written once, at insert.
    let mut attempt = done.clone();
    attempt.request = json!({ "ignored": true });
    commit(&store, vec![WriteOp::UpsertStep(attempt)]).await;
    let got = store
        .step(s.id, llm.id)
        .await
        .expect("read")
        .expect("present");
    assert_same(&got, &done);

    let mut tool = step(s.id, r.id, StepKind::Tool);
    tool.request = json!({ "id": "call_1", "name": "read_file", "arguments": { "path": "x" } });
    commit(&store, vec![WriteOp::UpsertStep(tool.clone())]).await;
    tool.status = StepStatus::Failed;
    tool.error = Some("no such file: x".into());
    tool.response = Some(json!("no such file: x"));
    tool.finished_at = Some(now());
    commit(&store, vec![WriteOp::UpsertStep(tool.clone())]).await;

    let all = store.steps(s.id, None, 10).await.expect("steps");
    assert_eq!(all.len(), 2);
    assert_same(&all[0], &done);
    assert_same(&all[1], &tool);
    let after = store.steps(s.id, Some(llm.id), 10).await.expect("steps");
    assert_eq!(after.len(), 1);
    assert_same(&after[0], &tool);
    assert_eq!(store.steps(s.id, None, 1).await.expect("steps").len(), 1);
    assert!(store.step(new_id(), llm.id).await.expect("read").is_none());
    assert!(store.step(s.id, new_id()).await.expect("read").is_none());
}

async fn latest_checkpoint(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    assert!(store.latest_checkpoint(s.id).await.expect("read").is_none());
    let r = run(s.id);
    let mut last = None;
    for (i, step_id) in [None, Some(new_id()), Some(new_id())]
        .into_iter()
        .enumerate()
    {
        let c = Checkpoint {
            id: new_id(),
            session_id: s.id,
            run_id: r.id,
            step_id,
            message_count: 2 * i as i64 + 1,
            seq: 10 * i as i64 + 4,
            created_at: now(),
        };
        commit(&store, vec![WriteOp::InsertCheckpoint(c.clone())]).await;
        let got = store
            .latest_checkpoint(s.id)
            .await
            .expect("read")
            .expect("present");
        assert_same(&got, &c);
        last = Some(c);
    }
    let other = new_session(&store, SessionState::Idle).await;
    assert!(store
        .latest_checkpoint(other.id)
        .await
        .expect("read")
        .is_none());
    assert!(last.is_some_and(|c| c.step_id.is_some()));
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

async fn delete_session_removes_everything(store: Arc<dyn Store>) {
    let keep = new_session(&store, SessionState::Idle).await;
    let gone = new_session(&store, SessionState::Running).await;
    let mut ops = Vec::new();
    for s in [&keep, &gone] {
        let r = run(s.id);
        let st = step(s.id, r.id, StepKind::Llm);
        ops.extend([
            WriteOp::InsertMessage {
                session_id: s.id,
                message: message(0, Role::User, "hi"),
            },
            WriteOp::UpsertRun(r.clone()),
            WriteOp::UpsertStep(st.clone()),
            WriteOp::InsertCheckpoint(Checkpoint {
                id: new_id(),
                session_id: s.id,
                run_id: r.id,
                step_id: Some(st.id),
                message_count: 1,
                seq: 2,
                created_at: now(),
            }),
        ]);
        ops.extend(events_op(s.id, 1..=2));
    }
    commit(&store, ops).await;
    commit(&store, vec![WriteOp::DeleteSession(gone.id)]).await;

    assert!(store.session(gone.id).await.expect("read").is_none());
    assert!(store
        .messages(gone.id, -1, 10)
        .await
        .expect("read")
        .is_empty());
    assert_eq!(store.message_count(gone.id).await.expect("count"), 0);
    assert!(store.events(gone.id, 0, 10).await.expect("read").is_empty());
    assert_eq!(store.last_seq(gone.id).await.expect("last"), 0);
    assert!(store
        .runs(gone.id, None, 10)
        .await
        .expect("read")
        .is_empty());
    assert!(store
        .steps(gone.id, None, 10)
        .await
        .expect("read")
        .is_empty());
    assert!(store
        .latest_checkpoint(gone.id)
        .await
        .expect("read")
        .is_none());
    assert!(!store
        .active_sessions()
        .await
        .expect("active")
        .contains(&gone.id));

    let kept = store
        .session(keep.id)
        .await
        .expect("read")
        .expect("present");
    assert_eq!((kept.message_count, kept.last_seq), (1, 2));
    assert_eq!(store.runs(keep.id, None, 10).await.expect("read").len(), 1);
    assert_eq!(store.steps(keep.id, None, 10).await.expect("read").len(), 1);
    assert!(store
        .latest_checkpoint(keep.id)
        .await
        .expect("read")
        .is_some());

    // Deleting again (or an unknown id) is a no-op; the id can be used afresh.
    commit(&store, vec![WriteOp::DeleteSession(gone.id)]).await;
    commit(&store, vec![WriteOp::InsertSession(gone.clone())]).await;
    commit(&store, events_op(gone.id, 1..=1)).await;
    assert_eq!(store.last_seq(gone.id).await.expect("last"), 1);
}

async fn active_sessions_are_running_or_waiting_tool(store: Arc<dyn Store>) {
    assert!(store.active_sessions().await.expect("active").is_empty());
    let mut want = HashSet::new();
    for state in [
        SessionState::Idle,
        SessionState::Running,
        SessionState::WaitingTool,
        SessionState::Completed,
        SessionState::Failed,
        SessionState::Cancelled,
        SessionState::Running,
    ] {
        let s = new_session(&store, state).await;
        if state.is_active() {
            want.insert(s.id);
        }
    }
    let got: HashSet<Uuid> = store
        .active_sessions()
        .await
        .expect("active")
        .into_iter()
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 3);

    // A session that leaves the active states drops out.
    let id = *want.iter().next().expect("one");
    let mut s = store.session(id).await.expect("read").expect("present");
    s.state = SessionState::Idle;
    commit(&store, vec![WriteOp::UpdateSession(s)]).await;
    let got = store.active_sessions().await.expect("active");
    assert_eq!(got.len(), 2);
    assert!(!got.contains(&id));
}

async fn thousand_events_in_one_commit(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    let ops = events_op(s.id, 1..=1000);
    let started = std::time::Instant::now();
    store.commit(&[ops.as_slice()]).await.expect("commit");
    let took = started.elapsed();
    assert_eq!(store.last_seq(s.id).await.expect("last"), 1000);
    let all = store.events(s.id, 0, 5000).await.expect("read");
    assert_eq!(all.len(), 1000);
    assert!(all.iter().zip(1..).all(|(e, seq)| e.seq == seq));
    assert_eq!(all[999].kind.data_value()["text"], "piece 1000");
    assert_eq!(store.events(s.id, 990, 5).await.expect("read")[0].seq, 991);

    // The same again as 100 groups of 10 (how the writer batches many sessions).
    let many: Vec<SessionRecord> = (0..100).map(|_| session(SessionState::Running)).collect();
    commit(
        &store,
        many.iter().cloned().map(WriteOp::InsertSession).collect(),
    )
    .await;
    let groups: Vec<Vec<WriteOp>> = many.iter().map(|s| events_op(s.id, 1..=10)).collect();
    let refs: Vec<&[WriteOp]> = groups.iter().map(Vec::as_slice).collect();
    store.commit(&refs).await.expect("commit groups");
    for s in &many {
        assert_eq!(store.last_seq(s.id).await.expect("last"), 10);
    }
    assert!(
        took < std::time::Duration::from_secs(10),
        "1000 events took {took:?}"
    );
}

async fn interleaved_ops_keep_their_order(store: Arc<dyn Store>) {
    // Events, then a delete of the same session, then events again: order decides the result.
    let s = new_session(&store, SessionState::Running).await;
    let ops = [
        events_op(s.id, 1..=3),
        vec![
            WriteOp::DeleteSession(s.id),
            WriteOp::InsertSession(s.clone()),
        ],
        events_op(s.id, 1..=2),
        vec![WriteOp::InsertMessage {
            session_id: s.id,
            message: message(0, Role::User, "after"),
        }],
        events_op(s.id, 3..=3),
    ]
    .concat();
    commit(&store, ops).await;
    assert_eq!(store.last_seq(s.id).await.expect("last"), 3);
    assert_eq!(store.events(s.id, 0, 100).await.expect("read").len(), 3);
    assert_eq!(store.message_count(s.id).await.expect("count"), 1);
    // An empty commit is fine.
    store.commit(&[]).await.expect("empty commit");
    store.commit(&[&[]]).await.expect("empty group");
}

async fn negative_limit_means_no_limit(store: Arc<dyn Store>) {
    let s = new_session(&store, SessionState::Running).await;
    let r = run(s.id);
    commit(
        &store,
        [
            events_op(s.id, 1..=5),
            vec![
                WriteOp::InsertMessage {
                    session_id: s.id,
                    message: message(0, Role::User, "a"),
                },
                WriteOp::InsertMessage {
                    session_id: s.id,
                    message: message(1, Role::Assistant, "b"),
                },
                WriteOp::UpsertRun(r.clone()),
                WriteOp::UpsertStep(step(s.id, r.id, StepKind::Llm)),
            ],
        ]
        .concat(),
    )
    .await;
    assert_eq!(store.events(s.id, 0, -1).await.expect("read").len(), 5);
    assert_eq!(store.messages(s.id, -1, -1).await.expect("read").len(), 2);
    assert_eq!(store.runs(s.id, None, -1).await.expect("read").len(), 1);
    assert_eq!(store.steps(s.id, None, -1).await.expect("read").len(), 1);
    let listed = store
        .sessions(&SessionQuery {
            limit: -1,
            before: None,
            state: None,
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        store
            .messages(s.id, -1, i64::MAX)
            .await
            .expect("read")
            .len(),
        2
    );
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
            WriteOp::InsertEvent(Arc::new(e.clone())),
            WriteOp::InsertEvent(Arc::new(Event::new(s.id, 2, e.kind.clone(), e.created_at))),
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

/// Not a trait case: `open` creates a missing database, and replicas starting together on a
/// fresh database migrate it once (sqlx takes an advisory lock) and all come up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(pg_tests),
    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
)]
async fn postgres_open_creates_the_database_and_replicas_start_together() {
    let base = server_url().to_string();
    let db = format!("tah_t_{}", Uuid::now_v7().simple());
    let url = with_database(&base, &db);
    let opens = (0..3).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { store::open(&url, Uuid::nil()).await.map(|o| o.store) })
    });
    let mut stores = Vec::new();
    for open in opens {
        stores.push(open.await.expect("join").expect("open"));
    }
    let s = session(SessionState::Idle);
    commit(&stores[0], vec![WriteOp::InsertSession(s.clone())]).await;
    for store in &stores {
        assert!(store.session(s.id).await.expect("read").is_some());
    }
    drop(stores);
    let mut admin = PgConnection::connect(&base).await.expect("connect");
    admin
        .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
        .await
        .expect("drop test database");
}

//! Sessions: a record round-trips, an update writes only what may change, the list pages newest
//! first (with a state filter), the active ones are found, and a delete takes everything.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::Duration;
use serde_json::json;
use tah::model::{new_id, now, Checkpoint, Role, SessionRecord, SessionState, StepKind, Usage};
use tah::store::{SessionLabels, SessionProgress, SessionQuery, Store, WriteOp};
use uuid::Uuid;

use crate::store::builders::*;

conformance!(
    session_round_trip,
    session_update_writes_only_mutable_columns,
    session_progress_writes_only_what_runs_change,
    sessions_page_newest_first_with_cursor_and_state,
    active_sessions_are_running_or_waiting_tool,
    delete_session_removes_everything,
);

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
    // The labels are UpdateLabels' alone: the actor's record writes keep them.
    want.title = s.title.clone();
    want.metadata = s.metadata.clone();
    want.parent_id = s.parent_id;
    want.system_prompt = s.system_prompt.clone();
    want.created_at = s.created_at;
    want.message_count = 0;
    want.last_seq = 0;
    assert_same(&got, &want);

    // The error can be cleared again.
    let mut cleared = want.clone();
    cleared.error = None;
    cleared.state = SessionState::Idle;
    commit(&store, vec![WriteOp::UpdateSession(cleared.clone())]).await;
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_same(&got, &cleared);

    // UpdateLabels writes the title and metadata (and updated_at), and nothing else.
    let labels = SessionLabels {
        id: s.id,
        title: Some("renamed".into()),
        metadata: json!({ "k": [1, 2, 3] }),
        updated_at: s.updated_at + Duration::seconds(9),
    };
    commit(&store, vec![WriteOp::UpdateLabels(labels.clone())]).await;
    let got = store.session(s.id).await.expect("read").expect("present");
    let mut labelled = cleared.clone();
    labelled.title = labels.title.clone();
    labelled.metadata = labels.metadata.clone();
    labelled.updated_at = labels.updated_at;
    assert_same(&got, &labelled);
    // And a title can be cleared.
    let unlabelled = SessionLabels {
        title: None,
        ..labels
    };
    commit(&store, vec![WriteOp::UpdateLabels(unlabelled)]).await;
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_eq!(got.title, None);
    assert_eq!(got.state, SessionState::Idle);

    // Updating a session that does not exist is not an error and creates nothing.
    let ghost = session(SessionState::Idle);
    commit(&store, vec![WriteOp::UpdateSession(ghost.clone())]).await;
    assert!(store.session(ghost.id).await.expect("read").is_none());
}

async fn session_progress_writes_only_what_runs_change(store: Arc<dyn Store>) {
    let mut s = session(SessionState::Idle);
    s.title = Some("kept".into());
    s.metadata = json!({ "kept": true });
    s.options.tools = Some(vec!["read_file".into()]);
    commit(&store, vec![WriteOp::InsertSession(s.clone())]).await;

    let mut changed = s.clone();
    changed.state = SessionState::WaitingTool;
    changed.error = Some("ünïcode error 世界".into());
    changed.usage = Usage {
        input_tokens: 7,
        output_tokens: 8,
    };
    changed.last_run_id = Some(new_id());
    changed.updated_at = s.updated_at + Duration::seconds(3);
    // What a progress update does not write: these stay as inserted.
    changed.title = Some("ignored".into());
    changed.metadata = json!({ "ignored": 1 });
    changed.options.tools = None;
    let progress = SessionProgress::of(&changed);
    commit(&store, vec![WriteOp::UpdateProgress(progress)]).await;

    let got = store.session(s.id).await.expect("read").expect("present");
    let mut want = changed.clone();
    want.title = s.title.clone();
    want.metadata = s.metadata.clone();
    want.options = s.options.clone();
    assert_same(&got, &want);
    assert_eq!(got.options, s.options);

    // The error is cleared again, and a session that does not exist is not created.
    want.error = None;
    want.state = SessionState::Idle;
    commit(
        &store,
        vec![WriteOp::UpdateProgress(SessionProgress::of(&want))],
    )
    .await;
    let got = store.session(s.id).await.expect("read").expect("present");
    assert_same(&got, &want);
    let ghost = session(SessionState::Idle);
    commit(
        &store,
        vec![WriteOp::UpdateProgress(SessionProgress::of(&ghost))],
    )
    .await;
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
                parent_id: None,
                ..SessionQuery::default()
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
            parent_id: None,
            ..SessionQuery::default()
        })
        .await
        .expect("list running");
    assert_eq!(ids(&first), running[..2]);
    let second = store
        .sessions(&SessionQuery {
            limit: 2,
            before: first.last().map(|s| s.id),
            state: Some(SessionState::Running),
            parent_id: None,
            ..SessionQuery::default()
        })
        .await
        .expect("list running");
    assert_eq!(ids(&second), running[2..]);
    let none = store
        .sessions(&SessionQuery {
            limit: 10,
            before: None,
            state: Some(SessionState::Cancelled),
            parent_id: None,
            ..SessionQuery::default()
        })
        .await
        .expect("list cancelled");
    assert!(none.is_empty());
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
            WriteOp::UpsertStep(st.clone().into()),
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

//! Commits: all or nothing (a duplicate seq rolls back every group of the batch), ops apply in
//! their order, and a negative limit reads everything.

use std::sync::Arc;

use tah::model::{Role, SessionState, StepKind};
use tah::store::{SessionQuery, Store, WriteOp};

use crate::store::builders::*;

conformance!(
    duplicate_seq_rolls_back_the_whole_commit,
    interleaved_ops_keep_their_order,
    negative_limit_means_no_limit,
);

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
                WriteOp::UpsertStep(step(s.id, r.id, StepKind::Llm).into()),
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
            parent_id: None,
            ..SessionQuery::default()
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

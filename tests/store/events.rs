//! The event log: pages by seq, `last_seq`, and a thousand events in one commit (alone, and as
//! many sessions' groups in one batch, as the writer commits them).

use std::sync::Arc;

use tah::model::{new_id, Event, SessionRecord, SessionState};
use tah::store::{Store, WriteOp};

use crate::store::builders::*;

conformance!(events_page_and_last_seq, thousand_events_in_one_commit);

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
    // Pages from anywhere, across the rows a long commit is stored in, in any size.
    for (after, limit) in [
        (0, 1),
        (255, 2),
        (256, 300),
        (500, 500),
        (999, 10),
        (1000, 10),
    ] {
        let page = store.events(s.id, after, limit).await.expect("read");
        let expected: Vec<i64> = (after + 1..=(after + limit).min(1000)).collect();
        let got: Vec<i64> = page.iter().map(|e| e.seq).collect();
        assert_eq!(got, expected, "after {after}, limit {limit}");
    }

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

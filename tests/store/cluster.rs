//! Several replicas on one fresh PostgreSQL database (not a case of the trait: PostgreSQL only).

use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};
use tah::model::SessionState;
use tah::store::{self, WriteOp};
use uuid::Uuid;

use crate::store::builders::*;
use crate::support::postgres::{server_url, with_database};

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

/// A lease that expired while its owner was slow (a stalled heartbeat) is renewed as long as
/// no other replica took it; once another one has (a new epoch), it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(pg_tests),
    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
)]
async fn an_expired_lease_is_renewed_until_another_replica_takes_it() {
    let base = server_url().to_string();
    let db = format!("tah_t_{}", Uuid::now_v7().simple());
    let url = with_database(&base, &db);
    let opened = store::open(&url, Uuid::nil()).await.expect("open");
    let cluster = opened
        .cluster
        .clone()
        .expect("PostgreSQL coordinates replicas");
    let s = session(SessionState::Idle);
    commit(&opened.store, vec![WriteOp::InsertSession(s.clone())]).await;
    let (mine, other) = (Uuid::now_v7(), Uuid::now_v7());
    let short = Duration::from_millis(50);
    let epoch = cluster.acquire(s.id, mine, short).await.expect("acquire");
    let epoch = epoch.expect("a free session's lease is taken");

    tokio::time::sleep(Duration::from_millis(200)).await;
    let renewed = cluster.renew(mine, short).await.expect("renew");
    assert_eq!(
        renewed,
        vec![(s.id, epoch)],
        "nobody took it: it is still mine"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    let taken = cluster.acquire(s.id, other, Duration::from_secs(10)).await;
    let taken = taken
        .expect("acquire")
        .expect("an expired lease is taken over");
    assert!(
        taken > epoch,
        "a takeover starts a new epoch: {taken} after {epoch}"
    );
    let renewed = cluster.renew(mine, short).await.expect("renew");
    assert!(
        renewed.is_empty(),
        "another replica holds it now: {renewed:?}"
    );
    assert_eq!(
        cluster
            .renew(other, Duration::from_secs(10))
            .await
            .expect("renew"),
        vec![(s.id, taken)]
    );

    drop(cluster);
    drop(opened);
    let mut admin = PgConnection::connect(&base).await.expect("connect");
    admin
        .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
        .await
        .expect("drop test database");
}

/// Migration `0019` moves each stored event into a row of `event_batches` of its own, in place:
/// the log reads back the same (times, text of every language, U+0000 as `jsonb` kept it), from
/// any id, and goes on from where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(pg_tests),
    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
)]
async fn postgres_a_database_before_0019_keeps_its_event_log() {
    use std::borrow::Cow;

    use tah::model::{new_id, now, Event, EventKind, Published};

    let base = server_url().to_string();
    let db = format!("tah_t_{}", Uuid::now_v7().simple());
    let url = with_database(&base, &db);
    let mut admin = PgConnection::connect(&base).await.expect("connect");
    admin
        .execute(format!("CREATE DATABASE {db}").as_str())
        .await
        .expect("create test database");
    let (session_id, step_id) = (new_id(), new_id());
    let mut events: Vec<Event> = ["plain", "naïve 日本語 🦀 \"quoted\" \\ \n\t"]
        .iter()
        .map(|text| EventKind::AssistantStream {
            step_id,
            text: text.to_string(),
        })
        .chain([EventKind::StateChanged {
            from: SessionState::Running,
            to: SessionState::Idle,
        }])
        .enumerate()
        .map(|(i, kind)| Event::new(session_id, i as i64 + 1, kind, now()))
        .collect();
    {
        let mut conn = PgConnection::connect(&url).await.expect("connect");
        let mut before = sqlx::migrate!("./migrations/postgres");
        before.migrations = Cow::Owned(
            before
                .migrations
                .iter()
                .filter(|m| m.version < 19)
                .cloned()
                .collect(),
        );
        before.run(&mut conn).await.expect("migrates to 0018");
        sqlx::query(
            "INSERT INTO sessions (id, state, created_at, updated_at) VALUES ($1, 'idle', $2, $2)",
        )
        .bind(session_id)
        .bind(now())
        .execute(&mut conn)
        .await
        .expect("a session");
        for e in events.iter().rev() {
            let published = Published::new(e.clone());
            sqlx::query(
                "INSERT INTO events (session_id, seq, type, data, created_at) \
                 VALUES ($1, $2, $3, $4::jsonb, $5)",
            )
            .bind(session_id)
            .bind(e.seq)
            .bind(e.type_name())
            .bind(published.stored_data().expect("cut"))
            .bind(e.created_at)
            .execute(&mut conn)
            .await
            .expect("an event");
        }
    }
    let store = store::open(&url, Uuid::nil())
        .await
        .expect("opens and migrates")
        .store;
    assert_eq!(
        store.events(session_id, 0, 100).await.expect("reads"),
        events
    );
    assert_eq!(
        store.events(session_id, 1, 1).await.expect("reads"),
        events[1..2]
    );
    assert_eq!(store.last_seq(session_id).await.expect("reads"), 3);

    let next = Event::new(
        session_id,
        4,
        EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        },
        now(),
    );
    commit(&store, vec![WriteOp::insert_event(next.clone())]).await;
    events.push(next);
    assert_eq!(
        store.events(session_id, 0, 100).await.expect("reads"),
        events
    );
    let again = [WriteOp::insert_event(events[0].clone())];
    assert!(store.commit(&[again.as_slice()]).await.is_err());
    drop(store);
    admin
        .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
        .await
        .expect("drop test database");
}

//! Several replicas on one fresh PostgreSQL database (not a case of the trait: PostgreSQL only).

use sqlx::{Connection, Executor, PgConnection};
use tah::model::SessionState;
use tah::store::{self, WriteOp};
use uuid::Uuid;

use crate::builders::*;
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

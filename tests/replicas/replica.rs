//! One replica under test: the real `tah serve` on 127.0.0.1:0 with the mock model, its own
//! workspace, and the shared PostgreSQL database (see `tests/support`). Replicas are always
//! processes: the tests signal them, look at their sockets, and print their logs when they
//! fail (`TAH_TEST_LOGS=1` prints them always).

use crate::support::{ServerOptions, TestServer};

/// The lease TTL of every replica in these tests (the heartbeat renews every ttl/3).
pub const LEASE_TTL_SECS: u64 = 2;

pub type Replica = TestServer;

/// Starts `tah serve` named `name` on `database_url` with `--mock-delay-ms mock_delay_ms`.
pub async fn start(name: &'static str, database_url: &str, mock_delay_ms: u64) -> Replica {
    TestServer::start(
        ServerOptions::new()
            .process()
            .named(name)
            .database_url(database_url)
            .mock_delay_ms(mock_delay_ms)
            .arg("--lease-ttl-secs")
            .arg(&LEASE_TTL_SECS.to_string())
            .paged_by(500),
    )
    .await
}

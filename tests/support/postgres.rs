//! One throwaway PostgreSQL for the tests of this test binary. The server is the one
//! `TAH_TEST_PG_URL` names, or else a cluster of this process's own, started on first use
//! with `scripts/pg-test-cluster.sh` (the script CI uses) and shared by the binary's tests. A
//! watchdog process holds the other end of a pipe to this process and stops the cluster and
//! removes its directory once the pipe closes, that is when this process exits, however it
//! exits.
//!
//! Tests that need PostgreSQL are marked
//! `#[cfg_attr(not(pg_tests), ignore = "…")]`: `build.rs` sets `pg_tests` when PostgreSQL's
//! server binaries are installed (or `TAH_TEST_PG=on` / `TAH_REQUIRE_PG=1` asks for them), so
//! where they are not, `cargo test` reports those tests as ignored instead of passing them.
//!
//! Each test gets a database of its own, a [`TestDatabase`], dropped with it.

use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};

/// How long dropping a test's database may take.
const DROP_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster script, as CI runs it.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-test-cluster.sh");

struct Server {
    url: String,
    /// This process's end of the watchdog's pipe; it closes when the process exits.
    _watchdog: Option<Mutex<ChildStdin>>,
}

/// The URL of the test server (a database on it that may be used for administration).
/// Panics with the reason when there is none.
pub fn server_url() -> &'static str {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| match std::env::var("TAH_TEST_PG_URL") {
        Ok(url) if !url.trim().is_empty() => Ok(Server {
            url: url.trim().to_string(),
            _watchdog: None,
        }),
        _ => start_cluster(),
    });
    match server {
        Ok(server) => &server.url,
        Err(why) => panic!("no PostgreSQL for the tests: {why}"),
    }
}

/// Starts a cluster with the script and a watchdog that stops it when this process ends.
fn start_cluster() -> Result<Server, String> {
    let started = std::time::Instant::now();
    let output = Command::new(SCRIPT)
        .arg("start")
        .stdin(Stdio::null())
        // Its own process group: Ctrl-C on the tests must not reach the cluster before the
        // watchdog stops it.
        .process_group(0)
        .output()
        .map_err(|e| format!("cannot run {SCRIPT}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let export = |name: &str| {
        stdout.lines().find_map(|line| {
            line.strip_prefix(&format!("export {name}="))
                .map(str::to_string)
        })
    };
    let (Some(url), Some(dir)) = (export("TAH_TEST_PG_URL"), export("TAH_TEST_PG_DIR")) else {
        return Err(format!(
            "{SCRIPT} start failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    };
    let mut watchdog = Command::new("sh")
        .args([
            "-c",
            r#"cat >/dev/null; exec "$0" stop "$1" >/dev/null 2>&1"#,
            SCRIPT,
            &dir,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the cluster's watchdog: {e}"))?;
    let pipe = watchdog.stdin.take().ok_or("the watchdog has no stdin")?;
    eprintln!(
        "PostgreSQL test cluster at {url} (in {dir}, started in {:.1} s; stopped when this \
         test binary exits)",
        started.elapsed().as_secs_f64()
    );
    Ok(Server {
        url,
        _watchdog: Some(Mutex::new(pipe)),
    })
}

/// `url` with its database (the last path segment) replaced by `database`; a query string is
/// kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(q) => url.split_at(q),
        None => (url, ""),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].rfind('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    format!("{base}/{database}{query}")
}

/// A database of one test's own on the test server, `{prefix}_{16 hex digits}`. It is not
/// created here (`tah` creates a missing database when it opens it; [`TestDatabase::create`]
/// does it for tests that open a store directly). Dropped with the value — unless the test
/// failed, when it is kept for a look and its URL printed.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub fn new(prefix: &str) -> TestDatabase {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        TestDatabase {
            url: with_database(server_url(), &name),
            name,
        }
    }

    pub async fn create(&self) {
        let mut admin = admin().await;
        admin
            .execute(format!("CREATE DATABASE {}", self.name).as_str())
            .await
            .unwrap_or_else(|e| panic!("create the test database {}: {e}", self.name));
        let _ = admin.close().await;
    }

    /// A connection to the database (it must exist).
    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}

async fn admin() -> PgConnection {
    PgConnection::connect(server_url())
        .await
        .unwrap_or_else(|e| panic!("connect to the test server {}: {e}", server_url()))
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the failed test's PostgreSQL database is kept: {}",
                self.url
            );
            return;
        }
        // A thread with its own runtime: drop() may run inside the test's runtime.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                tokio::time::timeout(DROP_TIMEOUT, async {
                    admin().await.execute(sql.as_str()).await.map(|_| ())
                })
                .await
                .map_err(|_| format!("timed out after {DROP_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop the test database {}: {e}", self.name),
            Err(_) => eprintln!(
                "could not drop the test database {}: the thread panicked",
                self.name
            ),
        }
    }
}

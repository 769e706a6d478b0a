//! The load generator behind `tah bench`: starts (or finds) a tah server, drives it over HTTP
//! like real clients — C sessions × T sequential `?wait=true` turns, S SSE subscribers per
//! session that must each see every event exactly once — measures it from outside (latency,
//! throughput, `/proc` CPU and memory), then sends the same workload straight to the fake model
//! for the floor.
//!
//! - `server`: the server under test (spawned `tah serve`, found by its ready line) and the
//!   in-process fake model behind it.
//! - `client`: the HTTP client and the error tally.
//! - `subscriber`: SSE subscribers that check every event arrives once, in order.
//! - `sse`: the subscribers' lean SSE client (HTTP/1.1 by hand, no allocation per event).
//! - `workload`: the turn workload and the idle-sessions workload.
//! - `streams`: the idle-streams workload (many SSE connections held open).
//! - `floor`: the same turns sent straight to the fake model; `fanout`: the same subscribers
//!   against a fan-out with nothing of tah behind it.
//! - `report`: the figures, as text or JSON.

mod client;
mod fanout;
mod floor;
mod report;
mod server;
mod sse;
mod streams;
mod subscriber;
mod workload;

use std::time::Duration;

use anyhow::{anyhow, bail};
use tah::cli::BenchArgs;

use server::Environment;

/// The longest a single turn may take.
const TURN_TIMEOUT: Duration = Duration::from_secs(600);

/// A run of the load generator, start to report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.idle_sessions.is_none() && args.idle_streams.is_none() && args.turns == 0 {
        bail!("--turns must be at least 1");
    }
    if args.idle_sessions == Some(0) {
        bail!("--idle-sessions must be at least 1");
    }
    if args.idle_streams == Some(0) {
        bail!("--idle-streams must be at least 1");
    }
    // Every stream is a descriptor on each side; the spawned server inherits the limit.
    let fds = streams::raise_fd_limit();
    if let Some(n) = args.idle_streams {
        if (n as u64).saturating_add(512) > fds {
            bail!("--idle-streams {n} needs more open files than the limit allows ({fds})");
        }
    }
    let load_before = load_average();
    let env = Environment::start(&args).await?;
    let workload = async {
        match (args.idle_sessions, args.idle_streams) {
            (Some(n), _) => workload::idle(&args, &env, n).await,
            (None, Some(n)) => streams::idle_streams(&args, &env, n).await,
            (None, None) => workload::turns(&args, &env).await,
        }
    };
    // On Ctrl-C, still stop the server and remove the temporary directory.
    let result = tokio::select! {
        result = workload => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    let log = env.stop().await;
    let mut report = result?;
    report.load_average_1m = load_before;
    report.cpus = std::thread::available_parallelism().map_or(0, usize::from);
    report.server_log_errors = log.errors;
    report.server_log_warnings = log.warnings;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if report.errors > 0 {
        bail!("{} error(s) during the benchmark", report.errors);
    }
    Ok(())
}

/// The 1-minute load average (`/proc/loadavg`): other work on the machine skews every figure.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

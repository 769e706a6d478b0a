//! Measuring tools shipped in the binary: a fake OpenAI-compatible model server
//! ([`fake_model`], the hidden `tah fake-model`) and a load generator (`tah bench`) that drives
//! a tah server over HTTP like real clients and reports throughput, latency, CPU and memory,
//! side by side with the same workload sent straight to the model (the floor).

pub mod fake_model;
mod loadgen;
pub mod stats;

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

pub use fake_model::{serve_fake_model, spawn_fake_model, FakeKnobs};

#[derive(Debug, Clone, Args)]
pub struct FakeModelArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    /// Content chunks per text reply.
    #[arg(long, default_value_t = 50)]
    pub pieces: usize,

    /// Delay between two content chunks, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub piece_delay_ms: u64,

    /// Tool-call replies per turn before the text reply (counted from the `tool` messages after
    /// the last user message).
    #[arg(long, default_value_t = 1)]
    pub tool_calls: usize,

    /// Stamp every piece with its send time (`⏱<unix-micros>⏱ `), not only the first.
    #[arg(long)]
    pub stamp_every_piece: bool,
}

impl FakeModelArgs {
    pub fn knobs(&self) -> FakeKnobs {
        FakeKnobs {
            pieces: self.pieces,
            piece_delay: Duration::from_millis(self.piece_delay_ms),
            tool_calls: self.tool_calls,
            stamp_every_piece: self.stamp_every_piece,
        }
    }
}

/// The model behind the server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchProvider {
    /// The fake OpenAI-compatible model over HTTP (in-process unless `--server` is given).
    Fake,
    /// The server's built-in mock model (no network, no floor).
    Mock,
}

impl BenchProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            BenchProvider::Fake => "fake",
            BenchProvider::Mock => "mock",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub concurrency: usize,

    /// Sequential turns per session.
    #[arg(long, default_value_t = 20)]
    pub turns: usize,

    /// SSE subscribers per session, opened before the first turn; each must receive every
    /// event exactly once.
    #[arg(long, default_value_t = 0)]
    pub subscribers: usize,

    /// The model behind the server.
    #[arg(long, value_enum, default_value = "fake")]
    pub provider: BenchProvider,

    /// Fake model: content chunks per text reply.
    #[arg(long, default_value_t = 50)]
    pub pieces: usize,

    /// Fake model: delay between two content chunks, in milliseconds (mock provider: the
    /// server's --mock-delay-ms).
    #[arg(long, default_value_t = 0)]
    pub piece_delay_ms: u64,

    /// Fake model: tool-call replies per turn before the text reply.
    #[arg(long, default_value_t = 1)]
    pub tool_calls: usize,

    /// Use this running server (e.g. http://127.0.0.1:8080) instead of spawning one; CPU and
    /// memory figures then need --server-pid.
    #[arg(long)]
    pub server: Option<String>,

    /// The pid of the --server process, for CPU and memory from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// With --server: the fake model it talks to (e.g. http://127.0.0.1:9090/v1), for the
    /// floor; it must run with the same --pieces/--tool-calls.
    #[arg(long)]
    pub fake_model_url: Option<String>,

    /// With --server: the API token to send as a bearer token.
    #[arg(long, env = "TAH_BENCH_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

    /// Database of the spawned server (default: SQLite in a temporary directory).
    #[arg(long)]
    pub database_url: Option<String>,

    /// Extra argument for the spawned `tah serve` (repeatable), e.g. --server-arg=--max-steps=40.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,

    /// Log filter (RUST_LOG) of the spawned server.
    #[arg(long, default_value = "info")]
    pub server_log: String,

    /// Skip the floor (the workload sent straight to the fake model).
    #[arg(long)]
    pub no_floor: bool,

    /// Turns on one extra session before measuring, to warm connections and caches.
    #[arg(long, default_value_t = 2)]
    pub warmup_turns: usize,

    /// Instead of the turn workload: create N sessions, run one turn on each (so each has a
    /// live actor), then report the server's resident memory per idle session.
    #[arg(long)]
    pub idle_sessions: Option<usize>,

    /// Print the figures as one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number of at least 1".to_string()),
    }
}

impl BenchArgs {
    /// The fake model's knobs for this workload. With subscribers every piece is stamped, so
    /// that delta latency is sampled on every delta, not only the first of each reply.
    pub fn knobs(&self) -> FakeKnobs {
        FakeKnobs {
            pieces: self.pieces,
            piece_delay: Duration::from_millis(self.piece_delay_ms),
            tool_calls: self.tool_calls,
            stamp_every_piece: self.subscribers > 0,
        }
    }
}

/// `tah fake-model`: serves the fake model until killed.
pub async fn fake_model(args: FakeModelArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let address = listener.local_addr()?;
    eprintln!("listening on http://{address}");
    serve_fake_model(listener, args.knobs()).await?;
    Ok(())
}

/// `tah bench`: runs the workload and prints the report; fails if any request failed or any
/// subscriber missed or repeated an event.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    loadgen::run(args).await
}

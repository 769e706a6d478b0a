//! The idle-streams workload (`--idle-streams N`): N SSE connections held open on idle
//! sessions, to weigh a connection (the server's resident memory before and after) and to
//! check that holding them costs no CPU between heartbeats.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use futures::StreamExt;
use serde::Serialize;
use tah::cli::BenchArgs;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::client::Client;
use super::report::Report;
use super::server::Environment;
use crate::bench::stats::Proc;

/// Connections opened at once.
const OPENING: usize = 64;
/// The quiet interval measured between two heartbeats (the server's tick is 5 s).
const QUIET: Duration = Duration::from_secs(3);
/// The whole interval measured afterwards, a full heartbeat period with its beats.
const CYCLE: Duration = Duration::from_secs(10);

#[derive(Debug, Default, Serialize)]
pub struct StreamsReport {
    pub streams: usize,
    pub sessions: usize,
    /// How long opening every stream (to its first event) took.
    pub open_s: f64,
    pub rss_before_kb: u64,
    pub rss_after_kb: u64,
    pub kb_per_stream: f64,
    /// Server CPU over [`QUIET`] between two heartbeats, and the heartbeats received in it.
    pub quiet_s: f64,
    pub quiet_cpu_ms: f64,
    pub quiet_heartbeats: u64,
    /// Server CPU over [`CYCLE`], and the heartbeats received in it.
    pub cycle_s: f64,
    pub cycle_cpu_ms: f64,
    pub cycle_heartbeats: u64,
    /// The server's open SSE subscribers, from its metrics, with every stream open.
    pub server_sse_subscribers: Option<u64>,
}

/// Heartbeats received over all streams, and when the newest arrived (ms since `epoch`).
#[derive(Default)]
struct Beats {
    count: AtomicU64,
    last_ms: AtomicU64,
}

/// Holds one SSE stream open, counting its heartbeats, until the task is aborted; `ready`
/// fires at its first frame.
async fn hold(
    client: Arc<Client>,
    session: String,
    beats: Arc<Beats>,
    epoch: Instant,
    ready: oneshot::Sender<anyhow::Result<()>>,
) {
    let response = match client.open_events(&session, 0).await {
        Ok(response) => response,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    let mut body = response.bytes_stream();
    let mut ready = Some(ready);
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(()));
        }
        let n = chunk.windows(12).filter(|w| w == b": heartbeat\n").count() as u64;
        if n > 0 {
            beats.count.fetch_add(n, Ordering::Relaxed);
            let ms = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            beats.last_ms.store(ms, Ordering::Relaxed);
        }
    }
    if let Some(ready) = ready.take() {
        let _ = ready.send(Err(anyhow!(
            "the stream of {session} ended before its first frame"
        )));
    }
}

/// Raises this process's soft limit on open files to its hard limit (the spawned server
/// inherits it): N streams need N descriptors on each side.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            eprintln!("cannot raise the open-files limit: {error}");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn cpu_ms(pid: u32) -> anyhow::Result<f64> {
    Ok(Proc::Pid(pid).cpu_seconds()? * 1000.0)
}

pub async fn idle_streams(args: &BenchArgs, env: &Environment, n: usize) -> anyhow::Result<Report> {
    let pid = env
        .pid
        .ok_or_else(|| anyhow!("--idle-streams measures the server's memory: pass --server-pid"))?;
    let sessions_wanted = args.concurrency.min(n);
    let client = Arc::new(Client::new(&env.base, args.api_token.clone(), OPENING + 8)?);
    let mut sessions = Vec::with_capacity(sessions_wanted);
    for _ in 0..sessions_wanted {
        sessions.push(client.create_session().await?);
    }
    // Warm up: a few streams opened and closed, so pools and the allocator have grown.
    let beats = Arc::new(Beats::default());
    let epoch = Instant::now();
    let warm = open(&client, &sessions, OPENING.min(n), &beats, epoch).await?;
    warm.iter().for_each(|t| t.abort());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = Proc::Pid(pid).status_kb("VmRSS")?;

    let started = Instant::now();
    let held = open(&client, &sessions, n, &beats, epoch).await?;
    let open_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = Proc::Pid(pid).status_kb("VmRSS")?;
    let subscribers = client.metric("tah_sse_subscribers").await.ok().flatten();

    // A quiet interval: from just after a burst of heartbeats until before the next tick.
    let seen = beats.count.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(12);
    while beats.count.load(Ordering::Relaxed) == seen && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        let last = Duration::from_millis(beats.last_ms.load(Ordering::Relaxed));
        if epoch.elapsed().saturating_sub(last) >= Duration::from_millis(300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (quiet_cpu_ms, quiet_heartbeats, quiet_s) = measure(pid, &beats, QUIET).await?;
    let (cycle_cpu_ms, cycle_heartbeats, cycle_s) = measure(pid, &beats, CYCLE).await?;
    held.iter().for_each(|t| t.abort());

    let mut report = Report {
        mode: "idle-streams",
        provider: args.provider.as_str(),
        server: env.description.clone(),
        concurrency: sessions_wanted,
        wall_s: open_s,
        server_peak_rss_kb: Proc::Pid(pid).status_kb("VmHWM").ok(),
        streams: Some(StreamsReport {
            streams: n,
            sessions: sessions_wanted,
            open_s,
            rss_before_kb: rss_before,
            rss_after_kb: rss_after,
            kb_per_stream: (rss_after as f64 - rss_before as f64) / n as f64,
            quiet_s,
            quiet_cpu_ms,
            quiet_heartbeats,
            cycle_s,
            cycle_cpu_ms,
            cycle_heartbeats,
            server_sse_subscribers: subscribers,
        }),
        ..Report::default()
    };
    report.errors = client.errors.count();
    report.error_samples = client.errors.samples();
    Ok(report)
}

/// Server CPU (ms) and heartbeats received over `span`.
async fn measure(pid: u32, beats: &Beats, span: Duration) -> anyhow::Result<(f64, u64, f64)> {
    let cpu_before = cpu_ms(pid)?;
    let beats_before = beats.count.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(span).await;
    let cpu = cpu_ms(pid)? - cpu_before;
    let received = beats.count.load(Ordering::Relaxed) - beats_before;
    Ok((cpu, received, started.elapsed().as_secs_f64()))
}

/// Opens `n` streams spread over `sessions`, [`OPENING`] at a time, each until its first
/// frame; the tasks then hold them.
async fn open(
    client: &Arc<Client>,
    sessions: &[String],
    n: usize,
    beats: &Arc<Beats>,
    epoch: Instant,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::with_capacity(n);
    let mut pending = futures::stream::FuturesUnordered::new();
    for i in 0..n {
        let (ready, opened) = oneshot::channel();
        let session = sessions[i % sessions.len()].clone();
        tasks.push(tokio::spawn(hold(
            client.clone(),
            session,
            beats.clone(),
            epoch,
            ready,
        )));
        pending.push(opened);
        while pending.len() >= OPENING {
            first_frame(pending.next().await)?;
        }
    }
    while let Some(opened) = pending.next().await {
        first_frame(Some(opened))?;
    }
    Ok(tasks)
}

fn first_frame(
    opened: Option<Result<anyhow::Result<()>, oneshot::error::RecvError>>,
) -> anyhow::Result<()> {
    match opened {
        Some(Ok(Ok(()))) | None => Ok(()),
        Some(Ok(Err(error))) => Err(error.context("opening an idle stream")),
        Some(Err(_)) => Err(anyhow!("a stream task ended before its first frame")),
    }
}

//! The workloads: C sessions × T sequential `?wait=true` turns with S subscribers each
//! ([`turns`]), or N sessions with one turn each to weigh an idle session ([`idle`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use futures::StreamExt;
use tah::cli::{BenchArgs, BenchProvider};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::client::{Client, Errors};
use super::fanout::fanout_floor;
use super::floor::floor;
use super::micros;
use super::report::{IdleReport, Report, SubscriberReport};
use super::server::Environment;
use super::subscriber::{subscribe, Subscriber};
use crate::bench::stats::{Proc, Summary};

#[derive(Default)]
struct SessionOutcome {
    /// Turn latencies, in µs.
    latencies: Vec<u64>,
    turns_end: Option<Instant>,
    last_seq: i64,
    subscribers: Vec<Subscriber>,
}

async fn drive_session(
    client: Arc<Client>,
    turns: usize,
    subscribers: usize,
    stamps: bool,
) -> SessionOutcome {
    let mut outcome = SessionOutcome::default();
    let session = match client.create_session().await {
        Ok(id) => id,
        Err(error) => {
            client.errors.record(format!("{error:#}"));
            return outcome;
        }
    };
    let (target_tx, target_rx) = watch::channel(None);
    let mut tasks = Vec::with_capacity(subscribers);
    let mut readies = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        let (ready_tx, ready_rx) = oneshot::channel();
        tasks.push(tokio::spawn(subscribe(
            client.clone(),
            format!("/v1/sessions/{session}/events"),
            ready_tx,
            target_rx.clone(),
            stamps,
        )));
        readies.push(ready_rx);
    }
    for ready in readies {
        let _ = ready.await;
    }
    for turn in 1..=turns {
        let start = Instant::now();
        match client.run_turn(&session, turn).await {
            Ok(()) => outcome.latencies.push(micros(start.elapsed())),
            Err(error) => client.errors.record(format!("{error:#}")),
        }
    }
    outcome.turns_end = Some(Instant::now());
    match client.last_seq(&session).await {
        Ok(seq) => {
            outcome.last_seq = seq;
            let _ = target_tx.send(Some(seq));
        }
        Err(error) => client.errors.record(format!("{error:#}")),
    }
    drop(target_tx);
    for task in tasks {
        match task.await {
            Ok(sub) => {
                if !sub.complete(outcome.last_seq) {
                    client.errors.record(format!(
                        "subscriber of session {session}: {} events for last seq {} ({} gaps, {} duplicates{})",
                        sub.received,
                        outcome.last_seq,
                        sub.gaps,
                        sub.duplicates,
                        if sub.incomplete { ", incomplete" } else { "" }
                    ));
                }
                outcome.subscribers.push(sub);
            }
            Err(error) => client.errors.record(format!("subscriber task: {error}")),
        }
    }
    outcome
}

fn cpu(pid: Option<u32>) -> Option<f64> {
    pid.and_then(|pid| Proc::Pid(pid).cpu_seconds().ok())
}

pub async fn turns(args: &BenchArgs, env: &Environment) -> anyhow::Result<Report> {
    let c = args.concurrency;
    let s = args.subscribers;
    let client = Arc::new(
        Client::new(&env.base, args.api_token.clone(), c * (s + 1) + 8)?
            .events_via(args.subscribe_via.clone()),
    );
    let stamps = s > 0;
    if args.warmup_turns > 0 {
        drive_session(client.clone(), args.warmup_turns, 0, false).await;
    }

    let cpu_before = cpu(env.pid);
    let fake_before = cpu(env.fake_model_pid());
    let self_before = Proc::This.cpu_seconds().unwrap_or(0.0);
    let started = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|_| tokio::spawn(drive_session(client.clone(), args.turns, s, stamps)))
        .collect();
    let mut outcomes = Vec::with_capacity(c);
    for task in tasks {
        match task.await {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => client.errors.record(format!("session task: {error}")),
        }
    }
    let cpu_after = cpu(env.pid);
    let fake_after = cpu(env.fake_model_pid());
    let self_after = Proc::This.cpu_seconds().unwrap_or(0.0);
    let ended = outcomes
        .iter()
        .filter_map(|o| o.turns_end)
        .max()
        .unwrap_or_else(Instant::now);
    let wall = ended
        .saturating_duration_since(started)
        .as_secs_f64()
        .max(1e-9);

    let mut latencies: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    let mut deltas: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.subscribers.iter().flat_map(|s| s.deltas.iter().copied()))
        .collect();
    let turns_completed = latencies.len();
    let events: i64 = outcomes.iter().map(|o| o.last_seq).sum();
    let subs = outcomes.iter().flat_map(|o| o.subscribers.iter());
    let subscriber_report = (s > 0).then(|| {
        let mut r = SubscriberReport::default();
        for sub in subs {
            r.streams += 1;
            r.events_received += sub.received;
            r.gaps += sub.gaps;
            r.duplicates += sub.duplicates;
            r.reconnects += sub.reconnects;
            r.incomplete += u64::from(sub.incomplete);
        }
        r
    });

    let mut report = Report {
        mode: "turns",
        provider: args.provider.as_str(),
        server: env.description.clone(),
        concurrency: c,
        turns_per_session: args.turns,
        subscribers_per_session: s,
        pieces: args.reply.pieces,
        piece_delay_ms: args.reply.piece_delay_ms,
        tool_calls: args.reply.tool_calls,
        turns_completed,
        wall_s: wall,
        turns_per_s: turns_completed as f64 / wall,
        turn_latency: Summary::of_micros(&mut latencies),
        delta_to_client: Summary::of_micros(&mut deltas),
        events_persisted: events,
        events_per_s: events as f64 / wall,
        loadgen_cpu_s: self_after - self_before,
        fake_model_in_process: env.fake_model_in_process(),
        fake_model_cpu_s: fake_before.zip(fake_after).map(|(b, a)| a - b),
        subscribers: subscriber_report,
        ..Report::default()
    };
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        report.server_cpu_s = Some(after - before);
        if turns_completed > 0 {
            report.server_cpu_ms_per_turn =
                Some((after - before) * 1000.0 / turns_completed as f64);
        }
    }
    report.server_peak_rss_kb = env
        .pid
        .and_then(|pid| Proc::Pid(pid).status_kb("VmHWM").ok());

    let floor_client_errors = Errors::default();
    if !args.no_floor && args.provider == BenchProvider::Fake {
        match &env.fake_url {
            Some(url) => {
                let floor = floor(args, url, &floor_client_errors).await?;
                if let (Some(server), Some(model)) = (&report.turn_latency, &floor.turn_latency) {
                    report.overhead_p50_ms = Some(server.p50_ms - model.p50_ms);
                    if model.p50_ms > 0.0 {
                        report.ratio_p50 = Some(server.p50_ms / model.p50_ms);
                    }
                }
                report.floor = Some(floor);
            }
            None => report
                .notes
                .push("no floor: pass --fake-model-url with --server".to_string()),
        }
    }
    let mut floor_errors = floor_client_errors.count();
    if !args.no_floor && args.provider == BenchProvider::Fake && s > 0 {
        let fanout = fanout_floor(args).await?;
        floor_errors += fanout.errors + fanout.incomplete;
        let (floor_events, events) = (fanout.events_received, report.events_persisted * s as i64);
        if floor_events as i64 != events {
            report.notes.push(format!(
                "the fan-out floor sent {floor_events} events to its subscribers, the server {events}: \
                 its turns are shaped for 1 tool call per turn"
            ));
        }
        report.fanout_floor = Some(fanout);
    }
    report.errors = client.errors.count() + floor_errors;
    report.error_samples = client.errors.samples();
    report.error_samples.extend(floor_client_errors.samples());
    Ok(report)
}
pub async fn idle(args: &BenchArgs, env: &Environment, n: usize) -> anyhow::Result<Report> {
    let pid = env.pid.ok_or_else(|| {
        anyhow!("--idle-sessions measures the server's memory: pass --server-pid")
    })?;
    let client = Arc::new(Client::new(
        &env.base,
        args.api_token.clone(),
        args.concurrency + 8,
    )?);
    // Warm up pools, caches and the allocator with a few sessions first.
    let warm = futures::stream::iter(0..args.concurrency.max(4))
        .map(|_| drive_session(client.clone(), 1, 0, false))
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>();
    warm.await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = Proc::Pid(pid).status_kb("VmRSS")?;
    let started = Instant::now();
    let outcomes = futures::stream::iter(0..n)
        .map(|_| drive_session(client.clone(), 1, 0, false))
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = Proc::Pid(pid).status_kb("VmRSS")?;
    let mut latencies: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    let mut report = Report {
        mode: "idle-sessions",
        provider: args.provider.as_str(),
        server: env.description.clone(),
        concurrency: args.concurrency,
        turns_per_session: 1,
        pieces: args.reply.pieces,
        piece_delay_ms: args.reply.piece_delay_ms,
        tool_calls: args.reply.tool_calls,
        turns_completed: latencies.len(),
        wall_s: elapsed,
        turns_per_s: latencies.len() as f64 / elapsed.max(1e-9),
        turn_latency: Summary::of_micros(&mut latencies),
        events_persisted: outcomes.iter().map(|o| o.last_seq).sum(),
        server_peak_rss_kb: Proc::Pid(pid).status_kb("VmHWM").ok(),
        idle: Some(IdleReport {
            sessions: n,
            rss_before_kb: rss_before,
            rss_after_kb: rss_after,
            kb_per_session: (rss_after as f64 - rss_before as f64) / n as f64,
        }),
        ..Report::default()
    };
    report.events_per_s = report.events_persisted as f64 / elapsed.max(1e-9);
    report.errors = client.errors.count();
    report.error_samples = client.errors.samples();
    Ok(report)
}

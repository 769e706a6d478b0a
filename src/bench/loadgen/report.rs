//! The report: every figure of a run, rendered as text or serialised as one JSON object.

use std::fmt::Write as _;

use serde::Serialize;

use crate::bench::stats::Summary;

#[derive(Debug, Default, Serialize)]
pub struct Floor {
    pub wall_s: f64,
    pub turns_per_s: f64,
    pub turn_latency: Option<Summary>,
}

/// The same subscribers against a fan-out with nothing of tah behind it (`tah fake-model`'s
/// floor streams, in a process of its own).
#[derive(Debug, Default, Serialize)]
pub struct FanoutFloor {
    pub streams: u64,
    pub events_received: u64,
    /// Streams that missed, repeated or did not get every event.
    pub incomplete: u64,
    pub wall_s: f64,
    /// CPU of the floor's process.
    pub server_cpu_s: f64,
    /// CPU of this process (the subscribers) during the floor's run.
    pub subscribers_cpu_s: f64,
    pub delta_to_client: Option<Summary>,
    pub errors: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct SubscriberReport {
    pub streams: u64,
    pub events_received: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub incomplete: u64,
    pub reconnects: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct IdleReport {
    pub sessions: usize,
    pub rss_before_kb: u64,
    pub rss_after_kb: u64,
    pub kb_per_session: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub provider: &'static str,
    pub server: String,
    pub concurrency: usize,
    pub turns_per_session: usize,
    pub subscribers_per_session: usize,
    pub pieces: usize,
    pub piece_delay_ms: u64,
    pub tool_calls: usize,
    pub turns_completed: usize,
    pub wall_s: f64,
    pub turns_per_s: f64,
    /// Client-side time of `POST …/runs?wait=true`.
    pub turn_latency: Option<Summary>,
    /// From a piece leaving the fake model to its `agent.assistant-stream` frame at a
    /// subscriber.
    pub delta_to_client: Option<Summary>,
    /// Sum over the measured sessions of their last event seq.
    pub events_persisted: i64,
    pub events_per_s: f64,
    pub server_cpu_s: Option<f64>,
    pub server_cpu_ms_per_turn: Option<f64>,
    pub server_peak_rss_kb: Option<u64>,
    /// CPU of this process (load generator, and the in-process fake model) during the run.
    pub loadgen_cpu_s: f64,
    pub fake_model_in_process: bool,
    /// CPU of the fake model's own process during the run, when it has one.
    pub fake_model_cpu_s: Option<f64>,
    pub floor: Option<Floor>,
    /// Server turn latency p50 − floor turn latency p50.
    pub overhead_p50_ms: Option<f64>,
    /// Server turn latency p50 / floor turn latency p50.
    pub ratio_p50: Option<f64>,
    pub subscribers: Option<SubscriberReport>,
    pub fanout_floor: Option<FanoutFloor>,
    pub idle: Option<IdleReport>,
    pub streams: Option<super::streams::StreamsReport>,
    /// The machine's 1-minute load average before the run, and its CPUs.
    pub load_average_1m: Option<f64>,
    pub cpus: usize,
    pub server_log_errors: u64,
    pub server_log_warnings: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub notes: Vec<String>,
}

/// A line of latency figures, `label` first, when they were measured.
fn latency_line(out: &mut String, label: &str, summary: Option<&Summary>) {
    if let Some(s) = summary {
        let _ = writeln!(
            out,
            "{label}p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (mean {:.2} ms, n={})",
            s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms, s.count
        );
    }
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tah bench — {} ({} provider)",
            self.server, self.provider
        );
        if let Some(load) = self.load_average_1m {
            let _ = writeln!(
                out,
                "machine:          {} CPUs, 1-min load average {load:.2} before the run",
                self.cpus
            );
        }
        let model = if self.provider == "mock" {
            format!("mock model, piece delay {} ms", self.piece_delay_ms)
        } else {
            format!(
                "{} tool call(s) + {} pieces per turn, piece delay {} ms",
                self.tool_calls, self.pieces, self.piece_delay_ms
            )
        };
        if let Some(streams) = &self.streams {
            let _ = writeln!(
                out,
                "workload:         {} idle SSE streams over {} session(s), opened in {:.2} s",
                streams.streams, streams.sessions, streams.open_s
            );
            let _ = writeln!(
                out,
                "server RSS:       {} kB before → {} kB after, {:.2} kB per stream ({} open by the server's metrics)",
                streams.rss_before_kb,
                streams.rss_after_kb,
                streams.kb_per_stream,
                streams
                    .server_sse_subscribers
                    .map_or_else(|| "?".to_string(), |n| n.to_string())
            );
            let _ = writeln!(
                out,
                "quiet interval:   {:.0} ms of server CPU in {:.1} s, {} heartbeats received",
                streams.quiet_cpu_ms, streams.quiet_s, streams.quiet_heartbeats
            );
            let _ = writeln!(
                out,
                "heartbeat cycle:  {:.0} ms of server CPU in {:.1} s, {} heartbeats received",
                streams.cycle_cpu_ms, streams.cycle_s, streams.cycle_heartbeats
            );
        } else if let Some(idle) = &self.idle {
            let _ = writeln!(
                out,
                "workload:         {} sessions, one turn each ({model}), {} at a time",
                idle.sessions, self.concurrency
            );
            let _ = writeln!(
                out,
                "created in:       {:.2} s ({:.0} turns/s)",
                self.wall_s, self.turns_per_s
            );
            let _ = writeln!(
                out,
                "server RSS:       {} kB before → {} kB after, {:.1} kB per idle session",
                idle.rss_before_kb, idle.rss_after_kb, idle.kb_per_session
            );
        } else {
            let _ = writeln!(
                out,
                "workload:         {} session(s) × {} turns ({model}), {} SSE subscriber(s) per session",
                self.concurrency, self.turns_per_session, self.subscribers_per_session
            );
            let _ = writeln!(
                out,
                "turns:            {} completed in {:.3} s → {:.1} turns/s",
                self.turns_completed, self.wall_s, self.turns_per_s
            );
        }
        latency_line(&mut out, "turn latency:     ", self.turn_latency.as_ref());
        if let Some(floor) = &self.floor {
            latency_line(&mut out, "floor (model):    ", floor.turn_latency.as_ref());
            let _ = writeln!(
                out,
                "floor throughput: {:.1} turns/s ({:.3} s)",
                floor.turns_per_s, floor.wall_s
            );
        }
        if let (Some(overhead), Some(ratio)) = (self.overhead_p50_ms, self.ratio_p50) {
            let _ = writeln!(
                out,
                "overhead:         {overhead:+.2} ms per turn at p50 (server/floor = {ratio:.2}×)"
            );
        }
        latency_line(
            &mut out,
            "delta → client:   ",
            self.delta_to_client.as_ref(),
        );
        if let Some(floor) = &self.fanout_floor {
            latency_line(
                &mut out,
                "floor (fan-out):  ",
                floor.delta_to_client.as_ref(),
            );
            let _ = writeln!(
                out,
                "floor fan-out:    {} streams, {} events in {:.3} s, {} incomplete; CPU: its server {:.2} s, the subscribers {:.2} s",
                floor.streams,
                floor.events_received,
                floor.wall_s,
                floor.incomplete,
                floor.server_cpu_s,
                floor.subscribers_cpu_s
            );
        }
        if self.streams.is_none() {
            let _ = writeln!(
                out,
                "events persisted: {} ({:.0} events/s)",
                self.events_persisted, self.events_per_s
            );
        }
        match (self.server_cpu_s, self.server_cpu_ms_per_turn) {
            (Some(cpu), Some(per_turn)) => {
                let _ = writeln!(
                    out,
                    "server CPU:       {cpu:.2} s → {per_turn:.3} ms per turn"
                );
            }
            (Some(cpu), None) => {
                let _ = writeln!(out, "server CPU:       {cpu:.2} s");
            }
            _ => {}
        }
        if let Some(kb) = self.server_peak_rss_kb {
            let _ = writeln!(
                out,
                "server peak RSS:  {:.1} MB (VmHWM)",
                kb as f64 / 1024.0
            );
        }
        if self.idle.is_none() && self.streams.is_none() {
            let _ = writeln!(
                out,
                "load generator:   {:.2} s CPU (this process{})",
                self.loadgen_cpu_s,
                if self.fake_model_in_process {
                    ", with the in-process fake model"
                } else {
                    ""
                }
            );
        }
        if let Some(cpu) = self.fake_model_cpu_s {
            let _ = writeln!(out, "fake model:       {cpu:.2} s CPU (its own process)");
        }
        if let Some(s) = &self.subscribers {
            let _ = writeln!(
                out,
                "subscribers:      {} streams, {} events, {} gaps, {} duplicates, {} incomplete, {} reconnects",
                s.streams, s.events_received, s.gaps, s.duplicates, s.incomplete, s.reconnects
            );
        }
        if self.server_log_errors + self.server_log_warnings > 0 {
            let _ = writeln!(
                out,
                "server log:       {} ERROR, {} WARN lines",
                self.server_log_errors, self.server_log_warnings
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "note:             {note}");
        }
        let _ = writeln!(out, "errors:           {}", self.errors);
        for sample in &self.error_samples {
            let _ = writeln!(out, "  - {sample}");
        }
        out
    }
}

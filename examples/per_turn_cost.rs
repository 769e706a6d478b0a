//! The CPU that metrics and (disabled) trace spans add to one turn (BENCHMARKS.md), measured
//! apart from the server: a tight loop over exactly the calls one `tah bench` turn makes
//! (1 tool call + 50 pieces: two LLM requests, the second streaming 50 pieces, one tool call,
//! one run, and `--commits` store commits).
//!
//! - **metrics**: `tah::metrics`'s counting calls, as the agent loop, the session actor and
//!   the writer make them.
//! - **spans, no exporter**: the trace spans and their records under a subscriber set up as
//!   `tah serve` sets it up without `OTEL_EXPORTER_OTLP_ENDPOINT` (the log layer, which leaves
//!   the trace spans out, writing to nowhere): each span is disabled.
//!
//! Warm caches and no contention, so these are lower bounds of what a turn pays; the cost of
//! exporting spans is measured with `tah bench` instead. Each figure is the median of 3 runs
//! of `--turns` turns:
//!
//! ```sh
//! cargo run --release --example per_turn_cost -- --commits 6
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::json;
use tah::llm::ModelReply;
use tah::model::{FinishReason, RunKind, RunRecord, RunStatus, ToolCall, Usage};
use tah::tools::ToolOutput;
use tah::{metrics, telemetry};
use tracing::Span;
use tracing_subscriber::filter::{filter_fn, FilterExt as _};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};
use uuid::Uuid;

const PIECES: usize = 50;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

/// The metrics one turn records.
fn metrics_of_a_turn(commits: usize, usage: Usage) {
    let took = Duration::from_micros(300);
    let tool_reply = metrics::LlmRequestTimer::start("openai", "default");
    tool_reply.finish("ok", Some(usage));
    metrics::tool_call("list_files", false, took);
    let mut text_reply = metrics::LlmRequestTimer::start("openai", "default");
    for _ in 0..PIECES {
        text_reply.piece();
    }
    text_reply.finish("ok", Some(usage));
    for _ in 0..commits {
        metrics::store_commit(1, took);
    }
    metrics::run_ended("completed", "default", took);
}

/// The spans one turn makes, and what is recorded on them.
fn spans_of_a_turn(session: Uuid, run: &RunRecord, call: &ToolCall, reply: &ModelReply) {
    let output = ToolOutput {
        output: String::new(),
        is_error: false,
        artifacts: Vec::new(),
    };
    let span = telemetry::run_span(
        &Span::none(),
        session,
        run.id,
        "openai",
        "fake",
        &Default::default(),
    );
    let _entered = span.enter();
    for _ in 0..2 {
        let chat = telemetry::chat_span(Some(session), ("openai", "fake", "default"), &[]);
        telemetry::chat_done(&chat, reply);
    }
    let tool = telemetry::tool_span(Some(session), call);
    telemetry::tool_finished(&tool, &output);
    telemetry::run_ended(&span, run);
}

/// Nanoseconds per turn of `turn`, the median of 3 runs of `turns`.
fn per_turn(turns: usize, mut turn: impl FnMut()) -> (f64, [f64; 3]) {
    let mut runs = [0.0; 3];
    for run in &mut runs {
        let started = Instant::now();
        for _ in 0..turns {
            turn();
        }
        *run = started.elapsed().as_nanos() as f64 / turns as f64;
    }
    let mut sorted = runs;
    sorted.sort_by(f64::total_cmp);
    (sorted[1], runs)
}

fn main() {
    let turns = arg("--turns", 200_000);
    let commits = arg("--commits", 6);
    // As `tah serve` sets it up without an exporter.
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
    let not_traces = filter_fn(|metadata| !telemetry::is_trace_span(metadata));
    tracing_subscriber::registry()
        .with(log.with_filter(EnvFilter::new("info,rmcp=warn").and(not_traces)))
        .init();

    let usage = Usage {
        input_tokens: 120,
        output_tokens: 60,
    };
    let (session, run_id) = (Uuid::now_v7(), Uuid::now_v7());
    let run = RunRecord {
        id: run_id,
        session_id: session,
        kind: RunKind::Run,
        status: RunStatus::Completed,
        input: Some("bench turn 1".to_string()),
        text: Some("done".to_string()),
        finish_reason: Some(FinishReason::Model("stop".to_string())),
        usage,
        steps: 2,
        error: None,
        start_seq: 1,
        created_at: chrono::Utc::now(),
        finished_at: Some(chrono::Utc::now()),
        client_tools: Vec::new(),
    };
    let call = ToolCall {
        id: "call_1".to_string(),
        name: "list_files".to_string(),
        arguments: json!({"path": "."}),
    };
    let reply = ModelReply {
        text: "done".to_string(),
        finish_reason: "stop".to_string(),
        usage,
        ..ModelReply::default()
    };
    println!("{turns} turns of 2 LLM requests ({PIECES} pieces), 1 tool call, {commits} commits");
    let (metrics, runs) = per_turn(turns, || metrics_of_a_turn(commits, black_box(usage)));
    println!("metrics:               {metrics:>7.0} ns per turn {runs:.0?}");
    let (spans, runs) = per_turn(turns, || {
        spans_of_a_turn(
            session,
            black_box(&run),
            black_box(&call),
            black_box(&reply),
        )
    });
    println!("spans, no exporter:    {spans:>7.0} ns per turn {runs:.0?}");
}

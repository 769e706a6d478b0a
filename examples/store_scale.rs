//! The store at scale (BENCHMARKS.md): an events page of 500 from a 1,000,000-event database
//! (target ≤ 10 ms) and the server's start-up with 10,000 sessions stored (target ≤ 1 s).
//!
//! Creates a SQLite database in a temporary directory through `tah::store::open`, fills it with
//! 10,000 sessions (each with its system message and `session.created` event) and 1,000,000
//! events, 250,000 of them in one session, in commits of 5,000 ops. Then it times
//! `Store::events(session, after, 500)` at the start, middle and end of that session's log
//! (median of 20 each). Then it starts `target/release/tah serve` on the database five times
//! with the database in the page cache (warm) and five times after evicting its files from the
//! page cache (cold, with GNU `dd iflag=nocache`), and times each start from spawning the
//! process to its ready line (`{"listening":…}` on stdout) and to the first `GET /readyz`
//! answered 200; on the last warm server it times the same pages over HTTP
//! (`GET /v1/sessions/{id}/events?after=…&limit=500`, median of 20 each).
//!
//! The server binary must be built first:
//!
//! ```sh
//! cargo build --release && cargo run --release --example store_scale
//! ```
//!
//! `--keep` keeps the database (its path is printed) instead of deleting it at the end.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde_json::json;
use tah::app::ReadyLine;
use tah::model::{
    Event, EventKind, FinishReason, Message, Role, RunKind, SessionRecord, SessionState, ToolCall,
    Usage,
};
use tah::store::{Store, WriteOp};
use uuid::Uuid;

const SESSIONS: usize = 10_000;
const EVENTS: usize = 1_000_000;
const BIG_SESSION_EVENTS: usize = 250_000;
const OPS_PER_COMMIT: usize = 5_000;
const PAGE: i64 = 500;
const RUNS: usize = 20;
const STARTS: usize = 5;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let mid = samples.len() / 2;
    if samples.len().is_multiple_of(2) {
        (samples[mid - 1] + samples[mid]) / 2
    } else {
        samples[mid]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The events of one turn as the server writes them: state changes, the run, a user message,
/// an LLM step with a tool call, the tool, a streamed answer of 50 pieces, a checkpoint.
fn turn_events(turn: usize) -> Vec<EventKind> {
    let run_id = tah::model::new_id();
    let (step1, step2) = (tah::model::new_id(), tah::model::new_id());
    let call = ToolCall {
        id: format!("call_{turn}"),
        name: "read_file".into(),
        arguments: json!({ "path": format!("src/module_{}.rs", turn % 97) }),
    };
    let usage = Usage {
        input_tokens: 1_800,
        output_tokens: 120,
    };
    let answer = "The writer commits each batch in one transaction; ".repeat(6);
    let mut kinds = vec![
        EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        },
        EventKind::AgentStarted {
            run_id,
            kind: RunKind::Run,
        },
        EventKind::UserMessage {
            message: Message::new(
                Role::User,
                format!(
                    "turn {turn}: {}",
                    "please look at the module and explain it ".repeat(4)
                ),
            ),
            queued: false,
        },
        EventKind::LlmStarted { step_id: step1 },
        EventKind::LlmCompleted {
            step_id: step1,
            message: Message::assistant("", vec![call.clone()]),
            finish_reason: FinishReason::Model("tool_calls".into()),
            usage,
            cost_usd: None,
        },
        EventKind::ToolStarted {
            step_id: step1,
            call: call.clone(),
        },
        EventKind::ToolFinished {
            step_id: step1,
            call_id: call.id.clone(),
            output: "fn main() {\n    println!(\"hello\");\n}\n".repeat(16),
            is_error: false,
        },
        EventKind::LlmStarted { step_id: step2 },
    ];
    for piece in 0..50 {
        kinds.push(EventKind::AssistantStream {
            step_id: step2,
            text: format!("piece {piece} "),
        });
    }
    kinds.extend([
        EventKind::LlmCompleted {
            step_id: step2,
            message: Message::assistant(answer.clone(), Vec::new()),
            finish_reason: FinishReason::Model("stop".into()),
            usage,
            cost_usd: None,
        },
        EventKind::Checkpoint {
            checkpoint_id: tah::model::new_id(),
            step_id: Some(step2),
        },
        EventKind::AgentFinished {
            run_id,
            text: answer,
            finish_reason: FinishReason::Model("stop".into()),
            usage,
        },
        EventKind::StateChanged {
            from: SessionState::Running,
            to: SessionState::Idle,
        },
    ]);
    kinds
}

/// Appends a session with `events` events in all (the first is `session.created`).
fn session_ops(id: Uuid, events: usize, at: &mut DateTime<Utc>, ops: &mut Vec<WriteOp>) {
    let record = SessionRecord {
        id,
        parent_id: None,
        title: Some(format!("session {id}")),
        metadata: json!({}),
        system_prompt: None,
        state: SessionState::Idle,
        error: None,
        message_count: 1,
        last_seq: events as i64,
        usage: Usage::default(),
        last_run_id: None,
        created_at: *at,
        updated_at: *at,
        tenant: tah::model::DEFAULT_TENANT.to_string(),
        owner: None,
        options: Default::default(),
    };
    ops.push(WriteOp::InsertSession(record));
    let mut system = Message::new(Role::System, "You are a coding agent. ".repeat(20));
    system.created_at = *at;
    ops.push(WriteOp::InsertMessage {
        session_id: id,
        message: system,
    });
    let mut kinds = vec![EventKind::SessionCreated {
        session_id: id,
        title: None,
        agent: None,
        model: None,
    }];
    let mut turn = 0;
    while kinds.len() < events {
        kinds.extend(turn_events(turn));
        turn += 1;
    }
    kinds.truncate(events);
    for (i, kind) in kinds.into_iter().enumerate() {
        *at += chrono::Duration::milliseconds(3);
        ops.push(WriteOp::insert_event(Event::new(
            id,
            i as i64 + 1,
            kind,
            *at,
        )));
    }
}

async fn fill(store: &dyn Store) -> anyhow::Result<Uuid> {
    let start = Instant::now();
    let big = tah::model::new_id();
    // The other sessions share the rest of the events evenly.
    let others = SESSIONS - 1;
    let rest = EVENTS - BIG_SESSION_EVENTS;
    let mut at = tah::model::now() - chrono::Duration::days(30);
    let mut ops = Vec::with_capacity(BIG_SESSION_EVENTS + 2);
    let mut written = 0;
    for s in 0..SESSIONS {
        let (id, events) = if s == 0 {
            (big, BIG_SESSION_EVENTS)
        } else {
            let i = s - 1;
            (
                tah::model::new_id(),
                rest / others + usize::from(i < rest % others),
            )
        };
        session_ops(id, events, &mut at, &mut ops);
        written += events;
        if ops.len() >= OPS_PER_COMMIT || s == SESSIONS - 1 {
            for chunk in ops.chunks(OPS_PER_COMMIT) {
                store.commit(&[chunk]).await?;
            }
            ops.clear();
        }
    }
    if written != EVENTS {
        bail!("wrote {written} events, meant {EVENTS}");
    }
    let elapsed = start.elapsed();
    println!(
        "filled: {SESSIONS} sessions, {EVENTS} events ({BIG_SESSION_EVENTS} in session {big}) \
         in {:.1} s ({:.0} events/s, {OPS_PER_COMMIT} ops per commit)",
        elapsed.as_secs_f64(),
        EVENTS as f64 / elapsed.as_secs_f64()
    );
    Ok(big)
}

fn positions() -> [(&'static str, i64); 3] {
    let n = BIG_SESSION_EVENTS as i64;
    [("start", 0), ("middle", n / 2), ("end", n - PAGE)]
}

async fn time_store_pages(store: &dyn Store, session: Uuid) -> anyhow::Result<()> {
    for (name, after) in positions() {
        let mut samples = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let start = Instant::now();
            let page = store.events(session, after, PAGE).await?;
            samples.push(start.elapsed());
            if page.len() != PAGE as usize || page[0].seq != after + 1 {
                bail!("page after {after}: {} events", page.len());
            }
        }
        let first = samples[0];
        println!(
            "Store::events page of {PAGE} at the {name} (after={after}): median {:.2} ms \
             (first {:.2} ms, {RUNS} runs)",
            ms(median(samples)),
            ms(first)
        );
    }
    Ok(())
}

struct Server {
    child: tokio::process::Child,
    base: String,
    listening: Duration,
    ready: Duration,
}

async fn start_server(
    exe: &std::path::Path,
    db: &std::path::Path,
    workspace: &std::path::Path,
    http: &reqwest::Client,
) -> anyhow::Result<Server> {
    let mut command = tokio::process::Command::new(exe);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TAH_") {
            command.env_remove(name);
        }
    }
    let start = Instant::now();
    let mut child = command
        .arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--database-url")
        .arg(format!("sqlite://{}", db.display()))
        .arg("--workspace")
        .arg(workspace)
        .arg("--provider")
        .arg("mock")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning {}", exe.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let Some(ready) = ReadyLine::read(stdout).await else {
        bail!("the server exited before listening");
    };
    let address = ready.listening;
    let listening = start.elapsed();
    let base = format!("http://{address}");
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the server was not ready within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ready = start.elapsed();
    Ok(Server {
        child,
        base,
        listening,
        ready,
    })
}

/// Drops the database's files from the page cache (GNU `dd iflag=nocache count=0`), after
/// writing them out. False when that is not possible here.
async fn evict(db: &std::path::Path) -> bool {
    let mut files = vec![db.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        files.push(name.into());
    }
    for file in files.iter().filter(|f| f.exists()) {
        let synced = tokio::process::Command::new("sync")
            .arg(file)
            .status()
            .await
            .is_ok_and(|s| s.success());
        let dropped = tokio::process::Command::new("dd")
            .arg(format!("if={}", file.display()))
            .args(["iflag=nocache", "count=0", "status=none"])
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !(synced && dropped) {
            return false;
        }
    }
    true
}

async fn stop_server(mut server: Server) -> anyhow::Result<()> {
    if let Some(pid) = server.child.id() {
        tokio::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await?;
    }
    server.child.wait().await?;
    Ok(())
}

async fn time_http_pages(http: &reqwest::Client, base: &str, session: Uuid) -> anyhow::Result<()> {
    for (name, after) in positions() {
        let url = format!("{base}/v1/sessions/{session}/events?after={after}&limit={PAGE}");
        let mut samples = Vec::with_capacity(RUNS);
        let mut bytes = 0;
        for _ in 0..RUNS {
            let start = Instant::now();
            let response = http.get(&url).send().await?.error_for_status()?;
            let body = response.bytes().await?;
            samples.push(start.elapsed());
            bytes = body.len();
        }
        println!(
            "GET …/events?after={after}&limit={PAGE} ({name}): median {:.2} ms over HTTP \
             ({:.0} KB, {RUNS} runs)",
            ms(median(samples)),
            bytes as f64 / 1024.0
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let keep = std::env::args().any(|a| a == "--keep");
    let exe = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .context("no parent directory of the example")?
        .join("tah");
    if !exe.exists() {
        bail!(
            "{} not found: build the server first (cargo build --release)",
            exe.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("scale.db");
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    std::fs::write(workspace.join("README.md"), "# workspace\n")?;

    let opened = tah::store::open(&format!("sqlite://{}", db.display()), Uuid::nil()).await?;
    let store = opened.store;
    let big = fill(store.as_ref()).await?;
    time_store_pages(store.as_ref(), big).await?;
    drop(store);
    let size: u64 = std::fs::read_dir(dir.path())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "database: {} ({:.0} MB with its WAL)",
        db.display(),
        size as f64 / 1e6
    );

    let http = reqwest::Client::builder().no_proxy().build()?;
    // Warm: the database is in the page cache (it was just written); cold: its files are
    // evicted from the page cache before each start.
    for cold in [false, true] {
        let label = if cold { "cold" } else { "warm" };
        let mut listening = Vec::with_capacity(STARTS);
        let mut ready = Vec::with_capacity(STARTS);
        for i in 0..STARTS {
            if cold && !evict(&db).await {
                println!("cold starts skipped: cannot evict the database from the page cache");
                break;
            }
            let server = start_server(&exe, &db, &workspace, &http).await?;
            println!(
                "{label} start {}: listening after {:.1} ms, /readyz 200 after {:.1} ms",
                i + 1,
                ms(server.listening),
                ms(server.ready)
            );
            listening.push(server.listening);
            ready.push(server.ready);
            if !cold && i + 1 == STARTS {
                time_http_pages(&http, &server.base, big).await?;
            }
            stop_server(server).await?;
        }
        if !listening.is_empty() {
            let starts = ready.len();
            println!(
                "start-up ({label}) with {SESSIONS} sessions and {EVENTS} events: median {:.1} ms \
                 to listening, {:.1} ms to ready ({starts} starts)",
                ms(median(listening)),
                ms(median(ready)),
            );
        }
    }
    if keep {
        let kept = dir.keep();
        println!("kept {}", kept.display());
    }
    Ok(())
}

//! The `tah` binary: parses the command line, sets up logging, and serves until SIGINT or
//! SIGTERM (see [`tah::app::Application`]); `tah bench` and the hidden `tah fake-model` are the
//! load generator and the fake model in [`bench`], and `tah healthcheck` is the probe in
//! [`healthcheck`], which live here rather than in the library. `tah sandbox-exec`, not a
//! command of `tah --help`, is the Landlock sandbox's helper (`tah::tools::sandbox::landlock`).

mod bench;
mod healthcheck;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use tah::app::{Application, ReadyLine};
use tah::cli::{Cli, Command, KeysArgs, KeysCommand, LogFormat, ServeArgs};
use tah::config::Settings;
use tah::telemetry::{self, Traces};
use tracing_subscriber::filter::{filter_fn, FilterExt as _};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// jemalloc rather than the system's malloc: measured, an idle SSE connection holds about
/// 9.6 KB instead of 12.9, and at mock C=64 a turn costs about a fifth less CPU, for 5–6 MB
/// more peak RSS under load (`BENCHMARKS.md`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // The Landlock sandbox's helper (`tah sandbox-exec`, run by the server for each `shell`
    // call; not a command of `tah --help`): before anything else, since it forks its command
    // and must have no other thread.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "sandbox-exec")
    {
        return tah::tools::sandbox::landlock::helper_main(std::env::args_os().skip(2));
    }
    let cli = Cli::parse();
    let command = match cli.command {
        // Inside a sandbox, before any runtime: plain threads.
        Command::EgressBridge(args) => {
            return match tah::tools::egress::bridge(args.listen, &args.socket) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("tah egress-bridge: {error}");
                    ExitCode::FAILURE
                }
            };
        }
        command => command,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("tah: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::FakeModel(args) => runtime.block_on(bench::fake_model(args)),
        Command::Bench(args) => runtime.block_on(bench::bench(*args)),
        Command::Keys(args) => runtime.block_on(keys(args)),
        Command::Acp(args) => runtime.block_on(async {
            let options = tah::acp::AcpOptions {
                server: args.server,
                agent: args.agent,
                token: args.token,
            };
            tah::acp::run(options).await.map_err(anyhow::Error::msg)
        }),
        Command::Worker(args) => runtime.block_on(worker(args)),
        Command::EgressBridge(_) => Ok(()),
        Command::Healthcheck(args) => {
            // Docker keeps a probe's output: one line on stdout either way.
            return match runtime.block_on(healthcheck::probe(&args)) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(not_ready) => {
                    println!("{not_ready}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Said once, on stderr (also where the log goes).
        Err(error) => {
            eprintln!("tah: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tah worker`: serves an environment's calls until SIGINT or SIGTERM.
async fn worker(args: tah::cli::WorkerArgs) -> anyhow::Result<()> {
    init_tracing(LogFormat::Text, None);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        stop.cancel();
    });
    let options = tah::worker::WorkerOptions {
        server: args.server,
        token: args.token,
        environment: args.environment,
        workspace: args.workspace,
        wait: std::time::Duration::from_secs(args.poll_secs),
        sandbox: args.sandbox.choice(),
    };
    tah::worker::run(options, shutdown).await?;
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let traces = Traces::from_env(args.trace_content)?;
    init_tracing(args.log_format, traces.as_ref());
    if traces.is_some() {
        tracing::info!(
            content = args.trace_content,
            "exporting traces over OTLP/HTTP"
        );
    }
    let served = run(args).await;
    if let Some(traces) = traces {
        // The exporter's shutdown blocks until the last spans are sent (or time out).
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    served
}

async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let app = Application::build(Settings::parse(args)?).await?;
    announce(ReadyLine {
        listening: app.addr(),
    });
    app.run_until_stopped().await?;
    Ok(())
}

/// The log on stderr, and the trace exporter's layer when there is one; the log leaves the
/// trace spans out, and the exporter takes nothing else.
fn init_tracing(format: LogFormat, traces: Option<&Traces>) {
    // rmcp logs every MCP connection's start and end at info, with the server's whole
    // handshake; tah logs what matters of them itself (ready, failed, stopped, why).
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    // Colours only for a terminal: a log file or a collector gets plain text.
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let log = match format {
        LogFormat::Text => log.boxed(),
        LogFormat::Json => log.json().boxed(),
    };
    let not_traces = filter_fn(|metadata| !telemetry::is_trace_span(metadata));
    tracing_subscriber::registry()
        .with(log.with_filter(filter.and(not_traces)))
        .with(traces.map(Traces::layer))
        .init();
}

/// `tah keys create|list|revoke`, straight on the database.
async fn keys(args: KeysArgs) -> anyhow::Result<()> {
    use tah::principals::Principals;
    let opened = tah::store::open(&args.database_url, tah::model::new_id())
        .await
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", args.database_url))?;
    let principals = Principals::new(opened.store);
    match args.command {
        KeysCommand::Create { tenant, role, name } => {
            let role = role.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let made = principals.create_key(&tenant, role, name).await?;
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{}", made.key)?;
            eprintln!(
                "key {} for tenant {} as {}: it is shown this once",
                made.view.id, made.view.tenant, made.view.role
            );
        }
        KeysCommand::List { tenant } => {
            let mut stdout = std::io::stdout().lock();
            let mut before: Option<String> = None;
            loop {
                let page = principals
                    .keys(tenant.as_deref(), before.as_deref(), 500)
                    .await?;
                for key in &page {
                    writeln!(
                        stdout,
                        "{}\t{}\t{}\t{}\t{}{}",
                        key.id,
                        key.tenant,
                        key.role,
                        key.name.as_deref().unwrap_or("-"),
                        key.created_at.to_rfc3339(),
                        if key.revoked_at.is_some() {
                            "\trevoked"
                        } else {
                            ""
                        }
                    )?;
                }
                match page.last() {
                    Some(last) if page.len() == 500 => before = Some(last.id.clone()),
                    _ => break,
                }
            }
        }
        KeysCommand::Revoke { id } => {
            principals
                .revoke_key(&id, None)
                .await
                .map_err(|e| match e {
                    tah::principals::PrincipalError::NotFound => {
                        anyhow::anyhow!("no key {id} that is not revoked already")
                    }
                    other => other.into(),
                })?;
            eprintln!("key {id} revoked");
        }
    }
    Ok(())
}

/// Writes the ready line to stdout (the only thing written there). A closed stdout does not
/// stop the server: whoever closed it did not want the line.
pub(crate) fn announce(line: ReadyLine) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        tracing::warn!(%error, "could not write the ready line to stdout");
    }
}

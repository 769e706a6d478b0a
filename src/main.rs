//! The `tah` binary: parse the configuration, start the runtime, serve HTTP until SIGINT or
//! SIGTERM, then stop gracefully (runs are checkpointed as interrupted and stay resumable).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tah::config::{Cli, Command, LogFormat, ServeConfig};
use tah::http::{self, AppState, HttpOptions};
use tah::runtime::Runtime;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// How long shutdown waits for open requests and sessions before it gives up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    let result = match cli.command {
        Command::Serve(config) => runtime.block_on(serve(*config)),
        Command::FakeModel(args) => runtime.block_on(tah::bench::fake_model(args)),
        Command::Bench(args) => runtime.block_on(tah::bench::bench(*args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("tah: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    init_tracing(config.log_format);
    config.validate().map_err(anyhow::Error::msg)?;
    let provider = config.provider();
    let runtime = Runtime::build(&config).await?;
    tracing::info!(
        provider = ?provider,
        model = runtime.model().model(),
        database = %config.database_url,
        workspace = %config.workspace.display(),
        "tah starting"
    );
    if provider == tah::config::Provider::Mock {
        tracing::info!("no provider key configured: using the offline mock model");
    }
    let listener = TcpListener::bind(config.listen).await?;
    let address = listener.local_addr()?;
    tracing::info!("listening on http://{address}");
    if config.api_tokens.iter().all(|t| t.is_empty()) {
        tracing::info!("no API tokens configured: the API is open to anyone who can reach it");
    }

    let shutdown = runtime.shutdown_token();
    let state = AppState {
        sessions: runtime.sessions().clone(),
        shutdown: shutdown.clone(),
    };
    let router = http::router(
        state,
        &HttpOptions {
            max_body_bytes: config.max_body_bytes,
            api_tokens: config.api_tokens.clone(),
            cors_origins: config.cors_origins.clone(),
            request_timeout: Duration::from_secs(config.request_timeout_secs),
            listen: Some(address),
            allowed_hosts: Vec::new(),
        },
    );
    let signal_token = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: stopping runs and closing streams");
        signal_token.cancel();
    });
    let server = http::serve(
        listener,
        router,
        shutdown.clone().cancelled_owned(),
        http::ConnectionLimits::default(),
    );
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => result?,
        _ = async { shutdown.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("open requests did not finish in time; closing them");
        }
    }
    runtime.shutdown(SHUTDOWN_GRACE).await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

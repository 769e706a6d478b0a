//! The application: a [`Runtime`] and its HTTP router on a bound listener, served until it is
//! told to stop, then shut down gracefully (runs are checkpointed as interrupted and stay
//! resumable). This is what `tah serve` runs and what the black-box tests start in-process on
//! port 0; `main` only parses the command line, sets up logging and prints the [`ReadyLine`].
//!
//! Besides `main`, this is the only module that imports `http`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Provider, Settings};
use crate::http::{self, AppState, HttpOptions};
use crate::runtime::{Runtime, RuntimeError};

/// How long shutdown waits for open requests and sessions before it gives up on them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr} (--metrics-listen): {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving HTTP: {0}")]
    Serve(std::io::Error),
    #[error("cannot make the HTTP client that fetches the JWKS: {0}")]
    JwksClient(reqwest::Error),
}

/// Connections the `--metrics-listen` listener holds at once at most.
const METRICS_CONNECTIONS: usize = 64;

/// A server ready to serve: its runtime is up and its listener bound.
pub struct Application {
    listener: TcpListener,
    addr: SocketAddr,
    router: axum::Router,
    /// `--metrics-listen`: its listener and `GET /metrics` alone.
    metrics: Option<(TcpListener, SocketAddr, axum::Router)>,
    limits: http::ConnectionLimits,
    runtime: Runtime,
}

/// Stops a running [`Application`] from elsewhere, as SIGTERM does.
#[derive(Debug, Clone)]
pub struct StopHandle(CancellationToken);

impl StopHandle {
    pub fn stop(&self) {
        self.0.cancel();
    }
}

impl Application {
    /// Builds the runtime (store, migrations, recovery of interrupted runs, model client) and
    /// binds the listener; with port 0 the system picks a free port, see [`Application::addr`].
    pub async fn build(settings: Settings) -> Result<Application, AppError> {
        let runtime = Runtime::build(&settings).await?;
        let provider = settings.model.provider;
        let http = &settings.http;
        tracing::info!(
            provider = ?provider,
            model = runtime.model().model(),
            database = %settings.store.database_url,
            workspace = %settings.tools.workspace.display(),
            "tah starting"
        );
        if provider == Provider::Mock {
            tracing::info!("no provider key configured: using the offline mock model");
        }
        let (listener, addr) = match bind(http.listen).await {
            Ok(bound) => bound,
            Err(error) => {
                runtime.shutdown(SHUTDOWN_GRACE).await;
                return Err(error);
            }
        };
        let metrics_listener = match http.metrics_listen {
            Some(wanted) => match bind(wanted).await {
                Ok(bound) => Some(bound),
                Err(error) => {
                    runtime.shutdown(SHUTDOWN_GRACE).await;
                    return Err(match error {
                        AppError::Bind { addr, source } => AppError::MetricsBind { addr, source },
                        other => other,
                    });
                }
            },
            None => None,
        };
        tracing::info!("listening on http://{addr}");
        if let Some((_, metrics_addr)) = &metrics_listener {
            tracing::info!("serving /metrics on http://{metrics_addr}");
        }
        if http.api_tokens.is_empty() && http.jwt.is_none() {
            tracing::info!(
                "no API tokens or JWTs configured: the API is open to anyone who can reach it \
                 until a key is made (tah keys create)"
            );
        }
        let jwt = match http.jwt.clone() {
            Some(settings) => {
                let client = reqwest::Client::builder()
                    .timeout(std::time::Duration::from_secs(10))
                    .build()
                    .map_err(AppError::JwksClient)?;
                Some(http::jwt::JwtVerifier::new(settings, client))
            }
            None => None,
        };
        let state = AppState {
            sessions: runtime.sessions().clone(),
            shutdown: runtime.shutdown_token(),
        };
        let metrics = metrics_listener
            .map(|(listener, addr)| (listener, addr, http::metrics_router(state.clone())));
        let router = http::router(
            state,
            &HttpOptions {
                jwt,
                max_body_bytes: http.max_body_bytes,
                api_tokens: http
                    .api_tokens
                    .iter()
                    .map(|t| t.expose().to_string())
                    .collect(),
                cors_origins: http.cors_origins.clone(),
                request_timeout: http.request_timeout,
                listen: Some(addr),
                allowed_hosts: http.allowed_hosts.clone(),
                a2a_allow_private_push: http.a2a_allow_private_push,
                metrics: metrics.is_none(),
            },
        );
        let limits = http::ConnectionLimits {
            max_connections: http
                .max_connections
                .unwrap_or_else(http::server::default_max_connections),
            header_read_timeout: http.header_read_timeout,
        };
        Ok(Application {
            listener,
            addr,
            router,
            metrics,
            limits,
            runtime,
        })
    }

    /// The address the listener is bound to (the real port when the settings said 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `GET /metrics` is served apart from the API (`--metrics-listen`), if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, addr, _)| *addr)
    }

    /// A handle that stops the application once it runs.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.runtime.shutdown_token())
    }

    /// Serves until SIGINT or SIGTERM (or a [`StopHandle`]), then shuts down gracefully.
    pub async fn run_until_stopped(self) -> Result<(), AppError> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `stop` resolves or a [`StopHandle`] is used, then shuts down gracefully:
    /// new requests are refused, SSE streams end, open requests get up to 5 s, every session
    /// stops (active runs are recorded as interrupted), and the writer flushes. Installs no
    /// signal handler, so it suits a program that embeds the server, and tests.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), AppError> {
        let Application {
            listener,
            router,
            runtime,
            limits,
            metrics,
            ..
        } = self;
        let shutdown = runtime.shutdown_token();
        let stopping = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = stopping.cancelled() => {}
            }
            tracing::info!("shutting down: stopping runs and closing streams");
            stopping.cancel();
        });
        if let Some((listener, _, router)) = metrics {
            let limits = http::ConnectionLimits {
                max_connections: METRICS_CONNECTIONS,
                ..limits.clone()
            };
            let stop = shutdown.clone().cancelled_owned();
            tokio::spawn(async move {
                if let Err(error) = http::serve(listener, router, stop, limits).await {
                    tracing::warn!(%error, "serving /metrics failed");
                }
            });
        }
        let server = http::serve(listener, router, shutdown.clone().cancelled_owned(), limits);
        tokio::pin!(server);
        let served = tokio::select! {
            result = &mut server => result.map_err(AppError::Serve),
            _ = async { shutdown.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
                tracing::warn!("open requests did not finish in time; closing them");
                Ok(())
            }
        };
        runtime.shutdown(SHUTDOWN_GRACE).await;
        tracing::info!("stopped");
        served
    }
}

/// Binds a listener; the address it got (the real port for port 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), AppError> {
    let bound = match TcpListener::bind(addr).await {
        Ok(listener) => listener.local_addr().map(|local| (listener, local)),
        Err(source) => Err(source),
    };
    bound.map_err(|source| AppError::Bind { addr, source })
}

/// Resolves on SIGINT or (on Unix) SIGTERM.
async fn shutdown_signal() {
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

/// The one line `tah serve` writes to stdout once it accepts connections, for programs that
/// start it (`--listen 127.0.0.1:0`) and need its address: `{"listening":"127.0.0.1:43123"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyLine {
    pub listening: SocketAddr,
}

impl ReadyLine {
    /// Reads a ready line (surrounding whitespace allowed); `None` for any other line.
    pub fn parse(line: &str) -> Option<ReadyLine> {
        serde_json::from_str(line.trim()).ok()
    }

    /// Reads a started server's stdout up to its ready line; `None` if stdout ends (or fails)
    /// first. The rest of stdout is drained by a task, so that the server never blocks on a
    /// full pipe.
    pub async fn read(stdout: impl AsyncRead + Unpin + Send + 'static) -> Option<ReadyLine> {
        let mut lines = BufReader::new(stdout).lines();
        let ready = loop {
            let line = lines.next_line().await.ok()??;
            if let Some(ready) = ReadyLine::parse(&line) {
                break ready;
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Some(ready)
    }
}

impl std::fmt::Display for ReadyLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // By hand rather than through serde_json: a socket address needs no escaping.
        write!(f, r#"{{"listening":"{}"}}"#, self.listening)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_round_trips() {
        for addr in ["127.0.0.1:43123", "[::1]:8080"] {
            let line = ReadyLine {
                listening: addr.parse().expect("an address"),
            };
            let text = line.to_string();
            assert_eq!(text, format!(r#"{{"listening":"{addr}"}}"#));
            assert_eq!(ReadyLine::parse(&format!("{text}\n")), Some(line));
        }
        assert_eq!(ReadyLine::parse("listening on http://127.0.0.1:1"), None);
        assert_eq!(ReadyLine::parse(r#"{"listening":"nowhere"}"#), None);
    }
}

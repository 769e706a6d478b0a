//! `tah worker`: runs the built-in tool calls of a `workers` environment on this machine.
//!
//! It dials out to the server (no inbound port) and long-polls
//! `POST /v1/environments/{name}/claims` as a principal (an API key of the environment's
//! tenant). A claimed call runs here, with the same built-in tools as the server's, in this
//! worker's own workspace and its own sandbox (probed at start, as `tah serve` does); while it
//! runs, a heartbeat renews the claim's lease; then its result is sent back. When the server
//! cannot be reached, the worker retries with exponential backoff and jitter, for ever; a
//! refusal that retrying cannot mend (a bad key, an environment it may not serve) ends it.

use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::model::ToolCall;
use crate::tools::sandbox::{Programs, SandboxChoice};
use crate::tools::{Sandbox, ToolContext, ToolOutput, ToolRegistry, ToolSettings, Workspace};

/// What `tah worker` was told.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The server's URL, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    /// The API key it authenticates with.
    pub token: String,
    /// The environment whose calls it runs.
    pub environment: String,
    /// The directory its tools work in (created if missing).
    pub workspace: PathBuf,
    /// How long one claim request waits for a call.
    pub wait: Duration,
    /// The sandbox `shell` runs in, chosen as `tah serve` chooses its own.
    pub sandbox: SandboxChoice,
}

/// The first and the longest wait between attempts to reach the server.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A call the server gave this worker.
#[derive(Debug, Deserialize)]
struct Claim {
    claim_id: String,
    call_id: String,
    tool: String,
    input: Value,
    lease_until: chrono::DateTime<chrono::Utc>,
    attempt: i64,
}

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("workspace {0}: {1}")]
    Workspace(PathBuf, std::io::Error),
    /// The server refused the worker, and asking again will not change that.
    #[error("the server refused this worker ({status}): {detail}")]
    Refused { status: StatusCode, detail: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(reqwest::Error),
}

/// Serves the environment until `shutdown` ends.
pub async fn run(
    options: WorkerOptions,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), WorkerError> {
    std::fs::create_dir_all(&options.workspace)
        .map_err(|e| WorkerError::Workspace(options.workspace.clone(), e))?;
    let workspace = Workspace::open(&options.workspace)
        .map_err(|e| WorkerError::Workspace(options.workspace.clone(), e))?;
    let sandbox = Sandbox::select(options.sandbox, &Programs::from_env()).await;
    match sandbox.reason() {
        Some(reason) => tracing::warn!(%reason, "shell calls will fail: no sandbox"),
        None => crate::tools::sandbox::shield_server(),
    }
    let tools = ToolRegistry::builtin(&ToolSettings::default(), sandbox);
    let context = ToolContext::new(workspace);
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(WorkerError::Client)?;
    let worker = Worker {
        client,
        base: format!(
            "{}/v1/environments/{}",
            options.server.trim_end_matches('/'),
            options.environment
        ),
        token: options.token.clone(),
        wait: options.wait,
    };
    tracing::info!(
        server = %options.server, environment = %options.environment,
        workspace = %options.workspace.display(), "worker started"
    );
    let mut backoff = FIRST_BACKOFF;
    loop {
        let claimed = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            claimed = worker.claim() => claimed,
        };
        match claimed {
            Ok(Some(claim)) => {
                backoff = FIRST_BACKOFF;
                worker.serve(&tools, &context, claim).await;
            }
            Ok(None) => backoff = FIRST_BACKOFF,
            Err(Failure::Refused(status, detail)) => {
                return Err(WorkerError::Refused { status, detail })
            }
            Err(Failure::Unreachable(error)) => {
                let pause = jittered(backoff);
                tracing::warn!(%error, retry_in_ms = pause.as_millis() as u64, "server unreachable");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(pause) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// A wait of `backoff` give or take half of it, so that many workers that lost the server
/// together do not come back together.
fn jittered(backoff: Duration) -> Duration {
    let half = backoff.as_millis() as u64 / 2;
    Duration::from_millis(half + rand::thread_rng().gen_range(0..=backoff.as_millis() as u64))
}

enum Failure {
    /// The server answered, and no retry will change its answer.
    Refused(StatusCode, String),
    /// No answer, or one that may change (a 5xx, a replica going away).
    Unreachable(String),
}

struct Worker {
    client: reqwest::Client,
    /// `…/v1/environments/{name}`.
    base: String,
    token: String,
    wait: Duration,
}

impl Worker {
    async fn claim(&self) -> Result<Option<Claim>, Failure> {
        let response = self
            .client
            .post(format!(
                "{}/claims?wait_s={}",
                self.base,
                self.wait.as_secs()
            ))
            .bearer_auth(&self.token)
            .timeout(self.wait + Duration::from_secs(15))
            .send()
            .await
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        match response.status() {
            StatusCode::NO_CONTENT => Ok(None),
            StatusCode::OK => response
                .json::<Claim>()
                .await
                .map(Some)
                .map_err(|e| Failure::Unreachable(e.to_string())),
            status if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS => Err(
                Failure::Unreachable(format!("the server answered {status}")),
            ),
            status => {
                let detail = response.text().await.unwrap_or_default();
                Err(Failure::Refused(status, detail))
            }
        }
    }

    /// Runs a claimed call, renewing its lease meanwhile, and sends its result.
    async fn serve(&self, tools: &ToolRegistry, context: &ToolContext, claim: Claim) {
        tracing::info!(
            call_id = %claim.call_id, tool = %claim.tool, attempt = claim.attempt,
            "running a call"
        );
        let call = ToolCall {
            id: claim.call_id.clone(),
            name: claim.tool.clone(),
            arguments: claim.input.clone(),
        };
        let context = context.for_call(&claim.call_id, None);
        let left = (claim.lease_until - chrono::Utc::now())
            .to_std()
            .unwrap_or(Duration::from_secs(3));
        let beat = (left / 3).max(Duration::from_millis(100));
        let run = tools.execute(&context, &call);
        tokio::pin!(run);
        let output: ToolOutput = loop {
            tokio::select! {
                output = &mut run => break output,
                _ = tokio::time::sleep(beat) => self.heartbeat(&claim.claim_id).await,
            }
        };
        self.send_result(&claim.claim_id, &output).await;
    }

    async fn heartbeat(&self, claim_id: &str) {
        let sent = self
            .client
            .post(format!("{}/claims/{claim_id}/heartbeat", self.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if let Err(error) = sent.and_then(|r| r.error_for_status()) {
            tracing::warn!(%error, "a heartbeat failed");
        }
    }

    /// Sends a result, retrying while the server cannot be reached (for as long as the claim
    /// may still hold); a refusal (the claim lapsed, the call was answered) drops it.
    async fn send_result(&self, claim_id: &str, output: &ToolOutput) {
        let body = json!({ "output": output.output, "is_error": output.is_error });
        let mut backoff = FIRST_BACKOFF;
        for _ in 0..8 {
            let sent = self
                .client
                .post(format!("{}/claims/{claim_id}/result", self.base))
                .bearer_auth(&self.token)
                .timeout(Duration::from_secs(30))
                .json(&body)
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => return,
                Ok(response) if !response.status().is_server_error() => {
                    let status = response.status();
                    let detail = response.text().await.unwrap_or_default();
                    tracing::warn!(%status, %detail, "the result was refused");
                    return;
                }
                Ok(response) => tracing::warn!(status = %response.status(), "sending a result"),
                Err(error) => tracing::warn!(%error, "sending a result"),
            }
            tokio::time::sleep(jittered(backoff)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        tracing::warn!(claim_id, "gave up sending a result");
    }
}

//! The runtime: the store, the group-commit writer, the model client, the tools (built-in and
//! those of MCP servers), the agent settings and the live sessions, put together from
//! validated [`Settings`]. Usable without HTTP: build one and drive sessions through
//! [`Runtime::sessions`].

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::agent::{AgentDeps, AgentSettings};
use crate::config::{Provider, Settings};
use crate::llm::wire::{HttpModelConfig, Timeouts};
use crate::llm::{anthropic, mock::MockModel, openai, ModelClient};
use crate::mcp::McpServers;
use crate::session::{SessionDeps, Sessions, ToolPolicy};
use crate::store::{self, writer::Writer, Cluster, Store};
use crate::tools::policy::Rules;
use crate::tools::{Sandbox, SandboxStatus, ToolContext, ToolRegistry, ToolSettings, Workspace};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("workspace {path}: {source}")]
    Workspace {
        path: String,
        source: std::io::Error,
    },
    #[error("model provider: {0}")]
    Model(#[from] crate::llm::LlmError),
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),
}

/// How long start-up waits for MCP servers to answer their handshake before it goes on
/// without them (their tools follow when they are ready).
const MCP_START_WAIT: Duration = Duration::from_secs(3);

/// Everything a runtime is made of.
pub struct RuntimeParts {
    pub store: Arc<dyn Store>,
    /// Lease coordination when replicas share the database.
    pub cluster: Option<Arc<dyn Cluster>>,
    pub model: Arc<dyn ModelClient>,
    pub tools: ToolRegistry,
    /// MCP servers, already started; the runtime ends them at shutdown.
    pub mcp: McpServers,
    /// The workspace tool calls run in (a session may choose a directory under it).
    pub tool_context: ToolContext,
    /// Bytes one artifact may have.
    pub max_artifact_bytes: u64,
    pub settings: AgentSettings,
    pub max_concurrent_runs: usize,
    pub auto_resume: bool,
    pub lease_ttl: Duration,
    /// This process's id among replicas.
    pub replica: Uuid,
    pub policy: ToolPolicy,
    pub max_subagent_depth: u32,
    /// Sub-agent sessions one top-level run may start, at every depth.
    pub max_subagents_per_run: u32,
}

pub struct Runtime {
    sessions: Sessions,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    writer_task: JoinHandle<()>,
    model: Arc<dyn ModelClient>,
    cluster: Option<Arc<dyn Cluster>>,
    replica: Uuid,
    mcp: McpServers,
}

impl Runtime {
    pub async fn build(config: &Settings) -> Result<Runtime, RuntimeError> {
        let model = model_client(config)?;
        let replica = crate::model::new_id();
        let opened = store::open(config.database_url(), replica).await?;
        // Before anything is written: events of this run of the process are queued for the
        // URLs it was started with.
        crate::webhooks::prepare(
            opened.store.as_ref(),
            config.webhooks(),
            opened.cluster.is_none(),
        )
        .await?;
        let store = opened.store.clone();
        let workspace =
            Workspace::open(config.workspace()).map_err(|source| RuntimeError::Workspace {
                path: config.workspace().display().to_string(),
                source,
            })?;
        let tools = builtin_tools(config).await;
        let mcp = McpServers::start(config.mcp(), config.mcp_settings());
        mcp.settle(MCP_START_WAIT.min(config.mcp_settings().handshake_timeout))
            .await;
        let settings = AgentSettings {
            system_prompt: config.system_prompt().to_string(),
            max_steps: config.max_steps(),
            context_chars: config.context_chars(),
            tool_concurrency: config.tool_concurrency(),
            budget: crate::agent::budget::TokenBudget {
                run: config.max_run_tokens(),
                session: config.max_session_tokens(),
                session_used: 0,
            },
        };
        // Checked when the settings were parsed.
        let rules = Rules::compile(config.tool_policy().to_vec()).unwrap_or_default();
        let policy = ToolPolicy {
            rules,
            mode: config.approval_mode(),
            approval_timeout: config.approval_timeout(),
        };
        let runtime = Runtime::assemble(RuntimeParts {
            store: opened.store,
            cluster: opened.cluster,
            model,
            tools,
            mcp,
            tool_context: ToolContext::new(workspace),
            max_artifact_bytes: config.max_artifact_bytes(),
            settings,
            max_concurrent_runs: config.max_concurrent_runs(),
            auto_resume: config.auto_resume(),
            lease_ttl: config.lease_ttl(),
            replica,
            policy,
            max_subagent_depth: config.max_subagent_depth(),
            max_subagents_per_run: config.max_subagents_per_run(),
        })
        .await?;
        if let Some(webhooks) = config.webhooks() {
            crate::webhooks::start(
                store,
                webhooks.clone(),
                replica.to_string(),
                runtime.shutdown_token(),
            );
        }
        Ok(runtime)
    }

    /// Puts a runtime together from its parts, starts the scale-out tasks when replicas share
    /// the database, and takes over runs a dead process left behind.
    pub async fn assemble(parts: RuntimeParts) -> Result<Runtime, RuntimeError> {
        let mcp = parts.mcp.clone();
        let assembled = Runtime::assemble_with(parts).await;
        if assembled.is_err() {
            mcp.shutdown().await;
        }
        assembled
    }

    async fn assemble_with(parts: RuntimeParts) -> Result<Runtime, RuntimeError> {
        let (writer, writer_task) = Writer::spawn(parts.store.clone());
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let sessions = Sessions::new(SessionDeps {
            store: parts.store,
            writer,
            agent: AgentDeps {
                model: parts.model.clone(),
                tools: parts.tools,
                tool_context: parts.tool_context,
            },
            mcp: parts.mcp.clone(),
            settings: parts.settings,
            max_artifact_bytes: parts.max_artifact_bytes,
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            run_permits: Arc::new(tokio::sync::Semaphore::new(parts.max_concurrent_runs)),
            cluster: parts.cluster.clone(),
            replica: parts.replica,
            lease_ttl: parts.lease_ttl,
            auto_resume: parts.auto_resume,
            policy: parts.policy,
            max_subagent_depth: parts.max_subagent_depth,
            max_subagents_per_run: parts.max_subagents_per_run,
        });
        sessions.start_coordination();
        let interrupted = sessions.recover_interrupted().await?;
        if !interrupted.is_empty() {
            tracing::info!(
                count = interrupted.len(),
                resume = parts.auto_resume,
                "recorded runs interrupted by an earlier stop"
            );
        }
        Ok(Runtime {
            sessions,
            shutdown,
            tasks,
            writer_task,
            model: parts.model,
            cluster: parts.cluster,
            replica: parts.replica,
            mcp: parts.mcp,
        })
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    pub fn model(&self) -> &Arc<dyn ModelClient> {
        &self.model
    }

    /// Cancelled when the runtime begins to shut down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops every actor (a single node records active runs as interrupted; a replica leaves
    /// them to be taken over), ends the MCP servers, releases this replica's leases, and
    /// flushes the writer.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not stop in time");
        }
        let Runtime {
            sessions,
            writer_task,
            cluster,
            replica,
            mcp,
            ..
        } = self;
        // After the runs: a call they dropped has told its server it was cancelled.
        mcp.shutdown().await;
        // Dropping the last handles to the writer lets it drain its queue and end.
        drop(sessions);
        let _ = tokio::time::timeout(grace, writer_task).await;
        if let Some(cluster) = cluster {
            // Released leases let another replica take the sessions over at once.
            if let Err(error) = cluster.release_all(replica).await {
                tracing::warn!(%error, "could not release leases; they will expire");
            }
        }
    }
}

/// The built-in tools `--tools` chose; `shell` is offered only where its sandbox works, and the
/// log says why when it does not. Where it is offered, the server shields itself from the OOM
/// killer ([`shield_server`](crate::tools::sandbox::shield_server)).
async fn builtin_tools(config: &Settings) -> ToolRegistry {
    let wants_shell = config
        .tools()
        .is_none_or(|tools| tools.iter().any(|t| t == "shell"));
    let sandbox = if wants_shell {
        Sandbox::probe().await
    } else {
        SandboxStatus::Unavailable("not chosen by --tools".into())
    };
    match (wants_shell, sandbox.reason()) {
        (true, Some(reason)) => tracing::warn!(%reason, "the shell tool is not offered"),
        (true, None) => crate::tools::sandbox::shield_server(),
        (false, _) => {}
    }
    let settings = ToolSettings {
        shell: config.shell(),
        ..ToolSettings::default()
    };
    let all = ToolRegistry::builtin(&settings, sandbox);
    match config.tools() {
        // The names were checked when the settings were parsed.
        Some(names) => all.keep(names),
        None => all,
    }
}

fn model_client(config: &Settings) -> Result<Arc<dyn ModelClient>, RuntimeError> {
    let model = config.model();
    let http = |base: &str, name: &str| HttpModelConfig {
        base_url: model.base_url.clone().unwrap_or_else(|| base.to_string()),
        api_key: model.api_key.as_ref().map(|key| key.expose().to_string()),
        model: model.model.clone().unwrap_or_else(|| name.to_string()),
        max_tokens: config.max_output_tokens(),
        thinking_budget: config.thinking_budget(),
        timeouts: Timeouts {
            total: config.llm_deadline(),
            ..Timeouts::default()
        },
        retry: Default::default(),
        limits: config.reply_limits().clone(),
    };
    if config.thinking_budget().is_some() && model.provider != Provider::Anthropic {
        tracing::warn!(
            provider = ?model.provider,
            "--thinking-budget applies to the anthropic provider only; ignored"
        );
    }
    Ok(match model.provider {
        Provider::Mock => Arc::new(MockModel::new(model.mock_delay)),
        Provider::Openai => Arc::new(openai::OpenAiClient::new(http(
            openai::DEFAULT_BASE_URL,
            openai::DEFAULT_MODEL,
        ))?),
        Provider::Anthropic => Arc::new(anthropic::AnthropicClient::new(http(
            anthropic::DEFAULT_BASE_URL,
            anthropic::DEFAULT_MODEL,
        ))?),
    })
}

/// The HTTP edge's own records, kept in the sessions' database: idempotency keys and the web
/// page's sign-ins. What the edge reads and writes of them goes through here, not the store.
/// Cheap to clone.
#[derive(Clone)]
pub struct EdgeRecords {
    store: Arc<dyn Store>,
}

pub use crate::store::keys::{IdempotencyKeys, KeyClaim, StoredResponse};
pub use crate::store::sign_ins::{NewSignIn, SignIns};

impl EdgeRecords {
    /// The records kept beside `sessions`.
    pub fn of(sessions: &Sessions) -> EdgeRecords {
        EdgeRecords {
            store: sessions.store().clone(),
        }
    }

    /// The idempotency keys; `None` for a store without them.
    pub fn idempotency(&self) -> Option<&dyn IdempotencyKeys> {
        self.store.idempotency()
    }

    /// The page's sign-ins; `None` for a store without them.
    pub fn sign_ins(&self) -> Option<&dyn SignIns> {
        self.store.sign_ins()
    }
}

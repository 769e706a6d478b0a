//! The runtime: the store, the group-commit writer, the model client, the tools (built-in and
//! those of MCP servers), the agent settings and the live sessions, put together from
//! validated [`Settings`]. Usable without HTTP: build one and drive sessions through
//! [`Runtime::sessions`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::agent::budget::TokenBudget;
use crate::agent::{AgentDeps, AgentSettings};
use crate::config::{ModelSettings, Provider, Settings, ToolSettings};
use crate::llm::providers::{self, ProviderKind, ProviderSpec, Providers};
use crate::llm::wire::Timeouts;
use crate::llm::ModelClient;
use crate::mcp::McpServers;
use crate::model::DEFAULT_TENANT;
use crate::session::{AgentMcp, SessionDeps, Sessions, ToolPolicy};
use crate::store::{self, writer::Writer, Cluster, Store};
use crate::tools::builtin::shell::ShellNetwork;
use crate::tools::{Sandbox, SandboxStatus, ToolContext, ToolRegistry, Workspace};
use crate::vault::Vaults;
use crate::webhooks::{SigningSecret, WebhookSecret};

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
    /// A vault reference of the configuration that cannot be resolved (never a value).
    #[error("{0}")]
    Vault(String),
}

/// How long start-up waits for MCP servers to answer their handshake before it goes on
/// without them (their tools follow when they are ready).
const MCP_START_WAIT: Duration = Duration::from_secs(3);

pub struct Runtime {
    sessions: Sessions,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    writer_task: JoinHandle<()>,
    model: Arc<dyn ModelClient>,
    cluster: Option<Arc<dyn Cluster>>,
    replica: Uuid,
    mcp: McpServers,
    agent_mcp: AgentMcp,
}

impl Runtime {
    /// Opens the store, makes the model client and the tools, starts the MCP servers, then
    /// starts the sessions (and the scale-out tasks when replicas share the database) and takes
    /// over runs a dead process left behind.
    pub async fn build(settings: &Settings) -> Result<Runtime, RuntimeError> {
        let replica = crate::model::new_id();
        // The shell sandbox's probe runs a program (bubblewrap, or the Landlock helper) and
        // waits for it: about 17 ms, as long as the rest of a start. It runs while the store
        // opens.
        let (opened, tools) = tokio::join!(
            store::open_with(
                &settings.store.database_url,
                replica,
                settings.store.durability,
            ),
            builtin_tools(&settings.tools),
        );
        let opened = opened?;
        // The configuration's vault references (the providers file's keys, the webhook
        // secret) are the tenant `default`'s, resolved now that the store is open.
        let vaults = Vaults::new(opened.store.clone(), settings.store.master_key.clone());
        let keys = provider_keys(&settings.model, &vaults).await?;
        let webhook_secret = match &settings.webhooks {
            Some(webhooks) => Some(webhook_secret(&webhooks.secret, &vaults).await?),
            None => None,
        };
        let providers = providers(&settings.model, &keys);
        let model = providers.default_client()?;
        // Before anything is written: events of this run of the process are queued for the
        // URLs it was started with.
        crate::webhooks::prepare(
            opened.store.as_ref(),
            settings.webhooks.as_ref(),
            opened.cluster.is_none(),
        )
        .await?;
        let store = opened.store.clone();
        let workspace = &settings.tools.workspace;
        let workspace = Workspace::open(workspace).map_err(|source| RuntimeError::Workspace {
            path: workspace.display().to_string(),
            source,
        })?;
        let agent = AgentDeps {
            model,
            tools,
            tool_context: ToolContext::new(workspace),
        };
        let mcp_timeouts = settings.tools.mcp_timeouts;
        let mcp = McpServers::start(&settings.tools.mcp, mcp_timeouts);
        mcp.settle(MCP_START_WAIT.min(mcp_timeouts.handshake_timeout))
            .await;
        let runtime = match Runtime::start(
            settings,
            opened,
            agent,
            providers,
            vaults,
            mcp.clone(),
            replica,
        )
        .await
        {
            Ok(runtime) => runtime,
            // The servers are ended here, as a runtime's shutdown would have ended them.
            Err(error) => {
                mcp.shutdown().await;
                return Err(error);
            }
        };
        if let (Some(webhooks), Some(secret)) = (&settings.webhooks, webhook_secret) {
            crate::webhooks::start(
                store,
                webhooks,
                secret,
                replica.to_string(),
                runtime.shutdown_token(),
            );
        }
        crate::schedules::scheduler::start(runtime.sessions().clone(), runtime.shutdown_token());
        crate::session::start_worker_sweeper(runtime.sessions().clone(), runtime.shutdown_token());
        Ok(runtime)
    }

    /// Starts the writer and the sessions over an open store, and recovers interrupted runs.
    async fn start(
        settings: &Settings,
        opened: store::Opened,
        agent: AgentDeps,
        providers: Providers,
        vaults: Vaults,
        mcp: McpServers,
        replica: Uuid,
    ) -> Result<Runtime, RuntimeError> {
        let (writer, writer_task) = Writer::spawn(opened.store.clone());
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let model = agent.model.clone();
        let run = &settings.run;
        let policy = &settings.policy;
        let agent_mcp = AgentMcp::new(settings.tools.mcp_timeouts, vaults.clone());
        let sessions = Sessions::new(SessionDeps {
            store: opened.store,
            writer,
            agent,
            providers: providers.clone(),
            mcp: mcp.clone(),
            agent_mcp: agent_mcp.clone(),
            vaults,
            settings: AgentSettings {
                system_prompt: run.system_prompt.clone(),
                max_steps: run.max_steps,
                context_chars: run.context_chars,
                tool_concurrency: run.tool_concurrency,
                budget: TokenBudget {
                    run: run.max_run_tokens,
                    session: run.max_session_tokens,
                    session_used: 0,
                },
                agent: crate::model::AgentTag::default(),
                model: providers.default_model(),
            },
            max_artifact_bytes: settings.store.max_artifact_bytes,
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            run_permits: Arc::new(tokio::sync::Semaphore::new(run.max_concurrent_runs)),
            tenant_limits: crate::session::TenantLimits::new(
                run.tenant_max_concurrent_runs,
                run.tenant_max_tokens_per_day,
                run.tenant_max_cost_usd_per_day,
            ),
            cluster: opened.cluster.clone(),
            replica,
            lease_ttl: settings.store.lease_ttl,
            auto_resume: run.auto_resume,
            policy: ToolPolicy {
                rules: policy.rules.clone(),
                mode: policy.mode,
                approval_timeout: policy.approval_timeout,
                worker_lease: policy.worker_lease,
            },
            max_subagent_depth: run.max_subagent_depth,
            max_subagents_per_run: run.max_subagents_per_run,
            started_at: crate::model::now(),
            replays: Default::default(),
        });
        sessions.start_coordination();
        let interrupted = sessions.recover_interrupted().await?;
        let replays = sessions.recover_replays().await?;
        if replays > 0 {
            tracing::info!(
                count = replays,
                "recorded replays cut short by an earlier stop"
            );
        }
        if !interrupted.is_empty() {
            tracing::info!(
                count = interrupted.len(),
                resume = run.auto_resume,
                "recorded runs interrupted by an earlier stop"
            );
        }
        Ok(Runtime {
            sessions,
            shutdown,
            tasks,
            writer_task,
            model,
            cluster: opened.cluster,
            replica,
            mcp,
            agent_mcp,
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
            agent_mcp,
            ..
        } = self;
        // After the runs: a call they dropped has told its server it was cancelled.
        mcp.shutdown().await;
        agent_mcp.shutdown().await;
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
async fn builtin_tools(settings: &ToolSettings) -> ToolRegistry {
    let wants_shell = settings
        .builtin
        .as_ref()
        .is_none_or(|tools| tools.iter().any(|t| t == "shell"));
    let sandbox = if wants_shell {
        let programs = crate::tools::sandbox::Programs::from_env();
        let sandbox = Sandbox::select(settings.shell.sandbox, &programs).await;
        match sandbox {
            // Landlock can limit the port a command connects to, not the address: any host
            // listening on the proxy's port number would be reachable. Fail closed.
            SandboxStatus::Ready(ready)
                if ready.backend_name() == "landlock"
                    && matches!(settings.shell.network, ShellNetwork::Allow(_)) =>
            {
                SandboxStatus::Unavailable(
                    "--shell-network allow=… needs the bwrap sandbox (network namespaces): \
                     Landlock can limit the port a command connects to but not the host"
                        .into(),
                )
            }
            other => other,
        }
    } else {
        SandboxStatus::Unavailable("not chosen by --tools".into())
    };
    match (wants_shell, &sandbox) {
        (true, SandboxStatus::Unavailable(reason)) => {
            tracing::warn!(%reason, "the shell tool is not offered")
        }
        (true, SandboxStatus::Ready(ready)) => {
            let backend = ready.backend_name();
            let limits = ready.limits_by();
            match ready.passed_over() {
                Some(why) => tracing::info!(
                    sandbox = backend,
                    limits,
                    bwrap_not_chosen = %why,
                    "shell sandbox: {backend} (bwrap does not work here)"
                ),
                None => tracing::info!(sandbox = backend, limits, "shell sandbox: {backend}"),
            }
            crate::tools::sandbox::shield_server();
        }
        (false, _) => {}
    }
    let registry = crate::tools::ToolSettings {
        shell: settings.shell.clone(),
        ..crate::tools::ToolSettings::default()
    };
    let all = ToolRegistry::builtin(&registry, sandbox);
    match &settings.builtin {
        // The names were checked when the settings were parsed.
        Some(names) => all.keep(names),
        None => all,
    }
}

/// The keys of the `--providers` file's providers whose `api_key` is a vault reference, by
/// provider name.
async fn provider_keys(
    model: &ModelSettings,
    vaults: &Vaults,
) -> Result<HashMap<String, String>, RuntimeError> {
    let mut keys = HashMap::new();
    for provider in &model.providers {
        if let Some(reference) = &provider.api_key_ref {
            let key = vaults
                .resolve(DEFAULT_TENANT, reference)
                .await
                .map_err(|e| {
                    RuntimeError::Vault(format!(
                        "--providers: providers.{}.api_key: {e}",
                        provider.name
                    ))
                })?;
            keys.insert(provider.name.clone(), key);
        }
    }
    Ok(keys)
}

/// The webhook signing secret, from its vault when the configuration references one.
async fn webhook_secret(
    secret: &SigningSecret,
    vaults: &Vaults,
) -> Result<WebhookSecret, RuntimeError> {
    let reference = match secret {
        SigningSecret::Value(secret) => return Ok(secret.clone()),
        SigningSecret::Vault(reference) => reference,
    };
    let value = vaults
        .resolve(DEFAULT_TENANT, reference)
        .await
        .map_err(|e| RuntimeError::Vault(format!("--webhook-secret-env: {e}")))?;
    WebhookSecret::parse(&value).map_err(|why| {
        RuntimeError::Vault(format!(
            "--webhook-secret-env: the secret its vault reference names is unusable: {why}"
        ))
    })
}

/// The providers: `default` from the model flags, then the `--providers` file's (`keys`: those
/// read from vaults). Each has the flags' timeouts, retries and reply limits, and its own
/// connection pool.
fn providers(model: &ModelSettings, keys: &HashMap<String, String>) -> Providers {
    if model.thinking_budget.is_some() && model.provider != Provider::Anthropic {
        tracing::warn!(
            provider = ?model.provider,
            "--thinking-budget applies to the anthropic provider only; ignored"
        );
    }
    let timeouts = Timeouts {
        total: model.llm_deadline,
        ..Timeouts::default()
    };
    let default = ProviderSpec {
        name: providers::DEFAULT.to_string(),
        kind: match model.provider {
            Provider::Mock => ProviderKind::Mock,
            Provider::Openai => ProviderKind::Openai,
            Provider::Anthropic => ProviderKind::Anthropic,
        },
        base_url: model.base_url.clone(),
        api_key: model.api_key.as_ref().map(|key| key.expose().to_string()),
        headers: Vec::new(),
        prices: Default::default(),
        max_output_tokens: model.max_output_tokens,
        timeouts: timeouts.clone(),
        limits: model.reply_limits.clone(),
        mock_delay: model.mock_delay,
    };
    let others = model
        .providers
        .iter()
        .map(|p| ProviderSpec {
            name: p.name.clone(),
            kind: p.kind,
            base_url: p.base_url.clone(),
            api_key: p.api_key.clone().or_else(|| keys.get(&p.name).cloned()),
            headers: p.headers.clone(),
            prices: p.prices.clone(),
            max_output_tokens: p.max_output_tokens.unwrap_or(model.max_output_tokens),
            timeouts: timeouts.clone(),
            limits: model.reply_limits.clone(),
            mock_delay: model.mock_delay,
        })
        .collect();
    Providers::new(default, model.model.clone(), model.thinking_budget, others)
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

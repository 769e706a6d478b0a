//! The runtime: the store, the group-commit writer, the model client, the tools, the agent
//! settings and the session registry, put together from a configuration. Usable without HTTP:
//! build one and drive sessions through [`Runtime::sessions`].

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{AgentDeps, AgentSettings};
use crate::config::{Provider, ServeConfig};
use crate::llm::wire::HttpModelConfig;
use crate::llm::{anthropic, mock::MockModel, openai, ModelClient};
use crate::session::{SessionContext, Sessions};
use crate::store::{self, writer::Writer, Store};
use crate::tools::ToolRegistry;

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

pub struct Runtime {
    sessions: Sessions,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    writer_task: JoinHandle<()>,
    model: Arc<dyn ModelClient>,
    /// Sessions whose run an earlier process left unfinished, recorded as interrupted at start.
    interrupted: Vec<uuid::Uuid>,
}

impl Runtime {
    pub async fn build(config: &ServeConfig) -> Result<Runtime, RuntimeError> {
        let model = model_client(config)?;
        let store = store::open(&config.database_url).await?;
        let tools =
            ToolRegistry::builtin(&config.workspace).map_err(|source| RuntimeError::Workspace {
                path: config.workspace.display().to_string(),
                source,
            })?;
        let settings = AgentSettings {
            system_prompt: config.system_prompt.clone(),
            max_steps: config.max_steps(),
            context_chars: config.context_chars.map(|c| c as usize),
        };
        let runtime = Runtime::assemble(store, model, tools, settings, config.max_concurrent_runs as usize).await?;
        if config.auto_resume() {
            runtime.sessions.resume_in_background(runtime.interrupted.clone());
        }
        Ok(runtime)
    }

    /// Puts a runtime together from its parts, and records runs a dead process left behind.
    pub async fn assemble(
        store: Arc<dyn Store>,
        model: Arc<dyn ModelClient>,
        tools: ToolRegistry,
        settings: AgentSettings,
        max_concurrent_runs: usize,
    ) -> Result<Runtime, RuntimeError> {
        let (writer, writer_task) = Writer::spawn(store.clone());
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let sessions = Sessions::new(SessionContext {
            store,
            writer,
            deps: AgentDeps {
                model: model.clone(),
                tools,
            },
            settings,
            shutdown: shutdown.clone(),
            tasks: tasks.clone(),
            run_permits: Arc::new(tokio::sync::Semaphore::new(max_concurrent_runs)),
        });
        let interrupted = sessions.recover_interrupted().await?;
        if !interrupted.is_empty() {
            tracing::info!(count = interrupted.len(), "recorded runs interrupted by an earlier stop");
        }
        Ok(Runtime {
            interrupted,
            sessions,
            shutdown,
            tasks,
            writer_task,
            model,
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

    /// Stops every actor (active runs are checkpointed as interrupted, so they can be resumed)
    /// and flushes the writer.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not stop in time");
        }
        // Dropping the last handles to the writer lets it drain its queue and end.
        let Runtime {
            sessions,
            writer_task,
            ..
        } = self;
        drop(sessions);
        let _ = tokio::time::timeout(grace, writer_task).await;
    }
}

fn model_client(config: &ServeConfig) -> Result<Arc<dyn ModelClient>, RuntimeError> {
    let provider = config.provider();
    let http = |base: &str, model: &str| HttpModelConfig {
        base_url: config.base_url.clone().unwrap_or_else(|| base.to_string()),
        api_key: config.api_key(provider),
        model: config.model.clone().unwrap_or_else(|| model.to_string()),
        max_tokens: 8192,
        timeouts: Default::default(),
        retry: Default::default(),
    };
    Ok(match provider {
        Provider::Mock => Arc::new(MockModel::new(Duration::from_millis(config.mock_delay_ms))),
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

//! Agents as sessions use them: created, versioned, archived and read through [`Sessions`],
//! chosen by a new session ([`Sessions::choose_agent`]) and captured by a run at its start
//! ([`Sessions::run_agent`]): a run never re-reads its agent while it runs.
//!
//! What a version captures: the model (and so its provider), the system prompt, the tools, the
//! MCP servers, the policy rules, the client tools, the sub-agents `task` may delegate to, and
//! the limits. What stays server-wide: the workspace root and the shell's sandbox, the
//! server's own `--policy` rules and the approval mode, MCP timeouts, run concurrency and the
//! store: they are what the operator promises about the machine, not what an agent chooses.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::agent_secrets;
use super::errors::{ConflictKind, SessionError};
use super::sessions::{NewSession, Sessions};
use crate::llm::providers::{ModelRef, ModelRefError};
use crate::llm::ModelClient;
use crate::mcp::{McpConfig, McpServers, McpSettings};
use crate::model::{
    self, AgentChoice, AgentId, AgentMcpServer, AgentRecord, AgentSpec, ClientTool, Rule,
    SessionAgent, SessionOptions, SessionRecord, VersionChoice, DEFAULT_AGENT,
};
use crate::store::agents::{AgentQuery, AgentStore, Bumped};
use crate::tools::policy::Rules;
use crate::vault::Vaults;

const MAX_NAME_CHARS: usize = 200;
const MAX_DESCRIPTION_CHARS: usize = 10_000;
const MAX_PROMPT_CHARS: usize = 100_000;
const MAX_SUBAGENTS: usize = 32;

/// The fields of an agent's body, which an update may change.
const FIELDS: &[&str] = &[
    "name",
    "description",
    "model",
    "system_prompt",
    "tools",
    "mcp_servers",
    "tool_policy",
    "client_tools",
    "subagents",
    "max_steps",
    "context_chars",
    "thinking_budget",
    "max_tokens",
    "max_run_tokens",
    "max_cost_usd",
    "environment",
    "metadata",
];

/// An agent as a request gives it (`POST /v1/agents`), or as an update leaves it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub model: String,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub mcp_servers: Option<Vec<AgentMcpServer>>,
    #[serde(default)]
    pub tool_policy: Option<Vec<Rule>>,
    #[serde(default)]
    pub client_tools: Option<Vec<ClientTool>>,
    /// Agent ids or names.
    #[serde(default)]
    pub subagents: Option<Vec<String>>,
    #[serde(default)]
    pub max_steps: Option<u32>,
    #[serde(default)]
    pub context_chars: Option<usize>,
    #[serde(default)]
    pub thinking_budget: Option<u32>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_run_tokens: Option<u64>,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    /// The environment its sessions' built-in tools run in (default: `local`).
    pub environment: Option<String>,
    pub metadata: Option<Value>,
}

/// The agent version a run captured at its start, the client that calls its model, and the
/// MCP servers it defines for itself.
#[derive(Clone)]
pub struct RunAgent {
    pub record: Arc<AgentRecord>,
    pub model: ModelRef,
    pub client: Arc<dyn ModelClient>,
    pub own_mcp: Option<McpServers>,
}

/// The MCP servers agents define for themselves: started at the first run of each agent
/// version that has any, shared by the runs of that version, and ended at shutdown. Cheap
/// to clone.
#[derive(Clone)]
pub struct AgentMcp {
    settings: McpSettings,
    /// Where the servers' `${vault:…}` references are resolved.
    vaults: Vaults,
    started: Arc<Mutex<HashMap<(Uuid, u32), McpServers>>>,
}

impl AgentMcp {
    pub fn new(settings: McpSettings, vaults: Vaults) -> AgentMcp {
        AgentMcp {
            settings,
            vaults,
            started: Arc::default(),
        }
    }

    /// The servers `agent` defines for itself (started now if they were not), once each has
    /// tried to connect or the handshake time has passed; `None` when it defines none. An
    /// error (which names the reference, never a value) when a vault reference in their
    /// `env` or `headers` cannot be resolved in the agent's tenant.
    async fn servers(&self, agent: &AgentRecord) -> Result<Option<McpServers>, String> {
        let Some(id) = agent.id.stored() else {
            return Ok(None);
        };
        let key = (id, agent.version);
        if let Some(servers) = self.lock().get(&key) {
            return Ok(Some(servers.clone()));
        }
        let mut config = McpConfig::default();
        for server in agent.spec.mcp_servers.iter().flatten() {
            if let AgentMcpServer::Inline(inline) = server {
                // Checked when the version was made.
                if let Ok(one) = inline_config(inline) {
                    config.servers.extend(one.servers);
                }
            }
        }
        if config.servers.is_empty() {
            return Ok(None);
        }
        agent_secrets::resolve(&mut config, &self.vaults, &agent.tenant).await?;
        // Two first runs at once: the one that comes second uses the first one's servers.
        let (servers, fresh) = match self.lock().entry(key) {
            Entry::Occupied(started) => (started.get().clone(), false),
            Entry::Vacant(slot) => {
                let redact = self.vaults.redactor(&agent.tenant);
                let servers = McpServers::start_redacted(&config, self.settings, Some(redact));
                (slot.insert(servers).clone(), true)
            }
        };
        if fresh {
            servers.settle(self.settings.handshake_timeout).await;
        }
        Ok(Some(servers))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Uuid, u32), McpServers>> {
        self.started.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every agent's servers.
    pub async fn shutdown(&self) {
        let all: Vec<McpServers> = self.lock().drain().map(|(_, servers)| servers).collect();
        futures::future::join_all(all.iter().map(McpServers::shutdown)).await;
    }
}

impl Sessions {
    fn agent_store(&self) -> Result<&dyn AgentStore, SessionError> {
        self.deps.store.agents().ok_or_else(|| {
            SessionError::BadInput("this server's store keeps no agents".to_string())
        })
    }

    /// The `default` agent: what the server's flags define, now.
    pub fn default_agent(&self) -> AgentRecord {
        let settings = &self.deps.settings;
        let mut spec = AgentSpec::named(
            DEFAULT_AGENT,
            self.deps.providers.default_model().qualified(),
        );
        spec.system_prompt = Some(settings.system_prompt.clone());
        spec.max_steps = settings.max_steps;
        spec.context_chars = settings.context_chars;
        spec.thinking_budget = self.deps.providers.default_thinking();
        spec.max_tokens = settings.budget.session;
        spec.max_run_tokens = settings.budget.run;
        AgentRecord {
            id: AgentId::Default,
            version: 1,
            spec,
            created_at: self.deps.started_at,
            updated_at: self.deps.started_at,
            archived_at: None,
            tenant: crate::model::DEFAULT_TENANT.to_string(),
        }
    }

    /// The model an agent version runs, on a configured provider (the default agent's is the
    /// flags'); an error when the version's provider is no longer configured.
    pub fn agent_model(&self, record: &AgentRecord) -> Result<ModelRef, ModelRefError> {
        match record.id {
            AgentId::Default => Ok(self.deps.providers.default_model()),
            AgentId::Stored(_) => self.deps.providers.resolve(&record.spec.model),
        }
    }

    /// The configured provider an agent version's model is on (`None`: no longer configured).
    pub fn agent_provider(&self, record: &AgentRecord) -> Option<String> {
        self.agent_model(record).ok().map(|model| model.provider)
    }

    /// Creates an agent of `tenant` at version 1, after checking everything it names.
    pub async fn create_agent(
        &self,
        body: AgentBody,
        tenant: &str,
    ) -> Result<AgentRecord, SessionError> {
        let spec = self.check_agent(body, None, tenant).await?;
        let at = model::now();
        let record = AgentRecord {
            id: AgentId::Stored(model::new_id()),
            version: 1,
            spec,
            created_at: at,
            updated_at: at,
            archived_at: None,
            tenant: tenant.to_string(),
        };
        self.agent_store()?.insert_agent(&record).await?;
        Ok(record)
    }

    /// The agent at `version`, or at its latest version.
    pub async fn agent(
        &self,
        id: AgentId,
        version: Option<u32>,
    ) -> Result<AgentRecord, SessionError> {
        let Some(stored) = id.stored() else {
            return match version {
                None | Some(1) => Ok(self.default_agent()),
                Some(n) => Err(no_version(id, n)),
            };
        };
        match self.agent_store()?.agent(stored, version).await? {
            Some(record) => Ok(record),
            None => match version {
                Some(n) if self.agent_store()?.agent(stored, None).await?.is_some() => {
                    Err(no_version(id, n))
                }
                _ => Err(no_agent(id)),
            },
        }
    }

    /// The agent at `version` (or its latest), if a principal of `tenant` (`None`: an
    /// operator) sees it; another tenant's agent is not found, as if it did not exist.
    pub async fn agent_seen_by(
        &self,
        id: AgentId,
        version: Option<u32>,
        tenant: Option<&str>,
    ) -> Result<AgentRecord, SessionError> {
        let record = self.agent(id, version).await?;
        match record.seen_by(tenant) {
            true => Ok(record),
            false => Err(no_agent(id)),
        }
    }

    /// A page of agents at their latest versions, newest first.
    pub async fn agents(&self, query: &AgentQuery) -> Result<Vec<AgentRecord>, SessionError> {
        Ok(self.agent_store()?.agents(query).await?)
    }

    /// A page of an agent's versions, newest first.
    pub async fn agent_versions(
        &self,
        id: AgentId,
        before: Option<u32>,
        limit: i64,
        tenant: Option<&str>,
    ) -> Result<Vec<AgentRecord>, SessionError> {
        let latest = self.agent_seen_by(id, None, tenant).await?;
        if id == AgentId::Default {
            let keep = before.is_none_or(|b| b > 1) && limit > 0;
            return Ok(if keep { vec![latest] } else { Vec::new() });
        }
        Ok(self
            .agent_store()?
            .agent_versions(latest.id.stored().unwrap_or_default(), before, limit)
            .await?)
    }

    /// Makes a new version with `changes` applied (`null` clears a field), unless nothing
    /// changes; `if_match` names the version the changes were made from. Without it, an
    /// update that another one overtook is made again over the newer version.
    pub async fn update_agent(
        &self,
        id: AgentId,
        changes: Map<String, Value>,
        if_match: Option<u32>,
        tenant: Option<&str>,
    ) -> Result<AgentRecord, SessionError> {
        self.agent_seen_by(id, None, tenant).await?;
        const ATTEMPTS: usize = 5;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.update_once(id, &changes, if_match).await {
                Err(SessionError::AgentStale { .. })
                    if if_match.is_none() && attempt < ATTEMPTS => {}
                other => return other,
            }
        }
    }

    async fn update_once(
        &self,
        id: AgentId,
        changes: &Map<String, Value>,
        if_match: Option<u32>,
    ) -> Result<AgentRecord, SessionError> {
        let current = self.agent(id, None).await?;
        let Some(stored) = id.stored() else {
            return Err(SessionError::Conflict(ConflictKind::DefaultAgent));
        };
        if current.archived_at.is_some() {
            return Err(SessionError::Conflict(ConflictKind::AgentArchived(id)));
        }
        let mut body = match body_of(&current.spec) {
            Value::Object(body) => body,
            _ => Map::new(),
        };
        if let Some(unknown) = changes.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(SessionError::BadInput(format!(
                "agent: unknown field `{unknown}`, expected one of {}",
                FIELDS.join(", ")
            )));
        }
        for (field, value) in changes {
            match value {
                Value::Null => body.remove(field),
                value => body.insert(field.clone(), value.clone()),
            };
        }
        let body: AgentBody = serde_json::from_value(Value::Object(body))
            .map_err(|e| SessionError::BadInput(format!("agent: {e}")))?;
        let spec = self
            .check_agent(body, Some(stored), &current.tenant)
            .await?;
        // A bad body is refused as such, whichever version it was made from.
        if if_match.is_some_and(|v| v != current.version) {
            return Err(SessionError::AgentStale {
                latest: current.version,
            });
        }
        if spec == current.spec {
            return Ok(current);
        }
        let next = AgentRecord {
            version: current.version + 1,
            spec,
            updated_at: model::now(),
            ..current.clone()
        };
        match self
            .agent_store()?
            .add_agent_version(&next, current.version)
            .await?
        {
            Bumped::Done => Ok(next),
            Bumped::Archived => Err(SessionError::Conflict(ConflictKind::AgentArchived(id))),
            Bumped::Stale => {
                let latest = self.agent(id, None).await?.version;
                Err(SessionError::AgentStale { latest })
            }
        }
    }

    /// Archives an agent (again: no change); it stays readable.
    pub async fn archive_agent(
        &self,
        id: AgentId,
        tenant: Option<&str>,
    ) -> Result<AgentRecord, SessionError> {
        self.agent_seen_by(id, None, tenant).await?;
        let Some(stored) = id.stored() else {
            return Err(SessionError::Conflict(ConflictKind::DefaultAgent));
        };
        self.agent_store()?
            .archive_agent(stored, model::now())
            .await?;
        self.agent(id, None).await
    }

    /// The agent a new session (or a fork that names one) runs: `None` is the default agent.
    /// Only the agents a principal of `tenant` sees (`None`: an operator) can be chosen.
    pub async fn choose_agent(
        &self,
        choice: Option<&AgentChoice>,
        tenant: Option<&str>,
    ) -> Result<(SessionAgent, AgentRecord), SessionError> {
        let Some(choice) = choice else {
            return Ok((SessionAgent::default(), self.default_agent()));
        };
        let version = match choice.version {
            VersionChoice::Pinned(n) => Some(n),
            VersionChoice::Current | VersionChoice::Latest => None,
        };
        // Every version of an agent carries the agent's `archived_at`.
        let record = self.agent_seen_by(choice.id, version, tenant).await?;
        if record.archived_at.is_some() {
            return Err(SessionError::Conflict(ConflictKind::AgentArchived(
                choice.id,
            )));
        }
        let chosen = SessionAgent {
            tag: record.tag(),
            follows_latest: choice.version == VersionChoice::Latest,
        };
        Ok((chosen, record))
    }

    /// A new session on an agent as a face or a schedule makes one, with no settings of its
    /// own: the agent `choice` (`None`: the default agent) as `tenant` sees it (`None`: an
    /// operator), in that tenant (for an operator, the agent's), owned by `owner`.
    pub async fn create_on_agent(
        &self,
        choice: Option<&AgentChoice>,
        tenant: Option<&str>,
        owner: Option<String>,
        metadata: Option<Value>,
    ) -> Result<SessionRecord, SessionError> {
        let (agent, version) = self.choose_agent(choice, tenant).await?;
        let options = SessionOptions {
            agent,
            ..SessionOptions::default()
        };
        let mut options = self.check_options_on(options, &version)?;
        let tenant = tenant.unwrap_or(&version.tenant).to_string();
        options.environment = Some(
            self.session_environment(&tenant, None, version.spec.environment.as_deref())
                .await?,
        );
        let new = NewSession {
            system_prompt: None,
            title: None,
            metadata,
            options,
            tenant,
            owner,
        };
        self.create(new, &version).await
    }

    /// The agent version a run of a session on `chosen` runs, and its model's client.
    pub async fn run_agent(&self, chosen: &SessionAgent) -> Result<RunAgent, SessionError> {
        let version = (!chosen.follows_latest).then_some(chosen.tag.version);
        let record = self.agent(chosen.tag.id, version).await?;
        let model = self
            .agent_model(&record)
            .map_err(|e| SessionError::BadInput(format!("agent {}: {e}", record.id)))?;
        let client = match record.id {
            AgentId::Default => self.deps.agent.model.clone(),
            AgentId::Stored(_) => self
                .deps
                .providers
                .client(&model, record.spec.thinking_budget)
                .map_err(SessionError::Upstream)?,
        };
        let own_mcp = self
            .deps
            .agent_mcp
            .servers(&record)
            .await
            .map_err(SessionError::BadInput)?;
        Ok(RunAgent {
            record: Arc::new(record),
            model,
            client,
            own_mcp,
        })
    }

    /// Checks what an agent version names (its provider, tools, MCP servers, sub-agents,
    /// rules, client tools and limits), and answers it as it is kept. `this` is the agent
    /// being updated (it may not delegate to itself); its sub-agents are `tenant`'s.
    async fn check_agent(
        &self,
        body: AgentBody,
        this: Option<Uuid>,
        tenant: &str,
    ) -> Result<AgentSpec, SessionError> {
        let bad = |detail: String| Err(SessionError::BadInput(detail));
        let name = body.name.trim();
        if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
            return bad(format!(
                "name must have 1 to {MAX_NAME_CHARS} characters besides spaces"
            ));
        }
        for (field, text, max) in [
            ("description", &body.description, MAX_DESCRIPTION_CHARS),
            ("system_prompt", &body.system_prompt, MAX_PROMPT_CHARS),
        ] {
            if text.as_ref().is_some_and(|t| t.chars().count() > max) {
                return bad(format!("{field} is longer than {max} characters"));
            }
        }
        let model = self
            .deps
            .providers
            .resolve(&body.model)
            .map_err(|e| SessionError::BadInput(format!("model: {e}")))?;
        if let Some(budget) = body.thinking_budget {
            if budget < 1024 {
                return bad(format!(
                    "thinking_budget {budget} is too small: Anthropic takes at least 1024 thinking tokens"
                ));
            }
            let anthropic = self
                .deps
                .providers
                .spec(&model.provider)
                .is_some_and(|p| p.kind == crate::llm::providers::ProviderKind::Anthropic);
            if !anthropic {
                return bad(format!(
                    "thinking_budget applies to anthropic providers only; {:?} is not one",
                    model.provider
                ));
            }
        }
        for (field, zero) in [
            ("max_steps", body.max_steps == Some(0)),
            ("context_chars", body.context_chars == Some(0)),
            ("max_tokens", body.max_tokens == Some(0)),
            ("max_run_tokens", body.max_run_tokens == Some(0)),
        ] {
            if zero {
                return bad(format!(
                    "{field} must be at least 1 (leave it out for the server's default)"
                ));
            }
        }
        if body
            .max_cost_usd
            .is_some_and(|usd| !usd.is_finite() || usd <= 0.0)
        {
            return bad("max_cost_usd must be a positive number of US dollars".to_string());
        }
        if body.metadata.as_ref().is_some_and(|m| !m.is_object()) {
            return bad("metadata must be a JSON object".to_string());
        }
        let tools = match body.tools {
            Some(tools) => Some(self.check_tool_names(tools)?),
            None => None,
        };
        let mcp_servers = match body.mcp_servers {
            Some(servers) => Some(self.check_agent_mcp(servers)?),
            None => None,
        };
        let tool_policy = body.tool_policy.unwrap_or_default();
        Rules::compile(tool_policy.clone())
            .map_err(|e| SessionError::BadInput(format!("tool_policy: {e}")))?;
        let client_tools = body.client_tools.unwrap_or_default();
        self.check_run_tools(&client_tools)?;
        let subagents = self
            .check_subagents(body.subagents.unwrap_or_default(), this, tenant)
            .await?;
        let environment = match &body.environment {
            Some(name) => Some(self.environment(tenant, name).await?.name),
            None => None,
        };
        Ok(AgentSpec {
            name: name.to_string(),
            description: body.description,
            model: body.model,
            system_prompt: body.system_prompt,
            tools,
            mcp_servers,
            tool_policy,
            client_tools,
            subagents,
            max_steps: body.max_steps,
            context_chars: body.context_chars,
            thinking_budget: body.thinking_budget,
            max_tokens: body.max_tokens,
            max_run_tokens: body.max_run_tokens,
            max_cost_usd: body.max_cost_usd,
            environment,
            metadata: body
                .metadata
                .unwrap_or_else(|| Value::Object(Default::default())),
        })
    }

    /// An agent's MCP servers: the server's by name, and its own, each well formed, no name
    /// twice.
    fn check_agent_mcp(
        &self,
        servers: Vec<AgentMcpServer>,
    ) -> Result<Vec<AgentMcpServer>, SessionError> {
        let known = self.deps.mcp.names();
        let mut names = HashSet::new();
        for server in &servers {
            let name = server.name();
            if !names.insert(name.to_string()) {
                return Err(SessionError::BadInput(format!(
                    "mcp_servers names {name:?} twice"
                )));
            }
            match server {
                AgentMcpServer::Named(name) if !known.contains(&name.as_str()) => {
                    let has = match known.is_empty() {
                        true => "it has none".to_string(),
                        false => format!("it has {}", known.join(", ")),
                    };
                    return Err(SessionError::BadInput(format!(
                        "mcp_servers names an MCP server this server does not have: {name} ({has}); \
                         an agent's own server is given as an object with name and command or url"
                    )));
                }
                AgentMcpServer::Named(_) => {}
                AgentMcpServer::Inline(inline) => {
                    if known.contains(&inline.name.as_str()) {
                        return Err(SessionError::BadInput(format!(
                            "mcp_servers: the agent's own server {:?} has the name of one of the server's",
                            inline.name
                        )));
                    }
                    inline_config(inline)
                        .map_err(|e| SessionError::BadInput(format!("mcp_servers: {e}")))?;
                }
            }
        }
        Ok(servers)
    }

    /// `subagents` entries (ids or names) as the agents' ids.
    async fn check_subagents(
        &self,
        entries: Vec<String>,
        this: Option<Uuid>,
        tenant: &str,
    ) -> Result<Vec<Uuid>, SessionError> {
        if entries.len() > MAX_SUBAGENTS {
            return Err(SessionError::BadInput(format!(
                "subagents lists more than {MAX_SUBAGENTS} agents"
            )));
        }
        let mut ids = Vec::new();
        for entry in entries {
            let id = match Uuid::parse_str(&entry) {
                Ok(id) => {
                    let found = self.agent_store()?.agent(id, None).await?;
                    if found.is_none_or(|agent| agent.tenant != tenant) {
                        return Err(SessionError::BadInput(format!(
                            "subagents: no agent {entry}"
                        )));
                    }
                    id
                }
                Err(_) => match self
                    .agent_store()?
                    .agents_named(tenant, &entry)
                    .await?
                    .as_slice()
                {
                    [id] => *id,
                    [] => {
                        return Err(SessionError::BadInput(format!(
                            "subagents: no agent named {entry:?}"
                        )))
                    }
                    _ => {
                        return Err(SessionError::BadInput(format!(
                            "subagents: several agents are named {entry:?}; give its id"
                        )))
                    }
                },
            };
            if Some(id) == this {
                return Err(SessionError::BadInput(format!(
                    "subagents: {entry:?} is this agent; a session delegates to itself with task alone"
                )));
            }
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Checks a session's choices against its agent: it narrows the agent's tools and MCP
    /// servers, and adds rules and client tools.
    pub fn check_options_on(
        &self,
        options: SessionOptions,
        agent: &AgentRecord,
    ) -> Result<SessionOptions, SessionError> {
        let options = self.check_options(options)?;
        let spec = &agent.spec;
        if let (Some(chosen), Some(offered)) = (&options.tools, &spec.tools) {
            let outside: Vec<&str> = chosen
                .iter()
                .filter(|t| !offered.contains(t))
                .map(String::as_str)
                .collect();
            if !outside.is_empty() {
                return Err(SessionError::BadInput(format!(
                    "tools names tools agent {:?} is not offered: {} (it is offered {})",
                    spec.name,
                    outside.join(", "),
                    offered.join(", ")
                )));
            }
        }
        if let (Some(chosen), Some(servers)) = (&options.mcp_servers, &spec.mcp_servers) {
            let offered: Vec<&str> = servers.iter().map(AgentMcpServer::name).collect();
            let outside: Vec<&str> = chosen
                .iter()
                .map(String::as_str)
                .filter(|name| !offered.contains(name))
                .collect();
            if !outside.is_empty() {
                return Err(SessionError::BadInput(format!(
                    "mcp_servers names MCP servers agent {:?} does not use: {}",
                    spec.name,
                    outside.join(", ")
                )));
            }
        }
        let clash = options
            .client_tools
            .iter()
            .find(|t| spec.client_tools.iter().any(|a| a.name == t.name));
        if let Some(tool) = clash {
            return Err(SessionError::BadInput(format!(
                "client tool name {:?} is one of agent {:?}'s client tools",
                tool.name, spec.name
            )));
        }
        Ok(options)
    }

    /// Tool names an agent is offered: the server's tools and `task`, each once.
    fn check_tool_names(&self, mut tools: Vec<String>) -> Result<Vec<String>, SessionError> {
        let probe = SessionOptions {
            tools: Some(std::mem::take(&mut tools)),
            ..SessionOptions::default()
        };
        let checked = self.check_options(probe)?;
        Ok(checked.tools.unwrap_or_default())
    }
}

/// An agent's own MCP server as the `mcpServers` configuration reads it. `${VAR}` is not
/// expanded: an agent's values are its own, not the server's environment. Vault references in
/// `env` and `headers` are kept (behind a marker) for [`agent_secrets::resolve`].
pub(crate) fn inline_config(inline: &model::InlineMcpServer) -> Result<McpConfig, String> {
    let inline =
        agent_secrets::marked(inline).map_err(|why| format!("server {:?}: {why}", inline.name))?;
    let mut entry = serde_json::to_value(&inline).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut entry {
        fields.remove("name");
    }
    let mut servers = Map::new();
    servers.insert(inline.name.clone(), entry);
    let text = serde_json::json!({ "mcpServers": servers }).to_string();
    McpConfig::parse(&text, |_| None).map_err(|e| e.to_string())
}

/// The body that gives `spec` again (its sub-agents by id).
fn body_of(spec: &AgentSpec) -> Value {
    let mut body = serde_json::to_value(spec).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut body {
        fields.insert(
            "subagents".to_string(),
            Value::Array(
                spec.subagents
                    .iter()
                    .map(|id| Value::String(id.to_string()))
                    .collect(),
            ),
        );
    }
    body
}

fn no_agent(id: AgentId) -> SessionError {
    SessionError::AgentNotFound(format!("agent {id} not found"))
}

fn no_version(id: AgentId, version: u32) -> SessionError {
    SessionError::AgentNotFound(format!("agent {id} has no version {version}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_update_may_name_every_field_of_the_body_and_no_other() {
        for field in FIELDS {
            let mut body = json!({"name": "a", "model": "m"});
            body[*field] = Value::Null;
            let parsed = serde_json::from_value::<AgentBody>(body);
            // `null` is not a name or a model, but it is a field the body knows.
            if let Err(error) = parsed {
                assert!(
                    !error.to_string().contains("unknown field"),
                    "{field}: {error}"
                );
            }
        }
        let error =
            serde_json::from_value::<AgentBody>(json!({"name": "a", "model": "m", "zzz": 1}))
                .unwrap_err()
                .to_string();
        let expected: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
        assert!(error.contains(&expected.join(", ")), "{error}");
    }
}

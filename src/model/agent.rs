//! Agents: named, versioned configurations that sessions run. A version ([`AgentSpec`]) is
//! what a run captures at its start: model, prompt, tools, MCP servers, policy, client tools
//! and limits. The `default` agent is not stored: it follows the server's flags.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

use super::ids::PathId;
use super::{ClientTool, Rule};

/// The name and id of the agent the server's flags define.
pub const DEFAULT_AGENT: &str = "default";

/// An agent: `default` (the flags') or one in the store. On the wire, `"default"` or its UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AgentId {
    #[default]
    Default,
    Stored(Uuid),
}

impl AgentId {
    pub fn stored(self) -> Option<Uuid> {
        match self {
            AgentId::Default => None,
            AgentId::Stored(id) => Some(id),
        }
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentId::Default => f.write_str(DEFAULT_AGENT),
            AgentId::Stored(id) => id.fmt(f),
        }
    }
}

impl FromStr for AgentId {
    type Err = uuid::Error;
    fn from_str(raw: &str) -> Result<AgentId, uuid::Error> {
        match raw {
            DEFAULT_AGENT => Ok(AgentId::Default),
            _ => Uuid::parse_str(raw).map(AgentId::Stored),
        }
    }
}

impl PathId for AgentId {
    const WHAT: &'static str = "agent";
    fn parse(raw: &str) -> Option<AgentId> {
        raw.parse().ok()
    }
}

impl Serialize for AgentId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AgentId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AgentId, D::Error> {
        let raw = String::deserialize(d)?;
        raw.parse()
            .map_err(|_| serde::de::Error::custom(format!("{raw:?} is not an agent id")))
    }
}

/// An MCP server an agent uses: one of the server's (`--mcp-config`) by name, or its own,
/// defined inline in the `mcpServers` entry shape with a `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AgentMcpServer {
    Named(String),
    Inline(InlineMcpServer),
}

impl AgentMcpServer {
    pub fn name(&self) -> &str {
        match self {
            AgentMcpServer::Named(name) => name,
            AgentMcpServer::Inline(inline) => &inline.name,
        }
    }
}

/// An agent's own MCP server, as the agent's body gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineMcpServer {
    pub name: String,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub env: serde_json::Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub headers: serde_json::Map<String, Value>,
}

/// One version of an agent: everything a run of it captures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `"<provider>/<model>"`, or a model of the default provider.
    pub model: String,
    /// `None`: the server's `--system-prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The built-in tools (and `task`) it is offered; `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The MCP servers whose tools it is offered; `None`: every server of the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<AgentMcpServer>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_policy: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ClientTool>,
    /// The agents (ids) its `task` tool may delegate to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_chars: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    /// Tokens a session of it may use over all its runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Tokens one run may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_run_tokens: Option<u64>,
    /// US dollars a session of it may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// The environment its sessions' built-in tools run in, unless a session names its own;
    /// `None`: `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    #[serde(default = "empty_object")]
    pub metadata: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl AgentSpec {
    /// An agent named `name` on `model` with nothing else chosen.
    pub fn named(name: impl Into<String>, model: impl Into<String>) -> AgentSpec {
        AgentSpec {
            name: name.into(),
            description: None,
            model: model.into(),
            system_prompt: None,
            tools: None,
            mcp_servers: None,
            tool_policy: Vec::new(),
            client_tools: Vec::new(),
            subagents: Vec::new(),
            max_steps: None,
            context_chars: None,
            thinking_budget: None,
            max_tokens: None,
            max_run_tokens: None,
            max_cost_usd: None,
            environment: None,
            metadata: empty_object(),
        }
    }
}

/// An agent at one version, as stored and served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: AgentId,
    pub version: u32,
    #[serde(flatten)]
    pub spec: AgentSpec,
    /// When the agent was created.
    pub created_at: DateTime<Utc>,
    /// When this version was made.
    pub updated_at: DateTime<Utc>,
    pub archived_at: Option<DateTime<Utc>>,
    /// The tenant it belongs to (SPEC §17); the default agent is every tenant's.
    #[serde(default = "default_tenant")]
    pub tenant: String,
}

fn default_tenant() -> String {
    super::DEFAULT_TENANT.to_string()
}

impl AgentRecord {
    /// Whether a principal of `tenant` (`None`: an operator) sees it.
    pub fn seen_by(&self, tenant: Option<&str>) -> bool {
        self.id == AgentId::Default || tenant.is_none_or(|t| t == self.tenant)
    }

    /// Names this version: what sessions and steps record.
    pub fn tag(&self) -> AgentTag {
        AgentTag {
            id: self.id,
            version: self.version,
            name: self.spec.name.clone(),
        }
    }
}

/// Which agent version something ran: recorded by sessions, events and steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentTag {
    pub id: AgentId,
    pub version: u32,
    pub name: String,
}

impl Default for AgentTag {
    fn default() -> AgentTag {
        AgentTag {
            id: AgentId::Default,
            version: 1,
            name: DEFAULT_AGENT.to_string(),
        }
    }
}

/// The agent a session runs: a version it is pinned to, or the latest one at each run's
/// start. `version` is the one its last run used, or its next run will use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SessionAgent {
    #[serde(flatten)]
    pub tag: AgentTag,
    #[serde(default, skip_serializing_if = "is_false")]
    pub follows_latest: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How a request names an agent: `"<id>"`, `{"id", "version": N}` or
/// `{"id", "version": "latest"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentChoice {
    pub id: AgentId,
    pub version: VersionChoice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionChoice {
    /// The version that is current now, pinned.
    Current,
    Pinned(u32),
    /// The latest version at each run's start.
    Latest,
}

impl<'de> Deserialize<'de> for AgentChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AgentChoice, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Version {
            Number(u64),
            Word(String),
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            id: String,
            version: Option<Version>,
        }
        const SHAPES: &str = "agent must be an agent id, {\"id\", \"version\": N} or {\"id\", \"version\": \"latest\"}";
        let (id, version) = match Value::deserialize(d)? {
            Value::String(id) => (id, None),
            object @ Value::Object(_) => {
                let full: Full = serde_json::from_value(object)
                    .map_err(|e| D::Error::custom(format!("agent: {e} ({SHAPES})")))?;
                (full.id, full.version)
            }
            _ => return Err(D::Error::custom(SHAPES)),
        };
        let id = id
            .parse()
            .map_err(|_| D::Error::custom(format!("agent: {id:?} is not an agent id")))?;
        let version = match version {
            None => VersionChoice::Current,
            Some(Version::Word(word)) if word == "latest" => VersionChoice::Latest,
            Some(Version::Word(word)) => {
                return Err(D::Error::custom(format!(
                    "agent.version: {word:?} is neither a version number nor \"latest\""
                )))
            }
            Some(Version::Number(n)) => match u32::try_from(n) {
                Ok(n) if n >= 1 => VersionChoice::Pinned(n),
                _ => {
                    return Err(D::Error::custom(format!(
                        "agent.version: {n} is not a version (versions count from 1)"
                    )))
                }
            },
        };
        Ok(AgentChoice { id, version })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn agent_ids_are_default_or_a_uuid() {
        let id = Uuid::now_v7();
        assert_eq!(AgentId::parse("default"), Some(AgentId::Default));
        assert_eq!(AgentId::parse(&id.to_string()), Some(AgentId::Stored(id)));
        assert_eq!(AgentId::parse("coder"), None);
        assert_eq!(
            serde_json::to_value(AgentId::Stored(id)).unwrap(),
            json!(id.to_string())
        );
        assert_eq!(
            serde_json::to_value(AgentId::Default).unwrap(),
            json!("default")
        );
    }

    #[test]
    fn a_choice_has_three_forms() {
        let id = Uuid::now_v7();
        let parse = |v: Value| serde_json::from_value::<AgentChoice>(v);
        let current = parse(json!(id.to_string())).unwrap();
        assert_eq!(current.version, VersionChoice::Current);
        assert_eq!(current.id, AgentId::Stored(id));
        let pinned = parse(json!({"id": id.to_string(), "version": 3})).unwrap();
        assert_eq!(pinned.version, VersionChoice::Pinned(3));
        let latest = parse(json!({"id": "default", "version": "latest"})).unwrap();
        assert_eq!(latest.version, VersionChoice::Latest);
        assert_eq!(latest.id, AgentId::Default);
        for bad in [
            json!({"id": id.to_string(), "version": 0}),
            json!({"id": id.to_string(), "version": "newest"}),
            json!({"id": id.to_string(), "version": -1}),
            json!({"id": "coder"}),
            json!(7),
            json!({"id": id.to_string(), "extra": 1}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn a_session_agent_shows_follows_latest_only_when_it_does() {
        let pinned = SessionAgent::default();
        assert_eq!(
            serde_json::to_value(&pinned).unwrap(),
            json!({"id": "default", "version": 1, "name": "default"})
        );
        let following = SessionAgent {
            follows_latest: true,
            ..pinned
        };
        assert_eq!(
            serde_json::to_value(&following).unwrap()["follows_latest"],
            true
        );
    }
}

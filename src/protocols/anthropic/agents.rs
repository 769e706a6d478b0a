//! Claude Managed Agents' agent object ↔ tah's agent version.
//!
//! | theirs | tah's |
//! |---|---|
//! | `name`, `description`, `metadata` | the same |
//! | `model` (`"x"` or `{id}`) | `model` (`"<provider>/<model>"` or a default-provider model) |
//! | `system` | `system_prompt` |
//! | `agent_toolset_20260401` (`default_config`, `configs`) | `tools` (built-ins: `bash` = `shell`, `read` = `read_file`, `write` = `write_file`, `edit` = `edit_file`, `glob`, `grep`) and `tool_policy` (`always_allow` / `always_ask` = an `allow` / `ask` rule; `auto` = tah's default) |
//! | `mcp_servers` (`{name, type: "url", url}`) and `mcp_toolset` | `mcp_servers` (inline `{name, type: "http", url}`, or a configured server by name) and rules on `mcp__<server>__…` |
//! | `custom` tools | `client_tools` |
//!
//! What tah has no concept for (`skills`, `multiagent`, `execution_identity`, `model.effort`,
//! `model.speed`, `model.inference_geo`, `web_fetch`, `web_search`, per-tool MCP `enabled:
//! false`, tool options such as `allowed_domains`) is refused with a message naming the field.

use serde_json::{json, Map, Value};

use super::events::{mcp_parts, stamp, tah_tool_name, vendor_tool_name};
use crate::model::{Action, AgentMcpServer, AgentRecord, Rule, BUILTIN_TOOLS};

/// The agent fields a create or an update may carry.
const AGENT_FIELDS: &[&str] = &[
    "name",
    "description",
    "model",
    "system",
    "tools",
    "mcp_servers",
    "metadata",
    "skills",
    "multiagent",
    "execution_identity",
];

/// An agent version as their object.
pub fn agent_object(record: &AgentRecord) -> Value {
    let spec = &record.spec;
    let (tools, mcp_servers) = tools_of(record);
    json!({
        "type": "agent",
        "id": record.id.to_string(),
        "version": record.version,
        "name": spec.name,
        "description": spec.description,
        "model": {"id": spec.model},
        "system": spec.system_prompt,
        "tools": tools,
        "mcp_servers": mcp_servers,
        "skills": [],
        "multiagent": null,
        "execution_identity": {"type": "service_account"},
        "metadata": string_map(&spec.metadata),
        "created_at": stamp(&record.created_at),
        "updated_at": stamp(&record.updated_at),
        "archived_at": record.archived_at.as_ref().map(stamp),
    })
}

/// Only the string values of a metadata object (what their `metadata` holds).
pub fn string_map(metadata: &Value) -> Value {
    let map: Map<String, Value> = metadata
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Value::Object(map)
}

fn policy(action: Option<Action>) -> Value {
    let kind = match action {
        Some(Action::Allow) => "always_allow",
        Some(Action::Ask) => "always_ask",
        // A deny rule has no vendor policy: tah's default is shown.
        Some(Action::Deny) | None => "auto",
    };
    json!({"type": kind})
}

/// The action of the last subject-less rule on exactly `tool`.
fn rule_for(rules: &[Rule], tool: &str) -> Option<Action> {
    rules
        .iter()
        .rev()
        .find(|r| r.tool == tool && r.subject.is_none())
        .map(|r| r.action)
}

fn tools_of(record: &AgentRecord) -> (Vec<Value>, Vec<Value>) {
    let spec = &record.spec;
    let rules = &spec.tool_policy;
    let mut tools = Vec::new();
    let config = |tool: &str| {
        let name = vendor_tool_name(tool);
        json!({
            "name": name,
            "type": name,
            "enabled": true,
            "permission_policy": policy(rule_for(rules, tool)),
        })
    };
    match &spec.tools {
        None => tools.push(json!({
            "type": "agent_toolset_20260401",
            "default_config": {"enabled": true, "permission_policy": {"type": "auto"}},
            "configs": BUILTIN_TOOLS
                .iter()
                .filter(|t| rule_for(rules, t).is_some())
                .map(|t| config(t))
                .collect::<Vec<_>>(),
        })),
        Some(list) if list.iter().any(|t| BUILTIN_TOOLS.contains(&t.as_str())) => {
            tools.push(json!({
                "type": "agent_toolset_20260401",
                "default_config": {"enabled": false, "permission_policy": {"type": "auto"}},
                "configs": BUILTIN_TOOLS
                    .iter()
                    .filter(|t| list.iter().any(|l| l == *t))
                    .map(|t| config(t))
                    .collect::<Vec<_>>(),
            }))
        }
        Some(_) => {}
    }
    let mut servers = Vec::new();
    for server in spec.mcp_servers.iter().flatten() {
        let name = server.name();
        if let AgentMcpServer::Inline(inline) = server {
            if let Some(url) = &inline.url {
                servers.push(json!({"name": name, "type": "url", "url": url}));
            }
        }
        let all = format!("{}{name}__*", crate::mcp::PREFIX);
        let configs: Vec<Value> = rules
            .iter()
            .filter(|r| r.subject.is_none())
            .filter_map(|r| {
                let (srv, tool) = mcp_parts(&r.tool)?;
                (srv == name && tool != "*").then(|| {
                    json!({"name": tool, "enabled": true, "permission_policy": policy(Some(r.action))})
                })
            })
            .collect();
        tools.push(json!({
            "type": "mcp_toolset",
            "mcp_server_name": name,
            "default_config": {"enabled": true, "permission_policy": policy(rule_for(rules, &all))},
            "configs": configs,
        }));
    }
    for tool in &spec.client_tools {
        tools.push(json!({
            "type": "custom",
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }));
    }
    (tools, servers)
}

/// What a create gives, as tah's agent body (`POST /v1/agents`).
pub fn create_body(params: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    check_fields(params)?;
    let mut body = Map::new();
    if !params.contains_key("name") {
        return Err("name: required".into());
    }
    if !params.contains_key("model") {
        return Err("model: required".into());
    }
    plain_fields(params, &mut body)?;
    let tools = params.get("tools").cloned().unwrap_or(json!([]));
    let servers = params.get("mcp_servers").cloned().unwrap_or(json!([]));
    tool_fields(&tools, &servers, &mut body)?;
    Ok(body)
}

/// What an update changes, as changes to tah's agent body; `current` is the version it
/// updates (its tools and MCP servers are what a change of only one of them keeps).
pub fn update_changes(
    params: &Map<String, Value>,
    current: &AgentRecord,
) -> Result<Map<String, Value>, String> {
    check_fields(params)?;
    let mut changes = Map::new();
    let mut given = params.clone();
    if let Some(metadata) = given.remove("metadata") {
        let mut merged = current
            .spec
            .metadata
            .as_object()
            .cloned()
            .unwrap_or_default();
        match metadata {
            Value::Null => merged.clear(),
            Value::Object(updates) => {
                for (key, value) in updates {
                    match value {
                        Value::Null => {
                            merged.remove(&key);
                        }
                        Value::String(_) => {
                            merged.insert(key, value);
                        }
                        _ => return Err(format!("metadata.{key}: must be a string or null")),
                    }
                }
            }
            _ => return Err("metadata: must be an object".into()),
        }
        changes.insert("metadata".into(), Value::Object(merged));
    }
    if given.get("name").is_some_and(Value::is_null) {
        return Err("name: must be a string".into());
    }
    plain_fields(&given, &mut changes)?;
    if given.contains_key("tools") || given.contains_key("mcp_servers") {
        let (tools, servers) = tools_of(current);
        let tools = match given.get("tools") {
            Some(Value::Null) => json!([]),
            Some(tools) => tools.clone(),
            None => json!(tools),
        };
        let servers = match given.get("mcp_servers") {
            Some(Value::Null) => json!([]),
            Some(servers) => servers.clone(),
            None => json!(servers),
        };
        tool_fields(&tools, &servers, &mut changes)?;
    }
    Ok(changes)
}

fn check_fields(params: &Map<String, Value>) -> Result<(), String> {
    for (key, value) in params {
        if !AGENT_FIELDS.contains(&key.as_str()) {
            return Err(format!("{key}: unknown field"));
        }
        let empty = match value {
            Value::Null => true,
            Value::Array(items) => items.is_empty(),
            _ => false,
        };
        match key.as_str() {
            "skills" | "multiagent" if !empty => {
                return Err(format!("{key}: not supported by tah (leave it out)"))
            }
            "execution_identity" if !empty && value["type"] != "service_account" => {
                return Err(format!(
                    "{key}: only {{\"type\": \"service_account\"}} (tah's own process) is supported"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// `name`, `description`, `model`, `system`, `metadata` (as given: a create's).
fn plain_fields(params: &Map<String, Value>, body: &mut Map<String, Value>) -> Result<(), String> {
    for (key, value) in params {
        match key.as_str() {
            "name" => {
                let name = value.as_str().ok_or("name: must be a string")?;
                body.insert("name".into(), json!(name));
            }
            "description" => match value {
                Value::Null | Value::String(_) => {
                    body.insert("description".into(), value.clone());
                }
                _ => return Err("description: must be a string or null".into()),
            },
            "system" => match value {
                Value::Null | Value::String(_) => {
                    body.insert("system_prompt".into(), value.clone());
                }
                _ => return Err("system: must be a string or null".into()),
            },
            "model" => {
                body.insert("model".into(), json!(model_id(value)?));
            }
            "metadata" if !body.contains_key("metadata") => {
                let map = value.as_object().ok_or("metadata: must be an object")?;
                if let Some((k, _)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!("metadata.{k}: must be a string"));
                }
                body.insert("metadata".into(), value.clone());
            }
            _ => {}
        }
    }
    Ok(())
}

fn model_id(value: &Value) -> Result<String, String> {
    match value {
        Value::String(id) if !id.is_empty() => Ok(id.clone()),
        Value::Object(config) => {
            for (key, value) in config {
                match key.as_str() {
                    "id" => {}
                    _ if value.is_null() => {}
                    other => {
                        return Err(format!(
                            "model.{other}: not supported by tah (the model's provider settings \
                             are the provider's)"
                        ))
                    }
                }
            }
            match config.get("id") {
                Some(Value::String(id)) if !id.is_empty() => Ok(id.clone()),
                _ => Err("model.id: must be a non-empty string".into()),
            }
        }
        _ => Err("model: must be a model name or {\"id\": name}".into()),
    }
}

fn policy_action(value: Option<&Value>, field: &str) -> Result<Option<Action>, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match value["type"].as_str() {
        Some("always_allow") => Ok(Some(Action::Allow)),
        Some("always_ask") => Ok(Some(Action::Ask)),
        Some("auto") => Ok(None),
        _ => Err(format!(
            "{field}: must be {{\"type\": \"always_allow\" | \"always_ask\" | \"auto\"}}"
        )),
    }
}

fn enabled(value: Option<&Value>, field: &str) -> Result<Option<bool>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{field}: must be a boolean")),
    }
}

fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("{field}: must be an object"))
}

fn only(map: &Map<String, Value>, allowed: &[&str], field: &str) -> Result<(), String> {
    match map
        .iter()
        .find(|(k, v)| !allowed.contains(&k.as_str()) && !v.is_null())
    {
        Some((k, _)) => Err(format!("{field}.{k}: not supported by tah")),
        None => Ok(()),
    }
}

/// `tools` and `mcp_servers` as tah's `tools`, `tool_policy`, `client_tools`, `mcp_servers`.
fn tool_fields(
    tools: &Value,
    servers: &Value,
    body: &mut Map<String, Value>,
) -> Result<(), String> {
    let tools = tools.as_array().ok_or("tools: must be an array")?;
    let servers = servers.as_array().ok_or("mcp_servers: must be an array")?;
    let mut defined: Vec<(String, String)> = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let field = format!("mcp_servers[{i}]");
        let map = object(server, &field)?;
        only(map, &["name", "type", "url"], &field)?;
        if map.get("type").is_some_and(|t| t != "url") {
            return Err(format!("{field}.type: must be \"url\""));
        }
        let name = map["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or(format!("{field}.name: must be a non-empty string"))?;
        let url = map
            .get("url")
            .and_then(Value::as_str)
            .ok_or(format!("{field}.url: must be a string"))?;
        defined.push((name.to_string(), url.to_string()));
    }
    let mut builtins: Option<Vec<&'static str>> = Some(Vec::new());
    let mut toolset_seen = false;
    let mut rules: Vec<Rule> = Vec::new();
    let mut mcp: Vec<Value> = defined
        .iter()
        .map(|(name, url)| json!({"name": name, "type": "http", "url": url}))
        .collect();
    let mut client = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let field = format!("tools[{i}]");
        let map = object(tool, &field)?;
        match map.get("type").and_then(Value::as_str) {
            Some("agent_toolset_20260401") => {
                if toolset_seen {
                    return Err(format!(
                        "{field}: only one agent_toolset_20260401 is allowed"
                    ));
                }
                toolset_seen = true;
                only(map, &["type", "configs", "default_config"], &field)?;
                let (on, default_rule) = default_config(map.get("default_config"), &field)?;
                let mut chosen: Vec<(&'static str, bool, Option<Action>)> = BUILTIN_TOOLS
                    .iter()
                    .map(|t| (*t, on, default_rule))
                    .collect();
                let configs = match map.get("configs") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(c)) => c.clone(),
                    Some(_) => return Err(format!("{field}.configs: must be an array")),
                };
                for (j, config) in configs.iter().enumerate() {
                    let field = format!("{field}.configs[{j}]");
                    let config = object(config, &field)?;
                    only(
                        config,
                        &["name", "type", "enabled", "permission_policy"],
                        &field,
                    )?;
                    let name = config
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or(format!("{field}.name: must be a string"))?;
                    let on_here = enabled(config.get("enabled"), &format!("{field}.enabled"))?;
                    let rule = policy_action(
                        config.get("permission_policy"),
                        &format!("{field}.permission_policy"),
                    )?;
                    let Some(tah) = tah_tool_name(name) else {
                        if on_here.unwrap_or(true) {
                            return Err(format!(
                                "{field}.name: tah has no {name} tool (its built-ins are bash, \
                                 read, write, edit, glob, grep, list_files)"
                            ));
                        }
                        continue;
                    };
                    if let Some(entry) = chosen.iter_mut().find(|c| c.0 == tah) {
                        entry.1 = on_here.unwrap_or(true);
                        if config.contains_key("permission_policy") {
                            entry.2 = rule;
                        }
                    }
                }
                let list: Vec<&'static str> = chosen.iter().filter(|c| c.1).map(|c| c.0).collect();
                for (tool, on, rule) in &chosen {
                    if let (true, Some(action)) = (on, rule) {
                        rules.push(Rule {
                            tool: tool.to_string(),
                            subject: None,
                            action: *action,
                        });
                    }
                }
                builtins = match list.len() == BUILTIN_TOOLS.len() {
                    true => None,
                    false => Some(list),
                };
            }
            Some("mcp_toolset") => {
                only(
                    map,
                    &["type", "mcp_server_name", "configs", "default_config"],
                    &field,
                )?;
                let server = map
                    .get("mcp_server_name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or(format!(
                        "{field}.mcp_server_name: must be a non-empty string"
                    ))?;
                if !defined.iter().any(|(n, _)| n == server) {
                    mcp.push(json!(server));
                }
                let (on, rule) = default_config(map.get("default_config"), &field)?;
                if !on {
                    return Err(format!(
                        "{field}.default_config.enabled: false is not supported (leave the \
                         toolset out instead)"
                    ));
                }
                if let Some(action) = rule {
                    rules.push(Rule {
                        tool: format!("{}{server}__*", crate::mcp::PREFIX),
                        subject: None,
                        action,
                    });
                }
                let configs = match map.get("configs") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(c)) => c.clone(),
                    Some(_) => return Err(format!("{field}.configs: must be an array")),
                };
                for (j, config) in configs.iter().enumerate() {
                    let field = format!("{field}.configs[{j}]");
                    let config = object(config, &field)?;
                    only(config, &["name", "enabled", "permission_policy"], &field)?;
                    let name = config
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or(format!("{field}.name: must be a string"))?;
                    if enabled(config.get("enabled"), &format!("{field}.enabled"))? == Some(false) {
                        return Err(format!(
                            "{field}.enabled: false is not supported (tah offers all of an MCP \
                             server's tools)"
                        ));
                    }
                    let rule = policy_action(
                        config.get("permission_policy"),
                        &format!("{field}.permission_policy"),
                    )?;
                    if let Some(action) = rule {
                        rules.insert(
                            0,
                            Rule {
                                tool: format!("{}{server}__{name}", crate::mcp::PREFIX),
                                subject: None,
                                action,
                            },
                        );
                    }
                }
            }
            Some("custom") => {
                only(
                    map,
                    &["type", "name", "description", "input_schema"],
                    &field,
                )?;
                let name = map
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or(format!("{field}.name: must be a string"))?;
                let description = match map.get("description") {
                    None | Some(Value::Null) => "",
                    Some(Value::String(d)) => d,
                    Some(_) => return Err(format!("{field}.description: must be a string")),
                };
                let schema = map
                    .get("input_schema")
                    .filter(|s| s.is_object())
                    .ok_or(format!("{field}.input_schema: must be an object"))?;
                client.push(json!({
                    "name": name,
                    "description": description,
                    "input_schema": schema,
                }));
            }
            _ => {
                return Err(format!(
                    "{field}.type: must be agent_toolset_20260401, mcp_toolset or custom"
                ))
            }
        }
    }
    body.insert("tools".into(), json!(builtins));
    body.insert("tool_policy".into(), json!(rules));
    body.insert("client_tools".into(), json!(client));
    body.insert("mcp_servers".into(), json!(mcp));
    Ok(())
}

/// A toolset's `default_config`: enabled (default true) and its policy.
fn default_config(value: Option<&Value>, field: &str) -> Result<(bool, Option<Action>), String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok((true, None));
    };
    let field = format!("{field}.default_config");
    let map = object(value, &field)?;
    only(map, &["enabled", "permission_policy"], &field)?;
    let on = enabled(map.get("enabled"), &format!("{field}.enabled"))?.unwrap_or(true);
    let rule = policy_action(
        map.get("permission_policy"),
        &format!("{field}.permission_policy"),
    )?;
    Ok((on, rule))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AgentId, AgentSpec};
    use crate::session::AgentBody;

    fn record(body: Map<String, Value>) -> AgentRecord {
        let body: AgentBody = serde_json::from_value(Value::Object(body)).unwrap();
        let mut spec = AgentSpec::named(body.name, body.model);
        spec.system_prompt = body.system_prompt;
        spec.tools = body.tools;
        spec.tool_policy = body.tool_policy.unwrap_or_default();
        spec.client_tools = body.client_tools.unwrap_or_default();
        spec.mcp_servers = body.mcp_servers;
        let at = chrono::DateTime::from_timestamp(0, 0).unwrap();
        AgentRecord {
            id: AgentId::Stored(uuid::Uuid::from_u128(1)),
            version: 1,
            spec,
            created_at: at,
            updated_at: at,
            archived_at: None,
            tenant: "t".into(),
        }
    }

    #[test]
    fn an_agent_goes_to_tah_and_back() {
        let params = json!({
            "name": "coder",
            "model": {"id": "mock"},
            "system": "Be brief.",
            "mcp_servers": [{"name": "docs", "type": "url", "url": "http://x/mcp"}],
            "tools": [
                {"type": "agent_toolset_20260401",
                 "default_config": {"permission_policy": {"type": "always_ask"}},
                 "configs": [{"name": "read", "permission_policy": {"type": "always_allow"}}]},
                {"type": "mcp_toolset", "mcp_server_name": "docs"},
                {"type": "custom", "name": "lookup", "description": "d",
                 "input_schema": {"type": "object"}},
            ],
        });
        let body = create_body(params.as_object().unwrap()).unwrap();
        assert_eq!(body["tools"], Value::Null);
        assert_eq!(body["system_prompt"], "Be brief.");
        assert_eq!(body["client_tools"][0]["name"], "lookup");
        assert_eq!(body["mcp_servers"][0]["type"], "http");
        let agent = agent_object(&record(body.clone()));
        assert_eq!(agent["model"]["id"], "mock");
        assert_eq!(agent["mcp_servers"][0]["url"], "http://x/mcp");
        // Their object read back makes the same tah body.
        let again = create_body(
            json!({"name": "coder", "model": agent["model"], "system": agent["system"],
                   "tools": agent["tools"], "mcp_servers": agent["mcp_servers"]})
            .as_object()
            .unwrap(),
        )
        .unwrap();
        let sorted = |v: &Value| {
            let mut rules: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.to_string())
                .collect();
            rules.sort();
            rules
        };
        assert_eq!(sorted(&again["tool_policy"]), sorted(&body["tool_policy"]));
        assert_eq!(again["tools"], body["tools"]);
        assert_eq!(again["client_tools"], body["client_tools"]);
    }

    #[test]
    fn what_tah_cannot_honour_is_named() {
        let refused = |params: Value| create_body(params.as_object().unwrap()).unwrap_err();
        let base = |extra: Value| {
            let mut p = json!({"name": "a", "model": "mock"});
            p.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            p
        };
        assert!(refused(base(
            json!({"skills": [{"type": "anthropic", "skill_id": "x"}]})
        ))
        .starts_with("skills"));
        assert!(
            refused(base(json!({"model": {"id": "m", "speed": "fast"}})))
                .starts_with("model.speed")
        );
        assert!(
            refused(base(json!({"tools": [{"type": "agent_toolset_20260401",
            "configs": [{"name": "web_search"}]}]})))
            .starts_with("tools[0].configs[0].name")
        );
        assert!(refused(base(json!({"colour": 1}))).starts_with("colour"));
        assert!(refused(json!({"model": "m"})).starts_with("name"));
    }
}

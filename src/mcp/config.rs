//! The `--mcp-config` file, in the `mcpServers` format other MCP hosts read:
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
//!             "env": {"LOG_LEVEL": "info"}, "cwd": "/srv"},
//!   "search": {"type": "http", "url": "https://mcp.example.com/mcp",
//!              "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"}}
//! }}
//! ```
//!
//! `${VAR}` in any string value (not in keys) is replaced by the variable from tah's own
//! environment, `${VAR:-fallback}` by the fallback when the variable is unset or empty; a
//! variable that is not set is an error naming it, so a server never starts with a credential
//! silently missing. Parsing is pure: the environment is passed in as a lookup.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// Servers by name, in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpConfig {
    pub servers: Vec<ServerConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `[A-Za-z0-9_-]`, 1–32 characters: it becomes part of tool names.
    pub name: String,
    pub transport: Transport,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process spoken to over its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Added to the few variables every server gets (see `connection`).
        env: BTreeMap<String, String>,
        /// Relative to tah's working directory; `None`: tah's working directory.
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpConfigError {
    #[error(
        "not an MCP configuration ({0}); expected {{\"mcpServers\": {{NAME: {{\"command\", \
         \"args\"?, \"env\"?, \"cwd\"?}} or {{\"type\": \"http\", \"url\", \"headers\"?}}}}}}"
    )]
    Syntax(String),
    #[error("server {server:?}: {why}")]
    Server { server: String, why: String },
    #[error("server {server:?}: {field} uses ${{{variable}}}, which is not set")]
    MissingVariable {
        server: String,
        field: String,
        variable: String,
    },
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, RawServer>,
}

/// A server as written; other hosts' extra keys (`disabled`, `timeout`, …) are ignored.
#[derive(Deserialize)]
struct RawServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Headers the streamable HTTP transport sets itself.
const RESERVED_HEADERS: &[&str] = &["accept", "mcp-session-id", "last-event-id"];

impl McpConfig {
    /// Reads a configuration, expanding `${VAR}` with `lookup` (tah's environment).
    pub fn parse(
        text: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<McpConfig, McpConfigError> {
        let file: File =
            serde_json::from_str(text).map_err(|e| McpConfigError::Syntax(e.to_string()))?;
        let servers = file
            .mcp_servers
            .into_iter()
            .map(|(name, raw)| server(name, raw, &lookup))
            .collect::<Result<_, _>>()?;
        Ok(McpConfig { servers })
    }

    pub fn names(&self) -> Vec<&str> {
        self.servers.iter().map(|s| s.name.as_str()).collect()
    }
}

fn server(
    name: String,
    raw: RawServer,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<ServerConfig, McpConfigError> {
    let refuse = |why: String| McpConfigError::Server {
        server: name.clone(),
        why,
    };
    let valid_name = (1..=32).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(refuse(
            "a server name is 1-32 letters, digits, _ or - (it becomes part of tool names)".into(),
        ));
    }
    let expand = |field: &str, text: &str| {
        expand(text, lookup).map_err(|e| match e {
            Expansion::Missing(variable) => McpConfigError::MissingVariable {
                server: name.clone(),
                field: field.to_string(),
                variable,
            },
            Expansion::Malformed(why) => refuse(format!("{field}: {why}")),
        })
    };
    let kind = match raw.kind.as_deref() {
        // Hosts that infer the transport take a server with a url and no command for HTTP.
        None if raw.command.is_none() && raw.url.is_some() => "http",
        None => "stdio",
        Some(kind) => kind,
    };
    let transport = match kind {
        "stdio" => {
            let command = match raw.command.as_deref().map(str::trim) {
                Some(command) if !command.is_empty() => expand("command", command)?,
                _ => return Err(refuse("a stdio server needs a \"command\"".into())),
            };
            if raw.url.is_some() || !raw.headers.is_empty() {
                return Err(refuse(
                    "\"url\" and \"headers\" are for \"type\": \"http\" servers".into(),
                ));
            }
            let args = raw
                .args
                .iter()
                .enumerate()
                .map(|(i, arg)| expand(&format!("args[{i}]"), arg))
                .collect::<Result<_, _>>()?;
            let env = raw
                .env
                .iter()
                .map(|(key, value)| Ok((key.clone(), expand(&format!("env.{key}"), value)?)))
                .collect::<Result<_, McpConfigError>>()?;
            let cwd = match &raw.cwd {
                Some(cwd) => Some(PathBuf::from(expand("cwd", cwd)?)),
                None => None,
            };
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            }
        }
        "http" | "streamable-http" | "streamableHttp" => {
            let url = match &raw.url {
                Some(url) => expand("url", url.trim())?,
                None => return Err(refuse("an http server needs a \"url\"".into())),
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(refuse(format!(
                    "url {url:?} is not an http:// or https:// URL"
                )));
            }
            if raw.command.is_some() || !raw.args.is_empty() || !raw.env.is_empty() {
                return Err(refuse(
                    "\"command\", \"args\" and \"env\" are for stdio servers".into(),
                ));
            }
            let mut headers = BTreeMap::new();
            for (key, value) in &raw.headers {
                let lower = key.to_ascii_lowercase();
                if RESERVED_HEADERS.contains(&lower.as_str()) {
                    return Err(refuse(format!(
                        "header {key} is set by the MCP transport itself"
                    )));
                }
                headers.insert(key.clone(), expand(&format!("headers.{key}"), value)?);
            }
            Transport::Http { url, headers }
        }
        "sse" => {
            return Err(refuse(
                "the old HTTP+SSE transport is not supported; use streamable HTTP \
                 (\"type\": \"http\")"
                    .into(),
            ))
        }
        other => {
            return Err(refuse(format!(
                "unknown type {other:?} (use \"stdio\" or \"http\")"
            )))
        }
    };
    Ok(ServerConfig { name, transport })
}

#[derive(Debug, PartialEq, Eq)]
enum Expansion {
    Missing(String),
    Malformed(String),
}

/// `text` with every `${VAR}` and `${VAR:-fallback}` replaced; a lone `$` stays as it is.
fn expand(text: &str, lookup: &impl Fn(&str) -> Option<String>) -> Result<String, Expansion> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| Expansion::Malformed(format!("unclosed ${{ in {text:?}")))?;
        let inner = &after[..end];
        let (name, fallback) = match inner.split_once(":-") {
            Some((name, fallback)) => (name, Some(fallback)),
            None => (inner, None),
        };
        let valid = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Expansion::Malformed(format!(
                "${{{inner}}} is not a variable reference (${{NAME}} or ${{NAME:-fallback}})"
            )));
        }
        match (lookup(name), fallback) {
            (Some(value), Some(fallback)) if value.is_empty() => out.push_str(fallback),
            (Some(value), _) => out.push_str(&value),
            (None, Some(fallback)) => out.push_str(fallback),
            (None, None) => return Err(Expansion::Missing(name.to_string())),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            "ROOT" => Some("/srv/data".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<McpConfig, McpConfigError> {
        McpConfig::parse(text, env)
    }

    #[test]
    fn variables_are_expanded_and_a_missing_one_is_named() {
        let ok = |text| expand(text, &env);
        assert_eq!(ok("Bearer ${TOKEN}"), Ok("Bearer s3cret".into()));
        assert_eq!(ok("${ROOT}/a:${TOKEN}"), Ok("/srv/data/a:s3cret".into()));
        assert_eq!(ok("${NOPE:-fallback}"), Ok("fallback".into()));
        assert_eq!(ok("${EMPTY:-fallback}"), Ok("fallback".into()));
        assert_eq!(ok("${EMPTY}"), Ok(String::new()));
        assert_eq!(ok("${TOKEN:-x}"), Ok("s3cret".into()));
        assert_eq!(ok("$HOME and $ stay"), Ok("$HOME and $ stay".into()));
        assert_eq!(ok("${NOPE}"), Err(Expansion::Missing("NOPE".into())));
        assert!(matches!(ok("${TOKEN"), Err(Expansion::Malformed(_))));
        assert!(matches!(ok("${1X}"), Err(Expansion::Malformed(_))));
        assert!(matches!(ok("${}"), Err(Expansion::Malformed(_))));
    }

    #[test]
    fn both_transports_are_read_in_name_order() {
        let config = parse(
            r#"{"mcpServers": {
                "web": {"type": "http", "url": "http://127.0.0.1:9/mcp",
                        "headers": {"Authorization": "Bearer ${TOKEN}"}},
                "files": {"command": "npx", "args": ["-y", "server", "${ROOT}"],
                          "env": {"KEY": "${TOKEN}"}, "cwd": "${ROOT}", "disabled": false},
                "inferred": {"url": "https://mcp.example.com/mcp"}
            }}"#,
        )
        .expect("valid");
        assert_eq!(config.names(), ["files", "inferred", "web"]);
        assert_eq!(
            config.servers[0].transport,
            Transport::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "server".into(), "/srv/data".into()],
                env: BTreeMap::from([("KEY".into(), "s3cret".into())]),
                cwd: Some("/srv/data".into()),
            }
        );
        assert!(matches!(
            config.servers[1].transport,
            Transport::Http { .. }
        ));
        let Transport::Http { url, headers } = &config.servers[2].transport else {
            panic!("http");
        };
        assert_eq!(url, "http://127.0.0.1:9/mcp");
        assert_eq!(headers["Authorization"], "Bearer s3cret");
        assert_eq!(parse(r#"{"mcpServers": {}}"#), Ok(McpConfig::default()));
    }

    #[test]
    fn a_missing_variable_names_the_server_the_field_and_the_variable() {
        let err =
            parse(r#"{"mcpServers": {"gh": {"command": "gh-mcp", "env": {"T": "${GH_TOKEN}"}}}}"#)
                .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "server \"gh\": env.T uses ${GH_TOKEN}, which is not set"
        );
        let err = parse(r#"{"mcpServers": {"w": {"type": "http", "url": "${URL}"}}}"#)
            .expect_err("missing");
        assert!(err.to_string().contains("url uses ${URL}"), "{err}");
    }

    #[test]
    fn what_cannot_work_is_refused_saying_why() {
        let refused = |text: &str, why: &str| {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(why), "{text}: {err}");
        };
        refused(r#"{"servers": {}}"#, "not an MCP configuration");
        refused(
            r#"{"mcpServers": {"a b": {"command": "x"}}}"#,
            "server name",
        );
        refused(
            r#"{"mcpServers": {"a__b.c": {"command": "x"}}}"#,
            "server name",
        );
        refused(
            r#"{"mcpServers": {"a": {"args": ["x"]}}}"#,
            "needs a \"command\"",
        );
        refused(
            r#"{"mcpServers": {"a": {"command": " "}}}"#,
            "needs a \"command\"",
        );
        refused(
            r#"{"mcpServers": {"a": {"type": "http"}}}"#,
            "needs a \"url\"",
        );
        refused(
            r#"{"mcpServers": {"a": {"type": "http", "url": "ftp://x"}}}"#,
            "not an http",
        );
        refused(
            r#"{"mcpServers": {"a": {"type": "http", "url": "http://x", "command": "y"}}}"#,
            "for stdio servers",
        );
        refused(
            r#"{"mcpServers": {"a": {"command": "y", "url": "http://x"}}}"#,
            "for \"type\": \"http\"",
        );
        refused(
            r#"{"mcpServers": {"a": {"type": "http", "url": "http://x", "headers": {"Accept": "x"}}}}"#,
            "set by the MCP transport",
        );
        refused(
            r#"{"mcpServers": {"a": {"type": "sse", "url": "http://x"}}}"#,
            "not supported",
        );
        refused(r#"{"mcpServers": {"a": {"type": "ws"}}}"#, "unknown type");
        refused(
            r#"{"mcpServers": {"a": {"command": "x", "args": ["${oops"]}}}"#,
            "args[0]: unclosed",
        );
    }
}

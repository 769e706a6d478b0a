//! Vault references (`${vault:VAULT/NAME}`) in an agent's own MCP servers' `env` and `headers`:
//! checked when a version is made (a malformed one is refused), resolved in the agent's tenant
//! when its servers start. The stored version keeps the references; values exist only in the
//! configuration handed to the servers.
//!
//! An agent's values get no `${VAR}` expansion, so references are hidden from it behind a
//! marker while the configuration is parsed, and turned back into references to be resolved.

use std::convert::Infallible;

use serde_json::Value;

use crate::mcp::config::Transport;
use crate::mcp::McpConfig;
use crate::model::InlineMcpServer;
use crate::vault::reference::{self, SubstituteError};
use crate::vault::Vaults;

/// What stands for `${vault:` and for its `}` while a configuration is parsed: characters no
/// variable reference and no configuration value uses.
const MARK_OPEN: &str = "\u{1}vault:";
const MARK_CLOSE: &str = "\u{2}";

/// `inline` with each reference in `env` and `headers` behind a marker; an error naming the
/// field for a malformed reference.
pub(crate) fn marked(inline: &InlineMcpServer) -> Result<InlineMcpServer, String> {
    let mut marked = inline.clone();
    for (field, values) in [("env", &mut marked.env), ("headers", &mut marked.headers)] {
        for (key, value) in values.iter_mut() {
            let Value::String(text) = value else { continue };
            let hidden = reference::substitute(text, |secret| {
                Ok::<_, Infallible>(format!("{MARK_OPEN}{secret}{MARK_CLOSE}"))
            })
            .map_err(|e| match e {
                SubstituteError::Malformed(e) => format!("{field}.{key}: {e}"),
                SubstituteError::Value(never) => match never {},
            })?;
            *text = hidden;
        }
    }
    Ok(marked)
}

/// The values of `config`'s servers with every marked reference resolved in `tenant`; an
/// error names the server, the field and the reference (never a value).
pub(crate) async fn resolve(
    config: &mut McpConfig,
    vaults: &Vaults,
    tenant: &str,
) -> Result<(), String> {
    for server in &mut config.servers {
        let (field, values) = match &mut server.transport {
            Transport::Stdio { env, .. } => ("env", env),
            Transport::Http { headers, .. } => ("headers", headers),
        };
        for (key, value) in values.iter_mut() {
            if !value.contains(MARK_OPEN) {
                continue;
            }
            let text = value
                .replace(MARK_OPEN, "${vault:")
                .replace(MARK_CLOSE, "}");
            *value = vaults
                .resolve(tenant, &text)
                .await
                .map_err(|e| format!("MCP server {:?}: {field}.{key}: {e}", server.name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(env: Value, headers: Value) -> InlineMcpServer {
        serde_json::from_value(serde_json::json!({
            "name": "s", "command": "x", "env": env, "headers": headers
        }))
        .expect("a server")
    }

    #[test]
    fn references_are_hidden_and_a_malformed_one_is_named() {
        let inline = server(
            serde_json::json!({"TOKEN": "${vault:prod/token}", "PLAIN": "p", "N": 3}),
            serde_json::json!({}),
        );
        let marked = marked(&inline).expect("well formed");
        assert_eq!(
            marked.env["TOKEN"],
            Value::String(format!("{MARK_OPEN}prod/token{MARK_CLOSE}"))
        );
        assert_eq!(marked.env["PLAIN"], "p");
        let bad = server(
            serde_json::json!({}),
            serde_json::json!({"Authorization": "Bearer ${vault:prod}"}),
        );
        let why = super::marked(&bad).expect_err("malformed");
        assert!(why.starts_with("headers.Authorization: "), "{why}");
    }
}

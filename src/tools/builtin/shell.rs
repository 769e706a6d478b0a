//! `shell`: `sh -c` in the session's workspace, inside the bubblewrap [`Sandbox`]. Offered only
//! when the sandbox probe succeeded; output is stdout and stderr merged, bounded, then the exit
//! code.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{cut_at_char, int_arg, required_string, MAX_OUTPUT_BYTES, NOTE_ROOM};
use crate::tools::sandbox::{Ending, Ran, RunLimits};
use crate::tools::{
    Availability, SandboxStatus, Subject, SubjectKind, Tool, ToolContext, ToolError, ToolResult,
};

/// Longest command accepted (bytes).
const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// How `shell` may run commands on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShellSettings {
    /// Whether commands may use the network (`--shell-network`).
    pub network: bool,
    /// Used when a call names no `timeout_s`.
    pub default_timeout: Duration,
    /// The longest `timeout_s` honoured (`--shell-max-timeout-s`).
    pub max_timeout: Duration,
}

impl Default for ShellSettings {
    fn default() -> ShellSettings {
        ShellSettings {
            network: false,
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
        }
    }
}

pub struct Shell {
    settings: ShellSettings,
    sandbox: SandboxStatus,
}

impl Shell {
    pub fn new(settings: ShellSettings, sandbox: SandboxStatus) -> Shell {
        Shell { settings, sandbox }
    }
}

#[async_trait]
impl Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn description(&self) -> String {
        let network = if self.settings.network {
            "the network is reachable"
        } else {
            "there is no network"
        };
        format!(
            "Run a command with `sh -c` in the workspace (the working directory), inside a \
             sandbox: only the workspace is writable, system directories are read-only, /tmp \
             is empty and private, {network}. Output is stdout and stderr merged (at most {} \
             KiB), then `exit code N`. The command and everything it starts is killed after \
             `timeout_s` seconds (default {}, at most {}); nothing keeps running after the call.",
            MAX_OUTPUT_BYTES / 1024,
            self.settings.default_timeout.as_secs(),
            self.settings.max_timeout.as_secs()
        )
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": { "type": "string", "description": "The shell command to run." },
                "timeout_s": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": self.settings.max_timeout.as_secs(),
                    "description": "Seconds before the command is killed."
                }
            },
            "required": ["command"]
        })
    }

    fn availability(&self) -> Availability {
        match &self.sandbox {
            SandboxStatus::Ready(_) => Availability::Available,
            SandboxStatus::Unavailable(reason) => Availability::Unavailable {
                reason: reason.clone(),
            },
        }
    }

    async fn subject(&self, _ctx: &ToolContext, input: &Value) -> Subject {
        match required_string(input, "command") {
            Ok(command) => Subject {
                kind: SubjectKind::Command,
                text: command,
            },
            Err(_) => Subject {
                kind: SubjectKind::Input,
                text: input.to_string(),
            },
        }
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let SandboxStatus::Ready(sandbox) = &self.sandbox else {
            return Err(ToolError("shell is not available on this server".into()));
        };
        let command = required_string(input, "command")?;
        if command.len() > MAX_COMMAND_BYTES {
            return Err(ToolError(format!(
                "command too long (limit {MAX_COMMAND_BYTES} bytes)"
            )));
        }
        let max = self.settings.max_timeout.as_secs().max(1);
        let timeout = match int_arg(input, "timeout_s", 1, u64::MAX)? {
            Some(seconds) => Duration::from_secs(seconds.min(max)),
            None => self.settings.default_timeout.min(self.settings.max_timeout),
        };
        let limits = RunLimits {
            network: self.settings.network,
            timeout,
            max_output: MAX_OUTPUT_BYTES - NOTE_ROOM,
        };
        let ran = sandbox
            .run(ctx.workspace.root(), &command, limits)
            .await
            .map_err(|e| ToolError(e.to_string()))?;
        match ran.ending {
            Ending::TimedOut => Err(ToolError(format!(
                "timed out after {} s; the command and everything it started were killed. \
                 Output so far:\n{}",
                timeout.as_secs(),
                shown_output(&ran, limits.max_output)
            ))),
            Ending::Exited(code) => {
                Ok(format!("{}exit code {code}", shown_output(&ran, limits.max_output)).into())
            }
            Ending::Signalled(signal) => Ok(format!(
                "{}killed by signal {signal}",
                shown_output(&ran, limits.max_output)
            )
            .into()),
        }
    }
}

/// The kept output as text ending in a newline (empty when there was none), with a note when
/// some was dropped.
fn shown_output(ran: &Ran, max: usize) -> String {
    let text = String::from_utf8_lossy(&ran.output);
    let mut shown = cut_at_char(&text, max).to_owned();
    if !shown.is_empty() && !shown.ends_with('\n') {
        shown.push('\n');
    }
    if ran.total > ran.output.len() as u64 {
        shown.push_str(&format!(
            "[output truncated: showed the first {} of {} bytes]\n",
            ran.output.len(),
            ran.total
        ));
    }
    shown
}

//! `shell`: `sh -c` in the session's workspace, inside the [`Sandbox`] (bubblewrap or Landlock).
//! Offered only when the sandbox probe succeeded; output is stdout and stderr merged, bounded,
//! then the exit code; a call that exceeds a limit (memory, processes, CPU time, file size,
//! /tmp) ends as a tool error naming it. After every call no file in the workspace keeps a setuid or setgid bit ([`setid`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    cut_to_cost, in_error_json, in_json, int_arg, required_string, Cost, MAX_OUTPUT_BYTES,
    NOTE_ROOM,
};
use crate::tools::egress::{Egress, EgressProxy};
use crate::tools::sandbox::{
    Ending, Limits, Network, Ran, RunLimits, SandboxChoice, MAX_READ_BYTES,
};
use crate::tools::setid;
use crate::tools::{
    Availability, SandboxStatus, Subject, SubjectKind, Tool, ToolContext, ToolError, ToolResult,
};

/// Longest command accepted (bytes).
const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Room a timed-out call's output leaves for the words around it and the error's JSON.
const TIMEOUT_ROOM: usize = 128;

/// What `shell` commands may reach (`--shell-network`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ShellNetwork {
    /// Nothing, not even loopback (the default).
    #[default]
    None,
    /// The host's network.
    All,
    /// The hosts on an allow-list, through a proxy run for each call.
    Allow(Arc<Egress>),
}

/// How `shell` may run commands on this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellSettings {
    /// What commands may reach (`--shell-network`).
    pub network: ShellNetwork,
    /// Used when a call names no `timeout_s`.
    pub default_timeout: Duration,
    /// The longest `timeout_s` honoured (`--shell-max-timeout-s`).
    pub max_timeout: Duration,
    /// The backend `--sandbox` asks for.
    pub sandbox: SandboxChoice,
    /// The limits on every call (`--shell-memory-mb` and the like).
    pub limits: Limits,
}

impl Default for ShellSettings {
    fn default() -> ShellSettings {
        ShellSettings {
            network: ShellNetwork::None,
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            sandbox: SandboxChoice::Auto,
            limits: Limits::default(),
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
        let network = match self.settings.network {
            ShellNetwork::All => "the network is reachable",
            ShellNetwork::None => "there is no network",
            ShellNetwork::Allow(_) => {
                "only the hosts on this server's allow-list are reachable, through the HTTP \
                 proxy set in HTTP_PROXY and HTTPS_PROXY (there is no DNS; other hosts get 403)"
            }
        };
        format!(
            "Run a command with `sh -c` in the workspace (the working directory), inside a \
             sandbox: only the workspace is writable, system directories are read-only, /tmp \
             is empty, private and holds at most {} MiB, {network}. Output is stdout and \
             stderr merged (at most {} KiB shown; past {} MiB the output is closed and writes \
             to it fail), then `exit code N`. The command and everything it starts is killed \
             after `timeout_s` seconds (default {}, at most {}); nothing keeps running after \
             the call. Limits: {} MB of memory, {} processes, {} MB per file written; a \
             command exceeding one is killed.",
            self.settings.limits.tmp_mb,
            MAX_OUTPUT_BYTES / 1024,
            MAX_READ_BYTES >> 20,
            self.settings.default_timeout.as_secs(),
            self.settings.max_timeout.as_secs(),
            self.settings.limits.memory_mb,
            self.settings.limits.pids,
            self.settings.limits.file_mb,
        )
    }

    fn sandbox(&self) -> Option<&'static str> {
        match &self.sandbox {
            SandboxStatus::Ready(sandbox) => Some(sandbox.backend_name()),
            SandboxStatus::Unavailable(_) => None,
        }
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
        // The call's own proxy, stopped when the call ends (or is dropped).
        let proxy = match &self.settings.network {
            ShellNetwork::Allow(egress) => {
                Some(EgressProxy::start(egress.clone()).await.map_err(|e| {
                    ToolError(format!("the egress proxy could not start ({})", e.kind()))
                })?)
            }
            _ => None,
        };
        let network = match (&self.settings.network, &proxy) {
            (ShellNetwork::All, _) => Network::All,
            (_, Some(proxy)) => Network::Proxy { port: proxy.port() },
            _ => Network::None,
        };
        let limits = RunLimits {
            network,
            timeout,
            max_output: MAX_OUTPUT_BYTES - NOTE_ROOM,
            limits: self.settings.limits,
        };
        let clear_setid = ClearSetid(Some(ctx.workspace.root().to_path_buf()));
        let ran = sandbox
            .run(&ctx.workspace, &command, limits)
            .await
            .map_err(|e| ToolError(e.to_string()))?;
        drop(proxy);
        clear_setid.now().await;
        match ran.ending {
            Ending::TimedOut => Err(ToolError(format!(
                "timed out after {} s; the command and everything it started were killed. \
                 Output so far:\n{}",
                timeout.as_secs(),
                shown_output(&ran, limits.max_output - TIMEOUT_ROOM, in_error_json)
            ))),
            Ending::Exceeded(breach) => Err(ToolError(format!(
                "{}; the command and everything it started were killed. Output so far:\n{}",
                breach.describe(&limits.limits, timeout),
                shown_output(&ran, limits.max_output - TIMEOUT_ROOM, in_error_json)
            ))),
            Ending::Exited(code) => Ok(format!(
                "{}exit code {code}",
                shown_output(&ran, limits.max_output, in_json)
            )
            .into()),
            Ending::Signalled(signal) => Ok(format!(
                "{}killed by signal {signal}",
                shown_output(&ran, limits.max_output, in_json)
            )
            .into()),
        }
    }
}

/// Clears the setuid and setgid bits in a workspace once a command is over, however its call
/// ends: [`ClearSetid::now`] before the call returns, or on a thread of its own when the call
/// is dropped (cancelled).
struct ClearSetid(Option<PathBuf>);

impl ClearSetid {
    async fn now(mut self) {
        if let Some(root) = self.0.take() {
            // A panic there would only lose the clearing; it is logged by the runtime.
            let _ = tokio::task::spawn_blocking(move || setid::clear(&root)).await;
        }
    }
}

impl Drop for ClearSetid {
    fn drop(&mut self) {
        if let Some(root) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(move || setid::clear(&root));
                }
                Err(_) => {
                    setid::clear(&root);
                }
            }
        }
    }
}

/// The kept output as text ending in a newline (empty when there was none), costing at most
/// `max` bytes in the model request, with a note when some was dropped or not read at all.
fn shown_output(ran: &Ran, max: usize, cost: Cost) -> String {
    let text = String::from_utf8_lossy(&ran.output);
    let mut shown = cut_to_cost(&text, max, cost).to_owned();
    let showed = if shown.len() < text.len() {
        shown.len()
    } else {
        ran.output.len()
    };
    if !shown.is_empty() && !shown.ends_with('\n') {
        shown.push('\n');
    }
    if ran.closed_early {
        shown.push_str(&format!(
            "[output truncated: showed the first {showed} of over {} bytes; the rest was \
             refused (broken pipe): redirect long output to a file]\n",
            ran.total
        ));
    } else if ran.total > showed as u64 {
        shown.push_str(&format!(
            "[output truncated: showed the first {showed} of {} bytes]\n",
            ran.total
        ));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;
    use crate::tools::sandbox::testing::{self, marker, processes_with};
    use crate::tools::{ToolRegistry, Workspace};
    use std::sync::Arc;
    use std::time::Instant;

    struct Fixture {
        _tmp: tempfile::TempDir,
        ctx: ToolContext,
        shell: Shell,
    }

    async fn fixture(settings: ShellSettings) -> Option<Fixture> {
        let sandbox = testing::sandbox().await?;
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(tmp.path()).expect("workspace");
        Some(Fixture {
            _tmp: tmp,
            ctx: ToolContext::new(ws),
            shell: Shell::new(settings, SandboxStatus::Ready(sandbox)),
        })
    }

    async fn run(f: &Fixture, command: &str) -> Result<String, ToolError> {
        let args = json!({ "command": command });
        f.shell.call(&f.ctx, &args).await.map(|r| r.output)
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn output_is_stdout_and_stderr_merged_then_the_exit_code() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let out = run(&f, "echo out; echo err >&2; printf 'no newline'; exit 3")
            .await
            .expect("ran");
        assert_eq!(out, "out\nerr\nno newline\nexit code 3");
        assert_eq!(run(&f, "true").await.expect("ran"), "exit code 0");
        assert_eq!(
            run(&f, "sh -c 'kill -9 $$'").await.expect("ran"),
            "Killed\nexit code 137",
            "a command killed by a signal is reported as the shell does, 128 + the signal"
        );
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn the_workspace_is_the_writable_working_directory() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let root = f.ctx.workspace.root().to_path_buf();
        let out = run(&f, "pwd; echo hi > made.txt; mkdir -p a/b && echo $HOME")
            .await
            .expect("ran");
        let root_text = root.display().to_string();
        assert_eq!(out, format!("{root_text}\n{root_text}\nexit code 0"));
        assert_eq!(
            std::fs::read_to_string(root.join("made.txt")).expect("written"),
            "hi\n"
        );
        assert!(root.join("a/b").is_dir());
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn nothing_of_the_server_environment_or_tmp_is_visible() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        // The test process runs with CARGO_* variables set; the sandbox must not see them.
        assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
        let out = run(&f, "env | cut -d= -f1 | sort").await.expect("ran");
        assert_eq!(out, "HOME\nLANG\nPATH\nPWD\nTERM\nTMPDIR\nexit code 0");
        let host_tmp = tempfile::NamedTempFile::new().expect("host temp file");
        let command = format!(
            "test -e {} && echo visible || echo hidden",
            host_tmp.path().display()
        );
        assert_eq!(run(&f, &command).await.expect("ran"), "hidden\nexit code 0");
        assert!(host_tmp.path().exists());
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn output_is_capped_with_a_note() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let out = run(&f, "head -c 200000 /dev/zero | tr '\\0' x; echo; echo tail")
            .await
            .expect("ran");
        assert!(out.len() <= MAX_OUTPUT_BYTES, "{} bytes", out.len());
        let kept = MAX_OUTPUT_BYTES - NOTE_ROOM;
        assert!(out.starts_with(&"x".repeat(kept)), "kept the first bytes");
        assert!(
            out.ends_with(&format!(
                "\n[output truncated: showed the first {kept} of 200006 bytes]\nexit code 0"
            )),
            "{}",
            &out[out.len() - 100..]
        );
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn endless_output_is_closed_and_the_model_told() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let started = Instant::now();
        let args = json!({ "command": "cat /dev/zero | tr '\\0' x", "timeout_s": 20 });
        let out = f.shell.call(&f.ctx, &args).await.expect("ran").output;
        eprintln!("`cat /dev/zero | tr`: {:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(5));
        let kept = MAX_OUTPUT_BYTES - NOTE_ROOM;
        assert!(out.starts_with(&"x".repeat(kept)), "kept the first bytes");
        assert!(
            out.ends_with(&format!(
                "\n[output truncated: showed the first {kept} of over {MAX_READ_BYTES} bytes; \
                 the rest was refused (broken pipe): redirect long output to a file]\n\
                 exit code 141"
            )),
            "{}",
            &out[kept..]
        );
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn control_characters_count_as_the_escapes_the_model_receives() {
        let settings = ShellSettings {
            max_timeout: Duration::from_secs(1),
            ..ShellSettings::default()
        };
        let Some(f) = fixture(settings).await else {
            return;
        };
        // Ends on its own, and times out still writing (the longest notes).
        let commands = [
            "head -c 100000 /dev/zero | tr '\\0' '\\1'; exit 3",
            "trap '' PIPE; head -c 5000000 /dev/zero | tr '\\0' '\\1'; sleep 10",
        ];
        let registry =
            ToolRegistry::new(vec![Arc::new(f.shell)], MAX_OUTPUT_BYTES).expect("registry");
        for (command, ends) in commands
            .into_iter()
            .zip(["exit code 3", "to a file]\\n\"}"])
        {
            let call = ToolCall {
                id: "c1".into(),
                name: "shell".into(),
                arguments: json!({ "command": command }),
            };
            let out = registry.execute(&f.ctx, &call).await.output;
            let request = serde_json::to_string(&out).expect("json").len() - 2;
            eprintln!(
                "{command}: {} bytes, {request} in the model request",
                out.len()
            );
            assert!(request <= MAX_OUTPUT_BYTES, "{request}");
            assert!(request > MAX_OUTPUT_BYTES - 2 * NOTE_ROOM, "{request}");
            let tail = &out[out.len() - 200..];
            assert!(
                tail.contains("[output truncated: showed the first "),
                "{tail}"
            );
            assert!(
                !tail.contains("[output cut"),
                "the registry cut nothing: {tail}"
            );
            assert!(tail.ends_with(ends), "{tail}");
        }
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn no_file_keeps_a_setuid_bit_after_the_call() {
        use std::os::unix::fs::PermissionsExt;
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let out = run(
            &f,
            "cp /bin/sh planted; chmod u+s planted; mkdir -p d/e; cp planted d/e/deep; \
             chmod 6755 d/e/deep; stat -c %A planted d/e/deep",
        )
        .await
        .expect("ran");
        assert_eq!(out, "-rwsr-xr-x\n-rwsr-sr-x\nexit code 0", "set inside");
        let root = f.ctx.workspace.root();
        for planted in ["planted", "d/e/deep"] {
            let mode = std::fs::metadata(root.join(planted))
                .expect("stat")
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o755, "{planted}: {mode:o}");
        }
        // Clearing a workspace of many files, as after every call.
        let many = root.join("many");
        for dir in 0..100 {
            std::fs::create_dir_all(many.join(dir.to_string())).expect("mkdir");
            for file in 0..200 {
                std::fs::write(many.join(format!("{dir}/{file}")), "").expect("write");
            }
        }
        let started = Instant::now();
        let cleared = setid::clear(root);
        eprintln!(
            "a walk over {} entries: {:?}",
            cleared.entries,
            started.elapsed()
        );
        assert!(cleared.complete);
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn a_timeout_kills_the_command_and_everything_it_started() {
        let settings = ShellSettings {
            max_timeout: Duration::from_secs(2),
            ..ShellSettings::default()
        };
        let Some(f) = fixture(settings).await else {
            return;
        };
        let m = marker();
        let started = Instant::now();
        let args =
            json!({ "command": format!("echo begun; sleep {m} & sleep {m}"), "timeout_s": 1 });
        let err = f.shell.call(&f.ctx, &args).await.expect_err("timed out");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        assert!(err.0.starts_with("timed out after 1 s"), "{err}");
        assert!(err.0.ends_with("Output so far:\nbegun\n"), "{err}");
        assert!(
            processes_with(&m).is_empty(),
            "left behind: {:?}",
            processes_with(&m)
        );
        // timeout_s above the maximum is cut to it.
        let started = Instant::now();
        let args = json!({ "command": "sleep 30", "timeout_s": 500 });
        let err = f.shell.call(&f.ctx, &args).await.expect_err("timed out");
        assert!(err.0.starts_with("timed out after 2 s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let err = f
            .shell
            .call(&f.ctx, &json!({ "command": "true", "timeout_s": 0 }))
            .await
            .expect_err("bad timeout");
        assert!(
            err.0
                .contains("`timeout_s` must be an integer of at least 1"),
            "{err}"
        );
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn three_calls_run_side_by_side() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let started = Instant::now();
        let (a, b, c) = tokio::join!(run(&f, "sleep 1"), run(&f, "sleep 1"), run(&f, "sleep 1"));
        let wall = started.elapsed();
        for out in [a, b, c] {
            assert_eq!(out.expect("ran"), "exit code 0");
        }
        // One after another they would take 3 s.
        assert!(wall < Duration::from_millis(2900), "{wall:?}");
    }

    #[tokio::test]
    async fn without_a_sandbox_nothing_runs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ctx = ToolContext::new(Workspace::open(tmp.path()).expect("workspace"));
        let shell = Shell::new(
            ShellSettings::default(),
            SandboxStatus::Unavailable("bwrap is missing".into()),
        );
        assert_eq!(
            shell.availability(),
            Availability::Unavailable {
                reason: "bwrap is missing".into()
            }
        );
        let args = json!({ "command": "touch ran" });
        let err = shell.call(&ctx, &args).await.expect_err("refused");
        assert_eq!(err.0, "shell is not available on this server");
        assert!(!tmp.path().join("ran").exists());
    }

    /// Prints the sandbox's start-up cost and the wall time of parallel calls (run with
    /// `cargo test --lib measure_the_sandbox -- --ignored --nocapture`).
    #[ignore = "a measurement, not a check"]
    #[tokio::test(flavor = "multi_thread")]
    async fn measure_the_sandbox() {
        let Some(f) = fixture(ShellSettings::default()).await else {
            return;
        };
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            assert_eq!(run(&f, "true").await.expect("ran"), "exit code 0");
            times.push(started.elapsed());
        }
        times.sort();
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        println!(
            "shell `true` x20 ({profile}): median {:?}, min {:?}, max {:?}",
            times[10], times[0], times[19]
        );
        let started = Instant::now();
        let (a, b, c) = tokio::join!(run(&f, "sleep 1"), run(&f, "sleep 1"), run(&f, "sleep 1"));
        let wall = started.elapsed();
        for out in [a, b, c] {
            assert_eq!(out.expect("ran"), "exit code 0");
        }
        println!("three parallel `sleep 1` calls: {wall:?}");
    }
}

//! The bubblewrap sandbox `shell` runs commands in, and the start-up probe that decides whether
//! it can. **Fail closed:** without a working `bwrap` there is no [`Sandbox`], only a reason,
//! and nothing ever runs unsandboxed.
//!
//! Inside: the workspace, read-write at its own path and the working directory; `/usr`, `/bin`,
//! `/sbin`, `/lib*` and `/etc` read-only (merged-`/usr` symlinks recreated as symlinks) with
//! the shadow password files masked; a minimal `/dev`, a fresh `/proc` and `/tmp`; every
//! namespace unshared (no network unless allowed), all capabilities dropped, a new session,
//! and an environment holding nothing of the server's. Nothing else of the host is visible.
//!
//! A command's processes live in the sandbox's own PID namespace, whose init is the command's
//! `sh`: when it exits, or is killed, the kernel kills everything left in the namespace. bwrap
//! runs in a process group of its own; when the call ends early (timeout, or the future dropped
//! on cancellation) the namespace's init and that group are killed at once. (As the init, `sh`
//! ignores signals sent from inside the sandbox that it has no handler for: `kill $$` does
//! nothing there.)

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{kill_process, kill_process_group, Pid, Signal};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::Workspace;

/// How long the start-up probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed sandbox may take to be reaped before the call returns anyway.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the sandbox looks for programs.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host files never shown inside, though they live in a directory that is.
const MASKED: [&str; 2] = ["/etc/shadow", "/etc/gshadow"];

/// A bubblewrap that was seen to work on this host.
#[derive(Debug)]
pub struct Sandbox {
    bwrap: PathBuf,
    /// The host's system directories, as bwrap arguments.
    system: Vec<OsString>,
    /// Host paths a workspace must not contain (binding it would hide their read-only mounts).
    system_paths: Vec<PathBuf>,
}

/// The probe's verdict, kept for the log and `GET /v1/tools`.
#[derive(Debug, Clone)]
pub enum SandboxStatus {
    Ready(Arc<Sandbox>),
    Unavailable(String),
}

/// What one sandboxed command is allowed.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub network: bool,
    pub timeout: Duration,
    /// Bytes of output kept; the rest is counted and dropped.
    pub max_output: usize,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signalled(i32),
    /// Killed, with everything it started, when the timeout passed.
    TimedOut,
}

/// A finished command: the first bytes of its merged stdout and stderr, and how it ended.
#[derive(Debug, Clone)]
pub struct Ran {
    pub output: Vec<u8>,
    /// Bytes of output in all, kept or not.
    pub total: u64,
    pub ending: Ending,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the workspace contains a system directory; commands do not run there")]
    WorkspaceHoldsSystem,
    #[error("the command contains a NUL byte")]
    Nul,
    /// The OS message is not kept: it may name host paths.
    #[error("the sandbox could not be started ({0})")]
    Start(std::io::ErrorKind),
}

impl SandboxStatus {
    /// Why the sandbox is unavailable, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            SandboxStatus::Ready(_) => None,
            SandboxStatus::Unavailable(reason) => Some(reason),
        }
    }
}

impl Sandbox {
    /// Finds `bwrap` on `PATH` and checks it can build the sandbox by running `true` in it.
    pub async fn probe() -> SandboxStatus {
        match find_on_path("bwrap") {
            Some(bwrap) => Sandbox::probe_with(&bwrap).await,
            None => SandboxStatus::Unavailable(
                "bwrap (bubblewrap) was not found on PATH; install it to offer shell".into(),
            ),
        }
    }

    /// As [`Sandbox::probe`], with the bwrap at `bwrap`.
    pub async fn probe_with(bwrap: &Path) -> SandboxStatus {
        let (system, system_paths) = system_mounts();
        let sandbox = Sandbox {
            bwrap: bwrap.to_path_buf(),
            system,
            system_paths,
        };
        let limits = RunLimits {
            network: false,
            timeout: PROBE_TIMEOUT,
            max_output: 4096,
        };
        let result = sandbox.run_in(None, "exit 0", limits).await;
        match result {
            Ok(Ran {
                ending: Ending::Exited(0),
                ..
            }) => SandboxStatus::Ready(Arc::new(sandbox)),
            Ok(Ran { output, ending, .. }) => {
                let said = String::from_utf8_lossy(&output);
                let said = said.lines().next().unwrap_or("").trim();
                let how = match ending {
                    Ending::Exited(code) => format!("exit code {code}"),
                    Ending::Signalled(signal) => format!("killed by signal {signal}"),
                    Ending::TimedOut => format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
                };
                SandboxStatus::Unavailable(format!(
                    "bwrap cannot create its sandbox here ({how}): {said}"
                ))
            }
            Err(e) => SandboxStatus::Unavailable(format!("bwrap could not be run: {e}")),
        }
    }

    /// Runs `sh -c script` in the sandbox with `workspace` bound read-write: its directory as
    /// the workspace's descriptor holds it (never its path resolved again), mounted at the
    /// path it had when it was opened.
    pub async fn run(
        &self,
        workspace: &Workspace,
        script: &str,
        limits: RunLimits,
    ) -> Result<Ran, SandboxError> {
        if self
            .system_paths
            .iter()
            .any(|p| p.starts_with(workspace.root()))
        {
            return Err(SandboxError::WorkspaceHoldsSystem);
        }
        self.run_in(Some(workspace), script, limits).await
    }

    async fn run_in(
        &self,
        workspace: Option<&Workspace>,
        script: &str,
        limits: RunLimits,
    ) -> Result<Ran, SandboxError> {
        if script.contains('\0') {
            return Err(SandboxError::Nul);
        }
        let start = |e: std::io::Error| SandboxError::Start(e.kind());
        let (sender, mut receiver) = tokio::net::unix::pipe::pipe().map_err(start)?;
        let stdout: OwnedFd = sender.into_blocking_fd().map_err(start)?;
        let stderr = stdout.try_clone().map_err(start)?;
        let mut command = self.command(workspace, script, limits.network);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(start)?;
        // The command holds our copies of the pipe's write end: without dropping it, the pipe
        // would never report its end.
        drop(command);
        let mut group = ProcessGroup::of(&child);

        let mut output = Vec::new();
        let mut total = 0;
        let pumped = tokio::time::timeout(
            limits.timeout,
            pump(
                &mut receiver,
                &mut child,
                &mut output,
                &mut total,
                limits.max_output,
            ),
        )
        .await;
        let ending = match pumped {
            Ok(Ok(status)) => {
                // Reaped: the group id may be reused from now on, so it is never signalled.
                group.forget();
                ending_of(status)
            }
            Ok(Err(e)) => {
                group.kill();
                return Err(SandboxError::Start(e.kind()));
            }
            Err(_elapsed) => {
                // Killing the namespace's init makes the kernel kill everything in it; bwrap
                // exits once all of it is gone, so after the wait nothing of the call is left.
                group.kill_namespace();
                match tokio::time::timeout(REAP_TIMEOUT, child.wait()).await {
                    Ok(Ok(_)) => group.forget(),
                    _ => group.kill(),
                }
                Ending::TimedOut
            }
        };
        Ok(Ran {
            output,
            total,
            ending,
        })
    }

    fn command(&self, workspace: Option<&Workspace>, script: &str, network: bool) -> Command {
        let mut command = Command::new(&self.bwrap);
        command.env_clear().env("PATH", SANDBOX_PATH);
        // `--as-pid-1`: `sh` is the namespace's init, so when it exits the kernel kills
        // everything left in the namespace before bwrap learns of the exit: the call ends
        // only when nothing it started is left. (bwrap's own init would report first.)
        command.args([
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--as-pid-1",
        ]);
        if network {
            command.arg("--share-net");
        }
        command.args(["--cap-drop", "ALL"]);
        command.args(&self.system);
        command.args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]);
        for masked in MASKED {
            if Path::new(masked).is_file() {
                command.args(["--ro-bind", "/dev/null", masked]);
            }
        }
        let home = workspace.map_or(Path::new("/"), Workspace::root);
        if let Some(workspace) = workspace {
            let fd = workspace.fd().as_raw_fd();
            command.arg("--bind-fd").arg(fd.to_string()).arg(home);
            // SAFETY: between fork and exec, only `fcntl` on a descriptor the parent keeps
            // open until the child is spawned: async-signal-safe, no allocation.
            unsafe {
                command.pre_exec(move || {
                    // bwrap gets the descriptor across exec; the parent's stays close-on-exec.
                    let fd = BorrowedFd::borrow_raw(fd);
                    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
                    Ok(())
                });
            }
        }
        command.arg("--chdir").arg(home);
        command.arg("--setenv").arg("HOME").arg(home);
        command.args(["--setenv", "PATH", SANDBOX_PATH]);
        command.args(["--setenv", "TMPDIR", "/tmp"]);
        command.args(["--setenv", "LANG", "C.UTF-8"]);
        command.args(["--setenv", "TERM", "dumb"]);
        command.args(["--", "sh", "-c", script]);
        command
    }
}

/// Reads the merged output until every process holding the pipe is gone, keeping the first
/// `max` bytes, then reaps bwrap.
async fn pump(
    receiver: &mut tokio::net::unix::pipe::Receiver,
    child: &mut Child,
    output: &mut Vec<u8>,
    total: &mut u64,
    max: usize,
) -> std::io::Result<ExitStatus> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = receiver.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        *total += n as u64;
        let keep = n.min(max.saturating_sub(output.len()));
        output.extend_from_slice(&buf[..keep]);
    }
    child.wait().await
}

fn ending_of(status: ExitStatus) -> Ending {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Exited(code),
        (None, Some(signal)) => Ending::Signalled(signal),
        (None, None) => Ending::Exited(-1),
    }
}

/// bwrap's process group, killed as a whole unless forgotten (after bwrap was reaped).
///
/// The sandboxed processes are not in it: bwrap's child, the init of the sandbox's PID
/// namespace, starts a session of its own. Killing that init is what ends them all; killing
/// bwrap ends it too (`--die-with-parent`), a moment later.
struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    fn of(child: &Child) -> ProcessGroup {
        ProcessGroup(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
        )
    }

    /// Kills bwrap's children (the namespace's init) but not bwrap, which then reports.
    fn kill_namespace(&self) {
        if let Some(leader) = self.0 {
            for child in children_of(leader) {
                // It may be gone already; there is nothing else to do.
                let _ = kill_process(child, Signal::KILL);
            }
        }
    }

    /// Kills the namespace's init and bwrap's whole group, at once.
    fn kill(&mut self) {
        self.kill_namespace();
        if let Some(pgid) = self.0.take() {
            let _ = kill_process_group(pgid, Signal::KILL);
        }
    }

    fn forget(&mut self) {
        self.0 = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child processes of `parent`, from `/proc`.
fn children_of(parent: Pid) -> Vec<Pid> {
    let raw = parent.as_raw_nonzero();
    let listed = std::fs::read_to_string(format!("/proc/{raw}/task/{raw}/children"));
    let pids: Vec<i32> = match listed {
        Ok(text) => text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
        // Kernels without that file: every process's parent, from its `stat`.
        Err(_) => std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
                let ppid: i32 = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                (ppid == raw.get()).then_some(pid)
            })
            .collect(),
    };
    pids.into_iter().filter_map(Pid::from_raw).collect()
}

/// The host's system directories as bwrap arguments: read-only binds of the directories, and
/// symlinks recreated as such (merged `/usr`); with the paths they occupy.
fn system_mounts() -> (Vec<OsString>, Vec<PathBuf>) {
    let mut names: Vec<OsString> = ["usr", "bin", "sbin", "etc"].map(OsString::from).to_vec();
    if let Ok(entries) = std::fs::read_dir("/") {
        let mut libs: Vec<OsString> = entries
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with("lib"))
            .collect();
        libs.sort();
        names.extend(libs);
    }
    let mut args = Vec::new();
    let mut paths = Vec::new();
    for name in names {
        let path = Path::new("/").join(&name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(&path) {
                args.extend([
                    "--symlink".into(),
                    target.into_os_string(),
                    path.clone().into(),
                ]);
            }
        } else if meta.is_dir() {
            args.extend(["--ro-bind".into(), path.clone().into(), path.clone().into()]);
        } else {
            continue;
        }
        paths.push(path);
    }
    (args, paths)
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Helpers for tests that need a real sandbox.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The sandbox, for tests that need one. Without it they fail, unless
    /// `TAH_SKIP_SANDBOX_TESTS` is set: then they print "skipped" and end early. (Build with
    /// `RUSTFLAGS="--cfg tah_no_sandbox"` to have them reported as ignored instead.)
    pub async fn sandbox() -> Option<Arc<Sandbox>> {
        match Sandbox::probe().await {
            SandboxStatus::Ready(sandbox) => Some(sandbox),
            SandboxStatus::Unavailable(reason) => {
                if std::env::var_os("TAH_SKIP_SANDBOX_TESTS").is_some() {
                    eprintln!("skipped: the sandbox is unavailable: {reason}");
                    None
                } else {
                    panic!(
                        "the sandbox is unavailable ({reason}); install bubblewrap, or set \
                         TAH_SKIP_SANDBOX_TESTS=1 to skip the tests that need it"
                    )
                }
            }
        }
    }

    /// A string no other process's command line holds, for finding a test's processes.
    pub fn marker() -> String {
        format!(
            "4{:07}.{:06}",
            std::process::id() % 10_000_000,
            rand::random::<u32>() % 1_000_000
        )
    }

    /// The processes whose command line contains `marker`.
    pub fn processes_with(marker: &str) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline
                        .windows(marker.len())
                        .any(|w| w == marker.as_bytes())
                })
            })
            .collect()
    }

    /// Waits up to `within` for `done`, polling.
    pub async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if done() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn a_missing_bwrap_fails_closed() {
        let status = Sandbox::probe_with(Path::new("/nonexistent/bwrap")).await;
        let reason = status.reason().expect("unavailable");
        assert!(reason.starts_with("bwrap could not be run"), "{reason}");
    }

    #[tokio::test]
    async fn a_bwrap_that_cannot_make_namespaces_fails_closed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("bwrap");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
        )
        .expect("write");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let status = Sandbox::probe_with(&fake).await;
        assert_eq!(
            status.reason(),
            Some(
                "bwrap cannot create its sandbox here (exit code 1): bwrap: No permissions to \
                 create new namespace"
            )
        );
        // A "bwrap" that succeeds without doing anything would pass the probe: the probe
        // checks that the tool runs, and the hostile tests check what it confines.
    }

    #[cfg_attr(tah_no_sandbox, ignore = "needs bubblewrap")]
    #[tokio::test]
    async fn the_probe_accepts_the_installed_bwrap() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        assert!(sandbox.bwrap.is_absolute());
        assert!(sandbox.system_paths.contains(&PathBuf::from("/usr")));
    }

    #[cfg_attr(tah_no_sandbox, ignore = "needs bubblewrap")]
    #[tokio::test]
    async fn a_workspace_holding_system_directories_is_refused() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        let limits = RunLimits {
            network: false,
            timeout: Duration::from_secs(5),
            max_output: 100,
        };
        for root in ["/", "/usr"] {
            let workspace = Workspace::open(Path::new(root)).expect("open");
            let err = sandbox
                .run(&workspace, "true", limits)
                .await
                .expect_err("refused");
            assert!(
                matches!(err, SandboxError::WorkspaceHoldsSystem),
                "{root}: {err}"
            );
        }
    }
}

//! The sandbox `shell` runs commands in, its two backends, and the start-up probe that decides
//! which one works here. **Fail closed:** without a working backend there is no [`Sandbox`],
//! only a reason, and nothing ever runs unsandboxed.
//!
//! `--sandbox auto` (the default) takes bubblewrap where its probe works (user namespaces
//! allowed), else Landlock + seccomp ([`landlock`]) where the kernel has them; `bwrap` or
//! `landlock` take only that one. Every call, on either backend, is bounded by the
//! [`limits`] (memory, processes, CPU time, file size, temporary space).
//!
//! **bubblewrap.** Inside: the workspace, read-write at its own path and the working
//! directory; `/usr`, `/bin`, `/sbin`, `/lib*` and `/etc` read-only (merged-`/usr` symlinks
//! recreated as symlinks) with the shadow password files masked; a minimal read-only `/dev`, a
//! fresh read-only `/proc`, and a sized `/tmp` and `/dev/shm` (tmpfs: `--shell-tmp-mb`,
//! [`SHM_BYTES`]); the sandbox's own root is read-only, so those two are the only
//! memory-backed files a command can write. Every namespace unshared (no network unless
//! allowed), all capabilities dropped, a new session, and an environment holding nothing of
//! the server's. Nothing else of the host is visible
//! (with [`Network::Proxy`], the call's egress proxy socket and the tah executable, read-only,
//! in `/run/tah-egress`).
//!
//! **Landlock.** The hidden `tah sandbox-exec` helper (see [`landlock`]): system directories
//! read and executed only, the workspace read-write, a private temporary directory made for
//! the call (`TMPDIR` and `HOME`; removed after it, its size watched: past `--shell-tmp-mb`
//! the call is killed), nothing else of the filesystem; seccomp refuses sockets (unless the
//! network is allowed), ptrace, mounts, namespaces and the like.
//!
//! Memory: tmpfs pages are charged to no process, so an OOM killer that picks by size would
//! pick the server. The sandbox and everything it starts get `oom_score_adj` 1000, set before
//! it runs: when memory runs out the sandbox is killed first, which also frees its tmpfs.
//! [`shield_server`] lowers the server's own score where it is allowed to; the programs it
//! starts outside the sandbox get the default back ([`unshielded`]).
//!
//! Output: the first `max_output` bytes are kept; reading goes on, only counting, up to
//! [`MAX_READ_BYTES`], then the pipe is closed, so the command's further writes fail (a
//! broken pipe) instead of costing the server a read each.
//!
//! With bubblewrap, a command's processes live in the sandbox's own PID namespace, whose init
//! is the command's `sh`: when it exits, or is killed, the kernel kills everything left in the
//! namespace. bwrap runs in a process group of its own; when the call ends early (timeout, or
//! the future dropped on cancellation) the namespace's init and that group are killed at once.
//! (As the init, `sh` ignores signals sent from inside the sandbox that it has no handler for:
//! `kill $$` does nothing there.) With Landlock there is no PID namespace: the helper is the
//! command's subreaper and kills what is left when `sh` exits; the call's cgroups, where the
//! server can make them, kill everything in them when the call ends, however it ends.

pub mod landlock;
pub mod limits;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{kill_process, kill_process_group, Pid, Signal};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

pub use self::limits::{Breach, Limits};
use self::limits::{CallCgroups, Cgroups, Rlimits};
use super::Workspace;

/// How long the start-up probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed sandbox may take to be reaped before the call returns anyway.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the sandbox looks for programs.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Host files never shown inside, though they live in a directory that is.
pub(crate) const MASKED: [&str; 2] = ["/etc/shadow", "/etc/gshadow"];
/// How often a call's cgroups and temporary directory are checked against its limits.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Size of the sandbox's `/dev/shm`.
pub const SHM_BYTES: u64 = 64 << 20;
/// Bytes of a command's output read in all (kept or only counted); then the pipe is closed.
pub const MAX_READ_BYTES: u64 = 4 << 20;
/// The sandbox's `oom_score_adj`: the highest, its processes are the OOM killer's first pick.
const SANDBOX_OOM_SCORE_ADJ: &[u8] = b"1000";
/// The server's `oom_score_adj` where it may lower it: the OOM killer's last pick, still
/// killable when nothing else is (-1000 would make it never killable).
const SERVER_OOM_SCORE_ADJ: i32 = -999;

/// Which backend `--sandbox` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxChoice {
    /// bubblewrap where it works, else Landlock.
    #[default]
    Auto,
    Bwrap,
    Landlock,
}

/// Where the backends' programs are.
#[derive(Debug, Clone)]
pub struct Programs {
    /// bubblewrap; `None`: looked for on `PATH`.
    pub bwrap: Option<PathBuf>,
    /// The `tah` binary, whose hidden `sandbox-exec` subcommand is the Landlock helper.
    pub helper: Option<PathBuf>,
}

impl Programs {
    /// bwrap from `TAH_BWRAP` (else `PATH`), the helper from this process's own binary.
    pub fn from_env() -> Programs {
        Programs {
            bwrap: std::env::var_os("TAH_BWRAP")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            helper: std::env::current_exe().ok(),
        }
    }
}

/// A backend that was seen to work on this host.
#[derive(Debug)]
pub struct Sandbox {
    backend: Backend,
    /// Why the other backend was not chosen, for the start-up log.
    passed_over: Option<String>,
    cgroups: Cgroups,
    /// The host's system directories, as bwrap arguments.
    system: Vec<OsString>,
    /// Host paths a workspace must not contain (binding it would hide their read-only mounts).
    system_paths: Vec<PathBuf>,
}

#[derive(Debug)]
enum Backend {
    Bwrap(PathBuf),
    Landlock {
        helper: PathBuf,
        /// Where each call's private temporary directory is made.
        tmp_base: PathBuf,
    },
}

/// The probe's verdict, kept for the log and `GET /v1/tools`.
#[derive(Debug, Clone)]
pub enum SandboxStatus {
    Ready(Arc<Sandbox>),
    Unavailable(String),
}

/// The network a sandboxed command reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// None: not even the host's loopback.
    None,
    /// The host's network.
    All,
    /// Only the egress proxy running on the host's 127.0.0.1:`port`
    /// ([`super::egress::EgressProxy`]). With bubblewrap the sandbox keeps its own network
    /// namespace and reaches the proxy through its unix socket, bound in, by way of
    /// `tah egress-bridge` listening on the sandbox's own 127.0.0.1:`port`.
    Proxy { port: u16 },
}

/// What one sandboxed command is allowed.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub network: Network,
    pub timeout: Duration,
    /// Bytes of output kept; the rest is counted and dropped.
    pub max_output: usize,
    pub limits: Limits,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signalled(i32),
    /// Killed, with everything it started, when the timeout passed.
    TimedOut,
    /// Ended (killed, with everything it started) for exceeding a limit.
    Exceeded(Breach),
}

/// A finished command: the first bytes of its merged stdout and stderr, and how it ended.
#[derive(Debug, Clone)]
pub struct Ran {
    pub output: Vec<u8>,
    /// Bytes of output read in all, kept or not.
    pub total: u64,
    /// Whether reading stopped at [`MAX_READ_BYTES`] and the pipe was closed before its end.
    pub closed_early: bool,
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
    /// The backend `choice` asks for, where it works here (see the module's documentation).
    pub async fn select(choice: SandboxChoice, programs: &Programs) -> SandboxStatus {
        let bwrap = || async {
            match &programs.bwrap {
                Some(bwrap) => Sandbox::probe_with(bwrap).await,
                None => Sandbox::probe().await,
            }
        };
        let landlock = || async {
            match &programs.helper {
                Some(helper) => Sandbox::probe_landlock(helper).await,
                None => SandboxStatus::Unavailable(
                    "Landlock: the tah binary (its sandbox helper) could not be found".into(),
                ),
            }
        };
        match choice {
            SandboxChoice::Bwrap => bwrap().await,
            SandboxChoice::Landlock => landlock().await,
            SandboxChoice::Auto => match bwrap().await {
                ready @ SandboxStatus::Ready(_) => ready,
                SandboxStatus::Unavailable(no_bwrap) => match landlock().await {
                    SandboxStatus::Ready(mut sandbox) => {
                        if let Some(sandbox) = Arc::get_mut(&mut sandbox) {
                            sandbox.passed_over = Some(no_bwrap);
                        }
                        SandboxStatus::Ready(sandbox)
                    }
                    SandboxStatus::Unavailable(no_landlock) => {
                        SandboxStatus::Unavailable(format!("{no_bwrap}; {no_landlock}"))
                    }
                },
            },
        }
    }

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
        let sandbox = Sandbox::new(Backend::Bwrap(bwrap.to_path_buf()));
        match sandbox.check().await {
            Ok(()) => SandboxStatus::Ready(Arc::new(sandbox)),
            Err(Failed::Said(how, said)) => SandboxStatus::Unavailable(format!(
                "bwrap cannot create its sandbox here ({how}): {said}"
            )),
            Err(Failed::Start(e)) => {
                SandboxStatus::Unavailable(format!("bwrap could not be run: {e}"))
            }
        }
    }

    /// Checks that the Landlock helper (`helper sandbox-exec`) confines a command here.
    pub async fn probe_landlock(helper: &Path) -> SandboxStatus {
        let sandbox = Sandbox::new(Backend::Landlock {
            helper: helper.to_path_buf(),
            tmp_base: std::env::temp_dir(),
        });
        match sandbox.check().await {
            Ok(()) => SandboxStatus::Ready(Arc::new(sandbox)),
            Err(Failed::Said(how, said)) => SandboxStatus::Unavailable(format!(
                "the Landlock sandbox cannot be made here ({how}): {said}"
            )),
            Err(Failed::Start(e)) => SandboxStatus::Unavailable(format!(
                "the Landlock sandbox helper could not be run: {e}"
            )),
        }
    }

    fn new(backend: Backend) -> Sandbox {
        let (system, system_paths) = system_mounts();
        Sandbox {
            backend,
            passed_over: None,
            cgroups: Cgroups::detect(),
            system,
            system_paths,
        }
    }

    /// Runs `exit 0` in the sandbox.
    async fn check(&self) -> Result<(), Failed> {
        let limits = RunLimits {
            network: Network::None,
            timeout: PROBE_TIMEOUT,
            max_output: 4096,
            limits: Limits::default(),
        };
        match self.run_in(None, "exit 0", limits).await {
            Ok(Ran {
                ending: Ending::Exited(0),
                ..
            }) => Ok(()),
            Ok(Ran { output, ending, .. }) => {
                let said = String::from_utf8_lossy(&output);
                let said = said.lines().next().unwrap_or("").trim().to_owned();
                let how = match ending {
                    Ending::Exited(code) => format!("exit code {code}"),
                    Ending::Signalled(signal) => format!("killed by signal {signal}"),
                    Ending::TimedOut => format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
                    Ending::Exceeded(breach) => breach.describe(&limits.limits, limits.timeout),
                };
                Err(Failed::Said(how, said))
            }
            Err(e) => Err(Failed::Start(e)),
        }
    }

    /// `"bwrap"` or `"landlock"`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Bwrap(_) => "bwrap",
            Backend::Landlock { .. } => "landlock",
        }
    }

    /// Why the other backend was not chosen (`--sandbox auto` fell back to Landlock).
    pub fn passed_over(&self) -> Option<&str> {
        self.passed_over.as_deref()
    }

    /// What bounds a call's memory and processes here, for the start-up log.
    pub fn limits_by(&self) -> &'static str {
        self.cgroups.describe()
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
        let tmp = match &self.backend {
            Backend::Bwrap(_) => None,
            Backend::Landlock { tmp_base, .. } => Some(PrivateTmp::make(tmp_base).map_err(start)?),
        };
        let cgroups = Arc::new(self.cgroups.for_call(&limits.limits));
        let rlimits = Rlimits::new(
            &limits.limits,
            limits.timeout,
            !cgroups.memory(),
            !cgroups.pids(),
        );
        let (sender, receiver) = tokio::net::unix::pipe::pipe().map_err(start)?;
        let stdout: OwnedFd = sender.into_blocking_fd().map_err(start)?;
        let stderr = stdout.try_clone().map_err(start)?;
        let mut command = match &self.backend {
            Backend::Bwrap(bwrap) => {
                let mut command = self.bwrap_command(bwrap, workspace, script, &limits);
                // bwrap and all it starts: the rlimits, set before it runs.
                // SAFETY: only setrlimit calls, async-signal-safe, no allocation.
                unsafe {
                    command.pre_exec(move || rlimits.apply());
                }
                command
            }
            Backend::Landlock { helper, .. } => {
                let tmp = tmp
                    .as_ref()
                    .map(|t| t.path.as_path())
                    .unwrap_or(Path::new("/"));
                landlock_command(helper, workspace, tmp, script, &limits, &rlimits)
                    .map_err(start)?
            }
        };
        let joins = cgroups.join_fds();
        // SAFETY: only write calls to descriptors the parent keeps open until the spawn.
        unsafe {
            command.pre_exec(move || limits::join(joins));
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .process_group(0);
        let leader = match self.backend {
            Backend::Bwrap(_) => Leader::Bwrap,
            Backend::Landlock { .. } => Leader::Helper,
        };
        command.kill_on_drop(leader == Leader::Bwrap);
        first_for_the_oom_killer(&mut command);
        let mut child = command.spawn().map_err(start)?;
        // The command holds our copies of the pipe's write end: without dropping it, the pipe
        // would never report its end.
        drop(command);
        let mut group = ProcessGroup::of(&child, leader);
        let _cleanup = KillOnDrop(cgroups.clone());

        let mut read = Read::default();
        let tmp_bytes = limits.limits.tmp_mb << 20;
        let tmpfs =
            matches!(self.backend, Backend::Bwrap(_)).then(|| TmpfsWatch::of(&group, tmp_bytes));
        let watch = watch(&cgroups, tmp.as_ref(), tmpfs.as_ref(), tmp_bytes);
        let pumped = tokio::select! {
            pumped = tokio::time::timeout(
                limits.timeout,
                pump(receiver, &mut child, &mut read, limits.max_output),
            ) => Some(pumped),
            breach = watch => {
                stop(&mut group, &cgroups, &mut child).await;
                return Ok(finish(read, Ending::Exceeded(breach), cgroups, tmp, tmp_bytes).await);
            }
        };
        let ending = match pumped {
            Some(Ok(Ok(status))) => {
                // Reaped: the group id may be reused from now on, so it is never signalled.
                group.forget();
                // A bwrap `/tmp` refuses writes past its size by itself: a command that found
                // it full and still succeeded gets its result; one that failed is told why.
                let failed = !status.success();
                match cgroups.breach() {
                    Some(breach) => Ending::Exceeded(breach),
                    None if failed && tmpfs.as_ref().is_some_and(TmpfsWatch::was_full) => {
                        Ending::Exceeded(Breach::Tmp)
                    }
                    None => breach_of(ending_of(status)),
                }
            }
            Some(Ok(Err(e))) => {
                group.kill();
                cgroups.kill_all();
                return Err(SandboxError::Start(e.kind()));
            }
            _ => {
                stop(&mut group, &cgroups, &mut child).await;
                Ending::TimedOut
            }
        };
        Ok(finish(read, ending, cgroups, tmp, tmp_bytes).await)
    }

    fn bwrap_command(
        &self,
        bwrap: &Path,
        workspace: Option<&Workspace>,
        script: &str,
        limits: &RunLimits,
    ) -> Command {
        let mut command = Command::new(bwrap);
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
        if limits.network == Network::All {
            command.arg("--share-net");
        }
        command.args(["--cap-drop", "ALL"]);
        command.args(&self.system);
        command.args(scratch_mounts(limits.limits.tmp_mb << 20));
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
        let proxy = match limits.network {
            Network::Proxy { port } => Some(proxy_args(&mut command, port)),
            _ => None,
        };
        // Last, once every mount point exists: the rest of the root is bwrap's own unsized tmpfs.
        command.args(["--remount-ro", "/"]);
        match proxy {
            Some(wrapper) => command.args(["--", "sh", "-c", &wrapper, "sh", script]),
            None => command.args(["--", "sh", "-c", script]),
        };
        command
    }
}

/// Why a probe's `exit 0` failed: how it ended and the first line it said, or why it did not
/// start.
enum Failed {
    Said(String, String),
    Start(SandboxError),
}

/// The Landlock helper's command: `helper sandbox-exec …`, with the workspace's descriptor
/// (or, for the probe, the private temporary directory's) handed over.
fn landlock_command(
    helper: &Path,
    workspace: Option<&Workspace>,
    tmp: &Path,
    script: &str,
    limits: &RunLimits,
    rlimits: &Rlimits,
) -> std::io::Result<Command> {
    let (fd, dir, held) = match workspace {
        Some(workspace) => (
            workspace.fd().as_raw_fd(),
            workspace.root().to_path_buf(),
            None,
        ),
        None => {
            let held = std::fs::File::open(tmp)?;
            (
                held.as_raw_fd(),
                tmp.to_path_buf(),
                Some(OwnedFd::from(held)),
            )
        }
    };
    let args = landlock::HelperArgs {
        workspace_fd: fd,
        tmp: tmp.to_path_buf(),
        network: limits.network,
        rlimits: rlimits.to_args(),
        script: script.to_owned(),
    };
    let mut command = Command::new(helper);
    command
        .env_clear()
        .env("PATH", SANDBOX_PATH)
        .env("HOME", tmp)
        .env("TMPDIR", tmp)
        .env("PWD", &dir)
        .env("LANG", "C.UTF-8")
        .env("TERM", "dumb")
        .arg("sandbox-exec")
        .args(args.to_args())
        .current_dir("/");
    // SAFETY: between fork and exec, only `fcntl` on a descriptor the parent keeps open until
    // the child is spawned: async-signal-safe, no allocation.
    unsafe {
        command.pre_exec(move || {
            // The helper gets the descriptor across exec; the parent's stays close-on-exec.
            let _held = &held;
            let fd = BorrowedFd::borrow_raw(fd);
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            Ok(())
        });
    }
    Ok(command)
}

/// A Landlock call's private temporary directory, removed (with all it holds) on drop.
#[derive(Debug)]
struct PrivateTmp {
    path: PathBuf,
}

impl PrivateTmp {
    fn make(base: &Path) -> std::io::Result<PrivateTmp> {
        use std::os::unix::fs::DirBuilderExt;
        let path = base.join(format!(
            "tah-sandbox-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(PrivateTmp { path })
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        // Symlinks inside are removed, never followed.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A bwrap call's `/tmp`, seen from the host through its namespace's init: whether it was
/// ever found full. (The tmpfs refuses writes past its size by itself; a call that filled it
/// and failed is reported as exceeding the limit when it ends.) The open directory keeps the tmpfs
/// mounted until the call's result is made, so its last state can still be read.
#[derive(Default)]
struct TmpfsWatch {
    leader: Option<Pid>,
    /// The tmpfs's size.
    size: u64,
    dir: std::sync::Mutex<Option<OwnedFd>>,
    full: std::sync::atomic::AtomicBool,
}

impl TmpfsWatch {
    fn of(group: &ProcessGroup, size: u64) -> TmpfsWatch {
        TmpfsWatch {
            leader: group.0,
            size,
            ..TmpfsWatch::default()
        }
    }

    /// Looks once: opens the namespace's `/tmp` if not yet open, and notes whether it is full.
    fn look(&self) {
        let Ok(mut dir) = self.dir.lock() else {
            return;
        };
        if dir.is_none() {
            let Some(leader) = self.leader else {
                return;
            };
            let Some(init) = children_of(leader).into_iter().next() else {
                return;
            };
            let path = format!("/proc/{}/root/tmp", init.as_raw_nonzero());
            let opened = rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok();
            // Until bwrap has built the sandbox its child still sees the host's `/tmp`: only a
            // file system of the call's size is the call's tmpfs.
            *dir = opened.filter(|fd| {
                rustix::fs::fstatvfs(fd)
                    .is_ok_and(|fs| fs.f_blocks.saturating_mul(fs.f_frsize) == self.size)
            });
        }
        if let Some(dir) = dir.as_ref() {
            // Full: fewer than 64 KiB left (a write that did not fit failed).
            if let Ok(fs) = rustix::fs::fstatvfs(dir) {
                if fs.f_bavail.saturating_mul(fs.f_frsize) < 64 << 10 {
                    self.full.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether it was ever seen full, looking a last time if it was opened (never opening
    /// it now: the leader was reaped, its pid may be another process's).
    fn was_full(&self) -> bool {
        if self.dir.lock().is_ok_and(|dir| dir.is_some()) {
            self.look();
        }
        self.full.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Kills what is left in a call's cgroups when the call is dropped (cancelled).
struct KillOnDrop(Arc<CallCgroups>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill_all();
    }
}

/// Resolves when the call exceeds a limit its cgroups or temporary directory show; never
/// otherwise.
async fn watch(
    cgroups: &CallCgroups,
    tmp: Option<&PrivateTmp>,
    tmpfs: Option<&TmpfsWatch>,
    tmp_bytes: u64,
) -> Breach {
    let mut ticks = 0u32;
    loop {
        // The first looks come quickly: a bwrap `/tmp` is opened while its namespace lives.
        let every = if ticks < 10 {
            WATCH_EVERY / 10
        } else {
            WATCH_EVERY
        };
        ticks += 1;
        tokio::time::sleep(every).await;
        if let Some(tmpfs) = tmpfs {
            tmpfs.look();
        }
        if let Some(breach) = cgroups.breach() {
            return breach;
        }
        if let Some(tmp) = tmp {
            let path = tmp.path.clone();
            let used = tokio::task::spawn_blocking(move || limits::dir_bytes(&path))
                .await
                .unwrap_or(0);
            if used > tmp_bytes {
                return Breach::Tmp;
            }
        }
    }
}

/// Kills a call that is still running: the namespace's init (bwrap) or the helper's command,
/// the process group, and everything in its cgroups; waits for it to be reaped.
async fn stop(group: &mut ProcessGroup, cgroups: &CallCgroups, child: &mut Child) {
    // Killing the namespace's init makes the kernel kill everything in it; bwrap exits once
    // all of it is gone, so after the wait nothing of the call is left. The helper, likewise,
    // kills what its command left, then exits.
    group.kill_namespace();
    cgroups.kill_all();
    match tokio::time::timeout(REAP_TIMEOUT, child.wait()).await {
        Ok(Ok(_)) => group.forget(),
        _ => group.kill(),
    }
}

/// The call's result, once everything it started is gone: its cgroups emptied and removed, its
/// temporary directory measured (a breach is named) and removed.
async fn finish(
    read: Read,
    mut ending: Ending,
    cgroups: Arc<CallCgroups>,
    tmp: Option<PrivateTmp>,
    tmp_bytes: u64,
) -> Ran {
    let _ = tokio::task::spawn_blocking(move || {
        let over = tmp
            .as_ref()
            .is_some_and(|tmp| limits::dir_bytes(&tmp.path) > tmp_bytes);
        cgroups.kill_all();
        drop(cgroups);
        drop(tmp);
        over
    })
    .await
    .map(|over| {
        // Over the /tmp limit is the cause even when a file size or a process was what
        // stopped the command first (the directory is checked only every so often).
        if over {
            ending = Ending::Exceeded(Breach::Tmp);
        }
    });
    Ran {
        output: read.output,
        total: read.total,
        closed_early: read.closed_early,
        ending,
    }
}

/// A limit an ending shows: killed by `SIGXCPU` or `SIGXFSZ` (or `sh` reporting a child was,
/// as 128 + the signal).
fn breach_of(ending: Ending) -> Ending {
    let xcpu = libc::SIGXCPU;
    let xfsz = libc::SIGXFSZ;
    match ending {
        Ending::Signalled(s) | Ending::Exited(s @ 128..) if s == xcpu || s - 128 == xcpu => {
            Ending::Exceeded(Breach::Cpu)
        }
        Ending::Signalled(s) | Ending::Exited(s @ 128..) if s == xfsz || s - 128 == xfsz => {
            Ending::Exceeded(Breach::FileSize)
        }
        other => other,
    }
}

/// Where the egress proxy's socket and the bridge are bound inside the sandbox.
const EGRESS_DIR: &str = "/run/tah-egress";

/// For [`Network::Proxy`]: binds the proxy's unix socket and the bridge program into the
/// sandbox and points the proxy variables at the bridge; returns the `sh -c` script that
/// starts the bridge, waits for its `ready`, then runs the command (`$1`) as `sh -c` does
/// (so `sh` stays the namespace's init). Without a running proxy on `port` the script only
/// fails: nothing runs with more network than asked.
fn proxy_args(command: &mut Command, port: u16) -> String {
    let Some(listening) = super::egress::listening_on(port) else {
        return "echo 'shell: the egress proxy is not running' >&2; exit 126".into();
    };
    let socket = format!("{EGRESS_DIR}/proxy.sock");
    let bridge = format!("{EGRESS_DIR}/tah");
    command.arg("--bind").arg(&listening.socket).arg(&socket);
    command.arg("--ro-bind").arg(&listening.bridge).arg(&bridge);
    for (name, value) in super::egress::proxy_env(port) {
        command.args(["--setenv", name, &value]);
    }
    format!(
        "r=$({bridge} egress-bridge --listen 127.0.0.1:{port} --socket {socket} </dev/null \
         2>/dev/null &); [ \"$r\" = ready ] || {{ echo 'shell: the egress proxy bridge did not \
         start' >&2; exit 126; }}; exec sh -c \"$1\""
    )
}

/// What was read of a command's output.
#[derive(Debug, Default)]
struct Read {
    output: Vec<u8>,
    total: u64,
    closed_early: bool,
}

/// Reads the merged output until every process holding the pipe is gone or
/// [`MAX_READ_BYTES`] were read, keeping the first `max` bytes; closes the pipe, then reaps
/// bwrap.
async fn pump(
    mut receiver: tokio::net::unix::pipe::Receiver,
    child: &mut Child,
    read: &mut Read,
    max: usize,
) -> std::io::Result<ExitStatus> {
    let mut buf = vec![0u8; 16 * 1024];
    while read.total < MAX_READ_BYTES {
        let room = usize::try_from(MAX_READ_BYTES - read.total).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let n = receiver.read(&mut buf[..want]).await?;
        if n == 0 {
            break;
        }
        read.total += n as u64;
        let keep = n.min(max.saturating_sub(read.output.len()));
        read.output.extend_from_slice(&buf[..keep]);
        read.closed_early = read.total >= MAX_READ_BYTES;
    }
    drop(receiver);
    child.wait().await
}

/// The sandbox's `/dev`, read-only but for a sized `/dev/shm`; its `/proc`, read-only (so no
/// process lowers its `oom_score_adj`); and a sized `/tmp`. (`--size` applies to the
/// `--tmpfs` after it.)
fn scratch_mounts(tmp_bytes: u64) -> Vec<OsString> {
    let shm = SHM_BYTES.to_string();
    let tmp = tmp_bytes.to_string();
    let mounts: [&[&str]; 5] = [
        &["--dev", "/dev"],
        &["--perms", "1777", "--size", &shm, "--tmpfs", "/dev/shm"],
        &["--remount-ro", "/dev"],
        &["--proc", "/proc", "--remount-ro", "/proc"],
        &["--size", &tmp, "--tmpfs", "/tmp"],
    ];
    mounts.concat().into_iter().map(OsString::from).collect()
}

/// Makes the spawned bwrap, and so everything it starts, the OOM killer's first pick: its
/// `oom_score_adj` is raised before it runs (raising needs no privilege; the sandbox's `/proc`
/// is read-only, so it cannot lower it again). Failing to set it fails the spawn.
fn first_for_the_oom_killer(command: &mut Command) {
    start_with_oom_score_adj(command, SANDBOX_OOM_SCORE_ADJ, true);
}

/// Gives a program the server starts outside the sandbox (an MCP server) the default OOM
/// score rather than the one the server lowered for itself, which it would inherit.
pub fn unshielded(command: &mut Command) {
    if SHIELDED.load(std::sync::atomic::Ordering::Relaxed) {
        start_with_oom_score_adj(command, b"0", false);
    }
}

/// Whether [`shield_server`] lowered the server's score.
static SHIELDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Has `command`'s process write `score` to its `oom_score_adj` before it runs the program;
/// when that fails, the spawn fails if `required`.
fn start_with_oom_score_adj(command: &mut Command, score: &'static [u8], required: bool) {
    let set = move || -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let written = rustix::fs::open(
            c"/proc/self/oom_score_adj",
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .and_then(|file| rustix::io::write(&file, score));
        match written {
            Err(errno) if required => Err(errno.into()),
            _ => Ok(()),
        }
    };
    // SAFETY: between fork and exec the closure only makes the open, write and close system
    // calls, which are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(set);
    }
}

/// Lowers the server's own `oom_score_adj` to [`SERVER_OOM_SCORE_ADJ`] (unless it is lower
/// already), so that the OOM killer picks a sandbox or any other process before it. Lowering
/// needs `CAP_SYS_RESOURCE`: without it the log says so, once, and the sandbox is still
/// picked first.
pub fn shield_server() {
    const PATH: &str = "/proc/self/oom_score_adj";
    let current = std::fs::read_to_string(PATH)
        .ok()
        .and_then(|text| text.trim().parse::<i32>().ok());
    if current.is_some_and(|adj| adj <= SERVER_OOM_SCORE_ADJ) {
        return;
    }
    match std::fs::write(PATH, SERVER_OOM_SCORE_ADJ.to_string()) {
        Ok(()) => {
            SHIELDED.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                oom_score_adj = SERVER_OOM_SCORE_ADJ,
                "lowered the server's OOM score: shell sandboxes are killed before it"
            );
        }
        Err(error) => tracing::info!(
            error = %error.kind(),
            "could not lower the server's OOM score (needs CAP_SYS_RESOURCE); shell \
             sandboxes are still the OOM killer's first pick"
        ),
    }
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
///
/// With Landlock the leader is the helper, and its child the command's `sh`: killing `sh` makes
/// the helper kill whatever the command left (also what left its group), then exit; so when
/// the call is dropped (cancelled) only `sh` is killed, and the helper, not killed on drop,
/// finishes that and is reaped in the background.
struct ProcessGroup(Option<Pid>, Leader);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Leader {
    Bwrap,
    Helper,
}

impl ProcessGroup {
    fn of(child: &Child, leader: Leader) -> ProcessGroup {
        ProcessGroup(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
            leader,
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
        match self.1 {
            Leader::Bwrap => self.kill(),
            Leader::Helper => {
                self.kill_namespace();
                self.forget();
            }
        }
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

    /// The sandbox, for the tests that need one: those are built as ignored where `build.rs`
    /// found no working bubblewrap (`cfg(sandbox_tests)`), so here it must work.
    pub async fn sandbox() -> Option<Arc<Sandbox>> {
        match Sandbox::probe().await {
            SandboxStatus::Ready(sandbox) => Some(sandbox),
            SandboxStatus::Unavailable(reason) => panic!(
                "the sandbox is unavailable ({reason}), though the build found bubblewrap; \
                 build with TAH_TEST_SANDBOX=off to have these tests reported as ignored"
            ),
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

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn the_probe_accepts_the_installed_bwrap() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        assert!(matches!(&sandbox.backend, Backend::Bwrap(bwrap) if bwrap.is_absolute()));
        assert!(sandbox.system_paths.contains(&PathBuf::from("/usr")));
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn memory_backed_files_are_sized_and_the_sandbox_is_the_oom_pick() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        let workspace = tempfile::tempdir().expect("tempdir");
        let limits = RunLimits {
            network: Network::None,
            timeout: Duration::from_secs(30),
            max_output: 4096,
            limits: Limits::default(),
        };
        let script = format!(
            "head -c {} /dev/zero > /tmp/big; echo tmp $? $(stat -c %s /tmp/big); rm /tmp/big; \
             head -c {} /dev/zero > /dev/shm/big; echo shm $? $(stat -c %s /dev/shm/big); \
             echo x > /dev/x; echo dev $?; echo x > /x; echo root $?; mkdir /d; echo mkdir $?; \
             echo oom $(cat /proc/self/oom_score_adj); echo 0 > /proc/self/oom_score_adj; \
             echo lowered $? $(cat /proc/self/oom_score_adj)",
            (Limits::default().tmp_mb << 20) + (16 << 20),
            SHM_BYTES + (16 << 20)
        );
        let ran = sandbox
            .run(
                &crate::tools::Workspace::open(workspace.path()).expect("workspace"),
                &script,
                limits,
            )
            .await
            .expect("ran");
        let said = String::from_utf8_lossy(&ran.output);
        eprintln!("{said}");
        let lines: Vec<&str> = said
            .lines()
            .filter(|l| !l.contains(": ") && !l.starts_with("head"))
            .collect();
        assert_eq!(
            lines,
            [
                format!("tmp 1 {}", Limits::default().tmp_mb << 20).as_str(),
                format!("shm 1 {SHM_BYTES}").as_str(),
                "dev 2",
                "root 2",
                "mkdir 1",
                "oom 1000",
                "lowered 2 1000"
            ],
            "{said}"
        );
        assert!(said.contains("No space left on device"), "{said}");
        // Filled then emptied: reported as a breach only where the watch saw it full.
        assert!(
            matches!(
                ran.ending,
                Ending::Exited(0) | Ending::Exceeded(Breach::Tmp)
            ),
            "{:?}",
            ran.ending
        );
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn a_flood_of_output_is_read_only_up_to_a_ceiling() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        let workspace = tempfile::tempdir().expect("tempdir");
        let limits = RunLimits {
            network: Network::None,
            timeout: Duration::from_secs(20),
            max_output: 1000,
            limits: Limits::default(),
        };
        for script in ["cat /dev/zero", "yes & yes & yes & yes; wait; echo after"] {
            let started = std::time::Instant::now();
            let ran = sandbox
                .run(
                    &crate::tools::Workspace::open(workspace.path()).expect("workspace"),
                    script,
                    limits,
                )
                .await
                .expect("ran");
            let took = started.elapsed();
            eprintln!(
                "`{script}`: read {} bytes, {took:?}, {:?}",
                ran.total, ran.ending
            );
            assert_eq!(ran.total, MAX_READ_BYTES, "{script}");
            assert!(ran.closed_early, "{script}");
            assert_eq!(ran.output.len(), 1000);
            assert!(took < Duration::from_secs(5), "{script}: {took:?}");
        }
    }

    #[cfg_attr(
        not(sandbox_tests),
        ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
    )]
    #[tokio::test]
    async fn a_workspace_holding_system_directories_is_refused() {
        let Some(sandbox) = testing::sandbox().await else {
            return;
        };
        let limits = RunLimits {
            network: Network::None,
            timeout: Duration::from_secs(5),
            max_output: 100,
            limits: Limits::default(),
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

//! The resource limits of one sandboxed call, on either backend.
//!
//! **Cgroups where a delegated hierarchy is writable** (as root on a cgroup v1 host, the
//! `memory` and `pids` controllers): each call gets a child cgroup of the server's own
//! (`tah-call-PID-N`), with `memory.limit_in_bytes` and `pids.max`, that the call's first
//! process joins before it runs (so everything it starts is in it). It is what ends the call
//! however its processes escape their process group: when the call ends every process still in
//! it is killed, then the cgroup is removed. A breach is read from the cgroup's counters
//! (`memory.oom_control`'s `oom_kill`, `pids.events`' `max`). On cgroup v2 only hosts, or
//! without write access, the rlimits below bound memory and processes instead.
//!
//! **rlimits always**, set on the call's first process and inherited by all it starts:
//! `RLIMIT_CPU` (SIGXCPU, then SIGKILL a second later), `RLIMIT_FSIZE` (SIGXFSZ / EFBIG), `RLIMIT_CORE` 0.
//! Without a memory cgroup, `RLIMIT_AS` per process (allocations past it fail). Without a
//! pids cgroup, `RLIMIT_NPROC`: it counts every process of the user, not of the call, and does
//! not bind root, so it is only a backstop (the count is the limit plus the user's current
//! processes, so other sessions are not starved by one call's bomb).

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Limits on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory of all the call's processes (cgroup), else address space per process.
    pub memory_mb: u64,
    /// Processes (and threads) of the call at once.
    pub pids: u64,
    /// CPU seconds per process; `None`: the call's timeout.
    pub cpu_s: Option<u64>,
    /// Largest file a process may write.
    pub file_mb: u64,
    /// Size of the call's private temporary directory.
    pub tmp_mb: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_mb: 2048,
            pids: 256,
            cpu_s: None,
            file_mb: 1024,
            tmp_mb: 256,
        }
    }
}

impl Limits {
    /// The CPU seconds allowed when the call may run for `timeout`.
    pub fn cpu_seconds(&self, timeout: Duration) -> u64 {
        self.cpu_s.unwrap_or(timeout.as_secs().max(1))
    }
}

/// Which limit a call exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    Memory,
    Pids,
    Cpu,
    FileSize,
    Tmp,
}

impl Breach {
    /// The tool error's words.
    pub fn describe(self, limits: &Limits, timeout: Duration) -> String {
        match self {
            Breach::Memory => format!(
                "the command exceeded the memory limit ({} MB)",
                limits.memory_mb
            ),
            Breach::Pids => format!("the command exceeded the process limit ({})", limits.pids),
            Breach::Cpu => format!(
                "the command exceeded the CPU time limit ({} s)",
                limits.cpu_seconds(timeout)
            ),
            Breach::FileSize => format!(
                "the command exceeded the file size limit ({} MB)",
                limits.file_mb
            ),
            Breach::Tmp => format!(
                "the command exceeded the /tmp size limit ({} MB)",
                limits.tmp_mb
            ),
        }
    }
}

/// The rlimits a call's first process sets on itself, as (resource, value) pairs.
#[derive(Debug, Clone, Copy)]
pub struct Rlimits {
    items: [(u32, u64); 5],
    len: usize,
}

impl Rlimits {
    /// `memory` and `nproc` only where no cgroup bounds them.
    // The resources are `u32` with glibc, `c_int` with musl.
    #[allow(clippy::unnecessary_cast)]
    pub fn new(limits: &Limits, timeout: Duration, memory: bool, nproc: bool) -> Rlimits {
        let mut r = Rlimits {
            items: [(0, 0); 5],
            len: 0,
        };
        r.push(libc::RLIMIT_CPU as u32, limits.cpu_seconds(timeout));
        r.push(libc::RLIMIT_FSIZE as u32, limits.file_mb << 20);
        r.push(libc::RLIMIT_CORE as u32, 0);
        if memory {
            r.push(libc::RLIMIT_AS as u32, limits.memory_mb << 20);
        }
        if nproc {
            r.push(libc::RLIMIT_NPROC as u32, limits.pids + user_processes());
        }
        r
    }

    fn push(&mut self, resource: u32, value: u64) {
        self.items[self.len] = (resource, value);
        self.len += 1;
    }

    /// Sets them on the calling process: async-signal-safe (only `setrlimit`), for `pre_exec`.
    pub fn apply(&self) -> std::io::Result<()> {
        for &(resource, value) in &self.items[..self.len] {
            // CPU: SIGXCPU at the limit (named as such when it ends the command), SIGKILL a
            // second later for a command that handles it. (Equal limits would be SIGKILL
            // alone, indistinguishable from any other kill.)
            #[allow(clippy::unnecessary_cast)]
            let hard = if resource == libc::RLIMIT_CPU as u32 {
                value.saturating_add(1)
            } else {
                value
            };
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: hard,
            };
            // SAFETY: setrlimit with a valid pointer to a local.
            if unsafe { libc::setrlimit(resource as _, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// As arguments for the Landlock helper: `RESOURCE=VALUE`.
    pub fn to_args(&self) -> Vec<String> {
        self.items[..self.len]
            .iter()
            .map(|(r, v)| format!("{r}={v}"))
            .collect()
    }

    /// Parses [`Rlimits::to_args`].
    pub fn from_args(args: &[String]) -> Option<Rlimits> {
        let mut r = Rlimits {
            items: [(0, 0); 5],
            len: 0,
        };
        for arg in args {
            let (resource, value) = arg.split_once('=')?;
            if r.len == r.items.len() {
                return None;
            }
            r.push(resource.parse().ok()?, value.parse().ok()?);
        }
        Some(r)
    }
}

/// Processes of this user now (for `RLIMIT_NPROC`, which counts them all).
fn user_processes() -> u64 {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| {
            use std::os::unix::fs::MetadataExt;
            e.metadata().is_ok_and(|m| m.uid() == uid)
        })
        .count() as u64
}

/// The cgroup directories calls are made in, found once at start-up.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    /// The server's own `memory` cgroup (v1), where a child can be made.
    memory: Option<PathBuf>,
    /// The server's own `pids` cgroup (v1).
    pids: Option<PathBuf>,
}

static CALLS: AtomicU64 = AtomicU64::new(0);

impl Cgroups {
    /// The v1 `memory` and `pids` hierarchies where the server may make a child cgroup (tried
    /// by making and removing one).
    pub fn detect() -> Cgroups {
        let Ok(own) = fs::read_to_string("/proc/self/cgroup") else {
            return Cgroups::default();
        };
        let mut found = Cgroups::default();
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            for controller in controllers.split(',') {
                let slot = match controller {
                    "memory" => &mut found.memory,
                    "pids" => &mut found.pids,
                    _ => continue,
                };
                let dir = Path::new("/sys/fs/cgroup")
                    .join(controller)
                    .join(path.trim_start_matches('/'));
                let probe = dir.join(format!("tah-probe-{}", std::process::id()));
                if fs::create_dir(&probe).is_ok() {
                    let _ = fs::remove_dir(&probe);
                    sweep(&dir);
                    *slot = Some(dir);
                }
            }
        }
        found
    }

    pub fn memory(&self) -> bool {
        self.memory.is_some()
    }

    pub fn pids(&self) -> bool {
        self.pids.is_some()
    }

    /// What bounds memory and processes here, for the start-up log.
    pub fn describe(&self) -> &'static str {
        match (self.memory(), self.pids()) {
            (true, true) => "cgroups (memory, pids)",
            (true, false) => "memory cgroup, RLIMIT_NPROC",
            (false, true) => "pids cgroup, RLIMIT_AS",
            (false, false) => "rlimits (RLIMIT_AS, RLIMIT_NPROC)",
        }
    }

    /// A call's cgroups, made with its limits; failures leave that controller to rlimits.
    pub fn for_call(&self, limits: &Limits) -> CallCgroups {
        let n = CALLS.fetch_add(1, Ordering::Relaxed);
        let name = format!("tah-call-{}-{n}", std::process::id());
        let make = |parent: &Option<PathBuf>, file: &str, value: String| -> Option<CallCgroup> {
            let dir = parent.as_ref()?.join(&name);
            fs::create_dir(&dir).ok()?;
            // Dropped (removed) on failure.
            let mut group = CallCgroup { dir, procs: None };
            fs::write(group.dir.join(file), value).ok()?;
            let procs = fs::OpenOptions::new()
                .write(true)
                .open(group.dir.join("cgroup.procs"))
                .ok()?;
            group.procs = Some(procs.into());
            Some(group)
        };
        let memory = make(
            &self.memory,
            "memory.limit_in_bytes",
            (limits.memory_mb << 20).to_string(),
        );
        if let Some(memory) = &memory {
            // No swap beyond the limit where the kernel accounts it.
            let _ = fs::write(
                memory.dir.join("memory.memsw.limit_in_bytes"),
                (limits.memory_mb << 20).to_string(),
            );
        }
        let pids = make(&self.pids, "pids.max", limits.pids.to_string());
        CallCgroups { memory, pids }
    }
}

/// Empties and removes the call cgroups under `parent` left by a server that is gone (killed
/// mid-call: nothing removed them), so what its calls left running ends now.
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("tah-call-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let stale = CallCgroup {
            dir: entry.path(),
            procs: None,
        };
        tracing::info!(dir = %stale.dir.display(), "removing a shell call's cgroup left by a server that is gone");
        drop(stale);
    }
}

/// One controller's cgroup of a call: removed (after killing what is left in it) on drop.
#[derive(Debug)]
struct CallCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for the first process to join with.
    procs: Option<OwnedFd>,
}

impl CallCgroup {
    fn kill_all(&self) {
        // Several rounds: a process may fork between the read and the kill.
        for _ in 0..50 {
            let Ok(text) = fs::read_to_string(self.dir.join("cgroup.procs")) else {
                return;
            };
            let pids: Vec<i32> = text.lines().filter_map(|l| l.parse().ok()).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for CallCgroup {
    fn drop(&mut self) {
        self.procs = None;
        self.kill_all();
        // A killed process leaves the cgroup once reaped; retry for a moment.
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            self.kill_all();
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(dir = %self.dir.display(), "could not remove a shell call's cgroup");
    }
}

/// A call's cgroups.
#[derive(Debug)]
pub struct CallCgroups {
    memory: Option<CallCgroup>,
    pids: Option<CallCgroup>,
}

impl CallCgroups {
    pub fn memory(&self) -> bool {
        self.memory.is_some()
    }

    pub fn pids(&self) -> bool {
        self.pids.is_some()
    }

    /// The `cgroup.procs` descriptors the first process writes `0` to, joining them.
    pub fn join_fds(&self) -> [i32; 2] {
        let fd = |g: &Option<CallCgroup>| {
            g.as_ref()
                .and_then(|g| g.procs.as_ref())
                .map_or(-1, |f| f.as_raw_fd())
        };
        [fd(&self.memory), fd(&self.pids)]
    }

    /// Kills every process left in the call's cgroups.
    pub fn kill_all(&self) {
        for group in [&self.memory, &self.pids].into_iter().flatten() {
            group.kill_all();
        }
    }

    /// The limit the cgroups saw breached, if any.
    pub fn breach(&self) -> Option<Breach> {
        if let Some(memory) = &self.memory {
            let control =
                fs::read_to_string(memory.dir.join("memory.oom_control")).unwrap_or_default();
            let killed = control
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let failed = fs::read_to_string(memory.dir.join("memory.failcnt"))
                .ok()
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if killed > 0 || (failed > 0 && control.contains("under_oom 1")) {
                return Some(Breach::Memory);
            }
        }
        if let Some(pids) = &self.pids {
            let events = fs::read_to_string(pids.dir.join("pids.events")).unwrap_or_default();
            let hit = events
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if hit > 0 {
                return Some(Breach::Pids);
            }
        }
        None
    }
}

/// Joins the cgroups whose `cgroup.procs` are open at `fds` (-1: none): async-signal-safe, for
/// `pre_exec`.
pub fn join(fds: [i32; 2]) -> std::io::Result<()> {
    for fd in fds {
        if fd >= 0 {
            // SAFETY: write of a static buffer to a descriptor the parent keeps open.
            if unsafe { libc::write(fd, b"0\n".as_ptr().cast(), 2) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The bytes of the files under `dir` (not following symlinks), for the Landlock backend's
/// private temporary directory.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > 100_000 {
                return total;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                use std::os::unix::fs::MetadataExt;
                // Blocks held, not the apparent size: sparse files cost nothing.
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

/// Writes `message` to stderr: async-signal-safe, for `pre_exec`.
pub fn say(message: &[u8]) {
    // SAFETY: write of a valid buffer.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

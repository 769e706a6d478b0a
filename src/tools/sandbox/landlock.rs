//! The Landlock + seccomp backend, for hosts where bubblewrap cannot make namespaces (a
//! default `docker run`). The server runs the hidden `tah sandbox-exec` subcommand (this
//! binary), which starts `sh -c CMD` confined, waits for it, then kills whatever it left.
//!
//! The command's process, before it runs `sh`: in a process group of its own; the call's
//! rlimits ([`super::limits`]); every capability dropped (bounding, ambient, effective,
//! permitted, inheritable); no new privileges; a Landlock domain where system directories
//! (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc` but its shadow files) are read and executed only,
//! `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random` and `/dev/urandom` are the only devices,
//! the workspace (from the server's descriptor, never its path again) is read, written and
//! executed, and the call's private temporary directory is read and written but not executed
//! from; nothing else of the filesystem is reachable (not `/proc`, not `/root`, not the
//! server's database). With Landlock ABI 4 TCP bind and connect are handled too (none; or, in
//! proxy mode, connect to the proxy's port only); with ABI 6 signals and abstract UNIX sockets
//! are scoped to the sandbox (its processes cannot signal the server). Then a seccomp filter
//! refuses (`EPERM`) `socket` of any family but the allowed ones (none without network: not
//! even `AF_UNIX`, since Landlock does not govern connecting to a UNIX socket's path, and a
//! host socket such as Docker's would be an escape; `socketpair` stays), `ptrace`,
//! `process_vm_*`, every mount and namespace call (`clone` with a `CLONE_NEW*` flag,
//! `unshare`, `setns`), `keyctl`, `bpf`, `perf_event_open`, `io_uring_*`, `kexec_*`, module
//! loading, `open_by_handle_at` and the like; `clone3` answers `ENOSYS` (its flags are out of a
//! filter's reach; libc falls back to `clone`). Without Landlock ABI 6, signals to other
//! processes than the caller's own group are refused by the filter too.
//!
//! The helper itself stays unconfined but only waits: it is the command's `PR_SET_CHILD_
//! SUBREAPER`, so processes that leave the group (`setsid`) are re-parented to it when their
//! parent dies, and once `sh` has exited it kills every descendant left, round after round,
//! before it exits with `sh`'s status. (The call's cgroups, where there are some, kill
//! everything first anyway.)

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use super::limits::{say, Rlimits};
use super::Network;

/// The ABI whose rights are asked for; older kernels enforce what they know (best effort),
/// and the status says which was enforced.
const TARGET_ABI: ABI = ABI::V6;
/// Devices a command may use.
const DEVICES: [(&str, bool); 5] = [
    ("/dev/null", true),
    ("/dev/zero", false),
    ("/dev/full", true),
    ("/dev/random", false),
    ("/dev/urandom", false),
];

/// What `tah sandbox-exec` is told.
#[derive(Debug, Clone)]
pub struct HelperArgs {
    pub workspace_fd: RawFd,
    pub tmp: PathBuf,
    pub network: Network,
    pub rlimits: Vec<String>,
    pub script: String,
}

impl HelperArgs {
    /// As the helper's command line, after `sandbox-exec`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--workspace-fd".into(),
            self.workspace_fd.to_string().into(),
            "--tmp".into(),
            self.tmp.clone().into(),
            "--network".into(),
            self.network.to_arg().into(),
        ];
        for r in &self.rlimits {
            args.push("--rlimit".into());
            args.push(r.into());
        }
        args.push("--".into());
        args.push(self.script.clone().into());
        args
    }
}

impl Network {
    fn to_arg(self) -> String {
        match self {
            Network::None => "none".into(),
            Network::All => "all".into(),
            Network::Proxy { port } => format!("proxy={port}"),
        }
    }

    /// Parses `none`, `all` or `proxy=PORT`.
    pub fn from_arg(arg: &str) -> Option<Network> {
        match arg {
            "none" => Some(Network::None),
            "all" => Some(Network::All),
            _ => Some(Network::Proxy {
                port: arg.strip_prefix("proxy=")?.parse().ok()?,
            }),
        }
    }
}

/// The host's system directories a command reads and executes from: `/usr`, `/bin`, `/sbin`,
/// `/lib*` (symlinks followed: merged `/usr`), and every entry of `/etc` but the shadow files.
fn system_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ["/usr", "/bin", "/sbin"].map(PathBuf::from).to_vec();
    if let Ok(entries) = std::fs::read_dir("/") {
        paths.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("lib"))
                .map(|e| e.path()),
        );
    }
    if let Ok(entries) = std::fs::read_dir("/etc") {
        paths.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| !super::MASKED.iter().any(|m| p == Path::new(m))),
        );
    }
    paths
}

/// The Landlock ruleset, made (not yet enforced) in the helper.
fn ruleset(
    workspace: BorrowedFd<'_>,
    tmp: &Path,
    network: Network,
) -> Result<RulesetCreated, String> {
    let abi = TARGET_ABI;
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(|e| e.to_string())?;
    if network != Network::All {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| e.to_string())?;
    }
    ruleset = ruleset
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?;
    let mut created = ruleset.create().map_err(|e| e.to_string())?;
    for path in system_paths() {
        // A path that vanished since it was listed is left out.
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        let access = if path.is_dir() {
            read
        } else {
            read & AccessFs::from_file(abi)
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| e.to_string())?;
    }
    for (device, writable) in DEVICES {
        let Ok(fd) = PathFd::new(device) else {
            continue;
        };
        let access = if writable {
            AccessFs::ReadFile | AccessFs::WriteFile
        } else {
            AccessFs::ReadFile.into()
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| e.to_string())?;
    }
    created = created
        .add_rule(PathBeneath::new(workspace, all))
        .map_err(|e| e.to_string())?;
    let tmp_fd = PathFd::new(tmp).map_err(|e| e.to_string())?;
    created = created
        .add_rule(PathBeneath::new(tmp_fd, all & !AccessFs::Execute))
        .map_err(|e| e.to_string())?;
    if let Network::Proxy { port } = network {
        created = created
            .set_compatibility(CompatLevel::BestEffort)
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| e.to_string())?;
    }
    Ok(created)
}

/// The seccomp filters: refusals (`EPERM`), then `clone3` (`ENOSYS`). `scoped_signals`: Landlock
/// confines signals already, else `kill` and friends reach only the caller's own group.
fn filters(network: Network, scoped_signals: bool) -> Result<[BpfProgram; 2], String> {
    use std::collections::BTreeMap;
    let arch =
        seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    #[allow(unused_mut)]
    let mut denied = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_userfaultfd,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_pidfd_getfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
    ];
    #[cfg(target_arch = "x86_64")]
    denied.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    for call in denied {
        rules.insert(call, Vec::new());
    }
    // clone(flags, …): any namespace flag.
    let namespaces = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWCGROUP,
    ];
    let mut clone = Vec::new();
    for flag in namespaces {
        let flag = flag as u64;
        clone.push(
            SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])
                .map_err(|e| e.to_string())?,
        );
    }
    rules.insert(libc::SYS_clone, clone);
    // socket(domain, …): any family but the allowed ones.
    if network != Network::All {
        let mut allowed: Vec<u64> = Vec::new();
        if matches!(network, Network::Proxy { .. }) {
            allowed.extend([libc::AF_INET as u64, libc::AF_INET6 as u64]);
        }
        let conditions = if allowed.is_empty() {
            // Always true: every family refused.
            vec![cond(0, SeccompCmpOp::Ge, 0)?]
        } else {
            allowed
                .into_iter()
                .map(|family| cond(0, SeccompCmpOp::Ne, family))
                .collect::<Result<_, _>>()?
        };
        rules.insert(
            libc::SYS_socket,
            vec![SeccompRule::new(conditions).map_err(|e| e.to_string())?],
        );
    }
    if !scoped_signals {
        // Only `kill(0, sig)`: the caller's own process group.
        let not_own_group =
            SeccompRule::new(vec![cond(0, SeccompCmpOp::Ne, 0)?]).map_err(|e| e.to_string())?;
        rules.insert(libc::SYS_kill, vec![not_own_group]);
        for call in [
            libc::SYS_tkill,
            libc::SYS_tgkill,
            libc::SYS_rt_sigqueueinfo,
            libc::SYS_rt_tgsigqueueinfo,
            libc::SYS_pidfd_send_signal,
        ] {
            rules.insert(call, Vec::new());
        }
    }
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    Ok([
        eperm
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
        enosys
            .try_into()
            .map_err(|e: seccompiler::BackendError| e.to_string())?,
    ])
}

/// Drops every capability: async-signal-safe system calls only.
fn drop_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl and capset with valid arguments; failures are checked where they matter.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        for cap in 0..64 {
            // Without CAP_SETPCAP (not root), the bounding set cannot shrink; the capset below
            // still leaves nothing effective or permitted.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                break;
            }
        }
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl HelperArgs {
    /// Parses [`HelperArgs::to_args`].
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<HelperArgs, String> {
        let mut args = args.into_iter();
        let mut workspace_fd = None;
        let mut tmp = None;
        let mut network = None;
        let mut rlimits = Vec::new();
        while let Some(arg) = args.next() {
            if arg == "--" {
                let script = args.next().ok_or("no script")?;
                let script = script
                    .into_string()
                    .map_err(|_| "the script is not UTF-8")?;
                return Ok(HelperArgs {
                    workspace_fd: workspace_fd.ok_or("no --workspace-fd")?,
                    tmp: tmp.ok_or("no --tmp")?,
                    network: network.ok_or("no --network")?,
                    rlimits,
                    script,
                });
            }
            let value = args.next().ok_or("a flag without its value")?;
            let text = value
                .to_str()
                .ok_or("a value that is not UTF-8")?
                .to_owned();
            match arg.to_str() {
                Some("--workspace-fd") => {
                    workspace_fd = Some(text.parse().map_err(|_| "bad --workspace-fd")?)
                }
                Some("--tmp") => tmp = Some(PathBuf::from(value)),
                Some("--network") => {
                    network = Some(Network::from_arg(&text).ok_or("bad --network")?)
                }
                Some("--rlimit") => rlimits.push(text),
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        Err("no script".into())
    }
}

/// `tah sandbox-exec ARGS`: runs the command confined and waits for it; exits with its status
/// (128 + the signal when it was killed by one). Must run before any other thread starts.
pub fn helper_main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match HelperArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("sandbox: {message}");
            return ExitCode::from(125);
        }
    };
    match helper(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("sandbox: {message}");
            ExitCode::from(125)
        }
    }
}

fn helper(args: HelperArgs) -> Result<ExitCode, String> {
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // SAFETY: the descriptor was handed over by the server, open, for this process.
    let workspace = unsafe { BorrowedFd::borrow_raw(args.workspace_fd) };
    rustix::io::fcntl_setfd(workspace, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| format!("no workspace descriptor: {e}"))?;
    let rlimits = Rlimits::from_args(&args.rlimits).ok_or("bad --rlimit")?;
    let ruleset = ruleset(workspace, &args.tmp, args.network)?;
    let scoped = filters(args.network, true)?;
    let unscoped = filters(args.network, false)?;
    let needs_net_rules = matches!(args.network, Network::Proxy { .. });
    let mut ruleset = Some(ruleset);
    let workspace_raw = workspace.as_raw_fd();

    let mut command = std::process::Command::new("/bin/sh");
    command.arg("-c").arg(&args.script).process_group(0);
    // SAFETY: this process is single-threaded (the helper starts no thread), so the closure may
    // allocate; it only confines the child before `sh` runs.
    unsafe {
        command.pre_exec(move || {
            let fail = |message: &[u8]| {
                say(message);
                Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
            };
            if libc::fchdir(workspace_raw) != 0 {
                return fail(b"sandbox: cannot enter the workspace\n");
            }
            rlimits.apply()?;
            if drop_capabilities().is_err() {
                return fail(b"sandbox: cannot drop capabilities\n");
            }
            let Some(ruleset) = ruleset.take() else {
                return fail(b"sandbox: no ruleset\n");
            };
            let status = match ruleset.restrict_self() {
                Ok(status) => status,
                Err(_) => return fail(b"sandbox: Landlock refused the ruleset\n"),
            };
            if status.ruleset == RulesetStatus::NotEnforced || !status.no_new_privs {
                return fail(b"sandbox: Landlock is not enforced by this kernel\n");
            }
            let abi = match status.landlock {
                LandlockStatus::Available { effective_abi, .. } => effective_abi,
                _ => ABI::Unsupported,
            };
            if needs_net_rules && abi < ABI::V4 {
                return fail(
                    b"sandbox: the network proxy needs Landlock ABI 4 (Linux 6.7) or later; \
                      this kernel cannot restrict TCP connections to one port\n",
                );
            }
            let programs = if abi >= ABI::V6 { &scoped } else { &unscoped };
            for program in programs {
                if seccompiler::apply_filter(program).is_err() {
                    return fail(b"sandbox: seccomp refused the filter\n");
                }
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| format!("the command could not be started ({})", e.kind()))?;
    let sh = child.id() as i32;
    let mut code = 125u8;
    // Reap everything re-parented here until `sh` is gone.
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid status pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            break;
        }
        if pid == sh {
            code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status) as u8
            } else if libc::WIFSIGNALED(status) {
                (128 + libc::WTERMSIG(status)) as u8
            } else {
                125
            };
            break;
        }
    }
    kill_descendants();
    Ok(ExitCode::from(code))
}

/// Kills every process left below this one (a subreaper: orphans are re-parented here), round
/// after round, until none is left.
fn kill_descendants() {
    let me = std::process::id();
    for _ in 0..1000 {
        let children =
            std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
        let pids: Vec<i32> = children
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        for &pid in &pids {
            // SAFETY: kill has no memory preconditions; each is this process's child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Reap what died; its children are re-parented here for the next round.
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
        }
        if pids.is_empty() {
            let mut status = 0;
            // SAFETY: as above; ECHILD means nothing is left.
            if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } < 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helper_reads_back_what_the_server_writes() {
        for network in [Network::None, Network::All, Network::Proxy { port: 3128 }] {
            let args = HelperArgs {
                workspace_fd: 7,
                tmp: PathBuf::from("/tmp/tah-sandbox-x"),
                network,
                rlimits: vec!["0=30".into(), "1=1048576".into()],
                script: "echo -- --tmp x".into(),
            };
            let back = HelperArgs::parse(args.to_args()).expect("parsed");
            assert_eq!(back.workspace_fd, 7);
            assert_eq!(back.tmp, args.tmp);
            assert_eq!(back.network, network);
            assert_eq!(back.rlimits, args.rlimits);
            assert_eq!(back.script, args.script);
        }
        assert!(HelperArgs::parse(["--tmp".into()]).is_err());
        assert!(
            HelperArgs::parse(["--bogus".into(), "1".into(), "--".into(), "x".into()]).is_err()
        );
    }
}

//! The hostile corpus: what a model (or a prompt injected into one) might try in order to leave
//! the workspace, read or change the host, reach the network, or leave processes behind — each
//! attempt with the check a reviewer would make. Shell attempts need bubblewrap (see
//! `sandbox::testing::sandbox`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::builtin::shell::{Shell, ShellSettings};
use super::builtin::NAMES;
use super::sandbox::testing::{self, eventually, marker, processes_with};
use super::{SandboxStatus, ToolContext, ToolOutput, ToolRegistry, ToolSettings, Workspace};
use crate::model::ToolCall;

const SECRET: &str = "TOP SECRET";

/// A workspace `ws` beside a directory `outside` holding `secret.txt`, with links that lead
/// out: `out_dir` → outside, `out_file` → outside/secret.txt, `out_new` → outside/new.txt (not
/// there yet), `etc` → /etc.
struct Fixture {
    tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    ctx: ToolContext,
    tools: ToolRegistry,
}

impl Fixture {
    fn new(sandbox: SandboxStatus) -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("src")).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("write");
        fs::write(outside.join("secret.txt"), SECRET).expect("write");
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).expect("symlink")
        };
        link(&outside, "out_dir");
        link(&outside.join("secret.txt"), "out_file");
        link(&outside.join("new.txt"), "out_new");
        link(Path::new("/etc"), "etc");
        let ws = Workspace::open(&root).expect("workspace");
        Fixture {
            root: ws.root().to_path_buf(),
            outside: outside.canonicalize().expect("canon"),
            ctx: ToolContext::new(ws),
            tools: ToolRegistry::builtin(&ToolSettings::default(), sandbox),
            tmp,
        }
    }

    async fn call(&self, tool: &str, arguments: Value) -> ToolOutput {
        let call = ToolCall {
            id: "call_1".into(),
            name: tool.into(),
            arguments,
        };
        tokio::time::timeout(
            Duration::from_secs(60),
            self.tools.execute(&self.ctx, &call),
        )
        .await
        .expect("the call ends")
    }

    /// A refused call: an error that names neither where the workspace lives nor the secret.
    async fn refused(&self, tool: &str, arguments: Value) -> String {
        let out = self.call(tool, arguments.clone()).await;
        assert!(
            out.is_error,
            "{tool} {arguments} was not refused: {}",
            out.output
        );
        assert!(out.artifacts.is_empty());
        let host = self.tmp.path().to_string_lossy().into_owned();
        assert!(
            !out.output.contains(&host),
            "{tool} {arguments} leaks a path: {}",
            out.output
        );
        assert!(
            !out.output.contains(SECRET),
            "{tool} {arguments} leaks: {}",
            out.output
        );
        out.output
    }

    /// The outside directory holds only the secret, unchanged.
    fn outside_untouched(&self) {
        let names: Vec<_> = fs::read_dir(&self.outside)
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["secret.txt"], "something was written outside");
        assert_eq!(
            fs::read_to_string(self.outside.join("secret.txt")).expect("read"),
            SECRET
        );
    }
}

fn no_sandbox() -> SandboxStatus {
    SandboxStatus::Unavailable("file tools only".into())
}

#[tokio::test]
async fn glob_and_grep_stay_inside() {
    let f = Fixture::new(no_sandbox());
    let abs = f.root.join("src").to_string_lossy().into_owned();
    for (tool, pattern) in [("glob", "*"), ("grep", "o")] {
        for path in [
            "..",
            "../outside",
            "src/../..",
            "out_dir",
            "etc",
            "/etc",
            "/",
            abs.as_str(),
        ] {
            let message = f
                .refused(tool, json!({"pattern": pattern, "path": path}))
                .await;
            assert!(
                message.contains("outside the workspace") || message.contains("absolute"),
                "{tool} {path}: {message}"
            );
        }
    }
    for pattern in ["../*", "../outside/*", "/etc/*", "**/../../*"] {
        f.refused("glob", json!({"pattern": pattern})).await;
        f.refused("grep", json!({"pattern": "x", "glob": pattern}))
            .await;
    }
    for path in [
        "out_file",
        "etc/passwd",
        "out_dir/secret.txt",
        "/etc/passwd",
    ] {
        f.refused("grep", json!({"pattern": "o", "path": path}))
            .await;
    }
    // Walks do not follow the links out.
    let listed = f.call("glob", json!({"pattern": "**"})).await;
    assert!(!listed.is_error);
    assert!(
        !listed.output.contains("secret") && !listed.output.contains("passwd"),
        "{}",
        listed.output
    );
    let found = f.call("grep", json!({"pattern": "SECRET|root:"})).await;
    assert_eq!(found.output, "[no matches]");
}

#[tokio::test]
async fn writes_and_edits_never_land_outside() {
    let f = Fixture::new(no_sandbox());
    let abs = f.root.join("x.txt").to_string_lossy().into_owned();
    let outside_abs = f.outside.join("x.txt").to_string_lossy().into_owned();
    for path in [
        "../outside/x.txt",
        "../x.txt",
        "src/../../x.txt",
        "/tmp/x.txt",
        abs.as_str(),
        outside_abs.as_str(),
        "out_dir/x.txt",
        "out_dir/sub/deeper/x.txt",
        "out_file",
        "out_new",
        "etc/passwd",
        "etc/tah-x",
        "x\0.txt",
    ] {
        f.refused("write_file", json!({"path": path, "content": "pwned"}))
            .await;
        let edit = json!({"path": path, "old_string": "TOP", "new_string": "pwned"});
        f.refused("edit_file", edit).await;
    }
    let long = "a/".repeat(3000);
    f.refused("write_file", json!({"path": long, "content": "x"}))
        .await;
    f.outside_untouched();
    assert!(!f.tmp.path().join("x.txt").exists());
    // Writing inside through an inside link still works.
    let out = f
        .call(
            "write_file",
            json!({"path": "src/../ok.txt", "content": "fine"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.output);
}

/// A process inside the workspace (here, a thread) swaps a directory for a symlink to the
/// outside, over and over, while file tools use a path through it. A check-then-open race
/// would sometimes read or write outside; the no-follow opens never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_directory_for_a_symlink_never_leads_outside() {
    let f = Fixture::new(no_sandbox());
    fs::create_dir(f.root.join("flip")).expect("mkdir");
    fs::write(f.root.join("flip/inside.txt"), "inside").expect("write");
    fs::write(f.outside.join("inside.txt"), SECRET).expect("write");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (root, outside, stop) = (f.root.clone(), f.outside.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = fs::rename(root.join("flip"), root.join("parked"));
                let _ = std::os::unix::fs::symlink(&outside, root.join("flip"));
                std::thread::yield_now();
                let _ = fs::remove_file(root.join("flip"));
                let _ = fs::rename(root.join("parked"), root.join("flip"));
            }
        })
    };
    let mut read_inside = 0;
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < deadline {
        let read = f
            .call("read_file", json!({"path": "flip/inside.txt"}))
            .await;
        assert!(
            !read.output.contains(SECRET),
            "read outside: {}",
            read.output
        );
        read_inside += usize::from(read.output.contains("inside"));
        let write = json!({"path": "flip/new.txt", "content": "pwned"});
        let wrote = f.call("write_file", write).await;
        assert!(
            !f.outside.join("new.txt").exists(),
            "wrote outside: {}",
            wrote.output
        );
        let edit =
            json!({"path": "flip/inside.txt", "old_string": "inside", "new_string": "inside"});
        f.call("edit_file", edit).await;
        let grep = f
            .call("grep", json!({"pattern": "SECRET", "path": "flip"}))
            .await;
        assert!(
            !grep.output.contains(SECRET),
            "grep outside: {}",
            grep.output
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().expect("flipper");
    assert!(
        read_inside > 0,
        "the race never let a read through; the test proves nothing"
    );
    assert_eq!(
        fs::read_to_string(f.outside.join("inside.txt")).expect("read"),
        SECRET
    );
    assert!(!f.outside.join("new.txt").exists());
}

/// The fixture with a working `shell`, or `None` when the sandbox tests are skipped.
async fn with_shell(network: bool) -> Option<Fixture> {
    let sandbox = testing::sandbox().await?;
    let mut f = Fixture::new(SandboxStatus::Ready(sandbox.clone()));
    if network {
        let settings = ShellSettings {
            network: super::builtin::shell::ShellNetwork::All,
            ..ShellSettings::default()
        };
        let shell = Shell::new(settings, SandboxStatus::Ready(sandbox));
        f.tools = ToolRegistry::new(vec![std::sync::Arc::new(shell)], 64 * 1024).expect("registry");
    }
    assert_eq!(f.tools.names().len(), if network { 1 } else { NAMES.len() });
    Some(f)
}

/// How many `sleep` processes carry `marker` (bwrap and `sh` carry it too).
fn sleeps(marker: &str) -> usize {
    let is_sleep = |pid: &u32| {
        fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))
    };
    processes_with(marker)
        .iter()
        .filter(|pid| is_sleep(pid))
        .count()
}

async fn shell(f: &Fixture, command: &str) -> String {
    let out = f.call("shell", json!({ "command": command })).await;
    assert!(!out.is_error, "{command}: {}", out.output);
    out.output
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn shell_cannot_write_outside_the_workspace() {
    let Some(f) = with_shell(false).await else {
        return;
    };
    let tag = marker();
    let host_targets = [
        f.outside.join(format!("w{tag}")),
        PathBuf::from(format!("/var/tmp/tah-hostile-{tag}")),
        PathBuf::from(format!("/usr/tah-hostile-{tag}")),
        PathBuf::from(format!("/etc/tah-hostile-{tag}")),
        f.tmp.path().join(format!("w{tag}")),
    ];
    for target in &host_targets {
        let target = target.display();
        shell(
            &f,
            &format!("mkdir -p \"$(dirname {target})\"; echo pwned > {target}"),
        )
        .await;
    }
    shell(&f, "echo pwned > ../escape.txt; echo pwned > out_dir/x; echo pwned > out_new; echo x >> out_file").await;
    for target in &host_targets {
        assert!(!target.exists(), "{} was written", target.display());
    }
    assert!(!f.tmp.path().join("escape.txt").exists());
    f.outside_untouched();
    // The system is read-only even where the sandbox can see it.
    let out = shell(&f, "touch /usr/bin/tah-x /etc/tah-x 2>&1; echo done").await;
    assert!(out.contains("Read-only file system"), "{out}");
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn shell_cannot_read_host_files() {
    let Some(f) = with_shell(false).await else {
        return;
    };
    let tag = marker();
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    let planted: Vec<PathBuf> = [
        PathBuf::from(format!("/var/tmp/tah-secret-{tag}")),
        home.join(format!("tah-secret-{tag}")),
    ]
    .into_iter()
    .filter(|p| fs::write(p, SECRET).is_ok())
    .collect();
    assert!(!planted.is_empty(), "could not plant a host file to read");
    let mut command =
        String::from("cat ../outside/secret.txt out_file out_dir/secret.txt /etc/shadow 2>&1;");
    for p in &planted {
        command.push_str(&format!(" cat {} 2>&1;", p.display()));
    }
    command.push_str(" ls / /root /home /var 2>&1; echo end");
    let out = shell(&f, &command).await;
    for p in &planted {
        let _ = fs::remove_file(p);
    }
    assert!(!out.contains(SECRET), "{out}");
    // /etc is visible, but its shadow files are masked.
    assert!(!out.contains("root:"), "{out}");
    assert!(out.contains("end\nexit code 0"), "{out}");
    assert!(shell(&f, "head -c 5 /etc/passwd")
        .await
        .starts_with("root:"));
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn shell_has_no_network_unless_allowed() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let connect = format!(
        "bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo connected || echo refused"
    );
    let Some(f) = with_shell(false).await else {
        return;
    };
    assert_eq!(shell(&f, &connect).await, "refused\nexit code 0");
    assert!(listener.accept().is_err(), "a connection got through");
    // The same command, with the network allowed, connects: the check above can fail.
    let Some(open) = with_shell(true).await else {
        return;
    };
    assert_eq!(shell(&open, &connect).await, "connected\nexit code 0");
    let accepted = eventually(Duration::from_secs(2), || listener.accept().is_ok()).await;
    assert!(accepted);
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn cancelling_a_call_kills_everything_it_started() {
    let Some(f) = with_shell(false).await else {
        return;
    };
    let m = marker();
    let command = format!("sleep {m} & (setsid sleep {m} > /dev/null 2>&1 &); sleep {m}");
    let call = ToolCall {
        id: "call_1".into(),
        name: "shell".into(),
        arguments: json!({ "command": command }),
    };
    let (tools, ctx) = (f.tools.clone(), f.ctx.clone());
    let running = tokio::spawn(async move { tools.execute(&ctx, &call).await });
    let started = eventually(Duration::from_secs(10), || sleeps(&m) == 3).await;
    assert!(
        started,
        "the sleeps did not start: {:?}",
        processes_with(&m)
    );
    // Cancelling a run drops the call's future.
    running.abort();
    assert!(running.await.is_err_and(|e| e.is_cancelled()));
    let gone = eventually(Duration::from_secs(5), || processes_with(&m).is_empty()).await;
    assert!(gone, "left behind: {:?}", processes_with(&m));
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn children_that_outlive_the_command_are_gone_when_the_call_ends() {
    let Some(f) = with_shell(false).await else {
        return;
    };
    let m = marker();
    let command = format!(
        "sleep {m} & nohup sleep {m} > /dev/null 2>&1 & (setsid sleep {m} > /dev/null 2>&1 &); \
         echo started"
    );
    let started = std::time::Instant::now();
    let out = shell(&f, &command).await;
    assert_eq!(out, "started\nexit code 0");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        processes_with(&m).is_empty(),
        "left behind: {:?}",
        processes_with(&m)
    );
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test]
async fn links_the_shell_makes_do_not_lead_file_tools_out() {
    let Some(f) = with_shell(false).await else {
        return;
    };
    let outside = f.outside.display();
    shell(
        &f,
        &format!("ln -s /etc sys && ln -s {outside} away && ln -s ../outside up"),
    )
    .await;
    f.refused("read_file", json!({"path": "sys/passwd"})).await;
    for path in ["away/new.txt", "up/new.txt", "away/secret.txt"] {
        f.refused("write_file", json!({"path": path, "content": "pwned"}))
            .await;
    }
    f.refused("grep", json!({"pattern": "TOP", "path": "up"}))
        .await;
    f.outside_untouched();
}

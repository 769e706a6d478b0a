//! Decides, when the package is built, whether its PostgreSQL tests can run here, and says so
//! to the compiler as `cfg(pg_tests)`; the tests that need PostgreSQL are `#[ignore]`d without
//! it, so that `cargo test` reports them as ignored rather than as passed.
//!
//! They can run where PostgreSQL's server binaries are installed (the tests then start a
//! throwaway cluster of their own), or where `TAH_TEST_PG_URL` names a server and
//! `TAH_TEST_PG=on` says so. `TAH_TEST_PG=off` builds as if the binaries were absent;
//! `TAH_REQUIRE_PG=1` (CI) is `on`. The library and the binary do not depend on any of this.
//!
//! Likewise `cfg(mount_tests)`: the storage-fault tests mount a small tmpfs (a disk that fills
//! up, a file system made read-only), which only root can; `TAH_TEST_MOUNT=on|off` overrides.
//!
//! And `cfg(sandbox_tests)`: the tests of the `shell` tool need bubblewrap (`bwrap` on `PATH`)
//! able to build its sandbox here; `TAH_TEST_SANDBOX=on|off` overrides the guess and
//! `TAH_REQUIRE_SANDBOX=1` (CI) is `on`.
//!
//! And `cfg(landlock_tests)`: the tests of the Landlock backend need a kernel with Landlock
//! (Linux 5.13 or later, with Landlock among its security modules: most distributions' kernels);
//! the guess is the kernel's version, `TAH_TEST_LANDLOCK=on|off` overrides it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pg_tests)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=TAH_TEST_PG");
    println!("cargo::rerun-if-env-changed=TAH_REQUIRE_PG");
    let required = std::env::var("TAH_REQUIRE_PG").is_ok_and(|v| v == "1");
    let enabled = match std::env::var("TAH_TEST_PG").unwrap_or_default().as_str() {
        "off" => false,
        "on" => true,
        _ => required || postgres_bindir().is_some(),
    };
    if enabled {
        println!("cargo::rustc-cfg=pg_tests");
    }
    println!("cargo::rustc-check-cfg=cfg(mount_tests)");
    println!("cargo::rerun-if-env-changed=TAH_TEST_MOUNT");
    let mounts = match std::env::var("TAH_TEST_MOUNT").unwrap_or_default().as_str() {
        "off" => false,
        "on" => true,
        _ => is_root(),
    };
    if mounts {
        println!("cargo::rustc-cfg=mount_tests");
    }
    println!("cargo::rustc-check-cfg=cfg(sandbox_tests)");
    println!("cargo::rerun-if-env-changed=TAH_TEST_SANDBOX");
    println!("cargo::rerun-if-env-changed=TAH_REQUIRE_SANDBOX");
    let required = std::env::var("TAH_REQUIRE_SANDBOX").is_ok_and(|v| v == "1");
    let sandbox = match std::env::var("TAH_TEST_SANDBOX")
        .unwrap_or_default()
        .as_str()
    {
        "off" => false,
        "on" => true,
        _ => required || bwrap_works(),
    };
    if sandbox {
        println!("cargo::rustc-cfg=sandbox_tests");
    }
    println!("cargo::rustc-check-cfg=cfg(landlock_tests)");
    println!("cargo::rerun-if-env-changed=TAH_TEST_LANDLOCK");
    let landlock = match std::env::var("TAH_TEST_LANDLOCK")
        .unwrap_or_default()
        .as_str()
    {
        "off" => false,
        "on" => true,
        _ => kernel_at_least(5, 13),
    };
    if landlock {
        println!("cargo::rustc-cfg=landlock_tests");
    }
}

/// Whether the running kernel's version is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

/// Whether a `bwrap` on `PATH` can build a sandbox here (user namespaces may be refused, as
/// in some containers).
fn bwrap_works() -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    let Some(bwrap) = std::env::split_paths(&path)
        .map(|dir| dir.join("bwrap"))
        .find(|candidate| candidate.is_file())
    else {
        return false;
    };
    Command::new(bwrap)
        .args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "true",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether the build runs as root (the effective uid on the `Uid:` line of /proc/self/status).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(2).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

/// Where `initdb` and `pg_ctl` are, looked up as `scripts/pg-test-cluster.sh` does.
fn postgres_bindir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten();
    if let Some(dir) = versions
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .find(|dir| has_server(dir))
    {
        return Some(dir);
    }
    let output = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    has_server(&dir).then_some(dir)
}

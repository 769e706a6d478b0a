//! `tah serve`'s flags as the manual documents them, boolean values as people write them, and
//! a `--cors-origin` as people copy it from an address bar.

use std::process::Stdio;
use std::time::Duration;

use clap::CommandFactory;
use tah::app::ReadyLine;
use tah::cli::{Cli, ServeArgs};

use crate::support::{ServerOptions, TestServer};
use crate::usage::demo::scratch;
use crate::usage::readme::{manual, page, read};
use crate::usage::tah;

/// The rows of the configuration page's table (`docs/src/configuration.md`): (first cell,
/// whole row).
fn configuration_rows() -> Vec<(String, String)> {
    read(&page("configuration.md"))
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .map(|line| {
            let first = line
                .split('|')
                .nth(1)
                .unwrap_or_default()
                .trim()
                .to_string();
            (first, line.to_string())
        })
        .collect()
}

/// `--name` out of a first cell such as "`--listen ADDR`" or "`--api-token TOKEN` (repeatable)".
fn flag_of(cell: &str) -> String {
    cell.trim_start_matches('`')
        .split(['`', ' ', '='])
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn every_flag_of_tah_serve_is_in_the_configuration_table_with_its_variable_and_default() {
    let rows = configuration_rows();
    let documented: Vec<String> = rows.iter().map(|(cell, _)| flag_of(cell)).collect();
    let command = ServeArgs::command();
    let mut flags = Vec::new();
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || arg.is_hide_set() {
            continue;
        }
        let flag = format!("--{long}");
        let (_, row) = rows
            .iter()
            .find(|(cell, _)| flag_of(cell) == flag)
            .unwrap_or_else(|| panic!("{flag} is not in docs/src/configuration.md's table"));
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            assert!(
                row.contains(&format!("`{env}`")),
                "{flag}: the row does not name {env}: {row}"
            );
        }
        if !arg.is_hide_default_value_set() {
            for default in arg.get_default_values() {
                let default = default.to_string_lossy();
                assert!(
                    row.contains(&format!("`{default}`")),
                    "{flag}: the row does not give the default `{default}`: {row}"
                );
            }
        }
        assert!(
            arg.get_help().is_some(),
            "{flag} has no help text in tah serve --help"
        );
        flags.push(flag);
    }
    for flag in &documented {
        assert!(
            flags.contains(flag),
            "docs/src/configuration.md documents {flag}, which tah serve does not have"
        );
    }
    assert_eq!(
        documented, flags,
        "the configuration table lists the flags in tah serve --help's order"
    );
}

#[test]
fn every_command_of_tah_is_in_its_help_and_the_manual() {
    let text = manual();
    let mut cli = Cli::command();
    let help = cli.render_help().to_string();
    for command in cli.get_subcommands().filter(|c| c.get_name() != "help") {
        let name = command.get_name();
        assert!(
            !command.is_hide_set(),
            "tah {name} is hidden from tah --help"
        );
        assert!(
            help.contains(name),
            "tah --help does not list {name}:\n{help}"
        );
        assert!(
            text.contains(&format!("-- {name}")) || text.contains(&format!("tah {name}")),
            "the manual never shows how to run tah {name}"
        );
    }
    assert!(help.contains("fake-model"), "{help}");
}

/// Starts `tah serve` on 0.0.0.0 without tokens and with `TAH_ALLOW_UNAUTHENTICATED=value`:
/// whether it started, and what it printed if it did not.
async fn start_exposed(value: &str) -> Result<(), String> {
    start_serve(
        &["--listen", "0.0.0.0:0"],
        &[
            ("TAH_ALLOW_UNAUTHENTICATED", value),
            ("TAH_AUTO_RESUME", value),
        ],
    )
    .await
}

/// Starts `tah serve --workspace .` in a scratch directory with `args` and `env`: whether it
/// started, and what it printed if it did not.
async fn start_serve(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let dir = scratch();
    let mut child = tah()
        .args(["serve", "--workspace", "."])
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tah serve");
    let stdout = child.stdout.take().expect("piped stdout");
    match tokio::time::timeout(Duration::from_secs(30), ReadyLine::read(stdout)).await {
        Ok(Some(_)) => {
            let _ = child.kill().await;
            Ok(())
        }
        _ => {
            let output = child.wait_with_output().await.expect("wait for tah");
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }
}

#[tokio::test]
async fn boolean_variables_take_true_false_1_0_yes_no_in_any_case() {
    for yes in ["true", "TRUE", "1", "yes", "Yes", "on"] {
        let started = start_exposed(yes).await;
        assert!(
            started.is_ok(),
            "TAH_ALLOW_UNAUTHENTICATED={yes}: {started:?}"
        );
    }
    for no in ["false", "False", "0", "no", "NO", "off"] {
        let refused = start_exposed(no).await.expect_err(no);
        assert!(
            refused.contains("refusing to listen on 0.0.0.0:0 without API tokens"),
            "TAH_ALLOW_UNAUTHENTICATED={no}: {refused}"
        );
    }
    let refused = start_exposed("maybe").await.expect_err("maybe");
    assert!(refused.contains("invalid value 'maybe'"), "{refused}");
}

#[tokio::test]
async fn a_thinking_budget_is_off_or_at_least_what_anthropic_takes() {
    let listen = ["--listen", "127.0.0.1:0"];
    let refused = start_serve(&[&listen[..], &["--thinking-budget", "1023"]].concat(), &[])
        .await
        .expect_err("1023 is too small");
    assert!(
        refused.contains("--thinking-budget 1023 is too small")
            && refused.contains("at least 1024"),
        "{refused}"
    );
    let refused = start_serve(&listen, &[("TAH_THINKING_BUDGET", "1")])
        .await
        .expect_err("1 is too small");
    assert!(refused.contains("--thinking-budget 1 "), "{refused}");
    let refused = start_serve(&listen, &[("TAH_THINKING_BUDGET", "-5")])
        .await
        .expect_err("not a number of tokens");
    assert!(refused.contains("--thinking-budget"), "{refused}");
    for on in ["0", "1024", "32000"] {
        let started = start_serve(&listen, &[("TAH_THINKING_BUDGET", on)]).await;
        assert!(started.is_ok(), "TAH_THINKING_BUDGET={on}: {started:?}");
    }
}

/// A sandboxed command with the network could call this server's own API; without tokens it
/// would approve its own calls, so the server does not start.
#[tokio::test]
async fn a_shell_with_network_is_refused_without_api_tokens() {
    let listen = ["--listen", "127.0.0.1:0"];
    let refused = start_serve(&[&listen[..], &["--shell-network"]].concat(), &[])
        .await
        .expect_err("no tokens");
    assert!(
        refused.contains("--shell-network") && refused.contains("--api-token"),
        "{refused}"
    );
    let refused = start_serve(&listen, &[("TAH_SHELL_NETWORK", "true")])
        .await
        .expect_err("no tokens");
    assert!(refused.contains("refusing --shell-network"), "{refused}");
    let token = ("TAH_API_TOKENS", "a-token-of-enough-length");
    let started = start_serve(&listen, &[("TAH_SHELL_NETWORK", "true"), token]).await;
    assert!(started.is_ok(), "with a token: {started:?}");
}

#[tokio::test]
async fn a_cors_origin_written_with_a_trailing_slash_matches_what_browsers_send() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--cors-origin", "http://LOCALHOST:5173/"]))
            .await;
    let reply = server
        .send(
            server
                .request(reqwest::Method::GET, "/v1/sessions")
                .header("origin", "http://localhost:5173"),
        )
        .await;
    assert_eq!(reply.status, reqwest::StatusCode::OK);
    assert_eq!(
        reply
            .headers
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("http://localhost:5173"),
        "{:?}",
        reply.headers
    );
}

#[tokio::test]
async fn a_refused_origin_is_logged_once_with_the_flag_that_allows_it() {
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            .args(&["--cors-origin", "http://localhost:5173"]),
    )
    .await;
    for method in [
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::GET,
    ] {
        let reply = server
            .send(
                server
                    .request(method.clone(), "/v1/sessions")
                    .header("origin", "http://localhost:3000"),
            )
            .await;
        assert!(
            reply.headers.get("access-control-allow-origin").is_none(),
            "{method}: {:?}",
            reply.headers
        );
    }
    // An allowed origin is not warned about.
    server
        .send(
            server
                .request(reqwest::Method::GET, "/v1/sessions")
                .header("origin", "http://localhost:5173"),
        )
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let warnings = loop {
        let lines = server.log_lines("web origin that is not allowed");
        if !lines.is_empty() || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("--cors-origin http://localhost:3000"),
        "{}",
        warnings[0]
    );
    assert!(!server.log().contains("localhost:5173 to allow"));
}

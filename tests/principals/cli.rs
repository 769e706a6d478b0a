//! `tah keys create|list|revoke` against a server's database (the same `--database-url` as
//! `tah serve`), and the keys it makes working over HTTP.

use std::process::Output;

use reqwest::StatusCode;

use super::{assert_unauthorized, operated};
use crate::support::*;

/// Runs `tah keys ARGS --database-url URL` with none of the caller's `TAH_*` variables; it
/// must succeed. Returns its stdout.
fn keys(database_url: &str, args: &[&str]) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tah"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TAH_") {
            command.env_remove(name);
        }
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .arg("keys")
        .args(args)
        .args(["--database-url", database_url])
        .output()
        .expect("run tah keys");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(
        status.success(),
        "tah keys {args:?} exited with {status}\nstdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

/// The one `tah_` key in `text` (`tah_` and 64 lowercase hex digits).
fn key_in(text: &str) -> String {
    let found: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|word| {
            word.len() == 68
                && word.starts_with("tah_")
                && word[4..]
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .collect();
    assert_eq!(found.len(), 1, "one tah_ key in: {text}");
    found[0].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_cli_creates_lists_and_revokes_keys_the_server_accepts() {
    let mut server = TestServer::start(operated()).await;
    let database = server.database_url().to_string();
    server.stop().await;

    let printed = keys(
        &database,
        &[
            "create",
            "--tenant",
            "acme",
            "--role",
            "admin",
            "--name",
            "cli-admin",
        ],
    );
    let key = key_in(&printed);
    let listed = keys(&database, &["list"]);
    assert!(
        listed.contains("acme") && listed.contains("admin") && listed.contains("cli-admin"),
        "tah keys list shows the key's tenant, role and name: {listed}"
    );
    assert!(
        !listed.contains(&key) && !listed.contains(&key[4..]),
        "tah keys list never shows a key's secret: {listed}"
    );

    server.spawn().await;
    let admin = server.with_bearer(&key);
    let made = admin.create_session_with(&serde_json::json!({})).await;
    assert_eq!(made["tenant"], "acme", "{made}");
    let mine = admin.get_ok("/v1/keys").await;
    let id = mine["data"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["name"] == "cli-admin"))
        .map(id_of)
        .unwrap_or_else(|| panic!("GET /v1/keys lists the CLI's key: {mine}"));
    assert!(
        listed.contains(&id),
        "tah keys list shows the key's id {id}: {listed}"
    );
    server.stop().await;

    keys(&database, &["revoke", &id]);
    server.spawn().await;
    assert_unauthorized(
        &server.with_bearer(&key).get("/v1/sessions").await,
        "a key the CLI revoked",
    );
    assert_eq!(
        server.get("/v1/keys").await.status,
        StatusCode::OK,
        "the operator still lists keys"
    );
}

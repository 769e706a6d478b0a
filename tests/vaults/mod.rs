//! Vaults (`/v1/vaults/{vault}/secrets`, `--master-key-env`), through HTTP only: secrets are
//! written, listed and deleted by an admin and never answered back; the database holds only
//! ciphertext; a server without a master key answers `409 vaults-disabled`, one with a bad key
//! does not start; a member or viewer key is refused; an agent whose MCP server references a
//! malformed secret is refused; a providers file's `api_key` taken from a vault reaches its
//! provider; the shell's sandbox sees neither the master key nor the provider key. (An agent's MCP server given a secret, and the redaction of tool outputs, are in
//! the MCP suite, whose binary is the MCP server it needs.)

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::fakes::{self, Reply as FakeReply};
use crate::support::scripted::{allow_all, call, model_calling, options, output_of};
use crate::support::*;

/// The variable the tests' master key is in, and the key (32 bytes, hex).
pub const KEY_VAR: &str = "TAH_TEST_VAULT_MASTER_KEY";
pub const KEY_HEX: &str = "8f1c2a0b9d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f10";
/// A value no answer, log or database page may show.
const VALUE: &str = "sk-vaulted-3b7e2c91f0a4";

/// Options of a server process with vaults on (its own environment holds the key).
fn with_vaults(options: ServerOptions) -> ServerOptions {
    options
        .process()
        .env(KEY_VAR, KEY_HEX)
        .args(&["--master-key-env", KEY_VAR])
}

/// A new API key, made by the operator; its bearer value.
async fn new_key(server: &TestServer, operator: &str, body: Value) -> String {
    let request = server
        .request(Method::POST, "/v1/keys")
        .bearer_auth(operator)
        .json(&body);
    let created = server
        .send(request)
        .await
        .expect_json(StatusCode::CREATED, "a key");
    created["key"].as_str().expect("a key").to_string()
}

async fn put_secret(server: &TestServer, path: &str, value: &str) -> Reply {
    server
        .call(Method::PUT, path, Some(&json!({ "value": value })))
        .await
        .expect("PUT a secret")
}

/// Every answer's bytes, checked for the value.
fn assert_hidden(reply: &Reply, what: &str) {
    let text = String::from_utf8_lossy(&reply.bytes);
    assert!(!text.contains(VALUE), "{what} shows the value: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_write_only_and_sealed_at_rest() {
    let mut server = TestServer::start(with_vaults(ServerOptions::new())).await;
    let written = put_secret(&server, "/v1/vaults/prod/secrets/openai", VALUE).await;
    assert_hidden(&written, "PUT");
    let body = written.expect_json(StatusCode::OK, "a secret written");
    assert_eq!(body["vault"], "prod");
    assert_eq!(body["name"], "openai");
    assert!(body["updated_at"].is_string(), "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(3), "{body}");
    put_secret(&server, "/v1/vaults/prod/secrets/a.b-c_d", "other")
        .await
        .expect_json(StatusCode::OK, "a second secret");
    // Written again: replaced, listed once.
    put_secret(&server, "/v1/vaults/prod/secrets/openai", VALUE)
        .await
        .expect_json(StatusCode::OK, "a secret replaced");

    let listed = server.get("/v1/vaults/prod/secrets").await;
    assert_hidden(&listed, "the list");
    let listed = listed.expect_json(StatusCode::OK, "the vault's secrets");
    let names: Vec<&str> = listed["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|s| s["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["a.b-c_d", "openai"]);
    let empty = server.get_ok("/v1/vaults/other/secrets").await;
    assert_eq!(empty["data"], json!([]));

    // Refused names and bodies, each a 400 that does not quote the value.
    for (path, body) in [
        (
            "/v1/vaults/prod/secrets/bad%20name",
            json!({ "value": VALUE }),
        ),
        ("/v1/vaults/prod/secrets/openai", json!({ "value": 42 })),
        (
            "/v1/vaults/prod/secrets/openai",
            json!({ "value": VALUE, "x": 1 }),
        ),
        (
            "/v1/vaults/prod/secrets/big",
            json!({ "value": "v".repeat(64 * 1024 + 1) }),
        ),
    ] {
        let reply = server.call(Method::PUT, path, Some(&body)).await.unwrap();
        assert_hidden(&reply, path);
        reply.expect_problem(StatusCode::BAD_REQUEST, path);
    }
    let long = format!("/v1/vaults/{}/secrets", "v".repeat(129));
    server
        .get(&long)
        .await
        .expect_problem(StatusCode::BAD_REQUEST, "a vault name over 128");

    // The database has the row, sealed: no page of its file (or its WAL) holds the value.
    server.stop().await;
    if !server.backend().is_postgres() {
        let dir = server.database_path();
        let dir = dir.parent().expect("the data dir");
        let mut files = 0;
        for entry in std::fs::read_dir(dir).expect("the data dir") {
            let path = entry.expect("an entry").path();
            let bytes = std::fs::read(&path).expect("a database file");
            files += 1;
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
                "{} holds the value",
                path.display()
            );
        }
        assert!(files >= 1);
    }
    server.restart().await;

    // The log of the whole life of the server does not hold it either.
    assert!(!server.log().contains(VALUE), "the log shows the value");

    let deleted = server
        .call(Method::DELETE, "/v1/vaults/prod/secrets/openai", None)
        .await
        .unwrap();
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "deleted");
    server
        .call(Method::DELETE, "/v1/vaults/prod/secrets/openai", None)
        .await
        .unwrap()
        .expect_problem(StatusCode::NOT_FOUND, "deleted again");
    let listed = server.get_ok("/v1/vaults/prod/secrets").await;
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_master_key_vaults_are_disabled() {
    let server = TestServer::start(ServerOptions::new()).await;
    for (method, path) in [
        (Method::PUT, "/v1/vaults/prod/secrets/k"),
        (Method::GET, "/v1/vaults/prod/secrets"),
        (Method::DELETE, "/v1/vaults/prod/secrets/k"),
    ] {
        let body = (method == Method::PUT).then(|| json!({ "value": VALUE }));
        let problem = server
            .call(method.clone(), path, body.as_ref())
            .await
            .unwrap()
            .expect_problem(StatusCode::CONFLICT, path);
        assert_eq!(problem["type"], "urn:tah:problem:vaults-disabled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_master_key_stops_the_start_naming_the_variable_only() {
    for bad in [
        "short",
        "zz1c2a0b9d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f10",
    ] {
        let (status, log) = serve_expecting_exit(&["--master-key-env", KEY_VAR], &[(KEY_VAR, bad)]);
        assert!(!status.success(), "started with the key {bad:?}");
        assert!(log.contains(KEY_VAR), "{log}");
        assert!(!log.contains(bad), "the log shows the key: {log}");
    }
    let (status, log) = serve_expecting_exit(&["--master-key-env", "TAH_TEST_NO_SUCH_VAR"], &[]);
    assert!(!status.success());
    assert!(log.contains("TAH_TEST_NO_SUCH_VAR is not set"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_malformed_reference_is_refused() {
    let server = TestServer::start(ServerOptions::new()).await;
    for (field, value) in [
        ("env", json!({"TOKEN": "${vault:prod}"})),
        ("env", json!({"TOKEN": "x ${vault:prod/to ken}"})),
    ] {
        let mut own = json!({"name": "own", "command": "true"});
        own[field] = value;
        let problem = server
            .post_json(
                "/v1/agents",
                &json!({"name": "refs", "model": "mock", "mcp_servers": [own]}),
            )
            .await
            .expect_problem(StatusCode::BAD_REQUEST, "a malformed reference");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("env.TOKEN"), "{detail}");
        assert!(detail.contains("${vault:"), "{detail}");
    }
    let own = json!({"name": "own", "type": "http", "url": "http://127.0.0.1:9/mcp",
                     "headers": {"Authorization": "Bearer ${vault:prod/token}"}});
    server
        .post_json(
            "/v1/agents",
            &json!({"name": "refs", "model": "mock", "mcp_servers": [own]}),
        )
        .await
        .expect_json(StatusCode::CREATED, "a well-formed reference");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_and_viewers_may_not_use_vaults() {
    // Once a key exists every request needs a bearer: the operator's is a deployment token.
    let operator = "vault-test-operator-token-0123";
    let server =
        TestServer::start(with_vaults(ServerOptions::new()).args(&["--api-token", operator])).await;
    let member = new_key(&server, operator, json!({"role": "member"})).await;
    let viewer = new_key(&server, operator, json!({"role": "viewer"})).await;
    for key in [&member, &viewer] {
        for (method, path) in [
            (Method::PUT, "/v1/vaults/prod/secrets/k"),
            (Method::GET, "/v1/vaults/prod/secrets"),
            (Method::DELETE, "/v1/vaults/prod/secrets/k"),
        ] {
            let mut request = server.request(method.clone(), path).bearer_auth(key);
            if method == Method::PUT {
                request = request.json(&json!({ "value": VALUE }));
            }
            let problem = server
                .send(request)
                .await
                .expect_problem(StatusCode::FORBIDDEN, path);
            assert_eq!(problem["type"], "urn:tah:problem:forbidden");
        }
    }
    // An admin writes its own tenant's vaults; the operator's `default` vault of the same
    // name is another one.
    let admin = new_key(
        &server,
        operator,
        json!({"role": "admin", "tenant": "acme"}),
    )
    .await;
    let put = |bearer: &str, value: &str| {
        server
            .request(Method::PUT, "/v1/vaults/prod/secrets/k")
            .bearer_auth(bearer)
            .json(&json!({ "value": value }))
    };
    server
        .send(put(&admin, VALUE))
        .await
        .expect_json(StatusCode::OK, "an admin's secret");
    let list = |bearer: &str| {
        server
            .request(Method::GET, "/v1/vaults/prod/secrets")
            .bearer_auth(bearer)
    };
    let theirs = server
        .send(list(operator))
        .await
        .expect_json(StatusCode::OK, "the operator's vault");
    assert_eq!(theirs["data"], json!([]));
    let own = server
        .send(list(&admin))
        .await
        .expect_json(StatusCode::OK, "the admin's vault");
    assert_eq!(own["data"].as_array().map(Vec::len), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_key_comes_from_a_vault() {
    let model = fakes::start_openai(vec![FakeReply::sse(fakes::openai::text_reply(&[
        "from the vaulted provider",
    ]))])
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("providers.json");
    std::fs::write(
        &file,
        json!({"providers": {"gw": {
            "type": "openai",
            "base_url": model.base_url,
            "api_key": "${vault:providers/gw}",
        }}})
        .to_string(),
    )
    .expect("write the providers file");
    // The secret is written first; the providers file is read at the next start.
    let mut server = TestServer::start(with_vaults(ServerOptions::new())).await;
    put_secret(&server, "/v1/vaults/providers/secrets/gw", VALUE)
        .await
        .expect_json(StatusCode::OK, "the provider's key");
    server.stop().await;
    let file = file.display().to_string();
    server
        .restart_with(with_vaults(ServerOptions::new()).args(&["--providers", &file]))
        .await;
    let agent = server
        .post_json("/v1/agents", &json!({"name": "gw", "model": "gw/gpt-fake"}))
        .await
        .expect_json(StatusCode::CREATED, "an agent on the provider");
    let session = server
        .create_session_with(&json!({ "agent": agent["id"] }))
        .await;
    let id = session["id"].as_str().expect("an id");
    let result = server.run_wait(id, "hello").await;
    assert_eq!(result["status"], "completed", "{result}");
    let requests = model.requests();
    assert_eq!(
        requests[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {VALUE}").as_str())
    );
    // Nothing the API answers shows it.
    let providers: Value = server.get_ok("/v1/providers").await;
    assert!(!providers.to_string().contains(VALUE));
    for path in [
        format!("/v1/sessions/{id}/steps"),
        format!("/v1/sessions/{id}/events"),
    ] {
        let reply = server.get(&path).await;
        assert_hidden(&reply, &path);
    }
    assert!(!server.log().contains(VALUE), "the log shows the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_sandbox_gets_neither_the_master_key_nor_the_provider_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = allow_all(dir.path());
    let model = model_calling(vec![call("env", "shell", json!({"command": "env"}))]).await;
    let launch = with_vaults(options(&model, &["--tool-policy", &policy]));
    let server = TestServer::start(launch).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "show the environment").await;
    assert_eq!(result["status"], "completed", "{result}");
    let output = output_of(&server.events(&id).await, "env");
    assert!(output.contains("PATH="), "{output}");
    // `options` gives the server process its provider key in OPENAI_API_KEY.
    for hidden in [KEY_VAR, KEY_HEX, "OPENAI_API_KEY", "sk-tools-test-key"] {
        assert!(
            !output.contains(hidden),
            "the sandbox sees {hidden}: {output}"
        );
    }
}

//! The `--providers` file: the providers it names are listed by `GET /v1/providers` without
//! their keys or header values, serve requests with their own base URL, model and headers at
//! the same time (two agents on two providers, one session each, running at once), and a bad
//! file stops `tah serve` with a message naming the file and field.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tah::cli::ServeArgs;
use tah::config::Settings;
use tah::runtime::Runtime;
use tempfile::TempDir;

use super::{done, request, run, text_reply};
use crate::support::fakes::{self, Flavor, Reply};
use crate::support::{serve_expecting_exit, ServerOptions, TestServer};

const TOKEN: &str = "providers-test-token-0123456789";
const KEY_ENV: &str = "PROVIDERS_TEST_LOCAL_KEY";
const KEY: &str = "sk-providers-file-SECRET-42";
const HEADER_VALUE: &str = "org-header-SECRET-77";

/// `text` written to `name` in a fresh directory (kept as long as the directory).
fn providers_file(name: &str, text: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write the providers file");
    (dir, path)
}

/// A file naming an OpenAI-compatible fake (`local`, with a key, a header and a price) and an
/// Anthropic fake (`claude`, with a header of its own).
fn two_fakes(openai: &str, anthropic: &str, key_env: Option<&str>) -> String {
    let mut local = json!({
        "type": "openai",
        "base_url": openai,
        "headers": {"X-Org": HEADER_VALUE},
        "prices": {"gpt-test": {"input_per_mtok": 0.5, "output_per_mtok": 1.5}},
    });
    if let Some(env) = key_env {
        local["api_key_env"] = json!(env);
    }
    json!({"providers": {
        "local": local,
        "claude": {
            "type": "anthropic",
            "base_url": anthropic,
            "headers": {"anthropic-beta": "tah-test-beta"},
            "max_output_tokens": 512,
        },
    }})
    .to_string()
}

#[tokio::test]
async fn the_file_s_providers_are_listed_after_default_without_secrets() {
    let openai = fakes::start_openai(vec![]).await;
    let anthropic = fakes::start_anthropic(vec![]).await;
    let (_dir, path) = providers_file(
        "providers.json",
        &two_fakes(&openai.base_url, &anthropic.base_url, Some(KEY_ENV)),
    );
    let path = path.to_str().expect("utf-8 path");
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            // Named, as the launcher takes `--providers` for a `--provider` of its own.
            .args(&[
                "--provider",
                "mock",
                "--api-token",
                TOKEN,
                "--providers",
                path,
            ])
            .env(KEY_ENV, KEY),
    )
    .await;

    let anonymous = server
        .send(server.request(Method::GET, "/v1/providers"))
        .await;
    assert_eq!(
        anonymous.status,
        StatusCode::UNAUTHORIZED,
        "behind the token"
    );

    let reply = server
        .send(
            server
                .request(Method::GET, "/v1/providers")
                .bearer_auth(TOKEN),
        )
        .await;
    let body = reply.expect_json(StatusCode::OK, "GET /v1/providers");
    let data = body["data"].as_array().expect("data is a list");
    let names: Vec<&str> = data.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["default", "claude", "local"], "{body}");
    assert_eq!(data[0]["type"], "mock");
    assert_eq!(data[1]["type"], "anthropic");
    assert_eq!(data[1]["base_url"], anthropic.base_url.as_str());
    assert_eq!(data[2]["type"], "openai");
    assert_eq!(data[2]["base_url"], openai.base_url.as_str());
    assert_eq!(data[2]["models"], json!(["gpt-test"]));
    assert_eq!(
        data[2]["prices"],
        json!({"gpt-test": {"input_per_mtok": 0.5, "output_per_mtok": 1.5}})
    );
    let text = reply.text();
    for secret in [KEY, HEADER_VALUE, "tah-test-beta", KEY_ENV] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let log = server.log();
    for secret in [KEY, HEADER_VALUE] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
}

/// How long each fake waits before its reply: one after the other, the two calls would take
/// twice as long.
const REPLY_DELAY: Duration = Duration::from_secs(1);

/// A runtime built from `tah serve` flags, as the binary builds it.
async fn runtime(dir: &TempDir, args: &[&str]) -> Runtime {
    let database = format!("sqlite://{}", dir.path().join("tah.db").display());
    let workspace = dir.path().to_str().expect("utf-8 path");
    let argv = ["serve", "--provider", "mock", "--database-url", &database]
        .into_iter()
        .chain(["--workspace", workspace])
        .chain(args.iter().copied());
    let args = ServeArgs::try_parse_from(argv).expect("tah serve flags");
    let settings = Settings::parse(args).expect("settings");
    Runtime::build(&settings).await.expect("the runtime")
}

#[tokio::test]
async fn two_providers_serve_at_once_each_with_its_url_model_and_headers() {
    let (openai, anthropic, dir, path) = delayed_fakes().await;
    let runtime = runtime(&dir, &["--providers", path.to_str().expect("utf-8")]).await;
    let providers = runtime.sessions().deps().providers.clone();
    let model = |name: &str| providers.resolve(name).expect("a configured provider");
    let local = providers
        .client(&model("local/gpt-test"), None)
        .expect("the local client");
    let claude = providers
        .client(&model("claude/claude-test"), None)
        .expect("the claude client");

    let started = tokio::time::Instant::now();
    let (local_items, claude_items) = tokio::join!(
        run(&*local, request("hello local")),
        run(&*claude, request("hello claude")),
    );
    let took = started.elapsed();
    assert_eq!(done(&local_items).text, "from local");
    assert_eq!(done(&claude_items).text, "from claude");
    assert!(
        took < REPLY_DELAY * 19 / 10,
        "both calls were in flight at once: {took:?}"
    );

    let local_request = openai.requests().remove(0);
    let claude_request = anthropic.requests().remove(0);
    eprintln!(
        "local: POST {} model {}; claude: POST {} model {}",
        local_request.path,
        local_request.body["model"],
        claude_request.path,
        claude_request.body["model"]
    );
    assert_eq!(local_request.path, "/v1/chat/completions");
    assert_eq!(local_request.body["model"], "gpt-test");
    assert_eq!(local_request.headers["x-org"], HEADER_VALUE);
    assert!(!local_request.headers.contains_key("anthropic-beta"));
    assert_eq!(claude_request.path, "/v1/messages");
    assert_eq!(claude_request.body["model"], "claude-test");
    assert_eq!(claude_request.body["max_tokens"], 512, "its own limit");
    assert_eq!(claude_request.headers["anthropic-beta"], "tah-test-beta");
    assert!(
        !claude_request.headers.contains_key("x-org"),
        "a provider's headers go to it alone"
    );
    runtime.shutdown(Duration::from_secs(5)).await;
}

/// Two fakes that answer `local` and `claude` after [`REPLY_DELAY`], and a providers file
/// naming them (no key).
async fn delayed_fakes() -> (fakes::FakeServer, fakes::FakeServer, TempDir, PathBuf) {
    let reply = |flavor: Flavor, text: &str| {
        Reply::sse(text_reply(flavor, &[text])).with_first_delay(REPLY_DELAY)
    };
    let openai = fakes::start_openai(vec![reply(Flavor::OpenAi, "from local")]).await;
    let anthropic = fakes::start_anthropic(vec![reply(Flavor::Anthropic, "from claude")]).await;
    let (dir, path) = providers_file(
        "providers.json",
        &two_fakes(&openai.base_url, &anthropic.base_url, None),
    );
    (openai, anthropic, dir, path)
}

#[tokio::test]
async fn two_agents_on_two_providers_run_at_once() {
    let (openai, anthropic, _dir, path) = delayed_fakes().await;
    let path = path.to_str().expect("utf-8 path");
    let server =
        TestServer::start(ServerOptions::new().args(&["--provider", "mock", "--providers", path]))
            .await;
    let mut sessions = Vec::new();
    for (name, model) in [
        ("coder", "local/gpt-test"),
        ("support", "claude/claude-test"),
    ] {
        let agent = server
            .post_json("/v1/agents", &json!({"name": name, "model": model}))
            .await
            .expect_json(StatusCode::CREATED, "POST /v1/agents");
        let session = server
            .create_session_with(&json!({"agent": agent["id"]}))
            .await;
        sessions.push(session["id"].as_str().expect("a session id").to_string());
    }

    let started = tokio::time::Instant::now();
    let (coder, support) = tokio::join!(
        server.run_wait(&sessions[0], "hello coder"),
        server.run_wait(&sessions[1], "hello support"),
    );
    let took = started.elapsed();
    assert_eq!(coder["text"], "from local", "{coder}");
    assert_eq!(support["text"], "from claude", "{support}");
    assert!(
        took < REPLY_DELAY * 19 / 10,
        "both runs were in flight at once: {took:?}"
    );

    let local = openai.requests();
    let claude = anthropic.requests();
    assert_eq!((local.len(), claude.len()), (1, 1), "one call each");
    eprintln!(
        "coder: POST {} model {}; support: POST {} model {}",
        local[0].path, local[0].body["model"], claude[0].path, claude[0].body["model"]
    );
    assert_eq!(local[0].path, "/v1/chat/completions");
    assert_eq!(local[0].body["model"], "gpt-test");
    assert_eq!(local[0].headers["x-org"], HEADER_VALUE);
    assert_eq!(claude[0].path, "/v1/messages");
    assert_eq!(claude[0].body["model"], "claude-test");
    assert_eq!(claude[0].headers["anthropic-beta"], "tah-test-beta");
}

#[test]
fn a_bad_file_stops_tah_serve_naming_the_file_and_the_field() {
    let provider = |fields: Value| json!({"providers": {"gw": fields}}).to_string();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "providers.json",
            json!({"providers": {"default": {"type": "mock"}}}).to_string(),
            "providers.default: ",
        ),
        (
            "providers.json",
            provider(json!({"type": "openai", "api_key_env": KEY_ENV})),
            "providers.gw.api_key_env: the environment variable PROVIDERS_TEST_LOCAL_KEY is not set",
        ),
        (
            "providers.json",
            provider(json!({"type": "openai", "headers": {"x-org": format!("{HEADER_VALUE}\n")}})),
            "providers.gw.headers.x-org: ",
        ),
        (
            "providers.json",
            provider(json!({"type": "openai", "api_key": KEY})),
            "providers.gw.api_key: ",
        ),
        (
            "providers.toml",
            "[providers.gw]\ntype = \"openai\"\nbase_url = \"ftp://h\"\n".to_string(),
            "providers.gw.base_url: ",
        ),
        (
            "providers.toml",
            "[providers.gw]\ntype = \"openai\"\n[providers.gw.prices.m]\n\
             input_per_mtok = -1\noutput_per_mtok = 1\n"
                .to_string(),
            "providers.gw.prices.m.input_per_mtok: ",
        ),
    ];
    for (name, text, says) in cases {
        let (_dir, path) = providers_file(name, &text);
        let path = path.to_str().expect("utf-8 path");
        let (status, log) = serve_expecting_exit(&["--providers", path], &[]);
        assert!(!status.success(), "{text} started: {log}");
        assert!(
            log.contains(&format!("--providers {path}: {says}")),
            "{text}: {says:?} not in {log}"
        );
        for secret in [KEY, HEADER_VALUE] {
            assert!(!log.contains(secret), "{secret} in {log}");
        }
    }
    let (status, log) = serve_expecting_exit(&[], &[("TAH_PROVIDERS", "/nonexistent/p.json")]);
    assert!(!status.success(), "started without its providers file");
    assert!(
        log.contains("--providers /nonexistent/p.json: "),
        "the file is named: {log}"
    );
}

//! Several providers at once: a providers file (JSON, or TOML by its extension) names a fake
//! OpenAI-compatible server and a fake Anthropic one, each with its own key (from an
//! environment variable) and header; an agent on each; two sessions running turns at the same
//! time. Each fake receives only its own requests, on its own path, with its own model, key
//! and header; `GET /v1/providers` lists the providers, default first, and never a key or a
//! header's value. A bad providers file stops the server from starting, naming the file and
//! what is wrong in it.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tempfile::TempDir;

use super::*;
use crate::support::fakes::{self, FakeServer, Recorded, Reply as FakeReply};

const OPENAI_KEY: &str = "sk-oai-secret-4711";
const ANTHROPIC_KEY: &str = "sk-ant-secret-0815";
const OPENAI_HEADER: &str = "team-alpha-7";
const ANTHROPIC_HEADER: &str = "team-beta-9";
const OPENAI_MODEL: &str = "gpt-fake-1";
const ANTHROPIC_MODEL: &str = "claude-fake-1";

/// The file's format.
#[derive(Clone, Copy)]
enum Format {
    Json,
    Toml,
}

/// A providers file `oai` (openai) and `ant` (anthropic) on the two fakes, in a directory
/// that lives as long as the returned guard.
fn providers_file(
    format: Format,
    openai: &FakeServer,
    anthropic: &FakeServer,
) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (name, text) = match format {
        Format::Json => (
            "providers.json",
            json!({"providers": {
                "oai": {
                    "type": "openai",
                    "base_url": openai.base_url,
                    "api_key_env": "FAKE_OAI_KEY",
                    "headers": {"x-team": OPENAI_HEADER},
                    "prices": {OPENAI_MODEL: {"input_per_mtok": 1.5, "output_per_mtok": 6.0}},
                },
                "ant": {
                    "type": "anthropic",
                    "base_url": anthropic.base_url,
                    "api_key_env": "FAKE_ANT_KEY",
                    "headers": {"x-team": ANTHROPIC_HEADER},
                },
            }})
            .to_string(),
        ),
        Format::Toml => (
            "providers.toml",
            format!(
                "# Two providers.\n\
                 [providers.oai]\n\
                 type = \"openai\"\n\
                 base_url = \"{}\"\n\
                 api_key_env = \"FAKE_OAI_KEY\"\n\
                 headers = {{ \"x-team\" = \"{OPENAI_HEADER}\" }}\n\
                 \n\
                 [providers.oai.prices.\"{OPENAI_MODEL}\"]\n\
                 input_per_mtok = 1.5\n\
                 output_per_mtok = 6.0\n\
                 \n\
                 [providers.ant]\n\
                 type = \"anthropic\"\n\
                 base_url = \"{}\"\n\
                 api_key_env = \"FAKE_ANT_KEY\"\n\
                 headers = {{ \"x-team\" = \"{ANTHROPIC_HEADER}\" }}\n",
                openai.base_url, anthropic.base_url
            ),
        ),
    };
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write the providers file");
    (dir, path)
}

/// The fakes (their replies held back by `delay`), a server process on the providers file in
/// `format` (the keys in its environment), and an agent on each provider: `(openai agent,
/// anthropic agent)`.
struct TwoProviders {
    openai: FakeServer,
    anthropic: FakeServer,
    server: TestServer,
    openai_agent: String,
    anthropic_agent: String,
    _dir: TempDir,
}

async fn two_providers(format: Format, delay: Duration) -> TwoProviders {
    let openai = fakes::start_openai(vec![FakeReply::sse(fakes::openai::text_reply(&[
        "hello ", "from oai",
    ]))
    .with_first_delay(delay)])
    .await;
    let anthropic = fakes::start_anthropic(vec![FakeReply::sse(fakes::anthropic::text_reply(&[
        "hello ", "from ant",
    ]))
    .with_first_delay(delay)])
    .await;
    let (dir, path) = providers_file(format, &openai, &anthropic);
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            .args(&["--providers", &path.display().to_string()])
            .env("FAKE_OAI_KEY", OPENAI_KEY)
            .env("FAKE_ANT_KEY", ANTHROPIC_KEY),
    )
    .await;
    let openai_agent = create_agent(
        &server,
        &json!({"name": "on oai", "model": format!("oai/{OPENAI_MODEL}"),
                "system_prompt": "You run on oai.", "tools": ["list_files"]}),
    )
    .await;
    assert_eq!(openai_agent["provider"], "oai", "{openai_agent}");
    let anthropic_agent = create_agent(
        &server,
        &json!({"name": "on ant", "model": format!("ant/{ANTHROPIC_MODEL}"),
                "system_prompt": "You run on ant.", "tools": ["list_files"]}),
    )
    .await;
    assert_eq!(anthropic_agent["provider"], "ant", "{anthropic_agent}");
    TwoProviders {
        openai,
        anthropic,
        server,
        openai_agent: id_of(&openai_agent),
        anthropic_agent: id_of(&anthropic_agent),
        _dir: dir,
    }
}

/// Asserts that every request a fake received went to `path` with `model`, the key and the
/// configured header; returns how many there were.
#[track_caller]
fn assert_requests(
    requests: &[Recorded],
    path: &str,
    model: &str,
    key: (&str, &str),
    team: &str,
    prompt: &str,
) -> usize {
    assert!(
        !requests.is_empty(),
        "the fake for {model} received nothing"
    );
    for request in requests {
        assert_eq!(request.path, path, "{request:?}");
        assert_eq!(request.body["model"], model, "{request:?}");
        assert_eq!(
            request.headers.get(key.0).map(String::as_str),
            Some(key.1),
            "the key header {}: {request:?}",
            key.0
        );
        assert_eq!(
            request.headers.get("x-team").map(String::as_str),
            Some(team),
            "{request:?}"
        );
        assert!(
            request.body.to_string().contains(prompt),
            "the request does not carry its agent's prompt {prompt:?}: {request:?}"
        );
    }
    requests.len()
}

/// The final answer of a session's last run.
async fn last_answer(server: &TestServer, id: &str) -> Value {
    let messages = server.messages(id).await;
    messages
        .last()
        .map(|m| m["content"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn two_sessions_on_two_providers_run_at_once_each_on_its_own_endpoint() {
    let two = two_providers(Format::Json, Duration::from_millis(1500)).await;
    let server = &two.server;
    let on_openai = id_of(&session_on(server, json!({"agent": two.openai_agent})).await);
    let on_anthropic = id_of(&session_on(server, json!({"agent": two.anthropic_agent})).await);
    let openai_run = id_of(&server.start_run(&on_openai, "hi oai").await);
    let anthropic_run = id_of(&server.start_run(&on_anthropic, "hi ant").await);

    // Both fakes hold a request while both runs are still running: they run at the same time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while two.openai.request_count() == 0 || two.anthropic.request_count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fakes got {} and {} requests",
            two.openai.request_count(),
            two.anthropic.request_count()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (session, run) in [(&on_openai, &openai_run), (&on_anthropic, &anthropic_run)] {
        let now = server
            .get_ok(&format!("/v1/sessions/{session}/runs/{run}"))
            .await;
        assert_eq!(now["status"], "running", "the runs did not overlap: {now}");
    }
    for (session, run) in [(&on_openai, &openai_run), (&on_anthropic, &anthropic_run)] {
        let ended = server.wait_run(session, run).await;
        assert_eq!(ended["status"], "completed", "{ended}");
    }
    assert_eq!(last_answer(server, &on_openai).await, "hello from oai");
    assert_eq!(last_answer(server, &on_anthropic).await, "hello from ant");

    let openai_paths = assert_requests(
        &two.openai.requests(),
        "/v1/chat/completions",
        OPENAI_MODEL,
        ("authorization", &format!("Bearer {OPENAI_KEY}")),
        OPENAI_HEADER,
        "You run on oai.",
    );
    let anthropic_paths = assert_requests(
        &two.anthropic.requests(),
        "/v1/messages",
        ANTHROPIC_MODEL,
        ("x-api-key", ANTHROPIC_KEY),
        ANTHROPIC_HEADER,
        "You run on ant.",
    );
    eprintln!(
        "requests seen: oai {openai_paths} × POST /v1/chat/completions (model {OPENAI_MODEL}), \
         ant {anthropic_paths} × POST /v1/messages (model {ANTHROPIC_MODEL})"
    );

    // What the sessions and their steps record.
    for (session, agent, provider, model) in [
        (&on_openai, &two.openai_agent, "oai", OPENAI_MODEL),
        (&on_anthropic, &two.anthropic_agent, "ant", ANTHROPIC_MODEL),
    ] {
        let events = server.events(session).await;
        assert_eq!(
            events[0]["data"]["model"],
            format!("{provider}/{model}"),
            "{}",
            events[0]
        );
        let views = server.llm_step_views(session).await;
        assert_eq!(views.len(), 1, "{views:?}");
        let projection = &views[0]["projection"];
        assert_eq!(projection["agent"]["id"], agent.as_str(), "{projection}");
        assert_eq!(projection["provider"], provider, "{projection}");
        assert_eq!(projection["model"], model, "{projection}");
    }

    // The providers, default first, without a key or a header's value.
    let reply = server.get("/v1/providers").await;
    let providers = reply.expect_json(StatusCode::OK, "GET /v1/providers");
    let listed = providers["data"].as_array().expect("data");
    let names: Vec<&str> = listed.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names.len(), 3, "{providers}");
    assert_eq!(names[0], "default", "{providers}");
    assert_eq!(listed[0]["type"], "mock", "{providers}");
    for (name, kind, base_url) in [
        ("oai", "openai", &two.openai.base_url),
        ("ant", "anthropic", &two.anthropic.base_url),
    ] {
        let provider = listed
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed: {providers}"));
        assert_eq!(provider["type"], kind, "{provider}");
        assert_eq!(provider["base_url"], base_url.as_str(), "{provider}");
    }
    let text = reply.text();
    for secret in [OPENAI_KEY, ANTHROPIC_KEY, OPENAI_HEADER, ANTHROPIC_HEADER] {
        assert!(
            !text.contains(secret),
            "GET /v1/providers shows {secret}: {text}"
        );
    }
    assert!(
        !server.log().contains(OPENAI_KEY) && !server.log().contains(ANTHROPIC_KEY),
        "a key is in the server's log"
    );
}

#[tokio::test]
async fn a_toml_providers_file_serves_the_same() {
    let two = two_providers(Format::Toml, Duration::ZERO).await;
    let server = &two.server;
    for (agent, answer) in [
        (&two.openai_agent, "hello from oai"),
        (&two.anthropic_agent, "hello from ant"),
    ] {
        let session = id_of(&session_on(server, json!({"agent": agent})).await);
        let result = server.run_wait(&session, "hi").await;
        assert_eq!(result["status"], "completed", "{result}");
        assert_eq!(last_answer(server, &session).await, answer);
    }
    assert_requests(
        &two.openai.requests(),
        "/v1/chat/completions",
        OPENAI_MODEL,
        ("authorization", &format!("Bearer {OPENAI_KEY}")),
        OPENAI_HEADER,
        "You run on oai.",
    );
    assert_requests(
        &two.anthropic.requests(),
        "/v1/messages",
        ANTHROPIC_MODEL,
        ("x-api-key", ANTHROPIC_KEY),
        ANTHROPIC_HEADER,
        "You run on ant.",
    );
    let providers = server.get_ok("/v1/providers").await;
    let oai = providers["data"]
        .as_array()
        .and_then(|d| d.iter().find(|p| p["name"] == "oai"))
        .cloned()
        .unwrap_or_else(|| panic!("no oai: {providers}"));
    assert!(
        oai.to_string().contains(OPENAI_MODEL),
        "the priced model is not shown: {oai}"
    );
}

#[tokio::test]
async fn the_default_provider_is_the_flags_one_and_listed_first() {
    let model =
        fakes::start_openai(vec![FakeReply::sse(fakes::openai::text_reply(&["flags"]))]).await;
    let server = TestServer::start(
        ServerOptions::new()
            .args(&["--provider", "openai", "--base-url", &model.base_url])
            .args(&["--model", "flag-model"]),
    )
    .await;
    let providers = server.get_ok("/v1/providers").await;
    assert_eq!(providers["data"][0]["name"], "default", "{providers}");
    assert_eq!(providers["data"][0]["type"], "openai", "{providers}");
    assert_eq!(
        providers["data"][0]["base_url"],
        model.base_url.as_str(),
        "{providers}"
    );
    let default = server.get_ok("/v1/agents/default").await;
    assert_eq!(default["model"], "default/flag-model", "{default}");
    // A bare model name is the default provider's.
    let agent = create_agent(&server, &json!({"name": "bare", "model": "other-model"})).await;
    assert_eq!(agent["provider"], "default", "{agent}");
    let session = id_of(&session_on(&server, json!({"agent": id_of(&agent)})).await);
    let result = server.run_wait(&session, "hi").await;
    assert_eq!(result["status"], "completed", "{result}");
    let requests = model.requests();
    assert_eq!(
        requests.last().map(|r| &r.body["model"]),
        Some(&json!("other-model"))
    );
}

/// What `providers::file` does not try: an unknown type or field, a file that does not parse
/// or does not exist (an entry named `default`, a missing key variable and `TAH_PROVIDERS`
/// are tried there).
#[test]
fn a_bad_providers_file_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "an unknown type",
            write(
                "type.json",
                r#"{"providers": {"gem": {"type": "gemini-pro-max"}}}"#,
            ),
            vec!["gemini-pro-max", "type"],
        ),
        (
            "an unknown field",
            write(
                "field.json",
                r#"{"providers": {"p": {"type": "mock", "colour": "red"}}}"#,
            ),
            vec!["colour"],
        ),
        (
            "malformed JSON",
            write("broken.json", r#"{"providers": {"#),
            vec![],
        ),
        (
            "malformed TOML",
            write("broken.toml", "[providers.p\ntype = \"mock\"\n"),
            vec![],
        ),
        (
            "a file that does not exist",
            dir.path().join("absent.json").display().to_string(),
            vec![],
        ),
    ];
    for (what, path, names) in &cases {
        let (status, stderr) = serve_expecting_exit(&["--providers", path], &[]);
        assert!(
            !status.success(),
            "{what}: tah started ({status}): {stderr}"
        );
        let file = std::path::Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert!(
            stderr.contains(file),
            "{what}: the message does not name the file {file}: {stderr}"
        );
        for name in names {
            assert!(
                stderr.contains(name),
                "{what}: the message does not name {name}: {stderr}"
            );
        }
    }
}

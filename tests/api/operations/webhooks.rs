//! Webhooks (`--webhook-url`, `--webhook-secret-env`): deliveries of the events that end a run
//! or wait for someone, signed per the Standard Webhooks spec and checked here with the spec's
//! scheme by a receiver of the test's own; retried with the same `webhook-id` after a 500;
//! delivered after a kill -9 of the server; refused at start without a usable secret.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::support::*;

/// The secret as an operator gives it: `whsec_` and the base64 of 32 bytes.
const SECRET: &str = "whsec_dGFoIHdlYmhvb2sgdGVzdCBzZWNyZXQgMDEyMzQ1Njc=";
const SECRET_ENV: &str = "TAH_TEST_WEBHOOK_SECRET";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hit {
    id: String,
    timestamp: String,
    signature: String,
    content_type: String,
    body: String,
    /// What the receiver answered.
    status: u16,
}

impl Hit {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

#[derive(Default)]
struct ReceiverState {
    hits: Vec<Hit>,
    /// Statuses to answer, in order; 200 once they are used up (unless `refusing`).
    script: VecDeque<u16>,
    /// Answer 500 to everything.
    refusing: bool,
}

/// A webhook endpoint on 127.0.0.1.
struct Receiver {
    url: String,
    state: Arc<Mutex<ReceiverState>>,
}

impl Receiver {
    async fn start(script: &[u16]) -> Receiver {
        let state = Arc::new(Mutex::new(ReceiverState {
            script: script.iter().copied().collect(),
            ..ReceiverState::default()
        }));
        let shared = state.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let state = shared.clone();
                async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    let mut state = state.lock().unwrap();
                    let status = if state.refusing {
                        500
                    } else {
                        state.script.pop_front().unwrap_or(200)
                    };
                    state.hits.push(Hit {
                        id: header("webhook-id"),
                        timestamp: header("webhook-timestamp"),
                        signature: header("webhook-signature"),
                        content_type: header("content-type"),
                        body,
                        status,
                    });
                    AxumStatus::from_u16(status).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, state }
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    fn refuse(&self, refusing: bool) {
        self.state.lock().unwrap().refusing = refusing;
    }

    /// Waits until the receiver got what `done` looks for.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Hit]) -> bool) -> Vec<Hit> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let hits = self.hits();
            if done(&hits) {
                return hits;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within 30 s; the receiver got {hits:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Checks a request as the Standard Webhooks spec tells a receiver to: the signature over
/// `{id}.{timestamp}.{body}` with the secret's bytes, among the space-separated `v1,`
/// signatures of the header, and a timestamp within five minutes.
fn verify(secret: &str, hit: &Hit) -> Result<(), String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let timestamp: i64 = hit
        .timestamp
        .parse()
        .map_err(|_| format!("webhook-timestamp {:?}", hit.timestamp))?;
    let now = chrono::Utc::now().timestamp();
    if (now - timestamp).abs() > 300 {
        return Err(format!(
            "timestamp {timestamp} is not within 5 minutes of {now}"
        ));
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", hit.id, hit.timestamp, hit.body).as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let matches = hit
        .signature
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|s| s == expected);
    if matches {
        Ok(())
    } else {
        Err(format!(
            "signature {:?} is not v1,{expected}",
            hit.signature
        ))
    }
}

fn options(receiver: &Receiver) -> ServerOptions {
    ServerOptions::new()
        .process()
        .args(&["--webhook-url", &receiver.url])
        .args(&["--webhook-secret-env", SECRET_ENV])
        .env(SECRET_ENV, SECRET)
}

fn of_type<'a>(hits: &'a [Hit], kind: &str) -> Vec<&'a Hit> {
    hits.iter().filter(|h| h.json()["type"] == kind).collect()
}

#[tokio::test]
async fn a_finished_run_is_delivered_signed_with_the_whole_event() {
    let receiver = Receiver::start(&[]).await;
    let server = TestServer::start(options(&receiver)).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello hooks").await;
    assert_eq!(result["status"], "completed", "{result}");

    let hits = receiver
        .wait_for("agent.finished", |h| {
            !of_type(h, "agent.finished").is_empty()
        })
        .await;
    let hit = of_type(&hits, "agent.finished")[0].clone();
    verify(SECRET, &hit).unwrap_or_else(|e| panic!("{e}: {hit:#?}"));
    // The scheme is checked for real: another body or another secret does not verify.
    let tampered = Hit {
        body: hit.body.replace("hello", "HELLO"),
        ..hit.clone()
    };
    assert!(verify(SECRET, &tampered).is_err());
    assert!(verify("whsec_b3RoZXIgc2VjcmV0IG9mIDI0IGJ5dGVzISE=", &hit).is_err());
    assert!(hit.content_type.starts_with("application/json"), "{hit:?}");

    let body = hit.json();
    let log = server.events(&id).await;
    let event = log
        .iter()
        .find(|e| e["type"] == "agent.finished")
        .expect("agent.finished in the log");
    assert_eq!(body["data"], *event, "the whole event in data");
    assert_eq!(body["type"], "agent.finished");
    assert_eq!(body["timestamp"], event["created_at"]);
    assert_eq!(hit.id, format!("{id}:{}", event["seq"]));
    // Nothing else of the turn is delivered.
    assert!(hits.iter().all(|h| {
        let kind = h.json()["type"].as_str().unwrap_or_default().to_string();
        ["agent.finished", "agent.failed", "agent.cancelled"].contains(&kind.as_str())
    }));
    assert_eq!(
        server
            .query_i64(
                "SELECT COUNT(*) FROM webhook_deliveries \
                 WHERE status = 'delivered' AND attempts = 1 AND delivered_at IS NOT NULL"
            )
            .await,
        1,
        "the delivery log"
    );
}

#[tokio::test]
async fn an_approval_and_a_cancel_are_delivered() {
    let receiver = Receiver::start(&[]).await;
    let server = TestServer::start(options(&receiver)).await;
    let id = server.create_session().await;
    server.start_run(&id, "write a note for the hooks").await;
    server
        .poll_session(&id, "waiting_tool", Duration::from_secs(20), |s| {
            s["state"] == "waiting_tool"
        })
        .await;
    let hits = receiver
        .wait_for("tool.approval-requested", |h| {
            !of_type(h, "tool.approval-requested").is_empty()
        })
        .await;
    let hit = of_type(&hits, "tool.approval-requested")[0].clone();
    verify(SECRET, &hit).unwrap_or_else(|e| panic!("{e}: {hit:#?}"));
    assert_eq!(hit.json()["data"]["session_id"], id.as_str());
    assert_eq!(
        hit.json()["data"]["data"]["tool"],
        "write_file",
        "{}",
        hit.body
    );

    server.cancel(&id).await;
    let hits = receiver
        .wait_for("agent.cancelled", |h| {
            !of_type(h, "agent.cancelled").is_empty()
        })
        .await;
    let hit = of_type(&hits, "agent.cancelled")[0].clone();
    verify(SECRET, &hit).unwrap_or_else(|e| panic!("{e}: {hit:#?}"));
    assert_eq!(hit.json()["data"]["session_id"], id.as_str());
}

#[tokio::test]
async fn a_500_is_retried_with_the_same_webhook_id() {
    let receiver = Receiver::start(&[500]).await;
    let server = TestServer::start(options(&receiver)).await;
    let id = server.create_session().await;
    server.run_wait(&id, "retry me").await;

    let hits = receiver
        .wait_for("a retry accepted", |h| h.iter().any(|h| h.status == 200))
        .await;
    assert_eq!(hits.len(), 2, "one 500, then one 200: {hits:#?}");
    assert_eq!(hits[0].status, 500);
    assert_eq!(hits[1].status, 200);
    assert_eq!(hits[0].id, hits[1].id, "the same webhook-id on the retry");
    assert_eq!(hits[0].body, hits[1].body, "the same body on the retry");
    for hit in &hits {
        verify(SECRET, hit).unwrap_or_else(|e| panic!("{e}: {hit:#?}"));
    }
    // Nothing more comes once it was accepted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.hits().len(), 2, "{:#?}", receiver.hits());
    assert_eq!(
        server
            .query_i64(
                "SELECT COUNT(*) FROM webhook_deliveries \
                 WHERE status = 'delivered' AND attempts = 2 AND last_error IS NULL"
            )
            .await,
        1,
        "the delivery log"
    );
}

#[tokio::test]
async fn a_delivery_survives_a_kill_9() {
    let receiver = Receiver::start(&[]).await;
    receiver.refuse(true);
    let mut server = TestServer::start(options(&receiver)).await;
    let id = server.create_session().await;
    server.run_wait(&id, "survive").await;
    let failed = receiver
        .wait_for("a refused attempt", |h| !h.is_empty())
        .await;
    assert_eq!(failed[0].status, 500);

    server.kill9().await;
    receiver.refuse(false);
    server.restart().await;

    let hits = receiver
        .wait_for("the delivery after the restart", |h| {
            h.iter().any(|h| h.status == 200)
        })
        .await;
    let accepted = hits.iter().find(|h| h.status == 200).unwrap();
    assert_eq!(accepted.id, failed[0].id, "{hits:#?}");
    verify(SECRET, accepted).unwrap_or_else(|e| panic!("{e}: {accepted:#?}"));
    assert_eq!(accepted.json()["type"], "agent.finished");
    assert_eq!(accepted.json()["data"]["session_id"], id.as_str());
    // Delivered once accepted: no second success.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let successes = receiver.hits().iter().filter(|h| h.status == 200).count();
    assert_eq!(successes, 1, "{:#?}", receiver.hits());
}

#[tokio::test]
async fn a_server_started_without_webhooks_queues_nothing() {
    let receiver = Receiver::start(&[]).await;
    let mut server = TestServer::start(options(&receiver)).await;
    let id = server.create_session().await;
    server.run_wait(&id, "hooked").await;
    receiver
        .wait_for("the first delivery", |h| !h.is_empty())
        .await;

    server.restart_with(ServerOptions::new()).await;
    server.run_wait(&id, "not hooked").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(receiver.hits().len(), 1, "{:#?}", receiver.hits());
    let queued = "SELECT COUNT(*) FROM webhook_deliveries";
    assert_eq!(
        server.query_i64(queued).await,
        1,
        "nothing queued without a URL"
    );

    // Configured again, later events are delivered again.
    server.restart_with(options(&receiver)).await;
    server.run_wait(&id, "hooked again").await;
    receiver
        .wait_for("the delivery after the restart", |h| h.len() == 2)
        .await;
    assert_eq!(server.query_i64(queued).await, 2);
}

#[tokio::test]
async fn replicas_deliver_each_event_once() {
    if !is_postgres() {
        return; // Replicas share a PostgreSQL database only.
    }
    let receiver = Receiver::start(&[]).await;
    let one = TestServer::start(options(&receiver)).await;
    let two = TestServer::start(options(&receiver).database_url(one.database_url())).await;
    // One turn after another, on each replica in turn: both dispatchers poll the queue for
    // every delivery.
    let mut ids = Vec::new();
    for n in 0..8 {
        let replica = if n % 2 == 0 { &one } else { &two };
        let id = replica.create_session().await;
        replica.run_wait(&id, "one of many").await;
        ids.push(id);
    }
    receiver
        .wait_for("eight deliveries", |h| h.len() >= ids.len())
        .await;
    // Both replicas poll the same queue; a claim keeps the other off a row.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hits = receiver.hits();
    let mut delivered: Vec<String> = hits.iter().map(|h| h.id.clone()).collect();
    delivered.sort();
    let mut expected = Vec::new();
    for id in &ids {
        let log = one.events(id).await;
        let end = log.iter().find(|e| e["type"] == "agent.finished").unwrap();
        expected.push(format!("{id}:{}", end["seq"]));
    }
    expected.sort();
    assert_eq!(delivered, expected, "each event once: {hits:#?}");
}

/// A webhook URL may carry credentials in its user info, its path and its query: a failed
/// delivery's log line names the host and port, never them.
#[tokio::test]
async fn a_failed_delivery_logs_the_host_and_not_the_credentials_of_its_url() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = closed.local_addr().unwrap().to_string();
    drop(closed);
    let secrets = [
        "hook-user",
        "hunter2-password",
        "path-s3cr3t",
        "query-t0k3n",
    ];
    let url = format!(
        "http://{}:{}@{host}/services/{}/hook?token={}",
        secrets[0], secrets[1], secrets[2], secrets[3]
    );
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            .args(&["--webhook-url", &url])
            .args(&["--webhook-secret-env", SECRET_ENV])
            .env(SECRET_ENV, SECRET),
    )
    .await;
    let id = server.create_session().await;
    server.run_wait(&id, "nobody listens").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let lines = server.log_lines("webhook delivery failed");
        if lines.len() >= 2 {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "no two failed attempts logged within 30 s: {}",
            server.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("a failed delivery's log line: {}", failed[0]);
    assert!(
        failed.iter().all(|line| line.contains(&host)),
        "the host and port are named: {failed:#?}"
    );
    let log = server.log();
    for secret in secrets {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

#[test]
fn a_webhook_url_without_a_usable_secret_is_refused_at_start() {
    let url = ["--webhook-url", "http://127.0.0.1:9/hook"];
    let with_env = |name: &'static str| [url[0], url[1], "--webhook-secret-env", name];
    for (args, env, says) in [
        (url.to_vec(), vec![], "--webhook-secret-env"),
        (
            with_env("TAH_TEST_NO_SUCH_SECRET").to_vec(),
            vec![],
            "is not set",
        ),
        (
            with_env(SECRET_ENV).to_vec(),
            vec![(SECRET_ENV, "whsec_c2hvcnQ=")],
            "shorter than 16 bytes",
        ),
        (
            with_env(SECRET_ENV).to_vec(),
            vec![(SECRET_ENV, "whsec_***")],
            "base64",
        ),
        (
            vec!["--webhook-url", "ftp://example.com/hook"],
            vec![],
            "not an http or https URL",
        ),
    ] {
        let (status, log) = serve_expecting_exit(&args, &env);
        assert!(!status.success(), "{args:?} started: {log}");
        assert!(log.contains(says), "{args:?}: {says:?} not in {log}");
        assert!(!log.contains("c2hvcnQ"), "the secret is not logged: {log}");
    }
}

#[tokio::test]
async fn a_secret_from_a_vault_signs_the_deliveries() {
    use crate::vaults::{KEY_HEX, KEY_VAR};
    let reference = "${vault:hooks/signing}";
    let receiver = Receiver::start(&[]).await;
    let hooks = [
        "--webhook-url",
        receiver.url.as_str(),
        "--webhook-secret-env",
        SECRET_ENV,
    ];
    // The referenced secret does not exist yet: the start fails, naming the reference.
    let (status, log) = serve_expecting_exit(
        &[&["--master-key-env", KEY_VAR][..], &hooks[..]].concat(),
        &[(KEY_VAR, KEY_HEX), (SECRET_ENV, reference)],
    );
    assert!(!status.success());
    assert!(log.contains(reference), "{log}");

    let vaults = ServerOptions::new()
        .process()
        .env(KEY_VAR, KEY_HEX)
        .env(SECRET_ENV, reference)
        .args(&["--master-key-env", KEY_VAR]);
    let mut server = TestServer::start(vaults.clone()).await;
    server
        .call(
            reqwest::Method::PUT,
            "/v1/vaults/hooks/secrets/signing",
            Some(&json!({ "value": SECRET })),
        )
        .await
        .expect("PUT")
        .expect_json(reqwest::StatusCode::OK, "the signing secret");
    server.restart_with(vaults.args(&hooks)).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello hooks").await;
    assert_eq!(result["status"], "completed", "{result}");
    let hits = receiver
        .wait_for("agent.finished", |h| {
            !of_type(h, "agent.finished").is_empty()
        })
        .await;
    let hit = of_type(&hits, "agent.finished")[0].clone();
    verify(SECRET, &hit).unwrap_or_else(|e| panic!("{e}: {hit:#?}"));
    assert!(!server.log().contains(SECRET), "the log shows the secret");
}

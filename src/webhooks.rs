//! Webhooks (SPEC §14): `agent.finished`, `agent.failed`, `agent.cancelled`,
//! `tool.approval-requested` and `tool.client-requested` are POSTed to every `--webhook-url`,
//! signed per the Standard Webhooks spec, at least once.
//!
//! Nothing here decides what is delivered: a trigger of the database (created at start only
//! when URLs are configured) queues a delivery row for each such event and each configured
//! URL in the very transaction that commits the event
//! (`migrations/*/0007_webhooks.sql`, `store::webhooks`), so a delivery cannot be lost between
//! the commit and the dispatcher, whatever kills the process. The dispatcher claims due rows
//! (on PostgreSQL with `FOR UPDATE SKIP LOCKED` and a claim that lapses, so one replica
//! delivers each), POSTs them, and records the outcome: delivered on a 2xx, else tried again
//! after 1 s, 2 s, 4 s… (at most an hour apart) until 24 hours after the event, then marked
//! failed. The rows are the delivery log.
//!
//! A delivery is `{type, timestamp, data}` with the whole event (as the event routes show it)
//! in `data`, and the headers `webhook-id` (`<session_id>:<seq>`, the same on every retry),
//! `webhook-timestamp` (Unix seconds of the attempt) and `webhook-signature`
//! (`v1,<base64 of HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::llm::guard::shown_url;
use crate::store::webhooks::{Claim, Delivery, FailedAttempt};
use crate::store::{Store, StoreResult};

/// The event types that are delivered.
pub const EVENT_TYPES: [&str; 5] = [
    "agent.finished",
    "agent.failed",
    "agent.cancelled",
    "tool.approval-requested",
    "tool.client-requested",
];

/// How often the queue is looked at when nothing was due.
const POLL: Duration = Duration::from_millis(200);
/// Deliveries claimed at once, and attempted concurrently.
const BATCH: i64 = 16;
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim holds a row: longer than an attempt can take.
const CLAIM_MS: i64 = 30_000;
/// The first retry's delay; each later one doubles, up to `MAX_DELAY_MS`.
const FIRST_DELAY_MS: i64 = 1_000;
const MAX_DELAY_MS: i64 = 3_600_000;
/// Retries stop this long after the event.
const RETRY_FOR_MS: i64 = 24 * 3_600_000;
/// How long the delivery log keeps a delivery made or given up, and how often it is pruned.
const KEEP_MS: i64 = 7 * 24 * 3_600_000;
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The signing secret: the bytes of a Standard Webhooks `whsec_<base64>` secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    /// Reads `whsec_<base64>` (the prefix may be left out). The spec asks for 24 to 64 bytes;
    /// fewer than 16 is refused as too weak.
    pub fn parse(text: &str) -> Result<WebhookSecret, &'static str> {
        let encoded = text.trim();
        let encoded = encoded.strip_prefix("whsec_").unwrap_or(encoded);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| "it is not whsec_ followed by base64")?;
        if bytes.len() < 16 {
            return Err("it is shorter than 16 bytes (24 to 64 are recommended)");
        }
        Ok(WebhookSecret(bytes))
    }

    /// `v1,<base64 signature>` of a message, as the `webhook-signature` header carries it.
    pub fn sign(&self, id: &str, timestamp: i64, body: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body.as_bytes());
        let signature = mac.finalize().into_bytes();
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(signature)
        )
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// Where deliveries go and how they are signed.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub urls: Vec<String>,
    pub secret: SigningSecret,
}

/// The signing secret as configured: the secret itself, or a vault reference
/// (`${vault:VAULT/NAME}`, of the tenant `default`) to a `whsec_<base64>` secret, resolved once
/// the store is open.
#[derive(Debug, Clone)]
pub enum SigningSecret {
    Value(WebhookSecret),
    Vault(String),
}

/// Records the configured URLs (none: later events are not queued, and deliveries still
/// pending to URLs no longer configured are marked failed). `single_node`: this process is
/// the store's only user, so claims left by a process that died are freed at once.
pub async fn prepare(
    store: &dyn Store,
    settings: Option<&WebhookSettings>,
    single_node: bool,
) -> StoreResult<()> {
    let Some(queue) = store.webhooks() else {
        return Ok(());
    };
    let urls = settings.map(|s| s.urls.as_slice()).unwrap_or_default();
    queue.set_endpoints(urls, now_ms()).await?;
    if single_node {
        queue.release_claims().await?;
    }
    Ok(())
}

/// Starts the dispatcher; it stops when `shutdown` is cancelled.
pub fn start(
    store: Arc<dyn Store>,
    settings: &WebhookSettings,
    secret: WebhookSecret,
    claim: String,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(ATTEMPT_TIMEOUT)
        .user_agent(concat!("tah-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("an HTTP client without custom TLS settings builds");
    let dispatcher = Arc::new(Dispatcher {
        store,
        secret,
        client,
        claim,
    });
    tracing::info!(urls = settings.urls.len(), "webhooks on");
    tokio::spawn(async move {
        let mut failing = false;
        let mut pruned = tokio::time::Instant::now();
        dispatcher.prune().await;
        while !shutdown.is_cancelled() {
            if pruned.elapsed() >= PRUNE_EVERY {
                pruned = tokio::time::Instant::now();
                dispatcher.prune().await;
            }
            let claimed = tokio::select! {
                _ = shutdown.cancelled() => break,
                claimed = dispatcher.claim() => claimed,
            };
            match claimed {
                Ok(batch) if !batch.is_empty() => {
                    failing = false;
                    let run = futures::stream::iter(batch)
                        .for_each_concurrent(None, |delivery| dispatcher.attempt(delivery));
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        () = run => {}
                    }
                    continue;
                }
                Ok(_) => failing = false,
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "cannot read the webhook queue");
                    }
                    failing = true;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    })
}

struct Dispatcher {
    store: Arc<dyn Store>,
    secret: WebhookSecret,
    client: reqwest::Client,
    /// Names this process's claims.
    claim: String,
}

impl Dispatcher {
    async fn claim(&self) -> StoreResult<Vec<Delivery>> {
        let Some(queue) = self.store.webhooks() else {
            return Ok(Vec::new());
        };
        let now = now_ms();
        let claim = Claim {
            owner: &self.claim,
            now,
            until: now + CLAIM_MS,
        };
        queue.claim_deliveries(claim, BATCH).await
    }

    /// Forgets the deliveries older than the log keeps.
    async fn prune(&self) {
        let Some(queue) = self.store.webhooks() else {
            return;
        };
        match queue.purge_deliveries(now_ms() - KEEP_MS).await {
            Ok(0) => {}
            Ok(count) => tracing::debug!(count, "pruned the webhook delivery log"),
            Err(error) => tracing::warn!(%error, "cannot prune the webhook delivery log"),
        }
    }

    /// One attempt of one delivery, and its outcome recorded.
    async fn attempt(&self, delivery: Delivery) {
        let Some(queue) = self.store.webhooks() else {
            return;
        };
        let outcome = match self.send(&delivery).await {
            Ok(()) => queue.delivered(delivery.id, &self.claim, now_ms()).await,
            Err(Failure::Gone) => {
                queue
                    .attempt_failed(
                        delivery.id,
                        &self.claim,
                        FailedAttempt {
                            error: "the event no longer exists (its session was deleted)",
                            next: None,
                        },
                    )
                    .await
            }
            Err(Failure::Attempt(error)) => {
                let next = next_attempt(&delivery, now_ms());
                match next {
                    Some(_) => tracing::warn!(
                        url = %shown(&delivery.url),
                        id = %webhook_id(&delivery),
                        attempts = delivery.attempts + 1,
                        %error,
                        "webhook delivery failed; it will be tried again"
                    ),
                    None => tracing::warn!(
                        url = %shown(&delivery.url),
                        id = %webhook_id(&delivery),
                        attempts = delivery.attempts + 1,
                        %error,
                        "webhook delivery failed for 24 hours; given up"
                    ),
                }
                queue
                    .attempt_failed(
                        delivery.id,
                        &self.claim,
                        FailedAttempt {
                            error: &error,
                            next,
                        },
                    )
                    .await
            }
        };
        if let Err(error) = outcome {
            // The claim lapses and the delivery is attempted again.
            tracing::warn!(%error, "cannot record a webhook delivery");
        }
    }

    async fn send(&self, delivery: &Delivery) -> Result<(), Failure> {
        let event = self
            .store
            .events(delivery.session_id, delivery.seq - 1, 1)
            .await
            .map_err(|e| Failure::Attempt(format!("reading the event: {e}")))?
            .into_iter()
            .next()
            .filter(|event| event.seq == delivery.seq)
            .ok_or(Failure::Gone)?;
        let body = format!(
            r#"{{"type":{},"timestamp":{},"data":{}}}"#,
            serde_json::Value::from(event.type_name()),
            serde_json::to_string(&event.created_at).unwrap_or_default(),
            serde_json::to_string(&event).unwrap_or_default()
        );
        let id = webhook_id(delivery);
        let timestamp = now_ms() / 1000;
        let signature = self.secret.sign(&id, timestamp, &body);
        let reply = self
            .client
            .post(&delivery.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|e| Failure::Attempt(describe(&e)))?;
        let status = reply.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(Failure::Attempt(format!("HTTP {}", status.as_u16())))
        }
    }
}

enum Failure {
    /// The event is not in the log any more.
    Gone,
    Attempt(String),
}

/// A delivery's URL as a log line may show it: credentials, path and query left out.
fn shown(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(|_| "(not a URL)".to_string(), |url| shown_url(&url))
}

/// The message id: one per event, the same on every retry.
fn webhook_id(delivery: &Delivery) -> String {
    format!("{}:{}", delivery.session_id, delivery.seq)
}

/// When a delivery that just failed is tried again: 1 s after the first attempt, doubling, at
/// most an hour apart; `None` once that would be more than 24 hours after the event.
pub fn next_attempt(delivery: &Delivery, now: i64) -> Option<i64> {
    let doublings = delivery.attempts.clamp(0, 32) as u32;
    let delay = FIRST_DELAY_MS
        .saturating_mul(1_i64 << doublings.min(31))
        .min(MAX_DELAY_MS);
    let next = now + delay;
    (next <= delivery.created_at + RETRY_FOR_MS).then_some(next)
}

/// A transport error in a few words (reqwest's own text names the URL again).
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut text = kind.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_the_standard_webhooks_example() {
        // The example of the Standard Webhooks spec (and its reference libraries).
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn refuses_secrets_that_are_not_base64_or_too_short() {
        assert!(WebhookSecret::parse("whsec_not base64!").is_err());
        assert!(WebhookSecret::parse("whsec_c2hvcnQ=").is_err());
        assert!(WebhookSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
    }

    #[test]
    fn backs_off_doubling_up_to_an_hour_for_a_day() {
        let delivery = |attempts| Delivery {
            id: 1,
            session_id: uuid::Uuid::nil(),
            seq: 1,
            url: String::new(),
            attempts,
            created_at: 0,
        };
        assert_eq!(next_attempt(&delivery(0), 0), Some(1_000));
        assert_eq!(next_attempt(&delivery(1), 0), Some(2_000));
        assert_eq!(next_attempt(&delivery(3), 10), Some(8_010));
        assert_eq!(next_attempt(&delivery(40), 0), Some(MAX_DELAY_MS));
        assert_eq!(
            next_attempt(&delivery(40), RETRY_FOR_MS - MAX_DELAY_MS + 1),
            None
        );
    }
}

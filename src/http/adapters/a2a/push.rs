//! A2A push notifications: a task's configs (`TaskPushNotificationConfig`), and their delivery.
//!
//! Each config is followed by a delivery loop from the moment it is made: every status and
//! artifact update of its task (the A2A `StreamResponse` of the stream, `metadata.tah_seq`
//! included) is POSTed to the config's URL, in order, until the task ends. Headers: the
//! config's `token` as `X-A2A-Notification-Token`, its `authentication` as `Authorization`,
//! and Standard Webhooks' `webhook-id` (`<task_id>:<seq>`), `webhook-timestamp` and, when the
//! token is a `whsec_…` secret, `webhook-signature` (signed as tah's webhooks are). A failed
//! attempt is retried after 1 s, 2 s, 4 s… (eight attempts at most).
//!
//! Configs live in this process (keyed by task), not in the store: a session's `metadata` is
//! fixed at its creation (nothing updates it after), and a face adds no tables. A restart
//! forgets them, with their deliveries; the task's events stay readable with `GetTask` and
//! `SubscribeToTask` (from `Last-Event-ID`), which is how a receiver catches up.
//!
//! Private, loopback and link-local addresses are refused as URLs unless the server runs with
//! `--a2a-allow-private-push`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::A2aError;
use crate::protocols::a2a::TaskView;
use crate::session::Sessions;
use crate::webhooks::WebhookSecret;

/// What a delivery loop needs of the request that made its config.
pub struct PushCtx {
    pub sessions: Sessions,
    pub base_url: String,
    pub shutdown: CancellationToken,
    pub allow_private: bool,
}

/// One config, as the client gave it (its id made here when it gave none).
#[derive(Debug, Clone)]
pub struct PushConfig {
    pub id: String,
    url: String,
    token: String,
    authentication: Option<(String, String)>,
}

impl PushConfig {
    pub fn to_json(&self, task_id: Uuid) -> Value {
        let mut config = json!({
            "id": self.id,
            "taskId": task_id.to_string(),
            "url": self.url,
        });
        if !self.token.is_empty() {
            config["token"] = json!(self.token);
        }
        if let Some((scheme, _)) = &self.authentication {
            // The credentials are the receiver's secret: never shown again.
            config["authentication"] = json!({ "scheme": scheme });
        }
        config
    }
}

/// A task's configs, and the cancellation of each one's delivery loop.
type Entry = (PushConfig, CancellationToken);

static REGISTRY: LazyLock<Mutex<HashMap<Uuid, Vec<Entry>>>> = LazyLock::new(Default::default);

/// Attempts per delivery.
const ATTEMPTS: u32 = 8;
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Configs a task may have.
const MAX_CONFIGS: usize = 10;

/// Reads and keeps a config for `task_id` (of `session`), and starts delivering to it: the
/// updates after the event `after` (a send's config: from where its task starts), or from now.
pub async fn create(
    ctx: PushCtx,
    session: Uuid,
    task_id: Uuid,
    params: &Map<String, Value>,
    after: Option<i64>,
) -> Result<PushConfig, A2aError> {
    for key in params.keys() {
        if !["tenant", "id", "taskId", "url", "token", "authentication"].contains(&key.as_str()) {
            return Err(A2aError::invalid_params(format!(
                "{key} is not a field of a push notification config"
            )));
        }
    }
    let text = |name: &str| -> Result<String, A2aError> {
        match params.get(name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(A2aError::invalid_params(format!("{name} must be a string"))),
        }
    };
    if !text("tenant")?.is_empty() {
        return Err(A2aError::invalid_params("tenant is not supported"));
    }
    let url = text("url")?;
    check_url(&url, ctx.allow_private).await?;
    let token = text("token")?;
    let authentication = match params.get("authentication") {
        None | Some(Value::Null) => None,
        Some(Value::Object(auth)) => {
            let scheme = auth.get("scheme").and_then(Value::as_str).unwrap_or("");
            let credentials = auth
                .get("credentials")
                .and_then(Value::as_str)
                .unwrap_or("");
            if scheme.is_empty() {
                return Err(A2aError::invalid_params(
                    "authentication.scheme is required",
                ));
            }
            Some((scheme.to_string(), credentials.to_string()))
        }
        Some(_) => return Err(A2aError::invalid_params("authentication must be an object")),
    };
    let id = match text("id")? {
        id if id.is_empty() => Uuid::now_v7().to_string(),
        id => id,
    };
    let config = PushConfig {
        id,
        url,
        token,
        authentication,
    };
    let stop = ctx.shutdown.child_token();
    {
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let configs = registry.entry(task_id).or_default();
        if let Some(at) = configs.iter().position(|(c, _)| c.id == config.id) {
            // The same id again replaces the config.
            configs.remove(at).1.cancel();
        } else if configs.len() >= MAX_CONFIGS {
            return Err(A2aError::invalid_params(format!(
                "a task has at most {MAX_CONFIGS} push notification configs"
            )));
        }
        configs.push((config.clone(), stop.clone()));
    }
    // Delivery follows the task from now on.
    let run = ctx
        .sessions
        .run_record(session, task_id)
        .await
        .map_err(A2aError::from)?
        .ok_or_else(|| A2aError::task_not_found(format!("task {task_id} not found")))?;
    let live = ctx.sessions.subscribe(session).map_err(A2aError::from)?;
    let mut view = TaskView::new(&run, &ctx.base_url);
    for event in ctx
        .sessions
        .run_events(session, &run)
        .await
        .map_err(A2aError::from)?
    {
        if after.is_some_and(|after| event.seq > after) {
            break;
        }
        view.push(&event);
    }
    if !view.state().is_terminal() {
        let events = ctx
            .sessions
            .stream_from(session, view.last_seq(), live, Some(run.id));
        tokio::spawn(deliver(config.clone(), task_id, view, events, stop));
    }
    Ok(config)
}

/// The configs of a task.
pub async fn configs(
    _sessions: &Sessions,
    _session: Uuid,
    task_id: Uuid,
) -> Result<Vec<PushConfig>, A2aError> {
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    Ok(registry
        .get(&task_id)
        .map(|configs| configs.iter().map(|(c, _)| c.clone()).collect())
        .unwrap_or_default())
}

/// Deletes a config of a task (and stops its deliveries).
pub async fn delete(
    _sessions: &Sessions,
    _session: Uuid,
    task_id: Uuid,
    config_id: &str,
) -> Result<(), A2aError> {
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let configs = registry.entry(task_id).or_default();
    let Some(at) = configs.iter().position(|(c, _)| c.id == config_id) else {
        return Err(A2aError::task_not_found(format!(
            "push notification config {config_id:?} not found"
        )));
    };
    configs.remove(at).1.cancel();
    Ok(())
}

/// Refuses a URL that is not http(s), or (without the operator's leave) one that reaches a
/// private, loopback or link-local address.
async fn check_url(raw: &str, allow_private: bool) -> Result<(), A2aError> {
    let url = reqwest::Url::parse(raw)
        .map_err(|_| A2aError::invalid_params("url must be an absolute http(s) URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(A2aError::invalid_params("url must be an http(s) URL"));
    }
    let Some(host) = url.host_str() else {
        return Err(A2aError::invalid_params("url needs a host"));
    };
    if allow_private {
        return Ok(());
    }
    let port = url.port_or_known_default().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .map_err(|_| {
                A2aError::invalid_params(format!("url's host {host:?} does not resolve"))
            })?,
    };
    if addresses.iter().any(|ip| is_private(*ip)) || addresses.is_empty() {
        return Err(A2aError::invalid_params(
            "url reaches a private, loopback or link-local address, which push notifications \
             may not (the operator allows them with --a2a-allow-private-push)",
        ));
    }
    Ok(())
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_private(IpAddr::V4(v4)))
        }
    }
}

/// Delivers the task's updates to one config until the task ends or the config is deleted.
async fn deliver(
    config: PushConfig,
    task_id: Uuid,
    mut view: TaskView,
    mut events: crate::session::EventStream,
    stop: CancellationToken,
) {
    let client = reqwest::Client::new();
    let secret = WebhookSecret::parse(&config.token).ok();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        let event = match event {
            Some(Ok(event)) => event,
            _ => break,
        };
        let Some(frame) = view.push(&event) else {
            continue;
        };
        if frame.get("task").is_some() {
            continue;
        }
        let body = frame.to_string();
        let id = format!("{task_id}:{}", event.seq);
        let mut delay = Duration::from_secs(1);
        for attempt in 1..=ATTEMPTS {
            let timestamp = chrono::Utc::now().timestamp();
            let mut request = client
                .post(&config.url)
                .timeout(ATTEMPT_TIMEOUT)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string());
            if let Some(secret) = &secret {
                request = request.header("webhook-signature", secret.sign(&id, timestamp, &body));
            }
            if !config.token.is_empty() {
                request = request.header("x-a2a-notification-token", &config.token);
            }
            if let Some((scheme, credentials)) = &config.authentication {
                request = request.header("authorization", format!("{scheme} {credentials}"));
            }
            let delivered = tokio::select! {
                _ = stop.cancelled() => return,
                sent = request.body(body.clone()).send() => {
                    sent.is_ok_and(|r| r.status().is_success())
                }
            };
            if delivered || attempt == ATTEMPTS {
                if !delivered {
                    tracing::warn!(task = %task_id, "an A2A push notification was not delivered");
                }
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay *= 2;
        }
        if view.state().is_terminal() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.1.1",
            "::1",
            "fd00::1",
            "100.64.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "2001:4860::8888"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }
}

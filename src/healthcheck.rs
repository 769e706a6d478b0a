//! `tah healthcheck`: one `GET /readyz` against a running server, for a container's
//! `HEALTHCHECK` (the runtime image has no curl). It exits 0 when the answer is 200 and 1
//! otherwise, and prints one line saying what it asked and what came back, which is what
//! `docker inspect` shows for a failing probe. Part of the binary only; it reaches the server
//! through HTTP like any client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tah::cli::HealthcheckArgs;

/// Why the server is not ready, as the probe's output says it.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("not ready: {url} is not a URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("not ready: cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("not ready: GET {url} answered {status}{detail}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
        detail: String,
    },
}

/// Probes the server once; `Ok` holds the line to print on success.
pub async fn probe(args: &HealthcheckArgs) -> Result<String, NotReady> {
    let url = args.url.clone().unwrap_or_else(|| readyz_url(args.listen));
    let bad_url = |reason: String| NotReady::BadUrl {
        url: url.clone(),
        reason,
    };
    let parsed = reqwest::Url::parse(&url).map_err(|e| bad_url(e.to_string()))?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout_secs))
        // The probe talks to the server next to it, never through a proxy of the environment,
        // and a redirect is not an answer from /readyz.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| bad_url(error_chain(&e)))?;
    let response = client
        .get(parsed)
        .send()
        .await
        .map_err(|e| NotReady::Unreachable {
            url: url.clone(),
            // reqwest's own message repeats the URL; its causes say what went wrong.
            reason: match std::error::Error::source(&e) {
                Some(cause) => error_chain(cause),
                None => e.to_string(),
            },
        })?;
    let status = response.status();
    if status == reqwest::StatusCode::OK {
        return Ok(format!("ready: GET {url} answered {status}"));
    }
    // A problem+json body says why (e.g. the database refuses writes); keep it short.
    let body = response.text().await.unwrap_or_default();
    let detail = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_string))
        .or_else(|| (!body.trim().is_empty()).then(|| body.trim().to_string()))
        .map(|d| format!(": {}", d.chars().take(300).collect::<String>()))
        .unwrap_or_default();
    Err(NotReady::Status {
        url,
        status,
        detail,
    })
}

/// `/readyz` on the address a server listens on; an unspecified address is reached on
/// loopback.
fn readyz_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/readyz", SocketAddr::new(ip, listen.port()))
}

/// An error and its causes on one line ("error sending request …: connection refused").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_url_is_readyz_on_the_listen_address_reached_on_loopback() {
        let url = |addr: &str| readyz_url(addr.parse().expect("an address"));
        assert_eq!(url("127.0.0.1:8080"), "http://127.0.0.1:8080/readyz");
        assert_eq!(url("0.0.0.0:9000"), "http://127.0.0.1:9000/readyz");
        assert_eq!(url("[::]:8080"), "http://[::1]:8080/readyz");
        assert_eq!(url("10.1.2.3:80"), "http://10.1.2.3:80/readyz");
    }
}

//! Requests a web page could make without the user's knowing: refused before any handler runs.
//!
//! - **Host**: a page on `attacker.example` whose name is made to resolve to 127.0.0.1 (DNS
//!   rebinding) reaches a loopback server as `Host: attacker.example`. Only the loopback names,
//!   the address the server listens on and the names given with `--allowed-host` are answered
//!   (`/healthz` and `/readyz` answer any name, for probes that use the pod's address). With
//!   API tokens and no `--allowed-host`, any name is answered: a rebound page has no token.
//! - **Origin**: browsers send `Origin` with every cross-origin `POST` or `DELETE`, including
//!   the "simple" form-style ones that need no preflight. A state-changing request is refused
//!   unless it has no `Origin` (curl, servers), comes from the server's own origin (the built-in
//!   page), or from an origin allowed with `--cors-origin`.
//!
//! A browser hides why a cross-origin request failed from the page (without
//! `Access-Control-Allow-Origin` the answer cannot be read), so the first request from each
//! origin that is not allowed is logged as a warning naming the origin and the flag.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;

/// What the guard lets through.
#[derive(Debug, Clone)]
pub struct RequestGuard {
    /// Host names (lower case) answered, or `None` for any.
    hosts: Option<Vec<String>>,
    /// Origins allowed besides the server's own (normalised), and whether any is.
    origins: Vec<String>,
    any_origin: bool,
    /// Origins already warned about (at most [`MAX_WARNED_ORIGINS`]).
    warned: Arc<Mutex<HashSet<String>>>,
}

/// Refused origins remembered so that each is logged once; past this many, no more are logged
/// (a page cannot fill the server's memory or its log with made-up origins).
const MAX_WARNED_ORIGINS: usize = 256;

impl RequestGuard {
    /// `allowed_hosts` are names (or `name:port`) to answer besides the loopback names and
    /// `listen`; `"*"` answers any.
    pub fn new(
        listen: Option<SocketAddr>,
        allowed_hosts: &[String],
        cors_origins: &[String],
        tokens_configured: bool,
    ) -> RequestGuard {
        let any_host = allowed_hosts.iter().any(|h| h == "*")
            || (tokens_configured && allowed_hosts.is_empty());
        let hosts = (!any_host).then(|| {
            let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
                .iter()
                .map(|h| h.to_string())
                .collect();
            if let Some(addr) = listen.filter(|a| !a.ip().is_unspecified()) {
                hosts.push(addr.ip().to_string());
            }
            hosts.extend(allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()));
            hosts
        });
        RequestGuard {
            hosts,
            origins: cors_origins.iter().map(|o| normalise_origin(o)).collect(),
            any_origin: cors_origins.iter().any(|o| o == "*"),
            warned: Arc::default(),
        }
    }

    /// Logs the first request from `origin`, which is not allowed; answers whether it did.
    fn warn_once(&self, origin: &str) -> bool {
        let origin = truncate(&normalise_origin(origin), 100).to_owned();
        let Ok(mut warned) = self.warned.lock() else {
            return false;
        };
        if warned.len() >= MAX_WARNED_ORIGINS || !warned.insert(origin.clone()) {
            return false;
        }
        let shown = origin.escape_debug().to_string();
        tracing::warn!(
            origin = %shown,
            "a browser request from a web origin that is not allowed: the page cannot read the \
             answer; start the server with --cors-origin {shown} to allow it"
        );
        true
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        let host = host.trim().to_ascii_lowercase();
        let (name, _port) = split_host(&host);
        hosts.iter().any(|allowed| {
            allowed == &host
                || allowed == name
                || allowed
                    .strip_prefix("*.")
                    .is_some_and(|suffix| name.ends_with(&format!(".{suffix}")))
        }) || name.ends_with(".localhost")
    }

    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = normalise_origin(origin);
        if self.any_origin || self.origins.contains(&origin) {
            return true;
        }
        host.is_some_and(|host| is_own_origin(&origin, host))
    }
}

/// True when `origin` is the server's own for a request to `host`: the page it serves, over
/// plain HTTP or behind a proxy that terminates TLS.
fn is_own_origin(origin: &str, host: &str) -> bool {
    let origin = normalise_origin(origin);
    let host = host.trim().to_ascii_lowercase();
    origin == format!("http://{host}") || origin == format!("https://{host}")
}

/// The request's `Host`.
pub fn request_host(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// True when the request carries an `Origin` that is the server's own.
pub fn sends_own_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match (origin, request_host(headers)) {
        (Some(origin), Some(host)) => is_own_origin(origin, &host),
        _ => false,
    }
}

/// True for a loopback name: `localhost` (and `*.localhost`), `127.0.0.0/8`, `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let (name, _port) = split_host(&host);
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `name` and `port` of a `Host` value (`[::1]:8080` → `::1`).
fn split_host(host: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((name, port)) => (name, port.strip_prefix(':')),
            None => (rest, None),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (host, None),
    }
}

/// An origin as compared: lower case, without a trailing slash.
pub fn normalise_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

pub fn changes_state(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

pub async fn check(State(guard): State<RequestGuard>, request: Request, next: Next) -> Response {
    let host = request_host(request.headers())
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let probe = matches!(request.uri().path(), "/healthz" | "/readyz");
    if let Some(host) = host.as_deref().filter(|_| !probe) {
        if !guard.host_allowed(host) {
            return Problem::new(
                StatusCode::FORBIDDEN,
                "host-not-allowed",
                format!(
                    "this server does not answer to the host name {:?}; start it with \
                     --allowed-host to add it",
                    truncate(host, 100)
                ),
            )
            .into_response();
        }
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !guard.origin_allowed(origin, host.as_deref()) {
            guard.warn_once(origin);
            if changes_state(request.method()) {
                return Problem::new(
                    StatusCode::FORBIDDEN,
                    "origin-not-allowed",
                    format!(
                        "requests that change state are not accepted from the web origin {:?}; \
                         start the server with --cors-origin to allow it",
                        truncate(origin, 100)
                    ),
                )
                .into_response();
            }
        }
    }
    next.run(request).await
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_origin_is_warned_about_once_and_the_memory_is_bounded() {
        let guard = guard(&[], &["http://allowed.example"], false);
        assert!(guard.warn_once("http://other.example"));
        assert!(!guard.warn_once("http://other.example"), "once per origin");
        assert!(!guard.warn_once("HTTP://other.example/"), "as compared");
        for n in 0..2 * MAX_WARNED_ORIGINS {
            guard.warn_once(&format!("http://{n}.example"));
        }
        assert_eq!(guard.warned.lock().expect("lock").len(), MAX_WARNED_ORIGINS);
    }

    fn guard(allowed: &[&str], cors: &[&str], tokens: bool) -> RequestGuard {
        let listen: SocketAddr = "10.0.0.5:8080".parse().unwrap();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        RequestGuard::new(Some(listen), &strings(allowed), &strings(cors), tokens)
    }

    #[test]
    fn loopback_names_and_the_listen_address_are_answered_by_default() {
        let g = guard(&[], &[], false);
        for host in [
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "LOCALHOST",
            "10.0.0.5:8080",
            "app.localhost:3000",
        ] {
            assert!(g.host_allowed(host), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "127.0.0.2",
            "localhost.evil",
        ] {
            assert!(!g.host_allowed(host), "{host}");
        }
    }

    #[test]
    fn allowed_hosts_add_names_and_wildcards() {
        let g = guard(&["tah.internal", "*.corp.example", "box:9000"], &[], false);
        assert!(g.host_allowed("tah.internal:8080"));
        assert!(g.host_allowed("a.corp.example"));
        assert!(g.host_allowed("box:9000"));
        assert!(!g.host_allowed("box:9001"));
        assert!(!g.host_allowed("corp.example.evil"));
        assert!(guard(&["*"], &[], false).host_allowed("anything"));
    }

    #[test]
    fn with_tokens_any_host_is_answered_unless_hosts_are_listed() {
        assert!(guard(&[], &[], true).host_allowed("attacker.example"));
        assert!(!guard(&["tah.internal"], &[], true).host_allowed("attacker.example"));
    }

    #[test]
    fn only_the_own_origin_and_allowed_origins_may_change_state() {
        let g = guard(&[], &["http://localhost:5173/"], false);
        assert!(g.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(g.origin_allowed("http://localhost:5173", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("https://evil.example", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("null", Some("127.0.0.1:8080")));
        assert!(!g.origin_allowed("http://127.0.0.1:8080", Some("localhost:8080")));
        assert!(guard(&[], &["*"], false).origin_allowed("https://evil.example", None));
    }

    #[test]
    fn loopback_names_are_known() {
        for host in [
            "localhost:8080",
            "LOCALHOST",
            "a.localhost",
            "127.0.0.1",
            "127.9.9.9:1",
            "[::1]:8080",
            "::1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["10.0.0.5:8080", "tah.example", "localhost.evil", "[::2]:80"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}

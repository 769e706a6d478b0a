//! The egress allow-list (`--shell-network allow=HOST[:PORT],…`): an HTTP proxy tah runs for
//! each `shell` call, the only way out of the sandbox, which lets a command reach the hosts on
//! the list and nothing else.
//!
//! **One proxy per call.** [`EgressProxy::start`] binds a listener on 127.0.0.1 (an ephemeral
//! port, for sandboxes that share the host's network and may connect to that port only) and a
//! unix socket in a private directory (for the bubblewrap sandbox, which keeps its own network
//! namespace, loopback only, and has the socket bound in). Dropping the proxy, when the call
//! ends, stops the listeners and every connection and tunnel it holds, and removes the socket.
//! A proxy per call rather than one per server keeps nothing shared between calls: no identity
//! to check, no call reaching another's connections, and its bounds are per call.
//!
//! The proxy speaks HTTP/1.1 through hyper (already the server's HTTP stack): `CONNECT
//! host:port` opens a tunnel (TLS passes through untouched), and a request with an absolute
//! `http://` URI is forwarded with its URI rewritten to origin-form, on a fresh upstream
//! connection (`Connection: close`, no pooling). The proxy resolves names itself (the sandbox
//! has no DNS) and checks every address it would connect to: loopback, private, link-local,
//! shared, multicast, reserved and documentation addresses (169.254.169.254, the cloud
//! metadata address, among them) are refused, unless the allow entry is that IP literal
//! itself; so a name on the list that resolves (or is rebound) to 127.0.0.1 gets nothing. A
//! refusal is `403` with a short text naming the host.
//!
//! Bounds, per call: [`MAX_CONNECTIONS`] client connections (tunnels included), request heads
//! of at most [`MAX_HEAD_BYTES`] read within [`HEAD_TIMEOUT`], and [`CONNECT_TIMEOUT`] for
//! resolving and connecting upstream.
//!
//! Inside the bubblewrap sandbox, [`bridge`] (the hidden `tah egress-bridge`) listens on the
//! sandbox's own 127.0.0.1 and forwards each TCP connection to the unix socket; the command
//! finds the proxy through `HTTP_PROXY` and its kin ([`proxy_env`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Client connections (and so tunnels) one call's proxy holds at once; more are closed.
pub const MAX_CONNECTIONS: usize = 32;
/// The longest request head the proxy reads (hyper's smallest buffer is 8 KiB).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send a request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long resolving a name and connecting upstream may take, in all.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports an allow entry without one admits.
const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Connections the in-sandbox bridge forwards at once.
const BRIDGE_MAX_CONNECTIONS: usize = 64;

/// What `--shell-network` says, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkChoice {
    /// No network (the default).
    None,
    /// The host's network, unfiltered.
    All,
    /// Only these hosts, through the proxy.
    Allow(AllowList),
}

/// The hosts a command may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: HostPattern,
    /// `None`: 80 and 443.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// A DNS name, lower case, without a trailing dot.
    Name(String),
    /// `*.example.com`: any name under `example.com` (not `example.com` itself).
    Subdomains(String),
    /// An IP literal: that address, whatever range it is in.
    Ip(IpAddr),
}

/// Why a `--shell-network` value was refused: the entry, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--shell-network entry {entry:?}: {reason}")]
pub struct NetworkParseError {
    pub entry: String,
    pub reason: String,
}

/// Parses `--shell-network`: `allow=HOST[:PORT],…`, `all` or `none`. The boolean words the
/// flag took before it had a value (`true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, `y`/`n`,
/// `t`/`f`, in any case) mean `all` and `none`.
pub fn parse_network(value: &str) -> Result<NetworkChoice, NetworkParseError> {
    let trimmed = value.trim();
    let lower = trimmed.to_ascii_lowercase();
    match lower.as_str() {
        "all" | "true" | "1" | "yes" | "on" | "y" | "t" => return Ok(NetworkChoice::All),
        "none" | "false" | "0" | "no" | "off" | "n" | "f" => return Ok(NetworkChoice::None),
        _ => {}
    }
    let Some(list) = lower.strip_prefix("allow=") else {
        return Err(NetworkParseError {
            entry: trimmed.to_string(),
            reason: "expected allow=HOST[:PORT],…, all or none".into(),
        });
    };
    let entries = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            parse_entry(e).map_err(|reason| NetworkParseError {
                entry: e.to_string(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if entries.is_empty() {
        return Err(NetworkParseError {
            entry: trimmed.to_string(),
            reason: "allow= names no host (use none for no network)".into(),
        });
    }
    Ok(NetworkChoice::Allow(AllowList { entries }))
}

fn parse_entry(entry: &str) -> Result<Entry, String> {
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address opened with [ is not closed with ]")?;
        let ip: Ipv6Addr = inside
            .parse()
            .map_err(|_| format!("{inside:?} is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("expected :PORT after ]")?),
        };
        (HostPattern::Ip(IpAddr::V6(ip)), port)
    } else {
        let (host, port) = match entry.split_once(':') {
            Some((host, port)) if !port.contains(':') => (host, Some(port)),
            Some(_) => return Err("an IPv6 address goes in brackets: [ADDRESS]:PORT".into()),
            None => (entry, None),
        };
        (parse_host(host)?, port)
    };
    let port = match port {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => return Err(format!("{text:?} is not a port (1 to 65535)")),
        },
    };
    Ok(Entry { host, port })
}

fn parse_host(host: &str) -> Result<HostPattern, String> {
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(HostPattern::Ip(IpAddr::V4(ip)));
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    if let Some(parent) = host.strip_prefix("*.") {
        check_name(parent)?;
        return Ok(HostPattern::Subdomains(parent.to_string()));
    }
    check_name(host)?;
    Ok(HostPattern::Name(host.to_string()))
}

/// A DNS name: labels of letters, digits, `-` and `_`, 1 to 63 bytes, at most 253 in all.
fn check_name(name: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "{name:?} is not a host name or IP address (a * may only start an entry, as *.)"
        ));
    }
    Ok(())
}

impl AllowList {
    /// The entry admitting `host` (lower case, no brackets, no trailing dot) on `port`.
    fn admits(&self, host: &Host, port: u16) -> Option<&Entry> {
        self.entries.iter().find(|entry| {
            let port_ok = match entry.port {
                Some(p) => p == port,
                None => DEFAULT_PORTS.contains(&port),
            };
            let host_ok = match (&entry.host, host) {
                (HostPattern::Ip(ip), Host::Ip(asked)) => ip == asked,
                (HostPattern::Name(name), Host::Name(asked)) => name == asked,
                (HostPattern::Subdomains(parent), Host::Name(asked)) => asked
                    .strip_suffix(parent.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                _ => false,
            };
            port_ok && host_ok
        })
    }
}

/// A host a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    fn parse(text: &str) -> Host {
        let text = text.trim_start_matches('[').trim_end_matches(']');
        match text.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => {
                let lower = text.to_ascii_lowercase();
                Host::Name(lower.strip_suffix('.').unwrap_or(&lower).to_string())
            }
        }
    }
}

/// Whether `ip` is an address on the public internet: not loopback, private, link-local,
/// shared (CGNAT), multicast, broadcast, reserved or documentation, in IPv4 or IPv6, and no
/// IPv6 form of such an IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || a >= 240
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (b == 18 || b == 19)))
        }
        IpAddr::V6(v6) => {
            if v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() {
                return false;
            }
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                is_public(IpAddr::V4(Ipv4Addr::new(
                    (hi >> 8) as u8,
                    hi as u8,
                    (lo >> 8) as u8,
                    lo as u8,
                )))
            };
            match s {
                // IPv4-compatible (deprecated), NAT64 and 6to4 carry an IPv4 address.
                [0, 0, 0, 0, 0, 0, hi, lo] => embedded(hi, lo),
                [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => embedded(hi, lo),
                [0x2002, hi, lo, ..] => embedded(hi, lo),
                // Unique local, link-local, site-local, documentation.
                [first, ..] if first & 0xfe00 == 0xfc00 => false,
                [first, ..] if first & 0xffc0 == 0xfe80 || first & 0xffc0 == 0xfec0 => false,
                [0x2001, 0x0db8, ..] => false,
                _ => true,
            }
        }
    }
}

/// A refused destination, or one that could not be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    NotAllowed(String),
    NotPublic(String, IpAddr),
    Unresolved(String),
    Unreachable(String),
}

impl Refusal {
    fn response(&self) -> Response<Body> {
        let (status, text) = match self {
            Refusal::NotAllowed(dest) => (
                StatusCode::FORBIDDEN,
                format!("{dest} is not on this server's egress allow-list"),
            ),
            Refusal::NotPublic(dest, ip) => (
                StatusCode::FORBIDDEN,
                format!(
                    "{dest} resolves to {ip}, a loopback, private or reserved address, which \
                     the egress allow-list does not reach"
                ),
            ),
            Refusal::Unresolved(dest) => (
                StatusCode::BAD_GATEWAY,
                format!("{dest}: the name did not resolve"),
            ),
            Refusal::Unreachable(dest) => (
                StatusCode::BAD_GATEWAY,
                format!("{dest}: could not connect"),
            ),
        };
        text_response(status, &text)
    }
}

/// The allow-list of a server and how it resolves names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    allow: AllowList,
    /// Test-only fixed answers for names under `.test` (`--shell-network-test-resolve`):
    /// addresses taken as they are, as an IP literal on the list would be.
    test_resolve: HashMap<String, IpAddr>,
    /// The program run inside the sandbox as `egress-bridge` (this server's executable).
    bridge: PathBuf,
}

impl Egress {
    pub fn new(allow: AllowList, bridge: PathBuf) -> Egress {
        Egress {
            allow,
            test_resolve: HashMap::new(),
            bridge,
        }
    }

    /// For tests only: `name` (which must end in `.test`, a name the DNS never answers)
    /// resolves to `ip`, and `ip` is reached whatever range it is in.
    pub fn with_test_resolve(mut self, name: &str, ip: IpAddr) -> Result<Egress, String> {
        let name = name.trim().to_ascii_lowercase();
        if !name.ends_with(".test") || check_name(&name).is_err() {
            return Err(format!(
                "{name:?}: only names under .test may be given a fixed address"
            ));
        }
        self.test_resolve.insert(name, ip);
        Ok(self)
    }

    /// The executable run as the in-sandbox bridge.
    pub fn bridge_program(&self) -> &Path {
        &self.bridge
    }

    /// The addresses `host:port` may be reached at, or why not.
    async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        let asked = Host::parse(host);
        let dest = match &asked {
            Host::Name(name) => format!("{name}:{port}"),
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            Host::Ip(ip) => format!("{ip}:{port}"),
        };
        if self.allow.admits(&asked, port).is_none() {
            return Err(Refusal::NotAllowed(dest));
        }
        let name = match asked {
            // The entry is this literal: reached whatever its range.
            Host::Ip(ip) => return Ok(vec![SocketAddr::new(ip, port)]),
            Host::Name(name) => name,
        };
        if let Some(ip) = self.test_resolve.get(&name) {
            return Ok(vec![SocketAddr::new(*ip, port)]);
        }
        let resolved: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), port)).await {
            Ok(found) => found.collect(),
            Err(_) => return Err(Refusal::Unresolved(dest)),
        };
        if resolved.is_empty() {
            return Err(Refusal::Unresolved(dest));
        }
        // Every address is checked; one that is not public refuses the name, so a name rebound
        // between lookups cannot mix a private answer in.
        if let Some(bad) = resolved.iter().find(|a| !is_public(a.ip())) {
            return Err(Refusal::NotPublic(dest, bad.ip()));
        }
        Ok(resolved)
    }

    /// Resolves, checks and connects to `host:port` within [`CONNECT_TIMEOUT`].
    async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, Refusal> {
        let attempt = async {
            let addresses = self.addresses(host, port).await?;
            for address in &addresses {
                if let Ok(stream) = TcpStream::connect(address).await {
                    return Ok(stream);
                }
            }
            Err(Refusal::Unreachable(format!("{host}:{port}")))
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Refusal::Unreachable(format!("{host}:{port}"))),
        }
    }
}

/// Where a running proxy listens, found by its port (the sandbox's [`RunLimits`] carry only
/// the port).
///
/// [`RunLimits`]: super::sandbox::RunLimits
#[derive(Debug, Clone)]
pub struct Listening {
    /// The unix socket the proxy also accepts on.
    pub socket: PathBuf,
    /// The program to run inside the sandbox as `egress-bridge`.
    pub bridge: PathBuf,
}

static LISTENING: Mutex<Option<HashMap<u16, Listening>>> = Mutex::new(None);

/// The unix socket and bridge of the proxy running on 127.0.0.1:`port`, if one is.
pub fn listening_on(port: u16) -> Option<Listening> {
    let map = LISTENING.lock().unwrap_or_else(|e| e.into_inner());
    map.as_ref()?.get(&port).cloned()
}

/// The environment that points a command at the proxy on 127.0.0.1:`port`.
pub fn proxy_env(port: u16) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env: Vec<(&str, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|name| (name, url.clone()))
    .collect();
    env.extend([("NO_PROXY", String::new()), ("no_proxy", String::new())]);
    env
}

/// One call's proxy; dropping it stops it.
#[derive(Debug)]
pub struct EgressProxy {
    port: u16,
    dir: PathBuf,
    stop: CancellationToken,
}

type Body = BoxBody<Bytes, hyper::Error>;

impl EgressProxy {
    /// Starts a proxy for `egress` on 127.0.0.1 (an ephemeral port) and on a unix socket in a
    /// directory of its own (mode 0700).
    pub async fn start(egress: Arc<Egress>) -> std::io::Result<EgressProxy> {
        use std::os::unix::fs::DirBuilderExt;
        let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = tcp.local_addr()?.port();
        let dir =
            std::env::temp_dir().join(format!("tah-egress-{}", uuid::Uuid::now_v7().simple()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let socket = dir.join("proxy.sock");
        let unix = match UnixListener::bind(&socket) {
            Ok(unix) => unix,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let stop = CancellationToken::new();
        let listening = Listening {
            socket,
            bridge: egress.bridge.clone(),
        };
        LISTENING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(port, listening);
        tokio::spawn(stop.clone().run_until_cancelled_owned(accept(
            tcp,
            unix,
            egress,
            stop.clone(),
        )));
        Ok(EgressProxy { port, dir, stop })
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(map) = LISTENING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            map.remove(&self.port);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn accept(
    tcp: TcpListener,
    unix: UnixListener,
    egress: Arc<Egress>,
    stop: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A connection over the bound is closed at once, unread.
        let serve_it = |stream, permits: &Arc<Semaphore>| {
            let permit = permits.clone().try_acquire_owned().ok()?;
            Some(stop.clone().run_until_cancelled_owned(serve(
                stream,
                egress.clone(),
                Arc::new(permit),
                stop.clone(),
            )))
        };
        tokio::select! {
            accepted = tcp.accept() => {
                if let Ok((stream, _)) = accepted {
                    if let Some(task) = serve_it(Box::new(stream) as Box<dyn Io>, &permits) {
                        tokio::spawn(task);
                    }
                }
            }
            accepted = unix.accept() => {
                if let Ok((stream, _)) = accepted {
                    if let Some(task) = serve_it(Box::new(stream) as Box<dyn Io>, &permits) {
                        tokio::spawn(task);
                    }
                }
            }
        }
    }
}

/// A client connection, over TCP or the unix socket.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Serves one client connection; the permit is held until it and its tunnel are gone.
async fn serve<S>(
    stream: S,
    egress: Arc<Egress>,
    permit: Arc<OwnedSemaphorePermit>,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        handle(req, egress.clone(), permit.clone(), stop.clone())
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

async fn handle(
    req: Request<Incoming>,
    egress: Arc<Egress>,
    permit: Arc<OwnedSemaphorePermit>,
    stop: CancellationToken,
) -> Result<Response<Body>, Infallible> {
    if req.method() == Method::CONNECT {
        return Ok(tunnel(req, &egress, permit, stop).await);
    }
    Ok(forward(req, &egress, permit, stop).await)
}

async fn tunnel(
    req: Request<Incoming>,
    egress: &Egress,
    permit: Arc<OwnedSemaphorePermit>,
    stop: CancellationToken,
) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return text_response(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
    };
    let Some(port) = authority.port_u16() else {
        return text_response(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
    };
    let mut upstream = match egress.connect(authority.host(), port).await {
        Ok(upstream) => upstream,
        Err(refusal) => return refusal.response(),
    };
    tokio::spawn(stop.run_until_cancelled_owned(async move {
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(upgraded), &mut upstream).await;
        }
        drop(permit);
    }));
    Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    )
}

/// Hop-by-hop headers, not passed on.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

async fn forward(
    req: Request<Incoming>,
    egress: &Egress,
    permit: Arc<OwnedSemaphorePermit>,
    stop: CancellationToken,
) -> Response<Body> {
    let uri = req.uri().clone();
    let (Some("http"), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return text_response(
            StatusCode::BAD_REQUEST,
            "this proxy takes CONNECT host:port, or a request whose URI is absolute http://",
        );
    };
    let port = uri.port_u16().unwrap_or(80);
    let upstream = match egress.connect(host, port).await {
        Ok(upstream) => upstream,
        Err(refusal) => return refusal.response(),
    };
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)).await
    else {
        return Refusal::Unreachable(format!("{host}:{port}")).response();
    };
    tokio::spawn(stop.run_until_cancelled_owned(async move {
        let _ = connection.await;
        drop(permit);
    }));
    let (mut parts, body) = req.into_parts();
    let origin_form = uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match origin_form.parse() {
        Ok(uri) => uri,
        Err(_) => return text_response(StatusCode::BAD_REQUEST, "bad request URI"),
    };
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if !parts.headers.contains_key(HOST) {
        if let Some(authority) = uri.authority() {
            if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(HOST, value);
            }
        }
    }
    parts
        .headers
        .insert(CONNECTION, HeaderValue::from_static("close"));
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(|body| body.boxed()),
        Err(_) => Refusal::Unreachable(format!("{host}:{port}")).response(),
    }
}

fn text_response(status: StatusCode, text: &str) -> Response<Body> {
    let body = format!("tah egress proxy: {text}\n");
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// `tah egress-bridge`, run inside the sandbox: listens on `listen` (the sandbox's own
/// loopback), says `ready` on stdout and closes it (so a `$(…)` around it returns while it
/// keeps running), then forwards every TCP connection to the proxy's unix socket `socket`.
/// Plain threads: it runs in the sandbox, for one call, with a handful of connections.
pub fn bridge(listen: SocketAddr, socket: &Path) -> std::io::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let listener = std::net::TcpListener::bind(listen)?;
    {
        let mut out = std::io::stdout().lock();
        out.write_all(b"ready\n")?;
        out.flush()?;
    }
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: descriptor 1 is open (the line above was written to it) and stays owned by the
    // process: the `ManuallyDrop` never closes it, `dup2` only replaces what it refers to.
    let mut stdout = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(1) });
    rustix::io::dup2(&null, &mut stdout)?;
    let live = Arc::new(AtomicUsize::new(0));
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        if live.load(Ordering::Relaxed) >= BRIDGE_MAX_CONNECTIONS {
            continue;
        }
        live.fetch_add(1, Ordering::Relaxed);
        let (live, socket) = (live.clone(), socket.to_path_buf());
        std::thread::spawn(move || {
            if let Ok(proxy) = std::os::unix::net::UnixStream::connect(&socket) {
                splice(client, proxy);
            }
            live.fetch_sub(1, Ordering::Relaxed);
        });
    }
    Ok(())
}

/// Copies both ways between a TCP connection and a unix one until both directions end.
fn splice(client: std::net::TcpStream, proxy: std::os::unix::net::UnixStream) {
    let (Ok(mut client_rx), Ok(mut proxy_tx)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = pump(&mut client_rx, &mut proxy_tx);
        let _ = proxy_tx.shutdown(std::net::Shutdown::Write);
    });
    let (mut proxy_rx, mut client_tx) = (proxy, client);
    let _ = pump(&mut proxy_rx, &mut client_tx);
    let _ = client_tx.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

fn pump(from: &mut impl std::io::Read, to: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(value: &str) -> AllowList {
        match parse_network(value).expect("parses") {
            NetworkChoice::Allow(list) => list,
            other => panic!("{value}: {other:?}"),
        }
    }

    fn admits(list: &AllowList, host: &str, port: u16) -> bool {
        list.admits(&Host::parse(host), port).is_some()
    }

    #[test]
    fn the_words_and_the_old_booleans() {
        for word in ["all", "ALL", "true", "1", "yes", "On", "y", "t"] {
            assert_eq!(parse_network(word), Ok(NetworkChoice::All), "{word}");
        }
        for word in ["none", "false", "0", "no", "off", "N", "f"] {
            assert_eq!(parse_network(word), Ok(NetworkChoice::None), "{word}");
        }
    }

    #[test]
    fn errors_name_the_entry() {
        let cases = [
            ("allow=ok.example,bad host", "bad host"),
            ("allow=a.example:0", "a.example:0"),
            ("allow=a.example:99999", "a.example:99999"),
            ("allow=::1", "::1"),
            ("allow=[::1", "[::1"),
            ("allow=[nope]:80", "[nope]:80"),
            ("allow=a.*.example", "a.*.example"),
            ("allow=-a.example", "-a.example"),
            ("allow=", "allow="),
            ("sometimes", "sometimes"),
        ];
        for (value, entry) in cases {
            let err = parse_network(value).expect_err(value);
            assert_eq!(err.entry, entry, "{value}: {err}");
            assert!(err.to_string().contains(entry), "{err}");
        }
    }

    #[test]
    fn hosts_ports_and_wildcards_match_as_written() {
        let list =
            allow("allow=Example.COM, *.pypi.org:443,10.1.2.3:8080,[2001:db8::1], api.test.");
        assert!(admits(&list, "example.com", 80));
        assert!(admits(&list, "EXAMPLE.com.", 443));
        assert!(!admits(&list, "example.com", 8080));
        assert!(!admits(&list, "www.example.com", 443));
        assert!(!admits(&list, "example.com.evil.org", 443));
        assert!(admits(&list, "files.pypi.org", 443));
        assert!(admits(&list, "a.b.pypi.org", 443));
        assert!(!admits(&list, "pypi.org", 443));
        assert!(!admits(&list, "files.pypi.org", 80));
        assert!(!admits(&list, "evilpypi.org", 443));
        assert!(admits(&list, "10.1.2.3", 8080));
        assert!(!admits(&list, "10.1.2.3", 80));
        assert!(admits(&list, "[2001:db8::1]", 443));
        assert!(admits(&list, "2001:db8:0::1", 80));
        assert!(!admits(&list, "[2001:db8::2]", 443));
        assert!(admits(&list, "api.test", 80));
    }

    #[test]
    fn private_and_special_addresses_are_not_public() {
        let not_public = [
            "127.0.0.1",
            "127.9.9.9",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
        ];
        for ip in not_public {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused_and_literals_are_not() {
        let list = allow("allow=localhost:8080,127.0.0.1:8080,fixed.test:8080");
        let egress = Egress::new(list, PathBuf::from("/nonexistent"))
            .with_test_resolve("fixed.test", "127.0.0.1".parse().unwrap())
            .expect("a .test name");
        assert!(matches!(
            egress.addresses("localhost", 8080).await,
            Err(Refusal::NotPublic(..))
        ));
        assert_eq!(
            egress.addresses("127.0.0.1", 8080).await,
            Ok(vec!["127.0.0.1:8080".parse().unwrap()])
        );
        assert_eq!(
            egress.addresses("fixed.test", 8080).await,
            Ok(vec!["127.0.0.1:8080".parse().unwrap()])
        );
        assert!(matches!(
            egress.addresses("127.0.0.1", 8081).await,
            Err(Refusal::NotAllowed(_))
        ));
        let real = Egress::new(allow("allow=x.test"), PathBuf::new());
        assert!(real
            .with_test_resolve("example.com", "1.1.1.1".parse().unwrap())
            .is_err());
    }

    /// Sends `request` to the proxy on `port` and reads the answer to its end.
    async fn ask(port: u16, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .expect("connect");
        let _ = stream.write_all(request).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn the_proxy_refuses_names_and_bounds_heads_connections_and_its_life() {
        let egress = Egress::new(allow("allow=example.com"), PathBuf::new());
        let proxy = EgressProxy::start(Arc::new(egress)).await.expect("start");
        let port = proxy.port();
        let socket = listening_on(port).expect("registered").socket;
        assert!(socket.exists());

        let refused = ask(
            port,
            b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
        )
        .await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(
            refused.ends_with(
                "tah egress proxy: evil.example:443 is not on this server's egress allow-list\n"
            ),
            "{refused}"
        );
        let refused = ask(port, b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n").await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        let origin_form = ask(port, b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n").await;
        assert!(origin_form.starts_with("HTTP/1.1 400"), "{origin_form}");

        let mut head = b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n".to_vec();
        for i in 0..2000 {
            head.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "y".repeat(20)).as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let too_big = ask(port, &head).await;
        assert!(
            too_big.starts_with("HTTP/1.1 431") || too_big.is_empty(),
            "{too_big}"
        );

        // MAX_CONNECTIONS idle connections are held; the next one is closed at once.
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(
                TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                    .await
                    .expect("connect"),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let extra = ask(port, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n").await;
        assert_eq!(extra, "", "a connection over the bound was served");
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = ask(port, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.1 403"), "{again}");

        // Stopped with the call: no listener, no socket, nothing registered.
        let mut tunnel = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .expect("connect");
        drop(proxy);
        assert!(listening_on(port).is_none());
        assert!(!socket.exists());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .is_err());
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(2), tunnel.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "an open connection outlived the proxy"
        );
    }
}

//! Token authentication for `/v1` routes, compared in constant time, and the sign-in cookie
//! of the built-in page.
//!
//! A request is authenticated by, in this order: an `Authorization: Bearer <token>` header;
//! the `tah_token` cookie that `POST /v1/auth/cookie` sets; on the SSE route only, an
//! `access_token` query parameter (browsers' EventSource cannot send headers; it is never
//! logged: request spans record the path only).
//!
//! The cookie is a credential of its own, not the token: 32 random bytes, of which the store
//! keeps only a hash (`store::sign_ins`), with an expiry and the token it was traded for bound
//! to it (an HMAC of the token keyed by the cookie's value, so the table reveals nothing of the
//! tokens). A cookie is accepted while its row exists, has not expired, and its token is still
//! one of the server's: signing out deletes the row, and removing a token from the
//! configuration ends every sign-in made with it.
//!
//! The cookie is `HttpOnly` (no script reads it, so an injected script could not steal it) and
//! `SameSite=Strict` (another site's page cannot make the browser send it). `Secure` is set when
//! the browser reached the page over https (its `Origin` says so, or a TLS-terminating proxy's
//! `X-Forwarded-Proto` / `Forwarded`); over plain http, sign-in is accepted only on a loopback
//! name, where browsers count the page as a secure context and nothing crosses a network.
//! Elsewhere over plain http it is refused: a `Secure` cookie would be dropped by the browser,
//! and a cookie without it would teach people to send a long-lived credential in clear text.
//!
//! Same-site is not same-origin (`evil.example.com` is the same site as `tah.example.com`), so
//! a state-changing request authenticated by the cookie must also carry the server's own
//! `Origin`: the built-in page always sends it, a form or script on another origin cannot.
//! Bearer-token requests are unaffected (a page cannot add that header without the token).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::guard::{changes_state, is_loopback_host, request_host, sends_own_origin};
use super::jwt::JwtVerifier;
use super::problem::{ApiJson, Problem};
use crate::model::Principal;
use crate::principals::{PrincipalError, Principals};
use crate::runtime::{EdgeRecords, NewSignIn, SignIns};

/// The accepted tokens; empty = authentication is off.
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<Vec<u8>>>);

impl Tokens {
    pub fn new(tokens: &[String]) -> Tokens {
        Tokens(Arc::new(
            tokens
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| t.as_bytes().to_vec())
                .collect(),
        ))
    }

    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// True when `candidate` equals one of the tokens. Every token is compared, each in
    /// constant time, so timing tells nothing about which or how much matched.
    fn accepts(&self, candidate: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for token in self.0.iter() {
            ok |= token.as_slice().ct_eq(candidate);
        }
        ok.into()
    }

    /// True when `binding` is the binding of `cookie` to one of the tokens.
    fn bound(&self, cookie: &CookieValue, binding: &str) -> bool {
        let mut ok = subtle::Choice::from(0);
        for token in self.0.iter() {
            ok |= token_binding(cookie, token)
                .as_bytes()
                .ct_eq(binding.as_bytes());
        }
        ok.into()
    }
}

/// The tokens, the keys and session tokens, the JWT verifier, and the records that keep the
/// page's sign-ins.
#[derive(Clone)]
pub struct Auth {
    tokens: Tokens,
    records: EdgeRecords,
    principals: Principals,
    jwt: Option<JwtVerifier>,
}

impl Auth {
    pub fn new(
        tokens: Tokens,
        records: EdgeRecords,
        principals: Principals,
        jwt: Option<JwtVerifier>,
    ) -> Auth {
        Auth {
            tokens,
            records,
            principals,
            jwt,
        }
    }

    fn sign_ins(&self) -> Result<&dyn SignIns, Problem> {
        self.records.sign_ins().ok_or_else(|| {
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "this server's store keeps no sign-ins: send Authorization: Bearer <token>",
            )
        })
    }

    /// The principal `cookie` signed in as, while its sign-in has not expired and what it was
    /// traded for is still valid: a deployment token that is still one of the server's, or a
    /// key that is not revoked.
    async fn signed_in(&self, cookie: &CookieValue) -> Result<Option<Principal>, Problem> {
        let binding = self
            .sign_ins()?
            .sign_in(&sign_in_id(cookie), now_ms())
            .await
            .map_err(Problem::from)?;
        let Some(binding) = binding else {
            return Ok(None);
        };
        if let Some(key_id) = binding.strip_prefix(KEY_BINDING) {
            return match self.principals.key_principal_by_id(key_id).await {
                Ok(principal) => Ok(Some(principal)),
                Err(PrincipalError::Store(error)) => Err(Problem::from(error)),
                Err(_) => Ok(None),
            };
        }
        Ok(self
            .tokens
            .bound(cookie, &binding)
            .then_some(Principal::Operator))
    }

    /// Whether a request must carry a credential: deployment tokens or JWTs are configured,
    /// or a key exists. Otherwise a request without one is an operator.
    async fn required(&self) -> bool {
        self.tokens.enabled() || self.jwt.is_some() || self.principals.any_live_key().await
    }

    /// The principal a bearer credential names; `Ok(None)` for one that is none of the
    /// server's kinds (which an open server ignores).
    async fn principal_of(&self, credential: &str) -> Result<Option<Principal>, Response> {
        if self.tokens.accepts(credential.as_bytes()) {
            return Ok(Some(Principal::Operator));
        }
        if let Some(resolved) = self.principals.resolve(credential).await {
            return match resolved {
                Ok(principal) => Ok(Some(principal)),
                Err(PrincipalError::Store(error)) => Err(Problem::from(error).into_response()),
                Err(error) => Err(unauthorized(&error.to_string())),
            };
        }
        if let Some(jwt) = self
            .jwt
            .as_ref()
            .filter(|_| JwtVerifier::looks_like_jwt(credential))
        {
            return match jwt.verify(credential).await {
                Ok(principal) => Ok(Some(principal)),
                Err(error) => Err(unauthorized(&error.to_string())),
            };
        }
        Ok(None)
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The credential of an `x-api-key` header, as Anthropic's SDKs send it.
fn api_key_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The path prefixes whose requests are authenticated: tah's own API and the faces that speak
/// other APIs over the same sessions (the managed-agents APIs, A2A, MCP).
const AUTHENTICATED_PREFIXES: &[&str] = &["/v1/", "/anthropic/", "/openai/", "/a2a/", "/mcp"];

/// Whether requests to `path` carry a principal (the rest are health, metrics, the page and
/// its assets).
pub fn is_authenticated_path(path: &str) -> bool {
    AUTHENTICATED_PREFIXES.iter().any(|p| path.starts_with(p))
        || path == "/.well-known/agent-card.json"
}

/// The sign-in route, which takes no token itself.
const COOKIE_ROUTE: &str = "/v1/auth/cookie";

/// Resolves the request's [`Principal`] and puts it in the request's extensions (see
/// [`super::access::Caller`]), or answers `401`.
pub async fn authenticate(State(auth): State<Auth>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if !is_authenticated_path(path) || path == COOKIE_ROUTE {
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| api_key_header(request.headers()))
        .map(str::to_owned)
        .or_else(|| sse_query_token(&request));
    let required = auth.required().await;
    let principal = match bearer {
        Some(credential) => match auth.principal_of(&credential).await {
            Ok(Some(principal)) => principal,
            Ok(None) if !required => Principal::Operator,
            Ok(None) => return unauthorized("the API token is not valid"),
            Err(response) => return response,
        },
        None => match sign_in_cookie(request.headers()) {
            Some(cookie) if required => {
                let principal = match auth.signed_in(&cookie).await {
                    Ok(Some(principal)) => principal,
                    Ok(None) => {
                        return unauthorized(
                            "the sign-in cookie is not valid any more: sign in again",
                        )
                    }
                    Err(problem) => return problem.into_response(),
                };
                if changes_state(request.method()) && !sends_own_origin(request.headers()) {
                    return Problem::new(
                        StatusCode::FORBIDDEN,
                        "origin-required",
                        "a request that changes state and is signed in by cookie must come from \
                         this server's own page (its Origin header); other clients send \
                         Authorization: Bearer <token>",
                    )
                    .into_response();
                }
                principal
            }
            _ if !required => Principal::Operator,
            _ => {
                return unauthorized(
                    "this server requires an API token: send Authorization: Bearer <token>",
                )
            }
        },
    };
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// What a sign-in made with a key is bound to: this, then the key's id.
const KEY_BINDING: &str = "key:";

/// The name of the sign-in cookie.
pub const COOKIE_NAME: &str = "tah_token";

/// How long a sign-in lasts, in seconds (30 days): the cookie's `Max-Age` and its row's expiry.
const COOKIE_MAX_AGE: u64 = 30 * 24 * 3600;

/// The random bytes of a sign-in cookie (hex-encoded in the cookie).
type CookieValue = [u8; 32];

/// A new cookie value, from the operating system's random source.
fn new_cookie_value() -> CookieValue {
    let mut value = [0; 32];
    rand::rngs::OsRng.fill_bytes(&mut value);
    value
}

/// The value of the `tah_token` cookie, when it has the shape of one.
fn sign_in_cookie(headers: &HeaderMap) -> Option<CookieValue> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .and_then(|(_, value)| decode_hex(value.trim()))
        .and_then(|bytes| CookieValue::try_from(bytes).ok())
}

/// What the store knows a sign-in by: the SHA-256 of its cookie's value, so that reading the
/// table gives no cookie.
fn sign_in_id(cookie: &CookieValue) -> String {
    encode_hex(&Sha256::digest(cookie))
}

/// The token a sign-in was traded for, as stored with it: HMAC-SHA256 keyed by the cookie's
/// value, so it can be checked against the configured tokens but tells nothing of them.
fn token_binding(cookie: &CookieValue, token: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(cookie).expect("HMAC takes any key length");
    mac.update(token);
    encode_hex(&mac.finalize().into_bytes())
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.is_empty() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `/v1/auth/cookie`: `GET` says whether tokens are required and the cookie is valid, `POST`
/// signs in, `DELETE` signs out.
pub fn routes<S>(auth: Auth) -> Router<S> {
    Router::new()
        .route(COOKIE_ROUTE, get(status).post(sign_in).delete(sign_out))
        .with_state(auth)
}

async fn status(State(auth): State<Auth>, headers: HeaderMap) -> Response {
    let required = auth.required().await;
    let signed_in = match sign_in_cookie(&headers) {
        Some(cookie) if required => match auth.signed_in(&cookie).await {
            Ok(signed_in) => signed_in.is_some(),
            Err(problem) => return problem.into_response(),
        },
        _ => false,
    };
    no_store(Json(json!({ "required": required, "signed_in": signed_in })).into_response())
}

/// The longest token accepted for sign-in, in bytes.
const MAX_TOKEN_BYTES: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: String,
}

async fn sign_in(
    State(auth): State<Auth>,
    request_headers: HeaderMap,
    ApiJson(body): ApiJson<SignIn>,
) -> Result<Response, Problem> {
    let tokens = &auth.tokens;
    if !auth.required().await {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "auth-disabled",
            "this server has no API tokens: every route is open, there is nothing to sign in to",
        ));
    }
    if body.token.len() > MAX_TOKEN_BYTES {
        return Err(unauthorized_problem("the API token is not valid"));
    }
    // A deployment token is bound by an HMAC (the table tells nothing of it); a key by its id
    // (its revocation ends the sign-in).
    let value = new_cookie_value();
    let binding = if tokens.accepts(body.token.as_bytes()) {
        token_binding(&value, body.token.as_bytes())
    } else if body.token.starts_with(crate::principals::KEY_PREFIX) {
        match auth.principals.key_principal(&body.token).await {
            Ok(principal) => format!("{KEY_BINDING}{}", principal.id()),
            Err(PrincipalError::Store(error)) => return Err(Problem::from(error)),
            Err(_) => return Err(unauthorized_problem("the API key is not valid")),
        }
    } else {
        return Err(unauthorized_problem("the API token is not valid"));
    };
    let secure = match transport(&request_headers) {
        Transport::Https => "; Secure",
        Transport::LoopbackHttp => "",
        Transport::Http => {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "insecure-sign-in",
                "sign-in over plain http is accepted only on a loopback address (localhost, \
                 127.0.0.1, ::1): serve tah behind an https proxy (which sends \
                 X-Forwarded-Proto: https), or send Authorization: Bearer <token>",
            ))
        }
    };
    let now = now_ms();
    let sign_ins = auth.sign_ins()?;
    sign_ins
        .insert_sign_in(&NewSignIn {
            id: &sign_in_id(&value),
            token_binding: &binding,
            created_at: now,
            expires_at: now + COOKIE_MAX_AGE as i64 * 1000,
        })
        .await
        .map_err(Problem::from)?;
    if let Err(error) = sign_ins.purge_sign_ins(now).await {
        tracing::warn!(%error, "cannot forget expired sign-ins");
    }
    let cookie = format!(
        "{COOKIE_NAME}={}; Path=/; Max-Age={COOKIE_MAX_AGE}; HttpOnly; SameSite=Strict{secure}",
        encode_hex(&value)
    );
    Ok(with_cookie(StatusCode::NO_CONTENT.into_response(), cookie))
}

/// Deletes the request's sign-in, so its cookie is refused even if it is sent again, and
/// clears the cookie in the browser (also when the sign-in could not be deleted, which the
/// answer then says).
async fn sign_out(State(auth): State<Auth>, request_headers: HeaderMap) -> Response {
    let secure = match transport(&request_headers) {
        Transport::Https => "; Secure",
        Transport::LoopbackHttp | Transport::Http => "",
    };
    let deleted = match (sign_in_cookie(&request_headers), auth.sign_ins()) {
        (Some(cookie), Ok(sign_ins)) => sign_ins
            .delete_sign_in(&sign_in_id(&cookie))
            .await
            .map(|_| ())
            .map_err(Problem::from),
        (Some(_), Err(problem)) => Err(problem),
        (None, _) => Ok(()),
    };
    let response = match deleted {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(problem) => problem.into_response(),
    };
    with_cookie(
        response,
        format!("{COOKIE_NAME}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}"),
    )
}

/// `response`, setting `cookie`.
fn with_cookie(mut response: Response, cookie: String) -> Response {
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    no_store(response)
}

fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// How the browser reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Https,
    LoopbackHttp,
    Http,
}

/// https when the page's `Origin` is https, or a proxy says it terminated TLS (a client that
/// forges the proxy's header only makes its own cookie stricter).
fn transport(headers: &HeaderMap) -> Transport {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
    };
    let origin_https = text("origin").is_some_and(|o| o.starts_with("https://"));
    let proxy_https = text("x-forwarded-proto")
        .is_some_and(|p| p.split(',').next().is_some_and(|p| p.trim() == "https"))
        || text("forwarded").is_some_and(|f| {
            f.split([';', ',']).any(|part| {
                part.trim()
                    .strip_prefix("proto=")
                    .is_some_and(|p| p.trim_matches('"') == "https")
            })
        });
    if origin_https || proxy_https {
        Transport::Https
    } else if request_host(headers).is_some_and(|h| is_loopback_host(&h)) {
        Transport::LoopbackHttp
    } else {
        Transport::Http
    }
}

/// The `access_token` query parameter, accepted only on the SSE route (GET .../events).
fn sse_query_token(request: &Request) -> Option<String> {
    if request.method() != axum::http::Method::GET || !request.uri().path().ends_with("/events") {
        return None;
    }
    let query = request.uri().query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned())
}

fn unauthorized_problem(detail: &str) -> Problem {
    Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
}

fn unauthorized(detail: &str) -> Response {
    let mut response = unauthorized_problem(detail).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_exactly() {
        let tokens = Tokens::new(&[
            "0123456789abcdef".to_string(),
            "fedcba9876543210".to_string(),
        ]);
        assert!(tokens.accepts(b"0123456789abcdef"));
        assert!(tokens.accepts(b"fedcba9876543210"));
        assert!(!tokens.accepts(b"0123456789abcde"));
        assert!(!tokens.accepts(b"0123456789abcdeff"));
        assert!(!tokens.accepts(b""));
        assert!(!Tokens::new(&[]).enabled());
    }

    #[test]
    fn cookie_values_round_trip_through_hex() {
        let value = new_cookie_value();
        assert_ne!(value, new_cookie_value());
        let cookies = |pair: String| {
            let mut headers = HeaderMap::new();
            let line = format!("other=1; {pair}; x=y");
            headers.insert(header::COOKIE, HeaderValue::from_str(&line).unwrap());
            sign_in_cookie(&headers)
        };
        assert_eq!(
            cookies(format!("{COOKIE_NAME}={}", encode_hex(&value))),
            Some(value)
        );
        // Not 32 bytes of hex: not a sign-in cookie (the token itself, in hex, included).
        for other in [
            "00ff",
            "not-hex",
            "",
            &encode_hex(b"a-token-of-enough-length"),
        ] {
            assert_eq!(cookies(format!("{COOKIE_NAME}={other}")), None, "{other}");
        }
        for bad in ["", "abc", "zz", "0g"] {
            assert_eq!(decode_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_binding_names_its_token_and_only_for_its_cookie() {
        let tokens = Tokens::new(&["0123456789abcdef".into(), "fedcba9876543210".into()]);
        let value = new_cookie_value();
        let binding = token_binding(&value, b"fedcba9876543210");
        assert!(tokens.bound(&value, &binding));
        assert!(!tokens.bound(&new_cookie_value(), &binding));
        assert!(!Tokens::new(&["0123456789abcdef".into()]).bound(&value, &binding));
        assert!(!binding.contains(&encode_hex(b"fedcba9876543210")));
        assert_ne!(sign_in_id(&value), encode_hex(&value));
    }

    #[test]
    fn the_transport_decides_the_secure_flag() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        let loopback = [
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ];
        assert_eq!(transport(&headers(&loopback)), Transport::LoopbackHttp);
        assert_eq!(
            transport(&headers(&[("host", "localhost")])),
            Transport::LoopbackHttp
        );
        assert_eq!(
            transport(&headers(&[("host", "[::1]:9")])),
            Transport::LoopbackHttp
        );
        assert_eq!(
            transport(&headers(&[("host", "tah.example")])),
            Transport::Http
        );
        for https in [
            [("host", "tah.example"), ("origin", "https://tah.example")],
            [("host", "tah.example"), ("x-forwarded-proto", "https")],
            [
                ("host", "tah.example"),
                ("forwarded", "for=1.2.3.4;proto=https"),
            ],
            [("host", "localhost"), ("x-forwarded-proto", "HTTPS, http")],
        ] {
            assert_eq!(transport(&headers(&https)), Transport::Https, "{https:?}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "  BeArEr   abc  "] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearer", "Bearer ", "Bearerabc"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}

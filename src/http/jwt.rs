//! Bearer JWTs from an OpenID Connect provider (SPEC §17): verified against the provider's
//! JSON Web Key Set, and turned into a tenant member.
//!
//! Only RS256 and ES256 are accepted, and the header's `alg` must fit the key it names (an
//! RSA key for RS256, a P-256 key for ES256): `none` and the HMAC algorithms are refused
//! before any key is looked at, so a public key can never be used as an HMAC secret. The
//! token must carry `iss`, `aud` (a string or an array) and `exp` (`nbf` is checked when
//! present), with [`LEEWAY_SECS`] of clock skew allowed. The principal is
//! `Member { id: "jwt:<sub>", tenant: <tenant claim>, role: <role claim, default member> }`.
//!
//! The key set is fetched at first use and cached; it is fetched again when it is older than
//! [`MAX_AGE`], and when a token names a key it does not hold (the provider rotated its keys),
//! at most once per [`REFETCH_INTERVAL`] so that made-up `kid`s cannot make the server hammer
//! the provider. A token without `kid` is tried against every key of its algorithm.
//!
//! Every refusal is a [`JwtError`] whose text says which check failed; it never repeats the
//! token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::model::{valid_tenant, Principal, TenantRole};

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// How often, at most, a token naming an unknown key makes the key set be fetched again; also
/// how long a failed fetch is not retried.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(30);

/// How long a fetched key set is used before it is fetched again.
pub const MAX_AGE: Duration = Duration::from_secs(3600);

/// How long fetching the key set may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest key set accepted, in bytes.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// The longest `kid` repeated in an error.
const MAX_KID_SHOWN: usize = 64;

/// Where JWTs are verified and what their claims are read from (`--jwt-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// The provider's JSON Web Key Set (`--jwt-jwks-url`).
    pub jwks_url: String,
    /// The `iss` a token must carry (`--jwt-issuer`).
    pub issuer: String,
    /// A value the token's `aud` must hold (`--jwt-audience`).
    pub audience: String,
    /// The claim naming the principal's tenant (`--jwt-tenant-claim`, default `tenant`).
    pub tenant_claim: String,
    /// The claim naming its role (`--jwt-role-claim`, default `role`); absent: `member`.
    pub role_claim: String,
}

/// Why a bearer JWT was refused. The text says which check failed (it is the `401`'s detail)
/// and never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token's algorithm {0} is not accepted: only RS256 and ES256 are")]
    Algorithm(String),
    #[error("the token's header names critical extensions (crit), which are not supported")]
    Critical,
    #[error("the token names an unknown key (kid {0})")]
    UnknownKey(String),
    #[error("the token names no key (kid) and the key set has no {0} key")]
    NoKey(&'static str),
    #[error("the token's key (kid {kid}) is not an {alg} key")]
    KeyMismatch { kid: String, alg: &'static str },
    #[error("the token's signature is not valid")]
    Signature,
    #[error("the token expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token's issuer is not {0:?}")]
    Issuer(String),
    #[error("the token's audience does not include {0:?}")]
    Audience(String),
    #[error("the token has no `{0}` claim")]
    MissingClaim(String),
    #[error(
        "the token's `{0}` claim is not a tenant name (1 to 128 letters, digits, '-', '_' or '.')"
    )]
    Tenant(String),
    #[error("the token's `{0}` claim is not a role: admin, member or viewer")]
    Role(String),
    #[error("the key set (JWKS) to verify the token could not be fetched: {0}")]
    Jwks(String),
}

/// Verifies bearer JWTs against a provider's key set, which it fetches and caches. Cheap to
/// clone: clones share the cache.
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

struct Inner {
    settings: JwtSettings,
    http: reqwest::Client,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    keys: Vec<Key>,
    /// When the keys were last fetched (`None`: never).
    loaded_at: Option<Instant>,
    /// When an unknown key last made them be fetched again.
    refetched_at: Option<Instant>,
    /// The last failed fetch, when and why.
    failed: Option<(Instant, String)>,
}

/// One usable key of the set.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

impl JwtVerifier {
    /// A verifier that fetches the key set with `http`, at first use.
    pub fn new(settings: JwtSettings, http: reqwest::Client) -> JwtVerifier {
        JwtVerifier {
            inner: Arc::new(Inner {
                settings,
                http,
                cache: Mutex::new(Cache::default()),
            }),
        }
    }

    pub fn settings(&self) -> &JwtSettings {
        &self.inner.settings
    }

    /// Cheap shape test: three dot-separated base64url parts (the signature's may be empty,
    /// so that an unsigned token is refused by [`JwtVerifier::verify`] with a reason). `tah_`
    /// keys and session tokens never pass it.
    pub fn looks_like_jwt(token: &str) -> bool {
        let b64url = |part: &str| {
            part.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        let mut parts = token.split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(header), Some(claims), Some(signature), None) => {
                !header.is_empty()
                    && !claims.is_empty()
                    && b64url(header)
                    && b64url(claims)
                    && b64url(signature)
            }
            _ => false,
        }
    }

    /// The member a token speaks for, or which check it failed.
    pub async fn verify(&self, token: &str) -> Result<Principal, JwtError> {
        let (alg, kid) = read_header(token)?;
        let keys = self.keys_for(alg, kid.as_deref()).await?;
        let settings = &self.inner.settings;
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        for key in &keys {
            match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
                Ok(data) => return self.principal(&data.claims),
                // Without a kid, the next key of the algorithm may be the one.
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
                Err(e) => return Err(self.refusal(e.kind())),
            }
        }
        Err(JwtError::Signature)
    }

    /// What a validation error of the library means for the client.
    fn refusal(&self, kind: &ErrorKind) -> JwtError {
        let settings = &self.inner.settings;
        match kind {
            ErrorKind::ExpiredSignature => JwtError::Expired,
            ErrorKind::ImmatureSignature => JwtError::NotYetValid,
            ErrorKind::InvalidIssuer => JwtError::Issuer(settings.issuer.clone()),
            ErrorKind::InvalidAudience => JwtError::Audience(settings.audience.clone()),
            ErrorKind::MissingRequiredClaim(claim) => JwtError::MissingClaim(claim.clone()),
            ErrorKind::Base64(_)
            | ErrorKind::Json(_)
            | ErrorKind::Utf8(_)
            | ErrorKind::InvalidToken => JwtError::Malformed,
            // A key of the set that cannot verify (bad components), or a verification error.
            _ => JwtError::Signature,
        }
    }

    /// The member named by verified claims.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, JwtError> {
        let settings = &self.inner.settings;
        let sub = match claims.get("sub") {
            Some(Value::String(sub)) if !sub.is_empty() => sub,
            _ => return Err(JwtError::MissingClaim("sub".into())),
        };
        let tenant = match claims.get(&settings.tenant_claim) {
            None | Some(Value::Null) => {
                return Err(JwtError::MissingClaim(settings.tenant_claim.clone()))
            }
            Some(Value::String(tenant)) if valid_tenant(tenant) => tenant.clone(),
            Some(_) => return Err(JwtError::Tenant(settings.tenant_claim.clone())),
        };
        let role = match claims.get(&settings.role_claim) {
            None | Some(Value::Null) => TenantRole::Member,
            Some(Value::String(role)) => role
                .parse()
                .map_err(|_| JwtError::Role(settings.role_claim.clone()))?,
            Some(_) => return Err(JwtError::Role(settings.role_claim.clone())),
        };
        Ok(Principal::Member {
            id: format!("jwt:{sub}"),
            tenant,
            role,
        })
    }

    /// The keys a token of `alg` naming `kid` may be verified with, fetching the set when it
    /// was never fetched, is old, or lacks the key.
    async fn keys_for(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Vec<DecodingKey>, JwtError> {
        let mut cache = self.inner.cache.lock().await;
        let fresh = cache.loaded_at.is_some_and(|at| at.elapsed() < MAX_AGE);
        if !fresh {
            // An old set is still used when fetching a new one fails.
            if let Err(e) = self.fetch(&mut cache).await {
                if cache.loaded_at.is_none() {
                    return Err(e);
                }
            }
        }
        let found = select(&cache.keys, alg, kid);
        let missing = matches!(found, Err(JwtError::UnknownKey(_) | JwtError::NoKey(_)));
        let may_refetch = cache
            .refetched_at
            .is_none_or(|at| at.elapsed() >= REFETCH_INTERVAL);
        if !missing || !may_refetch || !fresh {
            // (A set fetched just now is not fetched again.)
            return found;
        }
        cache.refetched_at = Some(Instant::now());
        self.fetch(&mut cache).await?;
        select(&cache.keys, alg, kid)
    }

    /// Fetches the key set into the cache, unless a fetch failed less than
    /// [`REFETCH_INTERVAL`] ago (then that failure is the answer).
    async fn fetch(&self, cache: &mut Cache) -> Result<(), JwtError> {
        if let Some((at, why)) = &cache.failed {
            if at.elapsed() < REFETCH_INTERVAL {
                return Err(JwtError::Jwks(why.clone()));
            }
        }
        match self.download().await {
            Ok(keys) => {
                cache.keys = keys;
                cache.loaded_at = Some(Instant::now());
                cache.failed = None;
                Ok(())
            }
            Err(why) => {
                tracing::warn!(url = %self.inner.settings.jwks_url, error = %why, "could not fetch the JWKS");
                cache.failed = Some((Instant::now(), why.clone()));
                Err(JwtError::Jwks(why))
            }
        }
    }

    /// The usable keys of the set at the URL, or why there are none (said without the URL,
    /// which is logged instead).
    async fn download(&self) -> Result<Vec<Key>, String> {
        let url = &self.inner.settings.jwks_url;
        let mut response = self
            .inner
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| match e.is_timeout() {
                true => "the provider did not answer in time".to_string(),
                false => "the provider could not be reached".to_string(),
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the provider answered HTTP {}", status.as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|_| "the provider's answer was cut short".to_string())?
        {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("the key set is over {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let set: Value = serde_json::from_slice(&body)
            .map_err(|_| "the provider's answer is not JSON".to_string())?;
        let Some(Value::Array(entries)) = set.get("keys") else {
            return Err("the provider's answer has no \"keys\" array".to_string());
        };
        Ok(entries.iter().filter_map(parse_jwk).collect())
    }
}

/// The algorithm and `kid` of a token's header, refusing every algorithm but RS256 and ES256.
fn read_header(token: &str) -> Result<(Algorithm, Option<String>), JwtError> {
    let encoded = token.split('.').next().unwrap_or_default();
    let header: Map<String, Value> = URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or(JwtError::Malformed)?;
    let alg = match header.get("alg") {
        Some(Value::String(alg)) => match alg.as_str() {
            "RS256" => Algorithm::RS256,
            "ES256" => Algorithm::ES256,
            other => return Err(JwtError::Algorithm(shown(other))),
        },
        _ => return Err(JwtError::Malformed),
    };
    // RFC 7515 §4.1.11: a recipient that does not understand every extension listed as
    // critical must refuse the token; none is understood here.
    if header.contains_key("crit") {
        return Err(JwtError::Critical);
    }
    let kid = match header.get("kid") {
        None | Some(Value::Null) => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(JwtError::Malformed),
    };
    Ok((alg, kid))
}

/// The keys of `keys` that may verify a token of `alg` naming `kid`.
fn select(keys: &[Key], alg: Algorithm, kid: Option<&str>) -> Result<Vec<DecodingKey>, JwtError> {
    let name = alg_name(alg);
    match kid {
        Some(kid) => match keys.iter().find(|k| k.kid.as_deref() == Some(kid)) {
            None => Err(JwtError::UnknownKey(format!("{:?}", shown(kid)))),
            Some(key) if key.alg != alg => Err(JwtError::KeyMismatch {
                kid: format!("{:?}", shown(kid)),
                alg: name,
            }),
            Some(key) => Ok(vec![key.key.clone()]),
        },
        None => {
            let fitting: Vec<DecodingKey> = keys
                .iter()
                .filter(|k| k.alg == alg)
                .map(|k| k.key.clone())
                .collect();
            match fitting.is_empty() {
                true => Err(JwtError::NoKey(name)),
                false => Ok(fitting),
            }
        }
    }
}

/// A key of the set, if it is one for signatures of RS256 or ES256 (others are skipped: a set
/// may hold encryption keys and algorithms tah does not take).
fn parse_jwk(jwk: &Value) -> Option<Key> {
    let field = |name: &str| jwk.get(name).and_then(Value::as_str);
    if field("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let (alg, key) = match field("kty")? {
        "RSA" => (
            Algorithm::RS256,
            DecodingKey::from_rsa_components(field("n")?, field("e")?).ok()?,
        ),
        "EC" if field("crv") == Some("P-256") => {
            let (x, y) = (field("x")?, field("y")?);
            let coordinate = |c: &str| URL_SAFE_NO_PAD.decode(c).is_ok_and(|b| b.len() == 32);
            if !coordinate(x) || !coordinate(y) {
                return None;
            }
            (
                Algorithm::ES256,
                DecodingKey::from_ec_components(x, y).ok()?,
            )
        }
        _ => return None,
    };
    if field("alg").is_some_and(|a| a != alg_name(alg)) {
        return None;
    }
    Some(Key {
        kid: field("kid").map(str::to_string),
        alg,
        key,
    })
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::ES256 => "ES256",
        _ => "RS256",
    }
}

/// A value from the token, cut short and with anything but printable ASCII replaced, for an
/// error's text.
fn shown(value: &str) -> String {
    value
        .chars()
        .take(MAX_KID_SHOWN)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::{Json, Router};
    use base64::engine::general_purpose::STANDARD;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://idp.example.com/";
    const AUDIENCE: &str = "tah";

    /// A JWKS endpoint whose answer the test changes, counting the fetches.
    struct Provider {
        jwks: std::sync::Mutex<Value>,
        status: AtomicU16,
        fetches: AtomicUsize,
    }

    impl Provider {
        fn fetches(&self) -> usize {
            self.fetches.load(Ordering::SeqCst)
        }
    }

    async fn serve_jwks(jwks: &str) -> (Arc<Provider>, String) {
        let provider = Arc::new(Provider {
            jwks: std::sync::Mutex::new(serde_json::from_str(jwks).expect("fixture JWKS")),
            status: AtomicU16::new(200),
            fetches: AtomicUsize::new(0),
        });
        let router = Router::new()
            .route(
                "/jwks",
                get(|State(p): State<Arc<Provider>>| async move {
                    p.fetches.fetch_add(1, Ordering::SeqCst);
                    let status =
                        StatusCode::from_u16(p.status.load(Ordering::SeqCst)).expect("status");
                    let body = p.jwks.lock().expect("jwks").clone();
                    (status, Json(body))
                }),
            )
            .with_state(provider.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let url = format!("http://{}/jwks", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, router).await });
        (provider, url)
    }

    fn settings(jwks_url: &str) -> JwtSettings {
        JwtSettings {
            jwks_url: jwks_url.into(),
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            tenant_claim: "tenant".into(),
            role_claim: "role".into(),
        }
    }

    fn verifier(jwks_url: &str) -> JwtVerifier {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        JwtVerifier::new(settings(jwks_url), http)
    }

    /// The DER inside a PEM file.
    fn pem_der(pem: &str) -> Vec<u8> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        STANDARD.decode(body).expect("PEM base64")
    }

    /// One DER item: its content, and what follows it.
    fn der_item(der: &[u8]) -> (&[u8], &[u8]) {
        let (len, start) = match der[1] {
            n if n < 0x80 => (n as usize, 2),
            n => {
                let bytes = (n & 0x7f) as usize;
                let len = der[2..2 + bytes]
                    .iter()
                    .fold(0usize, |acc, b| acc << 8 | *b as usize);
                (len, 2 + bytes)
            }
        };
        (&der[start..start + len], &der[start + len..])
    }

    /// The PKCS#1 key inside a PKCS#8 one (PrivateKeyInfo: version, algorithm, key), which
    /// is what the library signs RS256 with.
    fn pkcs1(pkcs8: &[u8]) -> Vec<u8> {
        let (info, _) = der_item(pkcs8);
        let (_version, rest) = der_item(info);
        let (_algorithm, rest) = der_item(rest);
        let (key, _) = der_item(rest);
        key.to_vec()
    }

    fn rsa_key() -> EncodingKey {
        let pem = include_str!("../../tests/fixtures/jwt/rsa.pem");
        EncodingKey::from_rsa_der(&pkcs1(&pem_der(pem)))
    }

    fn other_rsa_key() -> EncodingKey {
        let pem = include_str!("../../tests/fixtures/jwt/rsa-other.pem");
        EncodingKey::from_rsa_der(&pkcs1(&pem_der(pem)))
    }

    fn ec_key() -> EncodingKey {
        let pem = include_str!("../../tests/fixtures/jwt/ec.pem");
        EncodingKey::from_ec_der(&pem_der(pem))
    }

    const JWKS: &str = include_str!("../../tests/fixtures/jwt/jwks.json");
    const JWKS_ROTATED: &str = include_str!("../../tests/fixtures/jwt/jwks-rotated.json");

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    /// Valid claims, changed by `changes` (a null removes a claim).
    fn claims(changes: Value) -> Value {
        let mut claims = json!({
            "sub": "user-1",
            "iss": ISSUER,
            "aud": AUDIENCE,
            "exp": now() + 300,
            "iat": now(),
            "tenant": "acme",
        });
        for (name, value) in changes.as_object().expect("object") {
            match value {
                Value::Null => claims.as_object_mut().expect("object").remove(name),
                value => claims
                    .as_object_mut()
                    .expect("object")
                    .insert(name.clone(), value.clone()),
            };
        }
        claims
    }

    fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&header, claims, key).expect("sign")
    }

    fn rs256(claims: &Value) -> String {
        sign(Algorithm::RS256, Some("rsa-1"), &rsa_key(), claims)
    }

    fn member(tenant: &str, role: TenantRole) -> Principal {
        Principal::Member {
            id: "jwt:user-1".into(),
            tenant: tenant.into(),
            role,
        }
    }

    /// The refusal of a token, checked not to repeat it.
    async fn refusal(verifier: &JwtVerifier, token: &str) -> String {
        let error = verifier.verify(token).await.expect_err("refused");
        let text = error.to_string();
        assert!(!text.contains(token), "{text}");
        text
    }

    #[tokio::test]
    async fn rs256_and_es256_tokens_name_a_member_of_their_tenant_and_the_set_is_cached() {
        let (provider, url) = serve_jwks(JWKS).await;
        let verifier = verifier(&url);
        assert_eq!(
            verifier.verify(&rs256(&claims(json!({})))).await,
            Ok(member("acme", TenantRole::Member))
        );
        let es256 = sign(
            Algorithm::ES256,
            Some("ec-1"),
            &ec_key(),
            &claims(json!({"role": "admin", "aud": ["other", AUDIENCE]})),
        );
        assert_eq!(
            verifier.verify(&es256).await,
            Ok(member("acme", TenantRole::Admin))
        );
        // Without a kid, the keys of the token's algorithm are tried.
        for (alg, key) in [(Algorithm::RS256, rsa_key()), (Algorithm::ES256, ec_key())] {
            let token = sign(alg, None, &key, &claims(json!({"role": "viewer"})));
            assert_eq!(
                verifier.verify(&token).await,
                Ok(member("acme", TenantRole::Viewer)),
                "{alg:?}"
            );
        }
        // Expired a moment ago, within the leeway.
        let token = rs256(&claims(json!({"exp": now() - 5})));
        assert!(verifier.verify(&token).await.is_ok());
        assert_eq!(provider.fetches(), 1, "the key set is fetched once");
        assert!(JwtVerifier::looks_like_jwt(&es256));
    }

    #[tokio::test]
    async fn each_refusal_names_the_check_that_failed() {
        let (provider, url) = serve_jwks(JWKS).await;
        let verifier = verifier(&url);
        let cases: Vec<(String, &str)> = vec![
            (
                sign(
                    Algorithm::RS256,
                    Some("rsa-1"),
                    &other_rsa_key(),
                    &claims(json!({})),
                ),
                "the token's signature is not valid",
            ),
            (
                // The signature is checked first.
                sign(
                    Algorithm::RS256,
                    Some("rsa-1"),
                    &other_rsa_key(),
                    &claims(json!({"exp": now() - 3600})),
                ),
                "the token's signature is not valid",
            ),
            (
                sign(Algorithm::RS256, None, &other_rsa_key(), &claims(json!({}))),
                "the token's signature is not valid",
            ),
            (
                rs256(&claims(json!({"iss": "https://evil.example.com/"}))),
                "the token's issuer is not \"https://idp.example.com/\"",
            ),
            (
                rs256(&claims(json!({"aud": "someone-else"}))),
                "the token's audience does not include \"tah\"",
            ),
            (
                rs256(&claims(json!({"aud": ["a", "b"]}))),
                "the token's audience does not include \"tah\"",
            ),
            (
                rs256(&claims(json!({"exp": now() - 120}))),
                "the token expired",
            ),
            (
                rs256(&claims(json!({"exp": null}))),
                "the token has no `exp` claim",
            ),
            (
                rs256(&claims(json!({"aud": null}))),
                "the token has no `aud` claim",
            ),
            (
                rs256(&claims(json!({"iss": null}))),
                "the token has no `iss` claim",
            ),
            (
                rs256(&claims(json!({"sub": null}))),
                "the token has no `sub` claim",
            ),
            (
                rs256(&claims(json!({"nbf": now() + 600}))),
                "the token is not valid yet (nbf)",
            ),
            (
                rs256(&claims(json!({"tenant": null}))),
                "the token has no `tenant` claim",
            ),
            (
                rs256(&claims(json!({"tenant": "a b"}))),
                "the token's `tenant` claim is not a tenant name",
            ),
            (
                rs256(&claims(json!({"tenant": 7}))),
                "the token's `tenant` claim is not a tenant name",
            ),
            (
                rs256(&claims(json!({"role": "owner"}))),
                "the token's `role` claim is not a role: admin, member or viewer",
            ),
            (
                rs256(&claims(json!({"role": ["admin"]}))),
                "the token's `role` claim is not a role",
            ),
            (
                sign(
                    Algorithm::HS256,
                    Some("rsa-1"),
                    &EncodingKey::from_secret(b"a shared secret"),
                    &claims(json!({})),
                ),
                "the token's algorithm HS256 is not accepted: only RS256 and ES256 are",
            ),
            (
                format!(
                    "{}.{}.",
                    URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
                    URL_SAFE_NO_PAD.encode(claims(json!({})).to_string())
                ),
                "the token's algorithm none is not accepted",
            ),
            (
                // An ES256 header on the RSA key's kid.
                sign(
                    Algorithm::ES256,
                    Some("rsa-1"),
                    &ec_key(),
                    &claims(json!({})),
                ),
                "the token's key (kid \"rsa-1\") is not an ES256 key",
            ),
            (
                format!(
                    "{}.{}.c2ln",
                    URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"rsa-1","crit":["exp"]}"#),
                    URL_SAFE_NO_PAD.encode(claims(json!({})).to_string())
                ),
                "the token's header names critical extensions (crit)",
            ),
            (
                format!(
                    "{}.{}.c2ln",
                    URL_SAFE_NO_PAD.encode(r#"{"alg":"RS\u0007256"}"#),
                    URL_SAFE_NO_PAD.encode(claims(json!({})).to_string())
                ),
                "the token's algorithm RS?256 is not accepted",
            ),
            (
                "e30.e30.c2ln".to_string(),
                "the token is not a well-formed JWT",
            ),
            ("x.y.z".to_string(), "the token is not a well-formed JWT"),
        ];
        for (token, expected) in &cases {
            let text = refusal(&verifier, token).await;
            assert!(text.starts_with(expected), "{text:?} is not {expected:?}");
        }
        assert_eq!(provider.fetches(), 1, "a known kid makes no fetch");
        // Unknown roles and the viewer's and admin's are read as such.
        for (role, expected) in [
            ("viewer", TenantRole::Viewer),
            ("admin", TenantRole::Admin),
            ("member", TenantRole::Member),
        ] {
            let token = rs256(&claims(json!({ "role": role })));
            assert_eq!(verifier.verify(&token).await, Ok(member("acme", expected)));
        }
    }

    #[tokio::test]
    async fn an_unknown_kid_refetches_the_set_once_then_is_refused() {
        let (provider, url) = serve_jwks(JWKS).await;
        let verifier = verifier(&url);
        assert!(verifier.verify(&rs256(&claims(json!({})))).await.is_ok());
        assert_eq!(provider.fetches(), 1);
        let token = sign(
            Algorithm::RS256,
            Some("nope"),
            &rsa_key(),
            &claims(json!({})),
        );
        assert_eq!(
            refusal(&verifier, &token).await,
            "the token names an unknown key (kid \"nope\")"
        );
        assert_eq!(provider.fetches(), 2, "one refetch for the unknown kid");
        let token = sign(
            Algorithm::RS256,
            Some("nope-2"),
            &rsa_key(),
            &claims(json!({})),
        );
        assert_eq!(
            refusal(&verifier, &token).await,
            "the token names an unknown key (kid \"nope-2\")"
        );
        assert_eq!(provider.fetches(), 2, "no second refetch within 30 s");
    }

    #[tokio::test]
    async fn a_rotated_key_verifies_after_the_refetch() {
        let (provider, url) = serve_jwks(JWKS).await;
        let verifier = verifier(&url);
        assert!(verifier.verify(&rs256(&claims(json!({})))).await.is_ok());
        *provider.jwks.lock().expect("jwks") =
            serde_json::from_str(JWKS_ROTATED).expect("fixture JWKS");
        let token = sign(
            Algorithm::RS256,
            Some("rsa-2"),
            &other_rsa_key(),
            &claims(json!({})),
        );
        assert_eq!(
            verifier.verify(&token).await,
            Ok(member("acme", TenantRole::Member))
        );
        assert_eq!(provider.fetches(), 2);
        // The old key is gone with the old set.
        assert_eq!(
            refusal(&verifier, &rs256(&claims(json!({})))).await,
            "the token names an unknown key (kid \"rsa-1\")"
        );
        assert_eq!(provider.fetches(), 2);
    }

    #[tokio::test]
    async fn a_key_set_that_cannot_be_fetched_is_said_so_and_not_hammered() {
        let (provider, url) = serve_jwks(JWKS).await;
        provider.status.store(503, Ordering::SeqCst);
        let verifier = verifier(&url);
        let token = rs256(&claims(json!({})));
        for _ in 0..2 {
            assert_eq!(
                refusal(&verifier, &token).await,
                "the key set (JWKS) to verify the token could not be fetched: the provider \
                 answered HTTP 503"
            );
        }
        assert_eq!(
            provider.fetches(),
            1,
            "a failed fetch is not retried at once"
        );

        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
            listener.local_addr().expect("addr")
        };
        let verifier = self::verifier(&format!("http://{closed}/jwks"));
        assert_eq!(
            refusal(&verifier, &token).await,
            "the key set (JWKS) to verify the token could not be fetched: the provider could \
             not be reached"
        );
    }

    #[tokio::test]
    async fn the_claims_read_are_the_ones_configured() {
        let (_provider, url) = serve_jwks(JWKS).await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let verifier = JwtVerifier::new(
            JwtSettings {
                tenant_claim: "org".into(),
                role_claim: "https://tah.example/role".into(),
                ..settings(&url)
            },
            http,
        );
        let token = rs256(&claims(
            json!({"tenant": null, "org": "globex", "https://tah.example/role": "viewer"}),
        ));
        assert_eq!(
            verifier.verify(&token).await,
            Ok(member("globex", TenantRole::Viewer))
        );
        assert_eq!(
            refusal(&verifier, &rs256(&claims(json!({})))).await,
            "the token has no `org` claim"
        );
    }

    #[test]
    fn only_three_base64url_parts_look_like_a_jwt() {
        assert!(JwtVerifier::looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(
            JwtVerifier::looks_like_jwt("eyJh.eyJz."),
            "unsigned: refused later"
        );
        for not in [
            "",
            "tah_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "tahs_0123456789abcdef",
            "a.b",
            "a.b.c.d",
            ".b.c",
            "a..c",
            "a b.c.d",
            "a+b.c.d",
            "a.b.c=",
        ] {
            assert!(!JwtVerifier::looks_like_jwt(not), "{not:?}");
        }
    }
}

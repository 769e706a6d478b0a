//! Bearer JWTs end to end (SPEC §17): a server started with `--jwt-*` verifies tokens against
//! a JWKS served here, takes the principal from `sub` and its tenant and role from claims, and
//! answers a `401` that says which check failed. Tokens are signed with the verifier's fixture
//! key (`tests/fixtures/jwt/ec.pem`, kid `ec-1`, ES256).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{ServerOptions, TestServer};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "tah";

/// Serves the fixture key set on loopback; answers its URL.
async fn serve_jwks() -> String {
    let jwks = include_str!("../fixtures/jwt/jwks.json");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route(
        "/jwks",
        get(move || async move { ([("content-type", "application/json")], jwks) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/jwks")
}

/// The fixture EC key as PKCS#8 DER.
fn ec_key() -> EncodingKey {
    let pem = include_str!("../fixtures/jwt/ec.pem");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("the fixture is base64");
    EncodingKey::from_ec_der(&der)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token for `sub` with `claims` added (they replace the defaults).
fn token(sub: &str, claims: Value) -> String {
    let mut body = json!({
        "sub": sub,
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": now() + 600,
        "tenant": "acme",
    });
    for (k, v) in claims.as_object().unwrap() {
        body[k] = v.clone();
    }
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("ec-1".into());
    encode(&header, &body, &ec_key()).expect("sign")
}

async fn server() -> TestServer {
    let jwks = serve_jwks().await;
    TestServer::start(ServerOptions::new().args(&[
        "--jwt-jwks-url",
        &jwks,
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        AUDIENCE,
    ]))
    .await
}

async fn call(
    server: &TestServer,
    method: Method,
    path: &str,
    bearer: &str,
) -> (StatusCode, Value) {
    let reply = server
        .send(
            server
                .request(method, path)
                .bearer_auth(bearer)
                .json(&json!({})),
        )
        .await;
    (reply.status, reply.body)
}

#[tokio::test]
async fn a_jwt_is_a_principal_of_its_tenant_and_a_bad_one_says_which_check_failed() {
    let server = server().await;
    let alice = token("alice", json!({}));
    let (status, session) = call(&server, Method::POST, "/v1/sessions", &alice).await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    assert_eq!(session["tenant"], "acme");
    assert_eq!(session["owner"], "jwt:alice");
    let id = session["id"].as_str().unwrap().to_string();
    let path = format!("/v1/sessions/{id}");

    // Another member of the tenant does not see alice's session; a viewer reads it; another
    // tenant's admin does not see it.
    let bob = token("bob", json!({}));
    assert_eq!(
        call(&server, Method::GET, &path, &bob).await.0,
        StatusCode::NOT_FOUND
    );
    let viewer = token("carol", json!({"role": "viewer"}));
    assert_eq!(
        call(&server, Method::GET, &path, &viewer).await.0,
        StatusCode::OK
    );
    let (status, _) = call(&server, Method::POST, &format!("{path}/runs"), &viewer).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let other = token("dave", json!({"tenant": "globex", "role": "admin"}));
    assert_eq!(
        call(&server, Method::GET, &path, &other).await.0,
        StatusCode::NOT_FOUND
    );

    // Each refusal names its check, and never repeats the token.
    for (claims, says) in [
        (json!({"exp": now() - 3600}), "expired"),
        (json!({"aud": "someone-else"}), "audience"),
        (json!({"iss": "https://elsewhere.test"}), "issuer"),
        (json!({"tenant": null}), "tenant"),
    ] {
        let bad = token("alice", claims.clone());
        let (status, problem) = call(&server, Method::GET, &path, &bad).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{claims}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{claims}: {detail}");
        assert!(!detail.contains(&bad), "the detail repeats the token");
    }
    // A signature that does not verify: the payload changed after signing.
    let mut parts: Vec<String> = alice.split('.').map(str::to_string).collect();
    parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 600, "tenant": "acme", "role": "admin"}).to_string());
    let forged = parts.join(".");
    let (status, problem) = call(&server, Method::GET, &path, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("signature"),
        "{problem}"
    );
    // And no credential at all: authentication is required once JWTs are configured.
    let reply = server
        .send(server.request(Method::GET, "/v1/sessions"))
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}

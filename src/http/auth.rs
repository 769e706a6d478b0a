//! Bearer-token authentication for `/v1` routes, compared in constant time. Browsers'
//! EventSource cannot send headers, so the SSE route also accepts an `access_token` query
//! parameter (which is never logged: request spans record the path only).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::problem::Problem;

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
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

pub async fn require_token(State(tokens): State<Tokens>, request: Request, next: Next) -> Response {
    if !tokens.enabled() || !request.uri().path().starts_with("/v1/") {
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(|t| t.as_bytes().to_vec());
    let candidate = bearer.or_else(|| sse_query_token(&request));
    match candidate {
        Some(token) if tokens.accepts(&token) => next.run(request).await,
        Some(_) => unauthorized("the API token is not valid"),
        None => {
            unauthorized("this server requires an API token: send Authorization: Bearer <token>")
        }
    }
}

/// The `access_token` query parameter, accepted only on the SSE route (GET .../events).
fn sse_query_token(request: &Request) -> Option<Vec<u8>> {
    if request.method() != axum::http::Method::GET || !request.uri().path().ends_with("/events") {
        return None;
    }
    let query = request.uri().query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "access_token")
        .map(|(_, v)| v.into_owned().into_bytes())
}

fn unauthorized(detail: &str) -> Response {
    let mut response =
        Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
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
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer abc", "bearer abc", "BEARER abc", "  BeArEr   abc  "] {
            assert_eq!(bearer_token(value), Some("abc"), "{value}");
        }
        for value in ["Basic abc", "Bearer", "Bearer ", "Bearerabc"] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }
}

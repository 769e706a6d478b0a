//! Who is calling, for handlers: [`Caller`] is the [`Principal`] that authentication resolved
//! for the request (an operator when the server requires no token).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;

use super::problem::Problem;
use crate::model::{Denied, Principal};

/// The request's principal.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Problem> {
        Ok(Caller(
            parts
                .extensions
                .get::<Principal>()
                .cloned()
                .unwrap_or(Principal::Operator),
        ))
    }
}

/// The problem for a principal that may not do what it asked: `what` is the resource in
/// words ("session", "agent"), for the `404` that hides it.
pub fn denied(denied: Denied, what: &str) -> Problem {
    match denied {
        Denied::Hidden => Problem::not_found(format!("{what} not found")),
        Denied::Forbidden => forbidden(format!(
            "this principal may not do this to the {what}: its role or token scope does not \
             allow it"
        )),
    }
}

/// A `403`: the principal is known, and may not do this.
pub fn forbidden(detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::FORBIDDEN, "forbidden", detail)
}

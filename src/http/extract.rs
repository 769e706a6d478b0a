//! Typed path parameters: [`Ids`] parses a route's ids into their types, so no handler parses
//! an id by hand. A malformed id is a `404` problem on every route: no such resource can exist.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::problem::Problem;
use crate::model::PathId;

/// The ids of a route's path, in the order the route names them: `Ids<SessionId>` for
/// `/v1/sessions/{id}/…`, `Ids<(SessionId, RunId)>` for `/v1/sessions/{id}/runs/{run_id}`.
/// Parameters after the ones asked for are not read.
#[derive(Debug, Clone)]
pub struct Ids<T>(pub T);

/// What [`Ids`] can extract: one id, or a tuple of them.
pub trait FromSegments: Sized {
    fn from_segments(segments: &[(String, String)]) -> Result<Self, Problem>;
}

fn segment<T: PathId>(segments: &[(String, String)], at: usize) -> Result<T, Problem> {
    segments
        .get(at)
        .and_then(|(_, raw)| T::parse(raw))
        .ok_or_else(|| Problem::not_found(T::malformed()))
}

impl<T: PathId> FromSegments for T {
    fn from_segments(segments: &[(String, String)]) -> Result<T, Problem> {
        segment(segments, 0)
    }
}

impl<A: PathId, B: PathId> FromSegments for (A, B) {
    fn from_segments(segments: &[(String, String)]) -> Result<(A, B), Problem> {
        Ok((segment(segments, 0)?, segment(segments, 1)?))
    }
}

impl<S, T> FromRequestParts<S> for Ids<T>
where
    S: Send + Sync,
    T: FromSegments,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Ids<T>, Response> {
        // A path that is no text at all is refused as the framework refuses it (and made a
        // problem like every error the framework answers).
        let Path(segments) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        T::from_segments(&segments)
            .map(Ids)
            .map_err(IntoResponse::into_response)
    }
}

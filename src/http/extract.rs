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

#[cfg(test)]
mod tests {
    use axum::body::{to_bytes, Body};
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use axum::Router;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::model::{CallId, SessionId, MAX_CALL_ID_CHARS};

    fn router() -> Router {
        Router::new()
            .route(
                "/s/{id}",
                get(|Ids(id): Ids<SessionId>| async move { id.to_string() }),
            )
            .route(
                "/s/{id}/calls/{call_id}",
                get(|Ids((id, call)): Ids<(SessionId, CallId)>| async move {
                    format!("{id} {call}")
                }),
            )
    }

    async fn get_path(path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(Body::empty()).expect("a request");
        let response = router().oneshot(request).await.expect("an answer");
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn detail(body: &str) -> String {
        let problem: Value = serde_json::from_str(body).expect("a problem+json body");
        problem["detail"].as_str().unwrap_or_default().to_string()
    }

    #[tokio::test]
    async fn ids_parse_into_their_types() {
        let id = uuid::Uuid::now_v7();
        assert_eq!(
            get_path(&format!("/s/{id}")).await,
            (StatusCode::OK, id.to_string())
        );
        let (status, body) = get_path(&format!("/s/{id}/calls/call_%C3%A9t%C3%A9")).await;
        assert_eq!((status, body), (StatusCode::OK, format!("{id} call_été")));
    }

    #[tokio::test]
    async fn a_malformed_id_is_a_404_problem_naming_what_it_is_not() {
        for path in ["/s/not-a-uuid", "/s/123", "/s/%00"] {
            let (status, body) = get_path(path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
            assert_eq!(detail(&body), "session not found: not a valid id", "{path}");
        }
        // The first id is checked before the second.
        let (status, body) = get_path("/s/nope/calls/c1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(detail(&body), "session not found: not a valid id");
    }

    #[tokio::test]
    async fn a_call_id_longer_than_any_call_has_names_no_call() {
        let id = uuid::Uuid::now_v7();
        let longest = "c".repeat(MAX_CALL_ID_CHARS);
        let (status, _) = get_path(&format!("/s/{id}/calls/{longest}")).await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = get_path(&format!("/s/{id}/calls/{longest}c")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(detail(&body), "no call with this call_id");
    }
}

//! `/v1/sessions/{id}/artifacts`: the files a session's tools produced, as a list (the newest
//! version of each path, or every version), one artifact's record, and its bytes.
//!
//! The bytes are served as a download (`Content-Disposition: attachment`), never for the
//! browser to render in this origin: a page the model wrote must not run next to the API
//! (and its cookie), so the answer also forbids sniffing and sandboxes whatever is opened.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::extract::Ids;
use super::paging::{page_by_id, CursorQuery, Page};
use super::problem::{ApiQuery, Problem};
use super::AppState;
use crate::model::ArtifactRecord;
use crate::model::{ArtifactId, SessionId};
use crate::session::{ArtifactQuery, ArtifactVersions};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions/{id}/artifacts", get(list))
        .route("/v1/sessions/{id}/artifacts/{artifact_id}", get(show))
        .route(
            "/v1/sessions/{id}/artifacts/{artifact_id}/content",
            get(content),
        )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Every version of every path, not only the newest of each.
    #[serde(default, deserialize_with = "super::params::lenient_bool")]
    all: Option<bool>,
    cursor: Option<String>,
    limit: Option<i64>,
}

async fn list(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<ArtifactRecord>>, Problem> {
    let versions = match q.all {
        Some(true) => ArtifactVersions::All,
        Some(false) | None => ArtifactVersions::Newest,
    };
    let paging = CursorQuery {
        cursor: q.cursor,
        limit: q.limit,
    };
    let read = |id, after, limit| {
        let query = ArtifactQuery {
            versions,
            after,
            limit,
        };
        state.sessions.artifacts_page(id, query)
    };
    page_by_id(&state, id, &paging, read, |a| a.id).await
}

/// The artifact `artifact_id` of session `id`: 404 for an unknown (or malformed) id of either.
async fn find(state: &AppState, id: Uuid, artifact_id: Uuid) -> Result<ArtifactRecord, Problem> {
    state.sessions.get(id).await?;
    state
        .sessions
        .artifact(id, artifact_id)
        .await?
        .ok_or_else(|| Problem::not_found("artifact not found"))
}

async fn show(
    State(state): State<AppState>,
    Ids((SessionId(id), ArtifactId(artifact_id))): Ids<(SessionId, ArtifactId)>,
) -> Result<Json<ArtifactRecord>, Problem> {
    Ok(Json(find(&state, id, artifact_id).await?))
}

async fn content(
    State(state): State<AppState>,
    Ids((SessionId(id), ArtifactId(artifact_id))): Ids<(SessionId, ArtifactId)>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let artifact = find(&state, id, artifact_id).await?;
    let etag = format!("\"{}\"", artifact.sha256);
    let mut response = if matches_etag(&headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let bytes = state
            .sessions
            .blob(&artifact.sha256)
            .await?
            .ok_or_else(|| {
                // A record whose bytes are gone: the store lost them (never written so).
                tracing::error!(artifact_id = %artifact.id, sha256 = %artifact.sha256, "an artifact's bytes are missing");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "storage",
                    "the artifact's content is missing from the database",
                )
            })?;
        let mut response = bytes.into_response();
        let media_type = HeaderValue::from_str(&artifact.media_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, media_type);
        response
    };
    let headers = response.headers_mut();
    // The hex digest of the bytes: always a valid header value.
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    // Kept by the client's own cache only (a shared one would serve it without the token),
    // which asks again with the ETag.
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    if let Ok(value) = HeaderValue::from_str(&content_disposition(&artifact.path)) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    Ok(response)
}

/// Whether `If-None-Match` names `etag` (or is `*`): entity tags compare weakly, as RFC 9110
/// says for this header.
fn matches_etag(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

/// `attachment` with the path's last segment as the file name: a plain quoted name that any
/// client reads (non-ASCII, quotes, backslashes and `%`, which some clients decode, replaced),
/// and when the name is not plain also its exact UTF-8 form as `filename*` (RFC 6266, RFC 8187).
fn content_disposition(path: &str) -> String {
    let name = path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("artifact");
    let fallback: String = name
        .chars()
        .map(|c| match c {
            ' '..='~' if !matches!(c, '"' | '\\' | '%') => c,
            _ => '_',
        })
        .collect();
    if fallback == name {
        return format!("attachment; filename=\"{name}\"");
    }
    format!(
        "attachment; filename=\"{fallback}\"; filename*=UTF-8''{}",
        ext_value(name)
    )
}

/// Percent-encodes every byte of `name` that is not an RFC 5987 `attr-char`.
fn ext_value(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'!'
            | b'#'
            | b'$'
            | b'&'
            | b'+'
            | b'-'
            | b'.'
            | b'^'
            | b'_'
            | b'`'
            | b'|'
            | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_quoted_and_others_get_their_utf8_form_too() {
        assert_eq!(
            content_disposition("docs/notes.md"),
            "attachment; filename=\"notes.md\""
        );
        assert_eq!(
            content_disposition("a b.txt"),
            "attachment; filename=\"a b.txt\""
        );
        assert_eq!(
            content_disposition("docs/résumé 1.md"),
            "attachment; filename=\"r_sum_ 1.md\"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.md"
        );
        assert_eq!(
            content_disposition("say \"hi\"\\.txt"),
            "attachment; filename=\"say _hi__.txt\"; filename*=UTF-8''say%20%22hi%22%5C.txt"
        );
        assert_eq!(
            content_disposition("100%.txt"),
            "attachment; filename=\"100_.txt\"; filename*=UTF-8''100%25.txt"
        );
        assert_eq!(
            content_disposition("line\nbreak.txt"),
            "attachment; filename=\"line_break.txt\"; filename*=UTF-8''line%0Abreak.txt"
        );
        assert_eq!(
            content_disposition("日本.txt"),
            "attachment; filename=\"__.txt\"; filename*=UTF-8''%E6%97%A5%E6%9C%AC.txt"
        );
    }

    #[test]
    fn if_none_match_compares_weakly_and_takes_lists_and_stars() {
        let etag = "\"abc\"";
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::IF_NONE_MATCH, HeaderValue::from_str(value).unwrap());
            matches_etag(&headers, etag)
        };
        assert!(with("\"abc\""));
        assert!(with("W/\"abc\""));
        assert!(with("\"x\", \"abc\""));
        assert!(with("*"));
        assert!(!with("\"abcd\""));
        assert!(!with("abc"));
        assert!(!matches_etag(&HeaderMap::new(), etag));
    }
}

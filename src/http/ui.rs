//! The built-in web page: `GET /` and its assets under `/ui/`, embedded in the binary (plain
//! HTML, CSS and JavaScript modules in `src/http/ui/`; no build step, nothing fetched from
//! elsewhere).
//!
//! Every asset is served with its content type, `Content-Security-Policy: default-src 'self'`
//! (no inline script or style, nothing from another origin), `X-Frame-Options: DENY` (the
//! approval buttons must not be clickable through someone else's frame), a weak `ETag` with
//! `Cache-Control: no-cache` (a browser revalidates and gets `304` while the binary is the
//! same), and gzip when the browser accepts it. The page holds no secret: it reaches the API
//! with the sign-in cookie (see `auth`), or with nothing when tokens are off.
//!
//! Every other response (the API's) gets a policy that lets nothing run, so that a body a
//! browser is made to open as a document (a file the agent wrote, say) cannot script this
//! origin.

use std::sync::LazyLock;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower_http::compression::CompressionLayer;

use super::AppState;

/// The page's policy: its own scripts and styles only.
pub const PAGE_POLICY: &str = "default-src 'self'";
/// The policy of everything else: nothing runs, nothing is framed.
const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'; sandbox";

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $file:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("ui/", $file)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: &[Asset] = &[
    asset!("/", "index.html", "text/html; charset=utf-8"),
    asset!("/ui/app.css", "app.css", "text/css; charset=utf-8"),
    asset!("/ui/favicon.svg", "favicon.svg", "image/svg+xml"),
    asset!("/ui/app.js", "app.js", JS),
    asset!("/ui/api.js", "api.js", JS),
    asset!("/ui/dom.js", "dom.js", JS),
    asset!("/ui/stream.js", "stream.js", JS),
    asset!("/ui/conversation.js", "conversation.js", JS),
    asset!("/ui/markdown.js", "markdown.js", JS),
    asset!("/ui/diff.js", "diff.js", JS),
    asset!("/ui/inspector.js", "inspector.js", JS),
    asset!("/ui/sessions.js", "sessions.js", JS),
    asset!("/ui/agents.js", "agents.js", JS),
];

/// Each asset's ETag, computed once: FNV-1a over its bytes. Weak, because the bytes sent
/// differ with the encoding while the content does not.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let hash = asset.body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            });
            HeaderValue::from_str(&format!("W/\"{hash:016x}\""))
                .unwrap_or(HeaderValue::from_static("W/\"0\""))
        })
        .collect()
});

pub fn routes() -> Router<AppState> {
    let mut router = Router::new();
    for (index, asset) in ASSETS.iter().enumerate() {
        router = router.route(
            asset.path,
            get(move |headers: HeaderMap| async move { serve(index, &headers) }),
        );
    }
    router.layer(CompressionLayer::new().gzip(true))
}

fn serve(index: usize, request: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let etag = ETAGS[index].clone();
    let fresh = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| {
            let tag = tag.trim();
            tag == "*" || tag.trim_start_matches("W/") == etag_opaque(&etag)
        });
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The quoted part of an ETag (`W/"abc"` → `"abc"`).
fn etag_opaque(etag: &HeaderValue) -> &str {
    etag.to_str().unwrap_or("").trim_start_matches("W/")
}

/// Gives every response that set no policy of its own the API's: nothing runs, nothing is
/// framed, nothing is sniffed into another type.
pub async fn api_policy(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(API_POLICY),
        );
    }
    headers
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_distinct_path_and_etag() {
        let mut paths: Vec<_> = ASSETS.iter().map(|a| a.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), ASSETS.len());
        let mut tags: Vec<_> = ETAGS
            .iter()
            .map(|t| t.to_str().unwrap().to_string())
            .collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), ASSETS.len());
        assert!(ASSETS.iter().all(|a| !a.body.is_empty()));
    }

    #[test]
    fn the_page_loads_nothing_inline() {
        let page = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(!page.contains("<script>"), "an inline script");
        assert!(!page.contains("style="), "an inline style");
        assert!(!page.contains("<style"), "an inline style sheet");
        for asset in ASSETS {
            let text = String::from_utf8_lossy(asset.body);
            assert!(!text.contains("innerHTML"), "{} sets innerHTML", asset.path);
            assert!(
                !text.contains("http://") || asset.path.ends_with(".svg"),
                "{}",
                asset.path
            );
        }
    }
}

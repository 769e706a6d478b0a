//! `GET /` and the files it loads: each is served, with its content type, the page's policy,
//! a validator that answers `304`, and gzip for browsers that take it.

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};

use crate::support::{Reply, ServerOptions, TestServer};

const PAGE_POLICY: &str = "default-src 'self'";

fn header(reply: &Reply, name: &str) -> String {
    reply
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Every same-origin path `text` loads: `src="/…"`, `href="/…"`, `url("/…")` and the
/// relative module imports `from "./x.js"` (resolved against `/ui/`).
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (open, close) in [("src=\"", '"'), ("href=\"", '"'), ("url(\"", '"')] {
        for piece in text.split(open).skip(1) {
            if let Some(path) = piece.split(close).next().filter(|p| p.starts_with('/')) {
                found.push(path.to_string());
            }
        }
    }
    for piece in text.split("from \"./").skip(1) {
        if let Some(file) = piece.split('"').next() {
            found.push(format!("/ui/{file}"));
        }
    }
    found
}

fn expected_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        Some("svg") => "image/svg+xml",
        _ => "text/html",
    }
}

#[tokio::test]
async fn the_page_and_everything_it_loads_are_served_with_their_type_and_policy() {
    let server = TestServer::start(ServerOptions::new()).await;
    let mut seen = BTreeSet::new();
    let mut queue = vec!["/".to_string()];
    let mut total = 0;
    while let Some(path) = queue.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let reply = server.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert!(
            reply.content_type().starts_with(expected_type(&path)),
            "{path}: {}",
            reply.content_type()
        );
        assert_eq!(
            header(&reply, "content-security-policy"),
            PAGE_POLICY,
            "{path}"
        );
        assert_eq!(header(&reply, "x-frame-options"), "DENY", "{path}");
        assert_eq!(
            header(&reply, "x-content-type-options"),
            "nosniff",
            "{path}"
        );
        assert_eq!(header(&reply, "cache-control"), "no-cache", "{path}");
        assert!(header(&reply, "etag").starts_with("W/\""), "{path}");
        total += reply.bytes.len();
        let text = String::from_utf8_lossy(&reply.bytes).into_owned();
        // Nothing from elsewhere: no CDN, no font service.
        assert!(!text.contains("https://"), "{path} names another origin");
        queue.extend(references(&text));
    }
    for must in [
        "/",
        "/ui/app.js",
        "/ui/app.css",
        "/ui/conversation.js",
        "/ui/stream.js",
    ] {
        assert!(
            seen.contains(must),
            "the page does not load {must}: {seen:?}"
        );
    }
    println!("the page: {} files, {total} bytes uncompressed", seen.len());
}

#[tokio::test]
async fn assets_revalidate_with_their_etag_and_are_gzipped_when_asked() {
    let server = TestServer::start(ServerOptions::new()).await;
    let first = server.get("/ui/app.js").await;
    let etag = header(&first, "etag");
    let again = server
        .send(
            server
                .request(Method::GET, "/ui/app.js")
                .header("if-none-match", &etag),
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.bytes.is_empty());
    assert_eq!(header(&again, "etag"), etag);
    // Another file's tag (or a stale one) gets the whole file.
    let other = header(&server.get("/ui/app.css").await, "etag");
    assert_ne!(other, etag);
    let stale = server
        .send(
            server
                .request(Method::GET, "/ui/app.js")
                .header("if-none-match", &other),
        )
        .await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.bytes, first.bytes);

    let mut raw = 0;
    let mut gzipped = 0;
    for path in ["/", "/ui/app.js", "/ui/app.css", "/ui/conversation.js"] {
        let plain = server.get(path).await;
        let packed = server
            .send(
                server
                    .request(Method::GET, path)
                    .header("accept-encoding", "gzip"),
            )
            .await;
        assert_eq!(header(&packed, "content-encoding"), "gzip", "{path}");
        assert!(
            header(&packed, "vary").contains("accept-encoding"),
            "{path}"
        );
        assert!(packed.bytes.len() < plain.bytes.len(), "{path}");
        assert_eq!(
            header(&packed, "content-security-policy"),
            PAGE_POLICY,
            "{path}"
        );
        raw += plain.bytes.len();
        gzipped += packed.bytes.len();
    }
    println!("main files: {raw} bytes, {gzipped} gzipped");
}

#[tokio::test]
async fn unknown_assets_are_problems_and_api_answers_let_nothing_run() {
    let server = TestServer::start(ServerOptions::new()).await;
    for path in [
        "/ui/nope.js",
        "/ui/",
        "/index.html",
        "/ui/../openapi.yaml.js",
    ] {
        let reply = server.get(path).await;
        reply.expect_problem(StatusCode::NOT_FOUND, path);
    }
    let reply = server
        .send(server.request(Method::POST, "/").body("x"))
        .await;
    reply.expect_problem(StatusCode::METHOD_NOT_ALLOWED, "POST /");
    let head = server.send(server.request(Method::HEAD, "/")).await;
    assert_eq!(head.status, StatusCode::OK);
    // A body a browser might be made to open as a document cannot script the origin.
    for path in ["/v1/sessions", "/healthz", "/ui/nope.js", "/openapi.yaml"] {
        let reply = server.get(path).await;
        let policy = header(&reply, "content-security-policy");
        assert!(policy.contains("default-src 'none'"), "{path}: {policy}");
        assert!(policy.contains("sandbox"), "{path}: {policy}");
        assert_eq!(
            header(&reply, "x-content-type-options"),
            "nosniff",
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_page_is_not_served_to_a_foreign_host_name() {
    let server = TestServer::start(ServerOptions::new()).await;
    let reply = server
        .send(
            server
                .request(Method::GET, "/")
                .header("host", "attacker.example"),
        )
        .await;
    reply.expect_problem(StatusCode::FORBIDDEN, "rebound host");
}

/// Model output reaches the page as text nodes or as elements the page makes: no script the
/// page loads has a way to parse text as markup or code.
#[tokio::test]
async fn no_script_parses_text_as_markup() {
    let server = TestServer::start(ServerOptions::new()).await;
    let page = server.get("/").await;
    let mut scripts: Vec<String> = references(&String::from_utf8_lossy(&page.bytes))
        .into_iter()
        .filter(|p| p.ends_with(".js"))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(path) = scripts.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let text = String::from_utf8_lossy(&server.get(&path).await.bytes).into_owned();
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "DOMParser",
            "createContextualFragment",
            "srcdoc",
            "eval(",
            "new Function",
        ] {
            assert!(!text.contains(sink), "{path} uses {sink}");
        }
        scripts.extend(references(&text));
    }
    assert!(seen.contains("/ui/markdown.js"), "{seen:?}");
    assert!(seen.contains("/ui/diff.js"), "{seen:?}");
    println!("{} scripts checked", seen.len());
}

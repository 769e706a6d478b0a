//! The idle timeout (between two chunks) and the first-byte timeout, each retried.

use std::time::Duration;

use crate::providers::*;
use crate::support::fakes::{self, Flavor, Reply};

for_each_provider!(
    idle_timeout_is_retried_then_fails,
    first_byte_timeout_is_retried,
);

async fn idle_timeout_is_retried_then_fails(flavor: Flavor) {
    let events = fakes::split_events(&text_reply(flavor, &["slow"]));
    let server = fake(
        flavor,
        vec![Reply::sse_chunks(events).with_delay(Duration::from_millis(800))],
    )
    .await;
    let mut cfg = config(&server.base_url, 1);
    cfg.timeouts.idle = Duration::from_millis(100);
    let items = run(&*client_with(flavor, cfg), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Timeout, "{err}");
    assert_eq!(retries(&items).len(), 1);
    assert_eq!(server.request_count(), 2);
}

async fn first_byte_timeout_is_retried(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::sse(text_reply(flavor, &["late"])).with_first_delay(Duration::from_millis(800)),
            Reply::sse(text_reply(flavor, &["on time"])),
        ],
    )
    .await;
    let mut cfg = config(&server.base_url, 1);
    cfg.timeouts.first_byte = Duration::from_millis(150);
    let items = run(&*client_with(flavor, cfg), request("hi")).await;
    assert_eq!(retries(&items).len(), 1, "{items:?}");
    assert_eq!(done(&items).text, "on time");
}

//! An SSE follower: reads a session's event stream until it has seen the session's final seq,
//! optionally dropping the connection at random moments and reconnecting with
//! `Last-Event-ID` (or `?after=`), as a browser's EventSource on a flaky network would.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::hardening::checks::Problems;
use crate::support::{first_difference, Api, Next, SseFrom};

/// What a follower saw.
#[derive(Default)]
pub struct Followed {
    /// The event JSON of every frame, in the order received.
    pub events: Vec<Value>,
    /// Connections after the first (client drops and server-side ends).
    pub reconnects: usize,
    /// Streams the server ended (a subset of `reconnects`).
    pub server_ends: usize,
    /// Frames whose seq was not the one after the previous frame.
    pub out_of_order: usize,
    pub problems: Problems,
}

/// Follows session `id` until `target` (its final seq, once known) has been seen. With `chaos`
/// the connection is dropped after a random 0–15 frames or 0–200 ms and reopened from the last
/// seq seen, by `Last-Event-ID` (mostly) or `?after=`.
pub async fn follow(
    api: Api,
    id: String,
    target: watch::Receiver<Option<i64>>,
    mut chaos: Option<StdRng>,
    limit: Duration,
) -> Followed {
    let mut out = Followed::default();
    let deadline = Instant::now() + limit;
    let mut last: i64 = 0;
    let mut first = true;
    let done = |last: i64, target: &watch::Receiver<Option<i64>>| {
        target.borrow().is_some_and(|t| last >= t)
    };
    loop {
        if done(last, &target) {
            return out;
        }
        if Instant::now() > deadline {
            out.problems.push(format!(
                "session {id}: the SSE follower saw seq {last} after {limit:?}; target {:?}",
                *target.borrow()
            ));
            return out;
        }
        let coin = chaos.as_mut().map(|rng| rng.gen_bool(0.3));
        let from = match (coin, first) {
            (_, true) => SseFrom::Start,
            (Some(true), false) => SseFrom::After(last),
            _ => SseFrom::LastEventId(last),
        };
        if !first {
            out.reconnects += 1;
        }
        first = false;
        let mut frames = match api.open_events(&id, from).await {
            Ok(frames) => frames,
            Err(e) => {
                out.problems.push(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // When this connection is dropped on purpose.
        let (budget, drop_at) = match chaos.as_mut() {
            None => (usize::MAX, None),
            Some(rng) => {
                if rng.gen_bool(0.5) {
                    (rng.gen_range(0..=15), None)
                } else {
                    let ms = rng.gen_range(0..=200);
                    (usize::MAX, Some(Instant::now() + Duration::from_millis(ms)))
                }
            }
        };
        let mut got = 0usize;
        loop {
            if got >= budget || done(last, &target) || Instant::now() > deadline {
                break;
            }
            let mut wait = Duration::from_millis(50);
            if let Some(at) = drop_at {
                let now = Instant::now();
                if now >= at {
                    break;
                }
                wait = wait.min(at - now);
            }
            match frames.next_within(wait).await {
                Next::Timeout => continue,
                Next::End => {
                    out.server_ends += 1;
                    break;
                }
                Next::Error(e) => {
                    out.problems
                        .push(format!("session {id}: the SSE stream broke: {e}"));
                    break;
                }
                Next::Bad(e) => {
                    got += 1;
                    out.problems.push(format!("session {id}: {e}"));
                }
                Next::Frame(frame) => {
                    got += 1;
                    let data = frame.data;
                    let seq = data["seq"].as_i64().unwrap_or(-1);
                    if seq != last + 1 {
                        out.out_of_order += 1;
                        out.problems.push(format!(
                            "session {id}: after seq {last} the stream ({from:?}) sent seq {seq}"
                        ));
                    }
                    last = last.max(seq);
                    out.events.push(data);
                }
            }
        }
    }
}

/// Compares what a follower rebuilt with the stored log, event for event.
pub fn compare(id: &str, seen: &[Value], log: &[Value], problems: &mut Problems) -> bool {
    let Some(first_difference) = first_difference(seen, log) else {
        return true;
    };
    problems.push(format!(
        "session {id}: the SSE events differ from the log at #{first_difference}: {} seen, {} stored; seen {:?}, stored {:?}",
        seen.len(),
        log.len(),
        seen.get(first_difference),
        log.get(first_difference)
    ));
    false
}

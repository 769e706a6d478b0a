//! SSE subscribers: each follows one session's event stream with `eventsource-stream` (the
//! parser the tests use), reconnecting with `Last-Event-ID` like an EventSource when the stream
//! ends early, and checks that every event arrives exactly once and in order. With stamped
//! pieces it also samples how long each token delta took from the fake model to the client.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::client::Client;
use crate::bench::fake_model::{parse_stamps, unix_micros};

/// How long a subscriber may take, after the last turn, to receive the session's last event.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Reconnections (with `Last-Event-ID`) a subscriber may make before it gives up.
const MAX_RECONNECTS: u32 = 5;

type Events<E> = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<E>>> + Send>>;

/// What one subscriber saw.
#[derive(Debug, Default)]
pub struct Subscriber {
    /// The newest seq received.
    pub last: i64,
    /// Events received (duplicates included).
    pub received: u64,
    pub gaps: u64,
    pub duplicates: u64,
    pub reconnects: u64,
    /// Ended before the session's last event arrived.
    pub incomplete: bool,
    /// Delta → client latencies, in µs.
    pub deltas: Vec<u64>,
}

impl Subscriber {
    /// Checks and counts one event received at `now` (µs since the epoch).
    fn event(&mut self, event: &Event, now: u64, stamps: bool) {
        let Ok(seq) = event.id.trim().parse::<i64>() else {
            return; // not an event of the log
        };
        self.received += 1;
        if seq <= self.last {
            self.duplicates += 1;
            return;
        }
        if seq != self.last + 1 {
            self.gaps += 1;
        }
        self.last = seq;
        if stamps && event.event == "agent.assistant-stream" {
            self.deltas
                .extend(parse_stamps(&event.data).map(|sent| now.saturating_sub(sent)));
        }
    }
}

enum StreamEnd {
    /// The session's last event arrived.
    Done,
    /// The server closed the stream (a client reconnects with `Last-Event-ID`).
    Closed,
    Failed(String),
    TimedOut,
}

/// Follows a session's events until its last seq (sent on `target` after the last turn)
/// arrived, reconnecting like an EventSource when the stream ends early.
pub async fn subscribe(
    client: Arc<Client>,
    session: String,
    ready: oneshot::Sender<()>,
    mut target: watch::Receiver<Option<i64>>,
    stamps: bool,
) -> Subscriber {
    let mut ready = Some(ready);
    let mut sub = Subscriber::default();
    loop {
        let response = match client.open_events(&session, sub.last).await {
            Ok(response) => response,
            Err(error) => {
                client.errors.record(format!("subscriber: {error:#}"));
                if sub.reconnects >= u64::from(MAX_RECONNECTS) {
                    sub.incomplete = true;
                    return sub;
                }
                sub.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        let events: Events<reqwest::Error> = Box::pin(response.bytes_stream().eventsource());
        match follow(events, &mut sub, &mut target, stamps).await {
            StreamEnd::Done => return sub,
            StreamEnd::TimedOut => {
                sub.incomplete = true;
                return sub;
            }
            StreamEnd::Closed => {}
            StreamEnd::Failed(error) => client.errors.record(format!("subscriber: {error}")),
        }
        if sub.reconnects >= u64::from(MAX_RECONNECTS) {
            sub.incomplete = true;
            return sub;
        }
        sub.reconnects += 1;
    }
}

async fn follow<E: std::fmt::Display>(
    mut events: Events<E>,
    sub: &mut Subscriber,
    target: &mut watch::Receiver<Option<i64>>,
    stamps: bool,
) -> StreamEnd {
    // Until the last turn ended: read, and watch for the target.
    let goal = loop {
        if let Some(goal) = *target.borrow() {
            break goal;
        }
        tokio::select! {
            next = events.next() => match next {
                Some(Ok(event)) => sub.event(&event, unix_micros(), stamps),
                None => return StreamEnd::Closed,
                Some(Err(error)) => return StreamEnd::Failed(error.to_string()),
            },
            changed = target.changed() => {
                if changed.is_err() && target.borrow().is_none() {
                    // The session gave up without a target (its requests failed).
                    return StreamEnd::TimedOut;
                }
            }
        }
    };
    // Then: the remaining events, within the drain timeout.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while sub.last < goal {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => return StreamEnd::TimedOut,
            Ok(Some(Ok(event))) => sub.event(&event, unix_micros(), stamps),
            Ok(None) => return StreamEnd::Closed,
            Ok(Some(Err(error))) => return StreamEnd::Failed(error.to_string()),
        }
    }
    StreamEnd::Done
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;

    use super::*;

    fn frame(seq: i64, kind: &str, data: &str) -> String {
        format!("id: {seq}\nevent: {kind}\ndata: {data}\n\n")
    }

    #[test]
    fn subscribers_check_seq_and_read_stamps_across_chunks() {
        let stamp = unix_micros() - 1500;
        let mut body = String::new();
        body.push_str(&frame(1, "session.created", "{}"));
        body.push_str(":heartbeat\n\n");
        body.push_str(&frame(
            2,
            "agent.assistant-stream",
            &format!(r#"{{"data":{{"text":"⏱{stamp}⏱ the "}}}}"#),
        ));
        body.push_str(&frame(2, "agent.assistant-stream", "{}"));
        body.push_str(&frame(4, "agent.finished", "{}"));
        // Split everywhere, inside the multi-byte stamp too.
        let chunks: Vec<Result<Bytes, Infallible>> = body
            .as_bytes()
            .chunks(7)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut events = futures::stream::iter(chunks).eventsource();
        let mut sub = Subscriber::default();
        let mut parsed = 0;
        futures::executor::block_on(async {
            while let Some(event) = events.next().await {
                sub.event(&event.expect("a well-formed event"), unix_micros(), true);
                parsed += 1;
            }
        });
        assert_eq!(parsed, 4, "the heartbeat is no event, nothing is left over");
        assert_eq!(sub.received, 4);
        assert_eq!(sub.last, 4);
        assert_eq!(sub.duplicates, 1);
        assert_eq!(sub.gaps, 1);
        assert_eq!(sub.deltas.len(), 1);
        assert!(sub.deltas[0] >= 1500);
    }
}

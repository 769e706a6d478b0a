//! SSE subscribers: each follows one session's event stream with the lean client of [`super::sse`]
//! (so that a thousand of them take little of the CPUs the server needs), reconnecting with
//! `Last-Event-ID` like an EventSource when the stream ends early, and checks that every event
//! arrives exactly once and in order. With stamped pieces it also samples how long each token
//! delta took from the fake model to the client.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::client::Client;
use super::sse::{SseEvent, SseStream};
use crate::bench::fake_model::{parse_stamps, unix_micros};

/// How long a subscriber may take, after the last turn, to receive the session's last event.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Reconnections (with `Last-Event-ID`) a subscriber may make before it gives up.
const MAX_RECONNECTS: u32 = 5;

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
    /// Every event up to `last` arrived, once each, in order.
    pub fn complete(&self, last: i64) -> bool {
        self.received as i64 == last && self.gaps == 0 && self.duplicates == 0 && !self.incomplete
    }

    /// Checks and counts one event received at `now` (µs since the epoch).
    fn event(&mut self, event: SseEvent<'_>, now: u64, stamps: bool) {
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
                .extend(parse_stamps(event.data).map(|sent| now.saturating_sub(sent)));
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

/// Follows an event stream (`path`: a session's events) until its last seq (sent on `target`,
/// after the last turn) arrived, reconnecting like an EventSource when the stream ends early.
pub async fn subscribe(
    client: Arc<Client>,
    path: String,
    ready: oneshot::Sender<()>,
    mut target: watch::Receiver<Option<i64>>,
    stamps: bool,
) -> Subscriber {
    let mut ready = Some(ready);
    let mut sub = Subscriber::default();
    loop {
        let stream = match client.open_sse(&path, sub.last).await {
            Ok(stream) => stream,
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
        match follow(stream, &mut sub, &mut target, stamps).await {
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

async fn follow(
    mut events: SseStream,
    sub: &mut Subscriber,
    target: &mut watch::Receiver<Option<i64>>,
    stamps: bool,
) -> StreamEnd {
    // Until the last turn ended: read, and watch for the target.
    let goal = loop {
        if let Some(goal) = *target.borrow() {
            break goal;
        }
        let mut received = |event: SseEvent<'_>| sub.event(event, unix_micros(), stamps);
        tokio::select! {
            read = events.read(&mut received) => match read {
                Ok(true) => {}
                Ok(false) => return StreamEnd::Closed,
                Err(error) => return StreamEnd::Failed(format!("{error:#}")),
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
        let mut received = |event: SseEvent<'_>| sub.event(event, unix_micros(), stamps);
        match tokio::time::timeout_at(deadline, events.read(&mut received)).await {
            Err(_) => return StreamEnd::TimedOut,
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return StreamEnd::Closed,
            Ok(Err(error)) => return StreamEnd::Failed(format!("{error:#}")),
        }
    }
    StreamEnd::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event<'a>(id: &'a str, kind: &'a str, data: &'a str) -> SseEvent<'a> {
        SseEvent {
            id,
            event: kind,
            data,
        }
    }

    #[test]
    fn subscribers_check_seq_and_read_stamps() {
        let stamp = unix_micros() - 1500;
        let stamped = format!(r#"{{"data":{{"text":"⏱{stamp}⏱ the "}}}}"#);
        let mut sub = Subscriber::default();
        for e in [
            event("1", "session.created", "{}"),
            event("", "message", "not of the log"),
            event("2", "agent.assistant-stream", &stamped),
            event("2", "agent.assistant-stream", "{}"),
            event("4", "agent.finished", "{}"),
        ] {
            sub.event(e, unix_micros(), true);
        }
        assert_eq!(sub.received, 4, "an event without a seq is not counted");
        assert_eq!(sub.last, 4);
        assert_eq!(sub.duplicates, 1);
        assert_eq!(sub.gaps, 1);
        assert_eq!(sub.deltas.len(), 1);
        assert!(sub.deltas[0] >= 1500);
    }
}

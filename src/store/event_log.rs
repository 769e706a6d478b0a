//! How both backends store a session's events: one row of `event_batches` per session per
//! commit, holding that commit's events of the session in order, rather than a row per event.
//!
//! A turn writes some forty events in a handful of commits. A row per event put each of them
//! in the b-tree of the log, clustered by session, so every session in a commit dirtied (and
//! split, and rebalanced) leaves of its own: half of the pages SQLite appended to its WAL per
//! turn, and most of PostgreSQL's per-row work. A row per commit per session is one insert,
//! keyed by the session and the last `seq` it holds (`first_seq` beside it), so a read from
//! any event id finds the row that holds the next event with one index seek, and keeps only
//! the events after it: replay from any id, with no gap and no duplicate, works as before.
//!
//! The row's `events` is JSON text, an array with one entry per event:
//! `[seq, "type", "created_at", data]`, `data` being the event's data object as it is rendered
//! for subscribers (copied from the frame, not encoded again). A row written by the migration
//! from the former table holds one event.

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::rows::corrupt_event;
use super::{StoreError, StoreResult};
use crate::model::{Event, Published, UncutEvent};

/// One row of `event_batches` about to be written: a session's events of one commit.
pub struct EventBatch {
    pub session_id: Uuid,
    pub first_seq: i64,
    pub last_seq: i64,
    pub events: String,
    /// How many events it holds.
    pub count: usize,
}

/// Why a commit's events cannot be stored; the commit fails.
#[derive(Debug, thiserror::Error)]
pub enum Unstorable {
    #[error(transparent)]
    Uncut(#[from] UncutEvent),
    /// An event whose `seq` does not come after the session's previous one in the commit (a
    /// duplicate): a session's events are written once, in order.
    #[error(
        "event {seq} of session {session_id} comes after its event {after} in one commit: a \
         session's events are written once, in order"
    )]
    OutOfOrder {
        session_id: Uuid,
        seq: i64,
        after: i64,
    },
}

/// A row holds at most this many events, or stops taking more once its text is this long: a
/// read decodes whole rows, so a commit of many events of one session (an import, a long burst)
/// becomes several rows, and a page read from its middle decodes little beyond the page. A
/// turn's commits hold far fewer.
const BATCH_EVENTS: usize = 256;
const BATCH_BYTES: usize = 64 * 1024;

/// Groups `events` (in commit order) into rows: one per session in the usual case (in the
/// order each session's first event came), more for a session with more than a row holds. A
/// session's events keep their order, and must come in increasing `seq`.
pub fn batches<'a>(
    events: impl IntoIterator<Item = &'a Published>,
) -> Result<Vec<EventBatch>, Unstorable> {
    let mut out: Vec<EventBatch> = Vec::new();
    // Each session's row being filled.
    let mut at: HashMap<Uuid, usize> = HashMap::new();
    for e in events {
        if let Some(&index) = at.get(&e.session_id) {
            let open = &out[index];
            if e.seq <= open.last_seq {
                return Err(Unstorable::OutOfOrder {
                    session_id: e.session_id,
                    seq: e.seq,
                    after: open.last_seq,
                });
            }
            if open.count >= BATCH_EVENTS || open.events.len() >= BATCH_BYTES {
                at.remove(&e.session_id);
            }
        }
        let index = *at.entry(e.session_id).or_insert_with(|| {
            out.push(EventBatch {
                session_id: e.session_id,
                first_seq: e.seq,
                last_seq: e.seq,
                events: String::with_capacity(1024),
                count: 0,
            });
            out.len() - 1
        });
        let batch = &mut out[index];
        push_entry(&mut batch.events, e)?;
        batch.last_seq = e.seq;
        batch.count += 1;
    }
    for b in &mut out {
        b.events.push(']');
    }
    Ok(out)
}

/// Appends `[seq,"type","created_at",data]` to the array being written (its `[` or `,` first).
fn push_entry(out: &mut String, e: &Published) -> Result<(), UncutEvent> {
    use std::fmt::Write;
    let data = e.stored_data()?;
    out.push(if out.is_empty() { '[' } else { ',' });
    // The type is one of the event names and the time RFC 3339: neither holds a character
    // that JSON escapes.
    let _ = write!(
        out,
        "[{},\"{}\",\"{}\",{}]",
        e.seq,
        e.type_name(),
        e.created_at.to_rfc3339(),
        data
    );
    Ok(())
}

#[derive(Deserialize)]
struct Entry<'a>(
    i64,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] &'a RawValue,
);

/// The events of a stored batch with `seq > after`, appended to `out` until it holds `limit`.
pub fn read_into(
    session_id: Uuid,
    stored: &str,
    after: i64,
    limit: usize,
    out: &mut Vec<Event>,
) -> StoreResult<()> {
    let entries: Vec<Entry<'_>> = serde_json::from_str(stored)
        .map_err(|e| StoreError::Corrupt(format!("a batch of events of {session_id}: {e}")))?;
    for Entry(seq, type_name, created_at, data) in entries {
        if out.len() >= limit {
            break;
        }
        if seq <= after {
            continue;
        }
        let created_at = DateTime::parse_from_rfc3339(&created_at)
            .map_err(|e| corrupt_event(&type_name, e))?
            .with_timezone(&Utc);
        let event = Event::from_stored(session_id, seq, &type_name, data.get(), created_at)
            .map_err(|e| corrupt_event(&type_name, e))?;
        out.push(event);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{new_id, now, EventKind, SessionState};

    fn published(session_id: Uuid, seq: i64, kind: EventKind) -> Published {
        let p = Published::new(Event::new(session_id, seq, kind, now()));
        p.render();
        p
    }

    #[test]
    fn a_batch_reads_back_from_any_seq_with_its_times_and_text() {
        let (a, b) = (new_id(), new_id());
        let step_id = new_id();
        let text = "naïve 日本語 \"quoted\" \\ \n \u{0} end";
        let events = [
            published(
                a,
                7,
                EventKind::AssistantStream {
                    step_id,
                    text: text.into(),
                },
            ),
            published(
                b,
                3,
                EventKind::StateChanged {
                    from: SessionState::Idle,
                    to: SessionState::Running,
                },
            ),
            published(
                a,
                8,
                EventKind::AssistantStream {
                    step_id,
                    text: "two".into(),
                },
            ),
            published(
                a,
                9,
                EventKind::StateChanged {
                    from: SessionState::Running,
                    to: SessionState::Idle,
                },
            ),
        ];
        let written = batches(events.iter()).expect("encodes");
        let twice = [&events[0], &events[1], &events[0]];
        assert!(matches!(
            batches(twice),
            Err(Unstorable::OutOfOrder {
                seq: 7,
                after: 7,
                ..
            })
        ));
        assert_eq!(written.len(), 2);
        assert_eq!(
            (
                written[0].session_id,
                written[0].first_seq,
                written[0].last_seq
            ),
            (a, 7, 9)
        );
        assert_eq!(
            (
                written[1].session_id,
                written[1].first_seq,
                written[1].last_seq
            ),
            (b, 3, 3)
        );
        assert_eq!((written[0].count, written[1].count), (3, 1));

        let mut read = Vec::new();
        read_into(a, &written[0].events, 0, 100, &mut read).expect("decodes");
        let expected: Vec<&Event> = [&events[0], &events[2], &events[3]]
            .map(|p| p.event())
            .into();
        assert_eq!(read.iter().collect::<Vec<_>>(), expected);

        // From the middle of the batch, and up to a limit.
        let mut read = Vec::new();
        read_into(a, &written[0].events, 7, 1, &mut read).expect("decodes");
        assert_eq!(read, vec![events[2].event().clone()]);
    }

    #[test]
    fn a_long_burst_of_one_session_becomes_rows_of_bounded_size() {
        let (session_id, step_id) = (new_id(), new_id());
        let events: Vec<Published> = (1..=600)
            .map(|seq| {
                let kind = EventKind::AssistantStream {
                    step_id,
                    text: "x".into(),
                };
                published(session_id, seq, kind)
            })
            .collect();
        let written = batches(events.iter()).expect("encodes");
        let bounds: Vec<(i64, i64, usize)> = written
            .iter()
            .map(|b| (b.first_seq, b.last_seq, b.count))
            .collect();
        assert_eq!(bounds, [(1, 256, 256), (257, 512, 256), (513, 600, 88)]);
        let mut read = Vec::new();
        for b in &written {
            read_into(session_id, &b.events, 300, 1000, &mut read).expect("decodes");
        }
        assert_eq!(read.len(), 300);
        assert_eq!(read[0], *events[300].event());
        // Out of order across rows is refused as within one.
        let again = events[..300].iter().chain([&events[10]]);
        assert!(matches!(
            batches(again),
            Err(Unstorable::OutOfOrder {
                seq: 11,
                after: 300,
                ..
            })
        ));
    }

    #[test]
    fn a_corrupt_batch_is_an_error_not_a_panic() {
        let mut read = Vec::new();
        for stored in [
            "",
            "[",
            "{}",
            "[[1]]",
            "[[1,\"text.delta\",\"yesterday\",{}]]",
        ] {
            let got = read_into(new_id(), stored, 0, 10, &mut read);
            assert!(
                matches!(got, Err(StoreError::Corrupt(_))),
                "{stored:?}: {got:?}"
            );
        }
    }
}

//! An event as it is published: the [`Event`] and its wire form, rendered once and shared by
//! the store (which keeps its `data`), every SSE subscriber (which writes its frame) and every
//! webhook (which sends its JSON).

use std::ops::{Deref, Range};
use std::sync::OnceLock;

use bytes::Bytes;
use uuid::Uuid;

use super::Event;

/// An event on its way out of the session: what the writer commits and then publishes to the
/// session's live subscribers, and what an event stream yields (replayed events are wrapped
/// too). It reads as its [`Event`]; its frame is rendered on first use.
#[derive(Debug)]
pub struct Published {
    event: Event,
    frame: OnceLock<Frame>,
}

/// An SSE frame, where the event's JSON lies in it, and where that JSON's `data` lies
/// (`None`: it could not be cut out).
#[derive(Debug)]
struct Frame {
    bytes: Bytes,
    json: Range<usize>,
    data: Option<Range<usize>>,
}

/// An event whose `data` could not be cut from its rendered JSON: it cannot be stored (a
/// write that carries it fails rather than store something else).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "event {seq} ({type_name}) of session {session_id}: its data could not be cut from its JSON"
)]
pub struct UncutEvent {
    pub session_id: Uuid,
    pub seq: i64,
    pub type_name: &'static str,
}

impl Published {
    pub fn new(event: Event) -> Published {
        Published {
            event,
            frame: OnceLock::new(),
        }
    }

    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event as JSON (what SSE `data:` lines carry): the `data:` line of its
    /// [`sse_frame`](Published::sse_frame), so it is rendered once for the store, every
    /// subscriber and every webhook.
    pub fn json(&self) -> &str {
        let frame = self.frame();
        // The range lies on the bounds of the JSON that was written there.
        std::str::from_utf8(&frame.bytes[frame.json.clone()]).unwrap_or("{}")
    }

    /// The `data` object's JSON text, as the store keeps it: the part of
    /// [`json`](Published::json) between `"data":` and `,"created_at"`, found when the frame is
    /// rendered. An event whose data cannot be found there is an error, which fails the write
    /// that carries it.
    pub fn stored_data(&self) -> Result<&str, UncutEvent> {
        let frame = self.frame();
        let data = frame.data.clone().unwrap_or(0..0);
        match std::str::from_utf8(&frame.bytes[data]) {
            Ok(data) if !data.is_empty() => Ok(data),
            _ => Err(UncutEvent {
                session_id: self.event.session_id,
                seq: self.event.seq,
                type_name: self.event.type_name(),
            }),
        }
    }

    /// The event as one Server-Sent Events frame, `id: <seq>`, `event: <type>`, `data: <json>`
    /// and a blank line, encoded on first use: every subscriber writes the same bytes.
    pub fn sse_frame(&self) -> Bytes {
        self.frame().bytes.clone()
    }

    /// Renders the event's frame now, on the caller's thread, rather than where it is first
    /// needed.
    pub fn render(&self) {
        self.frame();
    }

    fn frame(&self) -> &Frame {
        self.frame.get_or_init(|| {
            let event = &self.event;
            let type_name = event.type_name();
            let mut frame = Vec::with_capacity(type_name.len() + 320);
            frame.extend_from_slice(b"id: ");
            frame.extend_from_slice(event.seq.to_string().as_bytes());
            frame.extend_from_slice(b"\nevent: ");
            frame.extend_from_slice(type_name.as_bytes());
            frame.extend_from_slice(b"\ndata: ");
            // Compact JSON has no raw line breaks (they are escaped inside strings), so the
            // data is one line. Plain data with string keys: serialising it cannot fail.
            let start = frame.len();
            let _ = serde_json::to_writer(&mut frame, event);
            let json = start..frame.len();
            let data =
                data_range(&frame[json.clone()]).map(|data| start + data.start..start + data.end);
            frame.extend_from_slice(b"\n\n");
            Frame {
                bytes: Bytes::from(frame),
                json,
                data,
            }
        })
    }
}

impl Deref for Published {
    type Target = Event;

    fn deref(&self) -> &Event {
        &self.event
    }
}

impl From<Event> for Published {
    fn from(event: Event) -> Published {
        Published::new(event)
    }
}

/// Where the `data` object lies in an event's JSON: between `"data":` and `,"created_at"`.
/// The fields before `data` (an id, a number, a type name) cannot hold the key, and
/// `created_at` is the last field, after everything `data` holds.
fn data_range(json: &[u8]) -> Option<Range<usize>> {
    const DATA: &[u8] = br#","data":"#;
    const CREATED_AT: &[u8] = br#","created_at":""#;
    let start = memchr::memmem::find(json, DATA).map(|at| at + DATA.len());
    let end = memchr::memmem::rfind(json, CREATED_AT);
    match (start, end) {
        (Some(start), Some(end)) if start < end => Some(start..end),
        // Not an event's JSON.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::model::EventKind;

    #[test]
    fn json_without_a_data_field_has_nothing_to_cut() {
        assert_eq!(data_range(br#"{"type":"x"}"#), None);
        assert_eq!(data_range(br#"{"created_at":"t","data":{}}"#), None);
        let json = br#"{"seq":1,"type":"x","data":{"a":1},"created_at":"t"}"#;
        let data = data_range(json).expect("cut");
        assert_eq!(&json[data], br#"{"a":1}"#);
    }

    #[test]
    fn an_event_renders_in_wire_order() {
        let event = Published::new(Event::new(
            Uuid::nil(),
            3,
            EventKind::AgentCancelled {
                run_id: Uuid::nil(),
            },
            chrono::DateTime::from_timestamp(0, 0).unwrap(),
        ));
        let nil = Uuid::nil();
        assert_eq!(
            event.json(),
            format!(
                r#"{{"session_id":"{nil}","seq":3,"type":"agent.cancelled","data":{{"run_id":"{nil}"}},"created_at":"1970-01-01T00:00:00Z"}}"#
            )
        );
        assert!(event.is_terminal());
        assert_eq!(event.run_id(), Some(nil));
        let back: Event = serde_json::from_str(event.json()).unwrap();
        assert_eq!(&back, event.event());
    }

    #[test]
    fn an_sse_frame_carries_the_id_type_and_json_on_one_data_line() {
        let kind = EventKind::AssistantStream {
            step_id: Uuid::nil(),
            text: "two\nlines\r and \u{2028}".into(),
        };
        let at = chrono::DateTime::from_timestamp(0, 0).unwrap();
        // Encoded from scratch, and after the JSON was rendered: the same bytes.
        let fresh = Published::new(Event::new(Uuid::nil(), 42, kind.clone(), at));
        let rendered = Published::new(Event::new(Uuid::nil(), 42, kind, at));
        let json = rendered.json();
        let expected = format!("id: 42\nevent: agent.assistant-stream\ndata: {json}\n\n");
        assert_eq!(&fresh.sse_frame()[..], expected.as_bytes());
        assert_eq!(&rendered.sse_frame()[..], expected.as_bytes());
        assert_eq!(expected.matches('\n').count(), 4, "{expected:?}");
        assert!(!expected.contains('\r'), "{expected:?}");
    }

    #[test]
    fn an_event_reads_through_its_publication() {
        let event = Event::new(
            Uuid::nil(),
            7,
            EventKind::LlmStarted {
                step_id: Uuid::nil(),
            },
            chrono::DateTime::from_timestamp(0, 0).unwrap(),
        );
        let published = Published::from(event.clone());
        assert_eq!(published.seq, 7);
        assert_eq!(published.type_name(), "llm.started");
        assert_eq!(published.event(), &event);
    }
}

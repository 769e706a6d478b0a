//! The reasoning and text of each LLM step, as both adapters tell them: a reasoning part and a
//! text part that open, take deltas and close, at most one of each open at a time. [`Parts`]
//! keeps which are open and what each step streamed; a protocol only says how its frames look
//! ([`PartFrames`]).
//!
//! Pure: no I/O, nothing stored.

use std::collections::HashSet;
use std::marker::PhantomData;

use serde_json::Value;
use uuid::Uuid;

use crate::model::Message;

/// How a protocol writes the parts of a step: the frames that open, fill and close them.
pub trait PartFrames {
    fn reasoning_start(step_id: Uuid, out: &mut Vec<Value>);
    fn reasoning_delta(step_id: Uuid, delta: &str) -> Value;
    fn reasoning_end(step_id: Uuid, out: &mut Vec<Value>);
    fn text_start(step_id: Uuid) -> Value;
    fn text_delta(step_id: Uuid, delta: &str) -> Value;
    fn text_end(step_id: Uuid) -> Value;
}

/// The id of a step's reasoning part (the step's id is its text part's).
pub fn reasoning_id(step_id: Uuid) -> String {
    format!("{step_id}-reasoning")
}

/// The open parts of a stream in protocol `F`, and the steps whose parts it has streamed.
#[derive(Debug)]
pub struct Parts<F> {
    reasoning_open: Option<Uuid>,
    text_open: Option<Uuid>,
    streamed: Streamed,
    frames: PhantomData<F>,
}

impl<F> Default for Parts<F> {
    fn default() -> Parts<F> {
        Parts {
            reasoning_open: None,
            text_open: None,
            streamed: Streamed::default(),
            frames: PhantomData,
        }
    }
}

impl<F: PartFrames> Parts<F> {
    /// A reasoning delta of step `step_id` (an empty one only opens its part).
    pub fn reasoning(&mut self, step_id: Uuid, delta: &str, out: &mut Vec<Value>) {
        self.open_reasoning(step_id, out);
        if !delta.is_empty() {
            out.push(F::reasoning_delta(step_id, delta));
        }
    }

    /// What a completed step's message holds that its stream did not carry (a provider that
    /// answered without streaming), each part sent whole; then both parts close.
    pub fn completed(&mut self, step_id: Uuid, message: &Message, out: &mut Vec<Value>) {
        let (reasoning, text) = self.streamed.rest(step_id, message);
        if let Some(reasoning) = reasoning {
            self.reasoning(step_id, &reasoning, out);
        }
        self.close_reasoning(out);
        if let Some(text) = text {
            self.open_text(step_id, out);
            out.push(F::text_delta(step_id, text));
        }
        self.close_text(out);
    }

    /// The openings of the parts open now, for a client that joins here.
    pub fn reopen(&self, out: &mut Vec<Value>) {
        if let Some(step_id) = self.reasoning_open {
            F::reasoning_start(step_id, out);
        }
        if let Some(step_id) = self.text_open {
            out.push(F::text_start(step_id));
        }
    }

    pub fn open_reasoning(&mut self, step_id: Uuid, out: &mut Vec<Value>) {
        if self.reasoning_open != Some(step_id) {
            self.close_reasoning(out);
            self.close_text(out);
            F::reasoning_start(step_id, out);
            self.reasoning_open = Some(step_id);
            self.streamed.reasoning.insert(step_id);
        }
    }

    pub fn close_reasoning(&mut self, out: &mut Vec<Value>) {
        if let Some(step_id) = self.reasoning_open.take() {
            F::reasoning_end(step_id, out);
        }
    }

    pub fn open_text(&mut self, step_id: Uuid, out: &mut Vec<Value>) {
        if self.text_open != Some(step_id) {
            self.close_text(out);
            out.push(F::text_start(step_id));
            self.text_open = Some(step_id);
            self.streamed.text.insert(step_id);
        }
    }

    pub fn close_text(&mut self, out: &mut Vec<Value>) {
        if let Some(step_id) = self.text_open.take() {
            out.push(F::text_end(step_id));
        }
    }

    /// Closes whatever part is open.
    pub fn close(&mut self, out: &mut Vec<Value>) {
        self.close_reasoning(out);
        self.close_text(out);
    }
}

/// The steps whose reasoning and text a stream has carried.
#[derive(Debug, Default)]
struct Streamed {
    reasoning: HashSet<Uuid>,
    text: HashSet<Uuid>,
}

impl Streamed {
    /// What the message of a completed step holds that its stream did not carry: its
    /// reasoning and its text.
    fn rest<'m>(&self, step_id: Uuid, message: &'m Message) -> (Option<String>, Option<&'m str>) {
        let reasoning = message.thinking_text();
        let reasoning =
            (!reasoning.is_empty() && !self.reasoning.contains(&step_id)).then_some(reasoning);
        let text = (!message.content.is_empty() && !self.text.contains(&step_id))
            .then_some(message.content.as_str());
        (reasoning, text)
    }
}

//! The recorded model: a client that calls no provider and answers each request of a turn with
//! the reply another session's log recorded for the same step of the same turn. A replay in
//! `recorded` mode runs on it (`POST /v1/sessions/{id}/replay`), so the server, the projection
//! and the policy run again on exactly the source's model output, with no model call.
//!
//! Before it answers, it checks that the request goes on from where the source's went on: the
//! tool results the request ends with must be the ones the source's next request had. A
//! request that diverges (the policy refused a call the source ran, a tool result differs)
//! and a step the source never made are refused with an error that says where, which ends the
//! replayed turn.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{stream, StreamExt};

use super::{
    LlmError, LlmErrorKind, ModelClient, ModelReply, ModelRequest, ModelStream, Purpose, StreamItem,
};
use crate::model::{Role, ThinkingBlock};

/// The provider name the recorded model goes by (in logs, traces and metrics).
pub const RECORDED: &str = "recorded";

/// What the source recorded of one turn: its model replies in order, and the results its tool
/// calls got (the content of their tool messages, by call id).
#[derive(Debug, Clone, Default)]
pub struct RecordedTurn {
    /// The turn's number, from 1.
    pub turn: usize,
    pub replies: Vec<ModelReply>,
    pub results: HashMap<String, String>,
}

/// Serves one turn of a recorded session.
pub struct RecordedModel {
    model: String,
    turn: Arc<RecordedTurn>,
}

impl RecordedModel {
    /// The recorded model for `turn`, named after the `model` the source ran.
    pub fn new(model: impl Into<String>, turn: Arc<RecordedTurn>) -> RecordedModel {
        RecordedModel {
            model: model.into(),
            turn,
        }
    }

    /// The source's reply to `request`, or why there is none.
    fn reply_to(&self, request: &ModelRequest) -> Result<ModelReply, String> {
        let turn = self.turn.turn;
        if request.purpose == Purpose::Summary {
            return Err(format!(
                "turn {turn}: a compaction summary is not served from the log"
            ));
        }
        let messages = &request.messages;
        let after_user = messages
            .iter()
            .rposition(|m| m.role == Role::User)
            .map_or(0, |i| i + 1);
        let step = messages[after_user..]
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let after_reply = messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
            .map_or(after_user, |i| (i + 1).max(after_user));
        for message in messages[after_reply..]
            .iter()
            .filter(|m| m.role == Role::Tool)
        {
            let call = message.tool_call_id.as_deref().unwrap_or_default();
            match self.turn.results.get(call) {
                Some(recorded) if *recorded == message.content => {}
                Some(recorded) => {
                    return Err(format!(
                        "turn {turn}, step {}: the result of call {call} differs from the \
                         source's (source: {}; replay: {})",
                        step + 1,
                        clip(recorded),
                        clip(&message.content)
                    ))
                }
                None => {
                    return Err(format!(
                        "turn {turn}, step {}: call {call} has a result the source never had",
                        step + 1
                    ))
                }
            }
        }
        self.turn.replies.get(step).cloned().ok_or_else(|| {
            format!(
                "turn {turn}: no recorded reply for step {} (the source's turn made {} model \
                 call(s))",
                step + 1,
                self.turn.replies.len()
            )
        })
    }
}

/// At most 200 characters of `text`, for an error message.
fn clip(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{:?}…", &text[..at]),
        None => format!("{text:?}"),
    }
}

impl ModelClient for RecordedModel {
    fn name(&self) -> &str {
        RECORDED
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn stream(&self, request: ModelRequest<'_>) -> ModelStream {
        let reply = match self.reply_to(&request) {
            Ok(reply) => reply,
            Err(why) => {
                let error = LlmError::new(
                    RECORDED,
                    LlmErrorKind::Rejected,
                    format!("the replay diverged from its source: {why}"),
                );
                return stream::iter([Err(error)]).boxed();
            }
        };
        let mut items: Vec<_> = reply
            .thinking
            .iter()
            .map(ThinkingBlock::text)
            .filter(|t| !t.is_empty())
            .map(|t| Ok(StreamItem::Thinking(t.to_string())))
            .collect();
        if !reply.text.is_empty() {
            items.push(Ok(StreamItem::Delta(reply.text.clone())));
        }
        items.push(Ok(StreamItem::Done(reply)));
        stream::iter(items).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, ToolCall, Usage};

    fn turn() -> Arc<RecordedTurn> {
        let call = ToolCall {
            id: "c1".into(),
            name: "list_files".into(),
            arguments: serde_json::json!({"path": "."}),
        };
        Arc::new(RecordedTurn {
            turn: 1,
            replies: vec![
                ModelReply {
                    tool_calls: vec![call],
                    finish_reason: "tool_calls".into(),
                    usage: Usage {
                        input_tokens: 10,
                        output_tokens: 2,
                    },
                    ..ModelReply::default()
                },
                ModelReply {
                    text: "done".into(),
                    finish_reason: "stop".into(),
                    ..ModelReply::default()
                },
            ],
            results: HashMap::from([("c1".to_string(), "a.txt".to_string())]),
        })
    }

    fn request(messages: Vec<Message>) -> ModelRequest<'static> {
        ModelRequest::owned(messages, Vec::new(), Purpose::Turn)
    }

    async fn answer(model: &RecordedModel, messages: Vec<Message>) -> Result<ModelReply, String> {
        let mut stream = model.stream(request(messages));
        while let Some(item) = stream.next().await {
            match item {
                Ok(StreamItem::Done(reply)) => return Ok(reply),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("no reply".into())
    }

    fn assistant_calling() -> Message {
        Message::assistant("", turn().replies[0].tool_calls.clone())
    }

    #[tokio::test]
    async fn serves_the_steps_of_the_turn_in_order() {
        let model = RecordedModel::new("mock", turn());
        let first = answer(&model, vec![Message::new(Role::User, "hi")]).await;
        assert_eq!(first.expect("a reply").usage.input_tokens, 10);
        let messages = vec![
            Message::new(Role::User, "hi"),
            assistant_calling(),
            Message::tool_result("c1", "a.txt"),
        ];
        assert_eq!(
            answer(&model, messages).await.expect("a reply").text,
            "done"
        );
    }

    #[tokio::test]
    async fn a_different_tool_result_or_a_missing_step_is_an_error() {
        let model = RecordedModel::new("mock", turn());
        let messages = vec![
            Message::new(Role::User, "hi"),
            assistant_calling(),
            Message::tool_result("c1", "{\"error\":\"denied\"}"),
        ];
        let error = answer(&model, messages).await.expect_err("diverged");
        assert!(
            error.contains("turn 1, step 2: the result of call c1 differs"),
            "{error}"
        );
        let messages = vec![
            Message::new(Role::User, "hi"),
            assistant_calling(),
            Message::tool_result("c1", "a.txt"),
            Message::assistant("done", Vec::new()),
            Message::new(Role::User, "again"),
        ];
        // A user message starts the count again: step 1 exists.
        assert!(answer(&model, messages).await.is_ok());
        let mut messages = vec![Message::new(Role::User, "hi")];
        for _ in 0..2 {
            messages.push(Message::assistant("x", Vec::new()));
        }
        let error = answer(&model, messages).await.expect_err("no third step");
        assert!(error.contains("no recorded reply for step 3"), "{error}");
    }
}

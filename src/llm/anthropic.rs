//! The Anthropic Messages API client: turns a [`ModelRequest`] into the `/v1/messages` request
//! (system prompt as a field, tool results as `tool_result` blocks, consecutive same-role
//! messages merged so roles alternate) and reads its typed SSE events (`message_start`,
//! `content_block_*`, `message_delta`, `message_stop`, `ping`, `error`).
//!
//! With a thinking budget, requests ask for extended thinking, and the `thinking` and
//! `redacted_thinking` blocks a reply streams are kept with its message. The API wants them
//! back, unchanged and before the text and `tool_use` blocks, in every later request of the
//! same tool-use cycle; those of earlier cycles it ignores, so they are not sent.
//!
//! Only the dialect lives here; retries, timeouts, SSE decoding and error mapping are shared
//! with the OpenAI client in [`super::wire`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use eventsource_stream::Event;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

use super::wire::{self, EventParser, Failure, HttpModelConfig, Piece, ReplyDraft, Transport};
use super::{LlmError, LlmErrorKind, ModelClient, ModelReply, ModelRequest, ModelStream, Purpose};
use crate::model::{Message, Role, ThinkingBlock, ToolCall, ToolSchema};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-5";

const PROVIDER: &str = "anthropic";
const API_VERSION: &str = "2023-06-01";

/// A client for the Anthropic Messages API.
pub struct AnthropicClient {
    model: String,
    max_tokens: u32,
    thinking_budget: Option<u32>,
    transport: Arc<Transport>,
}

impl AnthropicClient {
    /// Validates the configuration and builds the pooled HTTP client; connects lazily.
    pub fn new(config: HttpModelConfig) -> Result<Self, LlmError> {
        if config.max_tokens == 0 {
            return Err(LlmError::new(
                PROVIDER,
                LlmErrorKind::Rejected,
                "max_tokens must be at least 1",
            ));
        }
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        if let Some(key) = config.api_key.as_deref().filter(|k| !k.is_empty()) {
            headers.insert("x-api-key", wire::key_header(PROVIDER, key)?);
        }
        // Accept a base URL given with or without the `/v1` suffix.
        let path = if config
            .base_url
            .trim()
            .trim_end_matches('/')
            .ends_with("/v1")
        {
            "/messages"
        } else {
            "/v1/messages"
        };
        let transport = Transport::new(PROVIDER, &config, path, headers)?;
        Ok(AnthropicClient {
            model: config.model,
            max_tokens: config.max_tokens,
            thinking_budget: config.thinking_budget.filter(|b| *b > 0),
            transport: Arc::new(transport),
        })
    }
}

impl ModelClient for AnthropicClient {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let limits = Limits {
            max_tokens: self.max_tokens,
            thinking_budget: self.thinking_budget,
        };
        let body = request_body(&self.model, limits, &request);
        self.transport
            .stream(&body, request.purpose, EventReader::default)
    }
}

/// The token limits of a request.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Tokens of the reply's text and tool calls.
    max_tokens: u32,
    /// Tokens of thinking before them, when thinking is asked for.
    thinking_budget: Option<u32>,
}

/// The request body: model, max_tokens, system (omitted when empty), alternating messages,
/// tools (omitted when empty), thinking (with a budget), streaming.
///
/// Thinking counts against `max_tokens`, so the budget is added to it: the reply keeps its own
/// limit for what follows the thinking.
fn request_body(model: &str, limits: Limits, request: &ModelRequest) -> Value {
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System && !m.content.is_empty())
        .map(|m| m.content.as_str())
        .collect();
    let mut turns = conversation(&request.messages);
    // Summaries are asked for without thinking: they need no reasoning to speak of.
    let budget = limits
        .thinking_budget
        .filter(|_| request.purpose == Purpose::Turn && thinking_fits(&turns));
    if budget.is_none() {
        for turn in &mut turns {
            turn.blocks.retain(|b| !is_thinking(b));
        }
    }
    let max_tokens = limits.max_tokens.saturating_add(budget.unwrap_or(0));
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": turns.into_iter().map(Turn::into_json).collect::<Vec<_>>(),
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = Value::String(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.iter().map(|t| tool(t)).collect());
    }
    if let Some(budget) = budget {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    body
}

/// One message of the request: a role and its content blocks.
struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

impl Turn {
    fn into_json(self) -> Value {
        let Turn { role, blocks } = self;
        if role == "user" && blocks.len() == 1 && blocks[0]["type"] == "text" {
            return json!({"role": role, "content": blocks[0]["text"]});
        }
        // Tool results must come first in a user message.
        let (mut ordered, rest): (Vec<Value>, Vec<Value>) =
            blocks.into_iter().partition(|b| b["type"] == "tool_result");
        ordered.extend(rest);
        json!({"role": role, "content": ordered})
    }

    fn answers_tools(&self) -> bool {
        self.role == "user" && self.blocks.iter().any(|b| b["type"] == "tool_result")
    }
}

/// The conversation as alternating user/assistant messages of content blocks. An assistant
/// message carries its signed thinking blocks first only within the current tool-use cycle
/// (after the last user message that answers no tool call), where the API requires them.
fn conversation(history: &[Cow<'_, Message>]) -> Vec<Turn> {
    let mut merged: Vec<Turn> = Vec::new();
    for m in history {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => ("user", text_block(&m.content).into_iter().collect()),
            // A reply with neither text nor calls adds nothing (its thinking alone is no
            // message the API takes).
            Role::Assistant if m.content.is_empty() && m.tool_calls.is_empty() => continue,
            Role::Assistant => {
                let mut blocks: Vec<Value> = m
                    .thinking
                    .iter()
                    .filter(|b| b.is_signed())
                    .map(thinking_block)
                    .collect();
                blocks.extend(text_block(&m.content));
                blocks.extend(m.tool_calls.iter().map(|call| {
                    let input = if call.arguments.is_object() {
                        call.arguments.clone()
                    } else {
                        json!({})
                    };
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
                }));
                ("assistant", blocks)
            }
            Role::Tool => ("user", vec![tool_result(m)]),
        };
        if blocks.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some(last) if last.role == role => last.blocks.extend(blocks),
            _ => merged.push(Turn { role, blocks }),
        }
    }
    let cycle = merged
        .iter()
        .rposition(|t| t.role == "user" && !t.answers_tools())
        .unwrap_or(0);
    for turn in &mut merged[..cycle] {
        turn.blocks.retain(|b| !is_thinking(b));
    }
    merged
}

/// Whether thinking may be asked for: the API refuses it in a tool-use cycle whose assistant
/// message does not start with thinking (a cycle begun without it, before a restart with a
/// budget), as one assistant turn keeps one thinking configuration.
fn thinking_fits(turns: &[Turn]) -> bool {
    match turns {
        [.., assistant, last] if last.answers_tools() => {
            assistant.blocks.first().is_some_and(is_thinking)
        }
        _ => true,
    }
}

fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

/// A thinking block as the API sent it.
fn thinking_block(block: &ThinkingBlock) -> Value {
    match block {
        ThinkingBlock::Thinking {
            thinking,
            signature,
        } => json!({
            "type": "thinking",
            "thinking": thinking,
            "signature": signature.as_deref().unwrap_or_default(),
        }),
        ThinkingBlock::RedactedThinking { data } => {
            json!({"type": "redacted_thinking", "data": data})
        }
    }
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn tool_result(m: &Message) -> Value {
    let mut block = json!({
        "type": "tool_result",
        "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
    });
    // `content` is optional; an empty one is left out rather than sent as an empty text.
    if !m.content.is_empty() {
        block["content"] = Value::String(m.content.clone());
    }
    if is_tool_error(&m.content) {
        block["is_error"] = Value::Bool(true);
    }
    block
}

/// Tool errors reach the model as `{"error": "..."}`.
fn is_tool_error(content: &str) -> bool {
    content.starts_with("{\"error\"")
        && serde_json::from_str::<Value>(content)
            .ok()
            .and_then(|v| {
                v.as_object()
                    .map(|o| o.len() == 1 && o.contains_key("error"))
            })
            .unwrap_or(false)
}

fn tool(schema: &ToolSchema) -> Value {
    let mut input_schema = match &schema.parameters {
        Value::Object(o) => Value::Object(o.clone()),
        _ => json!({"properties": {}}),
    };
    if input_schema.get("type").is_none() {
        input_schema["type"] = json!("object");
    }
    json!({"name": schema.name, "description": schema.description, "input_schema": input_schema})
}

enum Block {
    Text,
    /// A thinking block, at this position of the draft's thinking.
    Thinking(usize),
    Tool {
        id: String,
        name: String,
        json: String,
        initial: Value,
    },
    Other,
}

/// Reads one attempt's events into a reply.
#[derive(Default)]
struct EventReader {
    reply: ReplyDraft,
    blocks: BTreeMap<u64, Block>,
}

fn normalise_stop_reason(reason: &str) -> String {
    match reason {
        "end_turn" | "stop_sequence" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        other => other,
    }
    .to_string()
}

/// Maps an in-stream `error` event to a failure.
fn stream_error(data: &Value) -> Failure {
    let error = &data["error"];
    let kind = error["type"].as_str().unwrap_or("error");
    let message = error["message"].as_str().unwrap_or("");
    let text = wire::truncate(&format!("{kind}: {message}"), 500);
    match kind {
        "overloaded_error" | "api_error" => {
            let mut failure = Failure::retryable(LlmErrorKind::Server, text);
            failure.short = format!("stream error: {kind}");
            failure
        }
        "rate_limit_error" => {
            let mut failure = Failure::retryable(LlmErrorKind::RateLimited, text);
            failure.short = format!("stream error: {kind}");
            failure
        }
        "authentication_error" | "permission_error" => {
            Failure::fatal(LlmErrorKind::Auth, format!("authentication failed: {text}"))
        }
        "not_found_error" => Failure::fatal(LlmErrorKind::NotFound, text),
        "invalid_request_error" | "request_too_large" => {
            Failure::fatal(LlmErrorKind::Rejected, text)
        }
        _ => Failure::fatal(LlmErrorKind::Server, text),
    }
}

impl EventParser for EventReader {
    fn event(
        &mut self,
        event: &Event,
        pieces: &mut Vec<Piece>,
    ) -> Result<Option<ModelReply>, Failure> {
        if event.data.trim().is_empty() {
            return Ok(None);
        }
        let data = wire::parse_json(&event.data)?;
        let kind = data["type"].as_str().unwrap_or(event.event.as_str());
        let index = data["index"].as_u64().unwrap_or(0);
        match kind {
            "message_start" => {
                let usage = &data["message"]["usage"];
                self.reply.usage.input_tokens = [
                    "input_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                ]
                .iter()
                .filter_map(|k| usage[*k].as_u64())
                .sum();
                self.reply.usage.output_tokens = usage["output_tokens"].as_u64().unwrap_or(0);
            }
            "content_block_start" => {
                let block = &data["content_block"];
                let parsed = match block["type"].as_str() {
                    Some("text") => {
                        self.reply
                            .push_text(block["text"].as_str().unwrap_or(""), pieces);
                        Block::Text
                    }
                    Some("thinking") => Block::Thinking(self.reply.start_thinking(
                        block["thinking"].as_str().unwrap_or(""),
                        block["signature"].as_str().unwrap_or(""),
                        pieces,
                    )),
                    Some("redacted_thinking") => {
                        self.reply
                            .push_redacted(block["data"].as_str().unwrap_or(""));
                        Block::Other
                    }
                    Some("tool_use") => Block::Tool {
                        id: block["id"].as_str().unwrap_or_default().to_string(),
                        name: block["name"].as_str().unwrap_or_default().to_string(),
                        json: String::new(),
                        initial: block["input"].clone(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, parsed);
            }
            "content_block_delta" => {
                let delta = &data["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => self
                        .reply
                        .push_text(delta["text"].as_str().unwrap_or(""), pieces),
                    Some("thinking_delta") => {
                        if let Some(Block::Thinking(at)) = self.blocks.get(&index) {
                            let text = delta["thinking"].as_str().unwrap_or("");
                            self.reply.push_thinking(*at, text, pieces);
                        }
                    }
                    Some("signature_delta") => {
                        if let Some(Block::Thinking(at)) = self.blocks.get(&index) {
                            let signature = delta["signature"].as_str().unwrap_or("");
                            self.reply.push_signature(*at, signature);
                        }
                    }
                    Some("input_json_delta") => {
                        if let Some(Block::Tool { json, .. }) = self.blocks.get_mut(&index) {
                            json.push_str(delta["partial_json"].as_str().unwrap_or(""));
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.reply.finish_reason = Some(normalise_stop_reason(reason));
                }
                let usage = &data["usage"];
                if let Some(output) = usage["output_tokens"].as_u64() {
                    self.reply.usage.output_tokens = output;
                }
                if let Some(input) = usage["input_tokens"].as_u64().filter(|n| *n > 0) {
                    self.reply.usage.input_tokens = input
                        + ["cache_creation_input_tokens", "cache_read_input_tokens"]
                            .iter()
                            .filter_map(|k| usage[*k].as_u64())
                            .sum::<u64>();
                }
            }
            "message_stop" => return Ok(Some(self.finish())),
            "error" => return Err(stream_error(&data)),
            // ping, content_block_stop and future event types carry nothing we need.
            _ => {}
        }
        Ok(None)
    }

    fn is_complete(&self) -> bool {
        self.reply.finish_reason.is_some()
    }

    fn finish(&mut self) -> ModelReply {
        let tool_calls = std::mem::take(&mut self.blocks)
            .into_values()
            .filter_map(|block| match block {
                Block::Tool {
                    id,
                    name,
                    json,
                    initial,
                } => Some(ToolCall {
                    id,
                    name,
                    arguments: if json.trim().is_empty() {
                        if initial.is_object() {
                            initial
                        } else {
                            json!({})
                        }
                    } else {
                        wire::parse_arguments(&json)
                    },
                }),
                _ => None,
            })
            .collect();
        self.reply.finish(tool_calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(thinking_budget: Option<u32>) -> Limits {
        Limits {
            max_tokens: 10,
            thinking_budget,
        }
    }

    #[test]
    fn tool_errors_are_flagged_and_schemas_are_objects() {
        assert!(is_tool_error(r#"{"error":"no such file"}"#));
        assert!(!is_tool_error(r#"{"error":"x","data":1}"#));
        assert!(!is_tool_error("error: plain"));
        let schema = ToolSchema {
            name: "t".into(),
            description: "d".into(),
            parameters: json!({}),
        };
        assert_eq!(tool(&schema)["input_schema"]["type"], "object");
    }

    #[test]
    fn empty_messages_are_skipped_and_roles_alternate() {
        let request = ModelRequest::owned(
            vec![
                Message::new(Role::User, "a"),
                Message::assistant("", vec![]),
                Message::new(Role::User, "b"),
            ],
            vec![],
            Purpose::Turn,
        );
        let body = request_body("m", limits(None), &request);
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}
            ]}])
        );
        assert!(body.get("system").is_none());
    }

    fn signed(text: &str, signature: &str) -> ThinkingBlock {
        ThinkingBlock::Thinking {
            thinking: text.into(),
            signature: Some(signature.into()),
        }
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "list_files".into(),
            arguments: json!({"path": "."}),
        }
    }

    /// An earlier turn with thinking, then the current turn in its tool-use cycle: a reply
    /// that thought (signed, redacted, and an unsigned block) and called a tool, and its result.
    fn history(current_thinking: Vec<ThinkingBlock>) -> Vec<Message> {
        vec![
            Message::new(Role::System, "sys"),
            Message::new(Role::User, "first"),
            Message::assistant("old answer", vec![]).with_thinking(vec![signed("old", "sig-old")]),
            Message::new(Role::User, "second"),
            Message::assistant("Looking.", vec![call("c1")]).with_thinking(current_thinking),
            Message::tool_result("c1", "README.md"),
        ]
    }

    fn turn(messages: Vec<Message>) -> ModelRequest<'static> {
        ModelRequest::owned(messages, vec![], Purpose::Turn)
    }

    #[test]
    fn the_current_cycle_sends_its_thinking_back_first_and_unchanged() {
        let thinking = vec![
            signed("Let me think: 世界 🤔", "sig-1"),
            ThinkingBlock::RedactedThinking {
                data: "opaque==".into(),
            },
            ThinkingBlock::Thinking {
                thinking: "unsigned".into(),
                signature: None,
            },
        ];
        let body = request_body("m", limits(Some(2048)), &turn(history(thinking)));
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 2048})
        );
        assert_eq!(body["max_tokens"], 10 + 2048, "the budget comes on top");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(
            messages[1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "old answer"}]}),
            "an earlier cycle's thinking stays home"
        );
        assert_eq!(
            messages[3]["content"],
            json!([
                {"type": "thinking", "thinking": "Let me think: 世界 🤔", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "opaque=="},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "list_files", "input": {"path": "."}},
            ])
        );
    }

    #[test]
    fn a_cycle_begun_without_thinking_goes_on_without_it() {
        let body = request_body("m", limits(Some(2048)), &turn(history(vec![])));
        assert!(body.get("thinking").is_none(), "{body}");
        assert_eq!(body["max_tokens"], 10);
        assert!(!body.to_string().contains("\"thinking\""), "{body}");
        // A new turn asks for thinking again.
        let mut messages = history(vec![]);
        messages.push(Message::assistant("done", vec![]));
        messages.push(Message::new(Role::User, "third"));
        let body = request_body("m", limits(Some(2048)), &turn(messages));
        assert_eq!(body["thinking"]["budget_tokens"], 2048);
    }

    #[test]
    fn without_a_budget_or_for_a_summary_nothing_is_thought_or_sent_back() {
        let messages = history(vec![signed("hmm", "sig-1")]);
        let body = request_body("m", limits(None), &turn(messages.clone()));
        assert!(body.get("thinking").is_none());
        assert!(!body.to_string().contains("sig-1"), "{body}");
        let summary = ModelRequest {
            purpose: Purpose::Summary,
            ..turn(messages)
        };
        let body = request_body("m", limits(Some(2048)), &summary);
        assert!(body.get("thinking").is_none());
        assert!(!body.to_string().contains("sig-1"), "{body}");
    }
}

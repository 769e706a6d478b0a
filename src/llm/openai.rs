//! The OpenAI-compatible Chat Completions client: turns a [`ModelRequest`] into the
//! `/chat/completions` request body and reads the streamed `data: {...}` chunks (text deltas,
//! reasoning deltas, tool-call fragments assembled by index, finish reason, the final usage
//! chunk, `[DONE]`).
//!
//! Reasoning arrives as `reasoning_content` (DeepSeek, llama.cpp, older vLLM) or `reasoning`
//! (OpenRouter, newer vLLM, which may send both with the same text). It is kept as the
//! message's thinking and never sent back: these servers neither need it nor, some of them,
//! accept it in a request.
//!
//! Only the dialect lives here; retries, timeouts, SSE decoding and error mapping are shared
//! with the Anthropic client in [`super::wire`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use eventsource_stream::Event;
use reqwest::header::{HeaderMap, AUTHORIZATION};
use serde::Serialize;
use serde_json::{json, Value};

use super::wire::{self, EventParser, Failure, HttpModelConfig, Piece, ReplyDraft, Transport};
use super::{LlmError, LlmErrorKind, ModelClient, ModelReply, ModelRequest, ModelStream};
use crate::model::{Message, Role, ToolCall, ToolSchema, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

const PROVIDER: &str = "openai";

/// A client for any OpenAI-compatible Chat Completions endpoint.
pub struct OpenAiClient {
    model: String,
    /// The reply's token limit, and the field it is sent in.
    max_tokens: (&'static str, u32),
    transport: Arc<Transport>,
}

impl OpenAiClient {
    /// Validates the configuration and builds the pooled HTTP client; connects lazily.
    pub fn new(config: HttpModelConfig) -> Result<Self, LlmError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = config.api_key.as_deref().filter(|k| !k.is_empty()) {
            headers.insert(
                AUTHORIZATION,
                wire::key_header(PROVIDER, &format!("Bearer {key}"))?,
            );
        }
        let transport = Transport::new(PROVIDER, &config, "/chat/completions", headers)?;
        Ok(OpenAiClient {
            max_tokens: (max_tokens_field(&config.base_url), config.max_tokens),
            model: config.model,
            transport: Arc::new(transport),
        })
    }
}

impl ModelClient for OpenAiClient {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let body = RequestBody::new(&self.model, self.max_tokens, &request);
        self.transport
            .stream(&body, request.purpose, ChunkParser::default)
    }
}

/// OpenAI's own API takes the reply's token limit as `max_completion_tokens` (its reasoning
/// models refuse `max_tokens`); compatible servers (vLLM, llama.cpp, Ollama, LM Studio) know
/// `max_tokens`.
fn max_tokens_field(base_url: &str) -> &'static str {
    let host = reqwest::Url::parse(base_url.trim())
        .ok()
        .and_then(|u| u.host_str().map(str::to_ascii_lowercase));
    match host.as_deref() {
        Some("api.openai.com") => "max_completion_tokens",
        _ => "max_tokens",
    }
}

/// The request body: model, messages, tools (omitted when empty), streaming with usage, and
/// the token limit in the field the server knows. It borrows the request and is serialised
/// straight into the bytes sent, with no intermediate JSON tree.
#[derive(Serialize)]
struct RequestBody<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

impl<'a> RequestBody<'a> {
    fn new(model: &'a str, (field, limit): (&str, u32), request: &'a ModelRequest) -> Self {
        let completion = field == "max_completion_tokens";
        RequestBody {
            model,
            messages: request
                .messages
                .iter()
                .map(|m| WireMessage::of(m))
                .collect(),
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            tools: request.tools.iter().map(|t| WireTool::of(t)).collect(),
            max_tokens: (!completion).then_some(limit),
            max_completion_tokens: completion.then_some(limit),
        }
    }
}

/// One message as Chat Completions takes it.
#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'a str,
    /// `null` for an assistant message that only calls tools.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
}

impl<'a> WireMessage<'a> {
    fn of(m: &'a Message) -> Self {
        let mut out = WireMessage {
            role: m.role.as_str(),
            content: Some(&m.content),
            tool_call_id: None,
            tool_calls: Vec::new(),
        };
        match m.role {
            Role::System | Role::User => {}
            Role::Assistant => {
                if m.content.is_empty() && !m.tool_calls.is_empty() {
                    out.content = None;
                }
                out.tool_calls = m.tool_calls.iter().map(WireCall::of).collect();
            }
            Role::Tool => out.tool_call_id = Some(m.tool_call_id.as_deref().unwrap_or_default()),
        }
        out
    }
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    /// The arguments as a JSON string, as the model sent them.
    arguments: Cow<'a, str>,
}

impl<'a> WireCall<'a> {
    fn of(call: &'a ToolCall) -> Self {
        let arguments = match &call.arguments {
            Value::String(raw) => Cow::Borrowed(raw.as_str()),
            other => Cow::Owned(other.to_string()),
        };
        WireCall {
            id: &call.id,
            kind: "function",
            function: WireFunction {
                name: &call.name,
                arguments,
            },
        }
    }
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> WireTool<'a> {
    fn of(schema: &'a ToolSchema) -> Self {
        WireTool {
            kind: "function",
            function: WireToolFunction {
                name: &schema.name,
                description: &schema.description,
                parameters: &schema.parameters,
            },
        }
    }
}

/// A tool call being assembled from its fragments.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Reads one attempt's chunks into a reply.
#[derive(Default)]
struct ChunkParser {
    reply: ReplyDraft,
    calls: BTreeMap<u64, PartialCall>,
}

impl ChunkParser {
    fn choice(&mut self, choice: &Value, pieces: &mut Vec<Piece>) {
        let delta = &choice["delta"];
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|key| delta[*key].as_str().filter(|r| !r.is_empty()));
        if let Some(reasoning) = reasoning {
            self.reply.push_reasoning(reasoning, pieces);
        }
        if let Some(text) = delta["content"].as_str() {
            self.reply.push_text(text, pieces);
        }
        if let Some(fragments) = delta["tool_calls"].as_array() {
            for (position, fragment) in fragments.iter().enumerate() {
                let index = fragment["index"].as_u64().unwrap_or(position as u64);
                let call = self.calls.entry(index).or_default();
                if let Some(id) = fragment["id"].as_str().filter(|s| !s.is_empty()) {
                    if call.id.is_empty() {
                        call.id = id.to_string();
                    }
                }
                let function = &fragment["function"];
                if let Some(name) = function["name"].as_str().filter(|s| !s.is_empty()) {
                    if call.name.is_empty() {
                        call.name = name.to_string();
                    }
                }
                if let Some(piece) = function["arguments"].as_str() {
                    call.arguments.push_str(piece);
                }
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.reply.finish_reason = Some(normalise_finish_reason(reason));
        }
    }
}

fn normalise_finish_reason(reason: &str) -> String {
    match reason {
        "function_call" => "tool_calls".to_string(),
        other => other.to_string(),
    }
}

impl EventParser for ChunkParser {
    fn event(
        &mut self,
        event: &Event,
        pieces: &mut Vec<Piece>,
    ) -> Result<Option<ModelReply>, Failure> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Some(self.finish()));
        }
        if data.is_empty() {
            return Ok(None);
        }
        let chunk = wire::parse_json(data)?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let text = wire::error_message(&json!({ "error": error }).to_string());
            return Err(Failure::retryable(
                LlmErrorKind::Server,
                format!(
                    "the provider reported an error mid-stream: {}",
                    wire::truncate(&text, 500)
                ),
            ));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.reply.usage = Usage {
                input_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
                output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
            };
        }
        if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
            let first = choices
                .iter()
                .find(|c| c["index"].as_u64() == Some(0))
                .or_else(|| choices.first());
            if let Some(choice) = first {
                self.choice(choice, pieces);
            }
        }
        Ok(None)
    }

    fn is_complete(&self) -> bool {
        self.reply.finish_reason.is_some()
    }

    fn finish(&mut self) -> ModelReply {
        let tool_calls = std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(index, call)| ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{index}")
                } else {
                    call.id
                },
                name: call.name,
                arguments: wire::parse_arguments(&call.arguments),
            })
            .collect();
        self.reply.finish(tool_calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Purpose;

    #[test]
    fn assistant_tool_calls_are_sent_as_strings() {
        let calls = vec![
            ToolCall {
                id: "a".into(),
                name: "read_file".into(),
                arguments: json!({"path": "x"}),
            },
            ToolCall {
                id: "b".into(),
                name: "list_files".into(),
                arguments: Value::String("{broken".into()),
            },
        ];
        let request =
            ModelRequest::owned(vec![Message::assistant("", calls)], vec![], Purpose::Turn);
        let body = serde_json::to_value(RequestBody::new("m", ("max_tokens", 64), &request))
            .expect("the body serialises");
        let sent = &body["messages"][0];
        assert_eq!(sent["content"], Value::Null);
        assert_eq!(
            sent["tool_calls"][0]["function"]["arguments"],
            r#"{"path":"x"}"#
        );
        assert_eq!(sent["tool_calls"][1]["function"]["arguments"], "{broken");
        assert!(body.get("tools").is_none());
        assert_eq!(body["max_tokens"], 64);
        assert!(body.get("max_completion_tokens").is_none());
        assert_eq!(body["stream_options"]["include_usage"], true);
    }

    #[test]
    fn the_token_limit_goes_in_the_field_the_server_knows() {
        assert_eq!(
            max_tokens_field("https://api.openai.com/v1"),
            "max_completion_tokens"
        );
        assert_eq!(max_tokens_field("http://127.0.0.1:11434/v1"), "max_tokens");
        assert_eq!(max_tokens_field("not a url"), "max_tokens");
    }
}

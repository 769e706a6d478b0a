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

use std::collections::BTreeMap;
use std::sync::Arc;

use eventsource_stream::Event;
use reqwest::header::{HeaderMap, AUTHORIZATION};
use serde_json::{json, Map, Value};

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
        let mut body = request_body(&self.model, &request);
        let (field, limit) = self.max_tokens;
        body[field] = json!(limit);
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

/// The request body: model, messages, tools (omitted when empty), streaming with usage.
fn request_body(model: &str, request: &ModelRequest) -> Value {
    let mut body = json!({
        "model": model,
        "messages": request.messages.iter().map(message).collect::<Vec<_>>(),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !request.tools.is_empty() {
        body["tools"] = Value::Array(request.tools.iter().map(tool).collect());
    }
    body
}

fn message(m: &Message) -> Value {
    match m.role {
        Role::System | Role::User => json!({"role": m.role.as_str(), "content": m.content}),
        Role::Assistant => {
            let mut out = Map::new();
            out.insert("role".into(), json!("assistant"));
            let content = if m.content.is_empty() && !m.tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(m.content.clone())
            };
            out.insert("content".into(), content);
            if !m.tool_calls.is_empty() {
                let calls = m.tool_calls.iter().map(tool_call).collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(out)
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
            "content": m.content,
        }),
    }
}

fn tool_call(call: &ToolCall) -> Value {
    let arguments = match &call.arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    };
    json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    })
}

fn tool(schema: &ToolSchema) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": schema.name,
            "description": schema.description,
            "parameters": schema.parameters,
        },
    })
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
        let request = ModelRequest {
            messages: vec![Message::assistant("", calls)],
            tools: vec![],
            purpose: Purpose::Turn,
        };
        let body = request_body("m", &request);
        let sent = &body["messages"][0];
        assert_eq!(sent["content"], Value::Null);
        assert_eq!(
            sent["tool_calls"][0]["function"]["arguments"],
            r#"{"path":"x"}"#
        );
        assert_eq!(sent["tool_calls"][1]["function"]["arguments"], "{broken");
        assert!(body.get("tools").is_none());
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

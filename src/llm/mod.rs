//! Model clients: the `ModelClient` trait and its providers (mock, OpenAI-compatible, Anthropic).
//!
//! A client turns a [`ModelRequest`] into a stream of [`StreamItem`]s: text and thinking deltas
//! as they arrive, retry notices, and finally the complete [`ModelReply`]. Dropping the stream drops the
//! HTTP request, which is how cancellation reaches the provider. Clients never touch sessions or
//! the store.
//!
//! - [`mock`]: the deterministic offline model.
//! - [`recorded`]: a session's recorded replies, served again (replays).
//! - [`openai`], [`anthropic`]: the two provider dialects.
//! - [`wire`]: what both dialects share: configuration, transport, retries, SSE decoding.
//! - [`guard`]: size limits and secret scrubbing for everything a provider sends back.

pub mod anthropic;
pub mod guard;
pub mod mock;
pub mod openai;
pub mod providers;
pub mod recorded;
pub mod wire;

use std::borrow::Cow;

use futures::stream::BoxStream;
use serde::Serialize;

use crate::model::{Message, ThinkingBlock, ToolCall, ToolSchema, Usage};

/// Why a request is made. Providers send both the same way and name it in their logs; the
/// mock answers each differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A step of the agent loop.
    Turn,
    /// A compaction summary of earlier turns.
    Summary,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Turn => "turn",
            Purpose::Summary => "summary",
        }
    }
}

/// One request to the model: the projected context (system message first) and the tools.
/// It borrows what it can (the session's history, the registry's schemas): a client reads it
/// while [`ModelClient::stream`] runs and keeps nothing of it.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRequest<'a> {
    pub messages: Vec<Cow<'a, Message>>,
    pub tools: Vec<Cow<'a, ToolSchema>>,
    #[serde(skip)]
    pub purpose: Purpose,
}

impl ModelRequest<'static> {
    /// A request that owns its messages and tools.
    pub fn owned(messages: Vec<Message>, tools: Vec<ToolSchema>, purpose: Purpose) -> Self {
        ModelRequest {
            messages: messages.into_iter().map(Cow::Owned).collect(),
            tools: tools.into_iter().map(Cow::Owned).collect(),
            purpose,
        }
    }
}

/// The complete reply of one model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelReply {
    pub text: String,
    /// The reasoning that came before the text, block by block as the provider sent it.
    pub thinking: Vec<ThinkingBlock>,
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `tool_calls`, `length`, … as the provider reported it (normalised to these names).
    pub finish_reason: String,
    pub usage: Usage,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A piece of the assistant's text.
    Delta(String),
    /// A piece of the model's reasoning.
    Thinking(String),
    /// The previous attempt failed and is being retried; text and thinking streamed so far are
    /// void.
    Retry { attempt: u32, error: String },
    /// The reply is complete; the stream ends after this item.
    Done(ModelReply),
}

pub type ModelStream = BoxStream<'static, Result<StreamItem, LlmError>>;

/// A failure that ends the LLM step. The message names the provider and the cause, never a key.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{provider}: {message}")]
pub struct LlmError {
    pub provider: String,
    pub kind: LlmErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmErrorKind {
    /// 401/403: the key is missing, wrong or not allowed.
    Auth,
    /// 404: wrong base URL or model.
    NotFound,
    /// 429 after all retries.
    RateLimited,
    /// 5xx after all retries.
    Server,
    /// Connection refused/reset after all retries.
    Connection,
    /// Connect, first-byte or idle timeout.
    Timeout,
    /// The provider sent something we cannot parse.
    Protocol,
    /// Any other 4xx: the request was rejected.
    Rejected,
}

impl LlmError {
    pub fn new(provider: &str, kind: LlmErrorKind, message: impl Into<String>) -> LlmError {
        LlmError {
            provider: provider.to_string(),
            kind,
            message: message.into(),
        }
    }
}

/// A model provider. Implementations must be cheap to share (`Arc<dyn ModelClient>`).
pub trait ModelClient: Send + Sync {
    /// The provider's name, for logs and errors (`mock`, `openai`, `anthropic`).
    fn name(&self) -> &str;

    /// The model's name as configured.
    fn model(&self) -> &str;

    /// Starts one model call. Connecting happens lazily when the stream is polled; dropping the
    /// stream aborts the call. The stream owns what it needs of the request.
    fn stream(&self, request: ModelRequest<'_>) -> ModelStream;
}

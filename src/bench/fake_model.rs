//! A fake OpenAI-compatible model: `POST /v1/chat/completions` (and `/chat/completions`)
//! answering streaming Chat Completions from a few knobs, fast enough never to be the
//! bottleneck of a benchmark.
//!
//! Each turn of the agent loop gets `tool_calls` tool-call replies (`list_files` on `.`) and then
//! a text reply of `pieces` content chunks, `piece_delay` apart. Which reply a request gets is
//! decided statelessly from the request: the `role: "tool"` messages after the last
//! `role: "user"` message are counted; fewer than `tool_calls` → a tool call, otherwise text.
//! A request without `tools` (a compaction summary) always gets text.
//!
//! The first text piece (every piece with [`FakeKnobs::stamp_every_piece`]) starts with
//! `⏱<unix-micros>⏱ `, the moment it left the model, so that a client at the far end of the
//! server can measure how long a delta took to reach it ([`parse_stamps`]).
//!
//! Bodies are written from pre-rendered byte strings: a reply without a piece delay is one
//! buffer and one write.
//!
//! It also serves the fan-out floor ([`super::fanout`]).

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use axum::routing::{get, post};
use axum::Router;
use bytes::BytesMut;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::json;
use tah::http::sse::event_stream;

/// The marker around a piece's send time.
pub const STAMP: char = '⏱';

/// The tool the fake model calls, with its arguments (a JSON string, as OpenAI sends them).
pub const TOOL_NAME: &str = "list_files";
pub const TOOL_ARGUMENTS: &str = r#"{"path":"."}"#;

/// What the fake model answers.
#[derive(Debug, Clone)]
pub struct FakeKnobs {
    /// Content chunks of a text reply.
    pub pieces: usize,
    /// Delay between two content chunks.
    pub piece_delay: Duration,
    /// Tool-call replies at the start of every turn, before the text reply.
    pub tool_calls: usize,
    /// Stamp every piece with its send time, not only the first.
    pub stamp_every_piece: bool,
}

impl Default for FakeKnobs {
    fn default() -> FakeKnobs {
        FakeKnobs {
            pieces: 50,
            piece_delay: Duration::ZERO,
            tool_calls: 1,
            stamp_every_piece: false,
        }
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Every `⏱<micros>⏱` stamp in `text`, in order.
pub fn parse_stamps(text: &str) -> impl Iterator<Item = u64> + '_ {
    let mut rest = text;
    std::iter::from_fn(move || loop {
        let start = rest.find(STAMP)? + STAMP.len_utf8();
        rest = &rest[start..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(STAMP) {
            let value = rest[..digits].parse().ok();
            rest = &rest[digits + STAMP.len_utf8()..];
            if value.is_some() {
                return value;
            }
        }
    })
}

/// Binds `addr` and serves the fake model until the task is dropped; returns the bound
/// address and the server task (abort it to stop).
pub async fn spawn_fake_model(
    addr: SocketAddr,
    knobs: FakeKnobs,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(serve_fake_model(listener, knobs));
    Ok((local, task))
}

/// Serves the fake model on `listener` until an I/O error ends it. Its sockets send each
/// piece at once (`TCP_NODELAY`), as a model provider's streaming endpoint does.
pub async fn serve_fake_model(
    listener: tokio::net::TcpListener,
    knobs: FakeKnobs,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(knobs)).await
}

/// The fake model's routes, for embedding.
pub fn router(knobs: FakeKnobs) -> Router {
    let knobs_for_floor = knobs.clone();
    let fake = Arc::new(Fake::new(knobs));
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/chat/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .with_state(fake)
        .merge(super::fanout::routes(knobs_for_floor))
}

const CHUNK_HEAD: &str = r#"data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1700000000,"model":"fake","choices":[{"index":0,"delta":"#;
const CHUNK_TAIL: &str = "}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const WORDS: [&str; 16] = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "the", "bench",
    "counts", "every", "small", "piece",
];

struct Fake {
    knobs: FakeKnobs,
    /// The role chunk that opens every reply.
    opening: Bytes,
    /// One rendered content chunk per piece, without a stamp.
    pieces: Vec<Bytes>,
    /// The raw text of each piece.
    words: Vec<String>,
    /// `finish_reason: stop` chunk.
    stop: Bytes,
    /// `finish_reason: tool_calls` chunk.
    tool_stop: Bytes,
    /// Completion tokens of a text reply.
    text_tokens: usize,
    next_call: AtomicU64,
}

impl Fake {
    fn new(knobs: FakeKnobs) -> Fake {
        let words: Vec<String> = (0..knobs.pieces)
            .map(|i| format!("{} ", WORDS[i % WORDS.len()]))
            .collect();
        let pieces = words
            .iter()
            .map(|w| Bytes::from(content_chunk(w, None)))
            .collect();
        Fake {
            opening: Bytes::from(chunk(
                r#"{"role":"assistant","content":""},"finish_reason":null"#,
            )),
            stop: Bytes::from(chunk(r#"{},"finish_reason":"stop""#)),
            tool_stop: Bytes::from(chunk(r#"{},"finish_reason":"tool_calls""#)),
            text_tokens: knobs.pieces,
            pieces,
            words,
            knobs,
            next_call: AtomicU64::new(1),
        }
    }

    fn stamped(&self, index: usize) -> bool {
        index == 0 || self.knobs.stamp_every_piece
    }

    /// Piece `index` as a chunk, stamped now when it carries a stamp.
    fn piece(&self, index: usize) -> Bytes {
        if self.stamped(index) {
            Bytes::from(content_chunk(&self.words[index], Some(unix_micros())))
        } else {
            self.pieces[index].clone()
        }
    }

    fn tool_call_chunk(&self) -> String {
        let n = self.next_call.fetch_add(1, Ordering::Relaxed);
        let arguments = serde_json::to_string(TOOL_ARGUMENTS).unwrap_or_default();
        chunk(&format!(
            r#"{{"role":"assistant","content":null,"tool_calls":[{{"index":0,"id":"call_fake_{n}","type":"function","function":{{"name":"{TOOL_NAME}","arguments":{arguments}}}}}]}},"finish_reason":null"#
        ))
    }
}

fn chunk(choice_rest: &str) -> String {
    let mut out = String::with_capacity(CHUNK_HEAD.len() + choice_rest.len() + CHUNK_TAIL.len());
    out.push_str(CHUNK_HEAD);
    out.push_str(choice_rest);
    out.push_str(CHUNK_TAIL);
    out
}

fn content_chunk(word: &str, stamp: Option<u64>) -> String {
    let text = match stamp {
        Some(micros) => format!("{STAMP}{micros}{STAMP} {word}"),
        None => word.to_string(),
    };
    let escaped = serde_json::to_string(&text).unwrap_or_else(|_| "\"\"".to_string());
    chunk(&format!(r#"{{"content":{escaped}}},"finish_reason":null"#))
}

fn usage_chunk(prompt_tokens: usize, completion_tokens: usize) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"fake\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt_tokens},\"completion_tokens\":{completion_tokens},\"total_tokens\":{}}}}}\n\n",
        prompt_tokens + completion_tokens
    )
}

#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(borrow, default)]
    messages: Vec<ChatMessage<'a>>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    tools: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct ChatMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
}

/// Whether this request gets a tool call: fewer tool results than `tool_calls` since the last
/// user message, and tools on offer.
fn wants_tool_call(request: &ChatRequest<'_>, tool_calls: usize) -> bool {
    if request.tools.is_none() {
        return false;
    }
    let since_user = request
        .messages
        .iter()
        .rposition(|m| m.role == "user")
        .map_or(0, |i| i + 1);
    let results = request.messages[since_user..]
        .iter()
        .filter(|m| m.role == "tool")
        .count();
    results < tool_calls
}

fn openai_error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
    (status, axum::Json(body)).into_response()
}

async fn models() -> Response {
    axum::Json(json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}))
        .into_response()
}

async fn completions(State(fake): State<Arc<Fake>>, body: Bytes) -> Response {
    let request: ChatRequest<'_> = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return openai_error(
                StatusCode::BAD_REQUEST,
                &format!("malformed request: {error}"),
            )
        }
    };
    // A rough token count, as a provider would report it.
    let prompt_tokens = body.len() / 4;
    let tool_call = wants_tool_call(&request, fake.knobs.tool_calls);
    if !request.stream {
        return whole_reply(&fake, tool_call, prompt_tokens);
    }
    if tool_call {
        let call = fake.tool_call_chunk();
        let usage = usage_chunk(prompt_tokens, 10);
        let mut out = BytesMut::with_capacity(
            fake.opening.len() + call.len() + fake.tool_stop.len() + usage.len() + DONE.len(),
        );
        out.extend_from_slice(&fake.opening);
        out.extend_from_slice(call.as_bytes());
        out.extend_from_slice(&fake.tool_stop);
        out.extend_from_slice(usage.as_bytes());
        out.extend_from_slice(DONE.as_bytes());
        return event_stream(Body::from(out.freeze()));
    }
    let usage = Bytes::from(usage_chunk(prompt_tokens, fake.text_tokens));
    if fake.knobs.piece_delay.is_zero() {
        let size = fake.opening.len()
            + fake.pieces.iter().map(Bytes::len).sum::<usize>()
            + 64
            + fake.stop.len()
            + usage.len()
            + DONE.len();
        let mut out = BytesMut::with_capacity(size);
        out.extend_from_slice(&fake.opening);
        for index in 0..fake.pieces.len() {
            out.extend_from_slice(&fake.piece(index));
        }
        out.extend_from_slice(&fake.stop);
        out.extend_from_slice(&usage);
        out.extend_from_slice(DONE.as_bytes());
        return event_stream(Body::from(out.freeze()));
    }
    // Paced: the opening and the first piece at once, then one piece per delay.
    let delay = fake.knobs.piece_delay;
    let total = fake.pieces.len();
    let stream =
        futures::stream::unfold((fake, usage, 0usize), move |(fake, usage, i)| async move {
            // Steps: 0 = opening, 1..=total = pieces, total+1 = stop + usage + [DONE].
            let item = if i == 0 {
                fake.opening.clone()
            } else if i <= total {
                if i > 1 {
                    tokio::time::sleep(delay).await;
                }
                fake.piece(i - 1)
            } else if i == total + 1 {
                let mut out = BytesMut::with_capacity(fake.stop.len() + usage.len() + DONE.len());
                out.extend_from_slice(&fake.stop);
                out.extend_from_slice(&usage);
                out.extend_from_slice(DONE.as_bytes());
                out.freeze()
            } else {
                return None;
            };
            Some((Ok::<_, Infallible>(item), (fake, usage, i + 1)))
        });
    event_stream(Body::from_stream(stream))
}

/// The non-streaming answer (`stream: false`).
fn whole_reply(fake: &Fake, tool_call: bool, prompt_tokens: usize) -> Response {
    let message = if tool_call {
        let n = fake.next_call.fetch_add(1, Ordering::Relaxed);
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_fake_{n}"),
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS},
            }],
        })
    } else {
        let mut text = format!("{STAMP}{}{STAMP} ", unix_micros());
        text.extend(fake.words.iter().map(String::as_str));
        json!({"role": "assistant", "content": text})
    };
    let completion_tokens = if tool_call { 10 } else { fake.text_tokens };
    axum::Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake",
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": if tool_call { "tool_calls" } else { "stop" },
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tah::llm::openai::OpenAiClient;
    use tah::llm::wire::HttpModelConfig;
    use tah::llm::{ModelClient, ModelReply, ModelRequest, Purpose, StreamItem};
    use tah::model::{Message, Role, ToolCall, ToolSchema};

    fn schema() -> ToolSchema {
        serde_json::from_value(json!({
            "name": "list_files",
            "description": "List files",
            "parameters": {"type": "object", "properties": {}},
        }))
        .unwrap()
    }

    async fn call(client: &OpenAiClient, messages: Vec<Message>) -> (Vec<String>, ModelReply) {
        let mut stream =
            client.stream(ModelRequest::owned(messages, vec![schema()], Purpose::Turn));
        let mut deltas = Vec::new();
        while let Some(item) = stream.next().await {
            match item.unwrap() {
                StreamItem::Delta(d) => deltas.push(d),
                StreamItem::Done(reply) => return (deltas, reply),
                StreamItem::Retry { error, .. } => panic!("retry: {error}"),
                StreamItem::Thinking(t) => panic!("the fake model does not think: {t}"),
            }
        }
        panic!("stream ended without a reply")
    }

    async fn turn_sequence(knobs: FakeKnobs) {
        let pieces = knobs.pieces;
        let (addr, task) = spawn_fake_model("127.0.0.1:0".parse().unwrap(), knobs)
            .await
            .unwrap();
        let client = OpenAiClient::new(HttpModelConfig::new(
            format!("http://{addr}/v1"),
            Some("k".into()),
            "fake",
        ))
        .unwrap();
        let mut history = vec![
            Message::new(Role::System, "sys"),
            Message::new(Role::User, "hi"),
        ];
        let (deltas, reply) = call(&client, history.clone()).await;
        assert!(deltas.is_empty());
        assert_eq!(reply.finish_reason, "tool_calls");
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0].name, TOOL_NAME);
        assert_eq!(reply.tool_calls[0].arguments, json!({"path": "."}));
        history.push(Message::assistant("", reply.tool_calls.clone()));
        history.push(Message::tool_result(
            reply.tool_calls[0].id.clone(),
            "README.md",
        ));
        let (deltas, reply) = call(&client, history.clone()).await;
        assert_eq!(deltas.len(), pieces);
        assert_eq!(reply.finish_reason, "stop");
        assert!(reply.tool_calls.is_empty());
        assert_eq!(reply.usage.output_tokens, pieces as u64);
        let stamps: Vec<u64> = parse_stamps(&deltas[0]).collect();
        assert_eq!(stamps.len(), 1);
        assert!(stamps[0] <= unix_micros());
        assert!(deltas[1..].iter().all(|d| parse_stamps(d).next().is_none()));
        // The next turn starts with a tool call again.
        history.push(Message::assistant(reply.text, Vec::<ToolCall>::new()));
        history.push(Message::new(Role::User, "again"));
        let (_, reply) = call(&client, history).await;
        assert_eq!(reply.finish_reason, "tool_calls");
        task.abort();
    }

    #[tokio::test]
    async fn a_turn_is_a_tool_call_then_text() {
        turn_sequence(FakeKnobs::default()).await;
    }

    #[tokio::test]
    async fn paced_pieces_arrive_one_by_one() {
        turn_sequence(FakeKnobs {
            pieces: 5,
            piece_delay: Duration::from_millis(2),
            ..FakeKnobs::default()
        })
        .await;
    }

    #[test]
    fn stamps_are_found_anywhere() {
        let text = format!("{STAMP}12{STAMP} a {STAMP}x{STAMP}{STAMP}34{STAMP} b {STAMP}");
        assert_eq!(parse_stamps(&text).collect::<Vec<_>>(), vec![12, 34]);
        assert_eq!(parse_stamps("plain").count(), 0);
    }

    #[test]
    fn tool_calls_are_counted_since_the_last_user_message() {
        let body = br#"{"messages":[{"role":"user","content":"a"},{"role":"tool","content":"x"},
            {"role":"user","content":"b"},{"role":"assistant","content":null},
            {"role":"tool","content":"y"}],"tools":[],"stream":true}"#;
        let request: ChatRequest<'_> = serde_json::from_slice(body).unwrap();
        assert!(wants_tool_call(&request, 2));
        assert!(!wants_tool_call(&request, 1));
        let no_tools: ChatRequest<'_> =
            serde_json::from_slice(br#"{"messages":[{"role":"user","content":"a"}]}"#).unwrap();
        assert!(!wants_tool_call(&no_tools, 1));
    }
}

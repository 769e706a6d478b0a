//! A hostile OpenAI-compatible provider: what a broken or malicious endpoint may send. Unlike
//! the byte-exact fakes of `support::fakes`, its replies are made on the fly (an endless
//! stream, a line of a hundred megabytes), and it records how much it sent.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures::StreamExt;

/// What every reply of the provider is.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Text deltas forever, `delay` apart.
    Endless { delay: Duration },
    /// Text deltas of `piece` bytes each, forever, as fast as they are read.
    Flood { piece: usize },
    /// One SSE line of this many bytes.
    HugeLine { bytes: usize },
    /// One reply asking for this many tool calls.
    ManyCalls { calls: usize },
    /// One tool call whose arguments are this many bytes.
    HugeArguments { bytes: usize },
    /// A mid-stream error chunk whose message echoes the request's `Authorization` header.
    EchoesKey,
    /// A 500 whose body echoes the request's `Authorization` header.
    EchoesKeyStatus,
    /// One byte a second, forever (a reply that never completes, but is never idle).
    Trickle,
    /// A complete reply whose text is sent as the given pieces (JSON string escapes allowed).
    Pieces(Vec<&'static str>),
}

struct Shared {
    behaviour: Behaviour,
    requests: AtomicUsize,
    sent: AtomicU64,
    /// The `max_tokens` / `max_completion_tokens` of each request.
    token_limits: Mutex<Vec<Option<u64>>>,
}

pub struct Hostile {
    pub base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    pub async fn start(behaviour: Behaviour) -> Hostile {
        let shared = Arc::new(Shared {
            behaviour,
            requests: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            token_limits: Mutex::new(Vec::new()),
        });
        let state = shared.clone();
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let shared = state.clone();
                async move { reply(shared, headers, body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the hostile provider");
        let addr = listener.local_addr().expect("its address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Hostile {
            base_url: format!("http://{addr}/v1"),
            shared,
            task,
        }
    }

    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Bytes of reply bodies sent so far.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::SeqCst)
    }

    pub fn token_limits(&self) -> Vec<Option<u64>> {
        self.shared.token_limits.lock().unwrap().clone()
    }
}

fn chunk(delta: &str) -> String {
    format!(
        "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
    )
}

const STOP: &str = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
const TOOL_STOP: &str = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";

fn reply(shared: Arc<Shared>, headers: axum::http::HeaderMap, body: Bytes) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let limit = request["max_tokens"]
        .as_u64()
        .or_else(|| request["max_completion_tokens"].as_u64());
    shared.token_limits.lock().unwrap().push(limit);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let stream: futures::stream::BoxStream<'static, Bytes> = match shared.behaviour.clone() {
        Behaviour::Endless { delay } => futures::stream::unfold(0u64, move |n| async move {
            tokio::time::sleep(delay).await;
            Some((
                Bytes::from(chunk(&format!("{{\"content\":\"word{n} \"}}"))),
                n + 1,
            ))
        })
        .boxed(),
        Behaviour::Flood { piece } => {
            let delta = Bytes::from(chunk(&format!("{{\"content\":\"{}\"}}", "x".repeat(piece))));
            futures::stream::repeat(delta).boxed()
        }
        Behaviour::HugeLine { bytes } => {
            let piece = Bytes::from(vec![b'a'; 64 * 1024]);
            let head =
                Bytes::from_static(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
            futures::stream::once(async move { head })
                .chain(futures::stream::iter(std::iter::repeat_n(
                    piece,
                    bytes / (64 * 1024) + 1,
                )))
                .boxed()
        }
        Behaviour::ManyCalls { calls } => {
            let mut text = String::new();
            for i in 0..calls {
                text.push_str(&chunk(&format!(
                    "{{\"tool_calls\":[{{\"index\":{i},\"id\":\"call_{i}\",\"type\":\"function\",\"function\":{{\"name\":\"list_files\",\"arguments\":\"{{}}\"}}}}]}}"
                )));
            }
            text.push_str(TOOL_STOP);
            futures::stream::once(async move { Bytes::from(text) }).boxed()
        }
        Behaviour::HugeArguments { bytes } => {
            let args = format!("{{\\\"path\\\":\\\"{}\\\"}}", "a".repeat(bytes));
            let text = chunk(&format!(
                "{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_0\",\"type\":\"function\",\"function\":{{\"name\":\"read_file\",\"arguments\":\"{args}\"}}}}]}}"
            )) + TOOL_STOP;
            futures::stream::once(async move { Bytes::from(text) }).boxed()
        }
        Behaviour::EchoesKey => {
            let escaped = serde_json::to_string(&format!("invalid request, you sent {auth}"))
                .unwrap_or_default();
            let text = format!("data: {{\"error\":{{\"message\":{escaped},\"type\":\"invalid_request_error\"}}}}\n\n");
            futures::stream::once(async move { Bytes::from(text) }).boxed()
        }
        Behaviour::EchoesKeyStatus => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header("content-type", "application/json")
                .body(Body::from(format!(
                    "{{\"error\":{{\"message\":\"upstream rejected {auth}\"}}}}"
                )))
                .unwrap();
        }
        Behaviour::Trickle => {
            let head = Bytes::from(chunk("{\"content\":\"slow \"}"));
            futures::stream::once(async move { head })
                .chain(futures::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Some((Bytes::from_static(b":"), ()))
                }))
                .boxed()
        }
        Behaviour::Pieces(pieces) => {
            let text: String = pieces
                .iter()
                .map(|p| chunk(&format!("{{\"content\":\"{p}\"}}")))
                .collect();
            futures::stream::iter(
                text_chunks(text)
                    .into_iter()
                    .chain([Bytes::from_static(STOP.as_bytes())]),
            )
            .boxed()
        }
    };
    let counted = stream.map(move |bytes| {
        shared.sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Ok::<_, Infallible>(bytes)
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(counted))
        .unwrap()
}

/// Each SSE event of `text` as its own network chunk.
fn text_chunks(text: String) -> Vec<Bytes> {
    text.split_inclusive("\n\n")
        .map(|event| Bytes::from(event.to_string()))
        .collect()
}

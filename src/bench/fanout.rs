//! The fan-out floor, served by `tah fake-model`: the subscribers' side of the fan-out workload
//! with nothing of tah behind it. `GET /floor/{stream}/events?subscribers=S&turns=T` is an SSE
//! stream; once S clients are connected to the same `{stream}`, one producer sends them what a
//! tah session with T turns sends its subscribers — per turn, the events a turn with one tool
//! call records besides its deltas, then `pieces` stamped `agent.assistant-stream` frames
//! `piece_delay` apart (no gap between turns, so it offers at least tah's rate) — through a
//! broadcast channel and hyper, as tah does, but with no agent loop, no database and no commit
//! between a piece and its frame. Measured beside tah, it says how much of the delta→client
//! latency is the machine's (loopback TCP, the scheduler, the client) and how much is tah's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tah::http::sse::event_stream;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::fake_model::{unix_micros, FakeKnobs, STAMP};

/// Events a tah turn with one tool call and a text reply records besides its deltas (run and
/// step starts and ends, the tool call and its result, messages, state changes): 67 per turn
/// with 50 pieces, as the fan-out workload counts them.
pub const OTHER_EVENTS_PER_TURN: u64 = 17;

/// The events a floor stream of `turns` turns sends: a first event, then each turn's.
pub fn events(turns: u64, pieces: u64) -> u64 {
    1 + turns * (OTHER_EVENTS_PER_TURN + pieces)
}

#[derive(Deserialize)]
struct Params {
    subscribers: usize,
    turns: u64,
}

/// Streams waiting for their subscribers, by name.
struct Floor {
    knobs: FakeKnobs,
    waiting: Mutex<HashMap<String, (broadcast::Sender<Bytes>, usize)>>,
}

pub fn routes(knobs: FakeKnobs) -> Router {
    let floor = Arc::new(Floor {
        knobs,
        waiting: Mutex::default(),
    });
    Router::new()
        .route("/floor/{stream}/events", get(subscribe))
        .with_state(floor)
}

async fn subscribe(
    State(floor): State<Arc<Floor>>,
    Path(stream): Path<String>,
    Query(params): Query<Params>,
) -> Response {
    if params.subscribers == 0 || params.turns == 0 {
        return (StatusCode::BAD_REQUEST, "subscribers and turns: at least 1").into_response();
    }
    let total = events(params.turns, floor.knobs.pieces as u64);
    let receiver = {
        let mut waiting = floor.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let (sender, joined) = waiting.entry(stream.clone()).or_insert_with(|| {
            // Room for the whole stream: a subscriber never lags.
            let capacity = usize::try_from(total)
                .unwrap_or(usize::MAX)
                .clamp(16, 1 << 16);
            (broadcast::channel(capacity).0, 0)
        });
        let receiver = sender.subscribe();
        *joined += 1;
        if *joined == params.subscribers {
            if let Some((sender, _)) = waiting.remove(&stream) {
                tokio::spawn(produce(sender, floor.knobs.clone(), params.turns));
            }
        }
        receiver
    };
    let frames = futures::stream::unfold(receiver, |mut receiver| async move {
        // Closed (the producer is done) or lagged (never, with room for every event): the end.
        let frame = receiver.recv().await.ok()?;
        Some((Ok::<_, Infallible>(frame), receiver))
    });
    event_stream(Body::from_stream(frames))
}

/// Sends a stream's events to its subscribers, paced as the fake model paces its pieces.
async fn produce(sender: broadcast::Sender<Bytes>, knobs: FakeKnobs, turns: u64) {
    let session = Uuid::now_v7().to_string();
    let step = Uuid::now_v7().to_string();
    let mut seq = 0;
    let mut send = |kind: &str, data: &str| {
        seq += 1;
        let frame = format!(
            "id: {seq}\nevent: {kind}\ndata: {{\"type\":\"{kind}\",\"seq\":{seq},\"session_id\":\"{session}\",\"timestamp\":\"{}\",\"data\":{data}}}\n\n",
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        );
        let _ = sender.send(Bytes::from(frame));
    };
    let other = format!(r#"{{"step_id":"{step}","status":"completed","name":"list_files"}}"#);
    send("session.created", r#"{"title":"floor"}"#);
    for _ in 0..turns {
        for _ in 0..OTHER_EVENTS_PER_TURN - 1 {
            send("agent.step", &other);
        }
        for piece in 0..knobs.pieces {
            if piece > 0 {
                tokio::time::sleep(knobs.piece_delay).await;
            }
            let text = format!("{STAMP}{}{STAMP} the ", unix_micros());
            send(
                "agent.assistant-stream",
                &format!(r#"{{"step_id":"{step}","text":"{text}"}}"#),
            );
        }
        send("agent.finished", &other);
    }
}

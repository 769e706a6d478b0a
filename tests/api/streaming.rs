//! Server-Sent Events: replay after any id, the replay → live hand-off for subscribers that
//! attach before or during a turn, a run streamed by its own POST, and many subscribers.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use tokio::sync::mpsc;

use crate::support::*;

#[tokio::test]
async fn replay_after_any_id_is_the_tail_of_the_log() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    server.run_wait(&id, "first").await;
    server.run_wait(&id, "second").await;
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    let last = log.len() as i64;

    // No cursor: the whole log.
    let mut stream = server.sse(&id, SseFrom::Start).await;
    let frames = stream.take(log.len()).await;
    assert_frames_are(&frames, &log, "no cursor");

    for k in 0..=last {
        for from in [SseFrom::After(k), SseFrom::LastEventId(k)] {
            let mut stream = server.sse(&id, from).await;
            let frames = stream.take((last - k) as usize).await;
            assert_frames_are(&frames, &log[k as usize..], &format!("{from:?}"));
            if k == last || k == last - 1 {
                // Nothing more: no duplicate, nothing invented.
                match stream.next_within(Duration::from_millis(300)).await {
                    Next::Timeout => {}
                    other => panic!("{from:?}: after the last event got {other:?}"),
                }
            }
        }
    }

    // Beyond the end: nothing yet, and the stream stays open for what comes.
    let mut ahead = server.sse(&id, SseFrom::After(last)).await;
    server.run_wait(&id, "third").await;
    let frame = ahead.next_frame().await;
    assert_eq!(
        frame.seq(),
        last + 1,
        "the next live event after the replayed tail"
    );
    assert_eq!(frame.event, "agent.started");
}

#[tokio::test]
async fn subscribers_before_and_during_a_turn_see_every_event_once() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let id = server.create_session().await;

    let mut before = server.sse(&id, SseFrom::Start).await;
    let created = before.next_frame().await;
    assert_eq!(created.event, "session.created");
    assert_eq!(created.id, "1");

    let run = server.start_run(&id, "watch me").await;
    let mut early = vec![created];
    let mut deltas = 0;
    early.extend(
        before
            .until(|f| {
                if f.event == "agent.assistant-stream" {
                    deltas += 1;
                }
                deltas == 3
            })
            .await,
    );
    let k = early.last().expect("frames").seq();

    // Attach mid-turn: by Last-Event-ID, by ?after, and with no cursor at all.
    let mut by_header = server.sse(&id, SseFrom::LastEventId(k)).await;
    let mut by_query = server.sse(&id, SseFrom::After(k)).await;
    let mut from_start = server.sse(&id, SseFrom::Start).await;

    let mut all_before = early;
    all_before.extend(before.until_type("agent.finished").await);
    let header_frames = by_header.until_type("agent.finished").await;
    let query_frames = by_query.until_type("agent.finished").await;
    let start_frames = from_start.until_type("agent.finished").await;

    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_eq!(log.last().expect("log")["type"], "agent.finished");
    assert_eq!(log.last().expect("log")["data"]["run_id"], run["id"]);
    assert_frames_are(&all_before, &log, "attached before the turn");
    assert_frames_are(
        &header_frames,
        &log[k as usize..],
        "attached mid-turn by Last-Event-ID",
    );
    assert_frames_are(
        &query_frames,
        &log[k as usize..],
        "attached mid-turn by ?after",
    );
    assert_frames_are(&start_frames, &log, "attached mid-turn without a cursor");
    assert!(
        header_frames
            .iter()
            .any(|f| f.event == "agent.assistant-stream"),
        "the mid-turn subscriber attached while the answer was still streaming"
    );
}

#[tokio::test]
async fn a_run_posted_with_accept_event_stream_streams_that_run_then_ends() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let earlier = server.run_wait(&id, "an earlier turn").await;
    let before = server.events(&id).await;

    let mut stream = server.run_streaming(&id, "stream this turn").await;
    let frames = stream.until_type("agent.finished").await;
    match stream.next_within(Duration::from_secs(5)).await {
        Next::End => {}
        other => panic!("the run's stream goes on after agent.finished: {other:?}"),
    }

    assert_eq!(frames[0].event, "agent.started", "{:?}", frames[0]);
    assert_eq!(
        frames[0].seq(),
        before.len() as i64 + 1,
        "starts with this run, not the log"
    );
    let run_id = frames[0].data["data"]["run_id"].clone();
    assert_ne!(run_id, earlier["run_id"]);
    let last = frames.last().expect("frames");
    assert_eq!(last.data["data"]["run_id"], run_id);
    assert!(
        last.data["data"]["text"]
            .as_str()
            .unwrap_or("")
            .contains("stream this turn"),
        "{last:?}"
    );

    let log = server.events(&id).await;
    assert_frames_are(&frames, &log[before.len()..], "the run's stream");
    let run = server
        .get_ok(&format!(
            "/v1/sessions/{id}/runs/{}",
            run_id.as_str().unwrap_or("?")
        ))
        .await;
    assert_eq!(run["status"], "completed", "{run}");
}

#[tokio::test]
async fn twenty_subscribers_receive_the_identical_sequence() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(5)).await;
    let id = server.create_session().await;

    let (ready_tx, mut ready_rx) = mpsc::channel::<()>(20);
    let mut readers = Vec::new();
    for _ in 0..20 {
        let mut stream = server.sse(&id, SseFrom::Start).await;
        assert!(stream
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")));
        let ready = ready_tx.clone();
        readers.push(tokio::spawn(async move {
            let first = stream.next_frame().await;
            let _ = ready.send(()).await;
            let mut frames = vec![first];
            frames.extend(stream.until_type("agent.finished").await);
            frames
        }));
    }
    for _ in 0..20 {
        ready_rx.recv().await.expect("a subscriber is ready");
    }
    let run = server.start_run(&id, "many watchers").await;

    let mut sequences = Vec::new();
    for reader in readers {
        sequences.push(reader.await.expect("a subscriber task"));
    }
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert_eq!(log.last().expect("log")["data"]["run_id"], run["id"]);
    for (n, frames) in sequences.iter().enumerate() {
        assert_frames_are(frames, &log, &format!("subscriber {n}"));
    }
}

#[tokio::test]
async fn a_subscriber_that_stops_reading_misses_nothing() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    // It reads the first frame, then nothing while several long answers stream: thousands of
    // deltas, far more than any in-memory buffer or socket holds.
    let mut stalled = server.sse(&id, SseFrom::Start).await;
    assert_eq!(stalled.next_frame().await.event, "session.created");
    // About 3,000 pieces of 60 characters per answer: megabytes of frames in all.
    let long_input: String = (0..3000).map(|n| format!("{n:0>59} ")).collect();
    for turn in 0..4 {
        let result = server.run_wait(&id, &format!("{turn} {long_input}")).await;
        assert_eq!(
            result["status"], "completed",
            "turn {turn}: the agent was not held up"
        );
    }
    let log = server.events(&id).await;
    assert_contiguous_from_one(&log);
    assert!(
        log.len() > 12_000,
        "the turns streamed {} events",
        log.len()
    );

    let mut frames = vec![];
    while frames.len() < log.len() - 1 {
        match stalled.next_within(FRAME_TIMEOUT).await {
            Next::Frame(frame) => frames.push(frame),
            other => panic!(
                "the stalled subscriber's stream broke after {} frames: {other:?}",
                frames.len()
            ),
        }
    }
    assert_frames_are(&frames, &log[1..], "the subscriber that fell behind");
}

#[tokio::test]
async fn an_idle_stream_gets_a_heartbeat_within_15_seconds() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let response = server
        .http
        .get(server.url(&format!("/v1/sessions/{id}/events")))
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await
        .expect("GET events (SSE)");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let mut body = response.bytes_stream();
    let started = tokio::time::Instant::now();
    let mut text = String::new();
    // A comment line (": …") is a heartbeat; the only event here is session.created.
    let beat = loop {
        let remaining = Duration::from_secs(16).saturating_sub(started.elapsed());
        let chunk = match tokio::time::timeout(remaining, futures::StreamExt::next(&mut body)).await
        {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(other) => panic!("the idle stream ended: {other:?}; read so far: {text:?}"),
            Err(_) => panic!("no heartbeat within 15 s on an idle stream; read: {text:?}"),
        };
        text.push_str(&String::from_utf8_lossy(&chunk));
        if text.lines().any(|l| l.starts_with(':')) {
            break started.elapsed();
        }
    };
    eprintln!("first heartbeat after {beat:?}");
    assert!(text.contains("event: session.created"), "{text:?}");
}

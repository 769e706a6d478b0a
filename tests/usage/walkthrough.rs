//! The manual's curl walkthrough and its conflict example, run against servers started as the
//! manual starts them: every checked block (see [`crate::usage::readme`]) is rendered here from the
//! real answers, so the seqs, call ids, entry counts and texts the manual shows are the ones
//! a reader gets. One function per stretch of the walkthrough, in the manual's order.

use std::path::Path;

use reqwest::StatusCode;

use crate::usage::demo::{echo_into, scratch, Curl, Demo, Walk};
use crate::usage::readme::Transcript;
use crate::usage::shown::{frames, Frame};

/// The walkthrough's workspace: small, so that the mock's read of it stays short.
const DEMO_FILES: [(&str, &str); 2] = [
    ("demo/README.md", "# Demo"),
    ("demo/src/main.rs", "fn main() {}"),
];

/// What `curl -w '%{http_code}\n'` shows: the status alone.
const STATUS_ONLY: &str = "-s -o /dev/null -w '%{http_code}\\n'";

/// The frames as curl prints them, one blank line after each.
pub fn shown(frames: &[&Frame]) -> String {
    frames
        .iter()
        .map(|f| f.shown())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `…` standing for the events from `first` to `last`, saying what they are.
pub fn elided(first: &Frame, last: &Frame, what: &str) -> String {
    let (a, b) = (first.seq().expect("an id"), last.seq().expect("an id"));
    format!("…  (seq {a}–{b}: {what})\n")
}

fn is_delta(frame: &Frame) -> bool {
    frame.event_type() == Some("agent.assistant-stream")
}

/// Writes the walkthrough's workspace into `dir`; the command that does so in a shell.
fn demo_workspace(dir: &Path) -> String {
    let echoes = DEMO_FILES
        .iter()
        .map(|(path, text)| {
            echo_into(dir, path, text);
            format!("echo '{text}' > {path}")
        })
        .collect::<Vec<_>>()
        .join(" && ");
    format!("mkdir -p demo/src && {echoes}")
}

#[tokio::test]
async fn the_walkthrough_shows_what_the_server_answers() {
    let dir = scratch();
    let mut t = Transcript::new("walkthrough");
    t.block("setup", "sh");
    t.push(&demo_workspace(dir.path()));
    t.push("cargo run --release -- serve --workspace demo");
    let demo = Demo::start(dir.path(), &["--workspace", "demo"], &[]).await;
    let mut w = Walk { demo, t };
    health_and_a_session(&mut w).await;
    first_turn(&mut w).await;
    more_turns(&mut w).await;
    replay(&mut w).await;
    history(&mut w).await;
    manage(&mut w).await;
    errors(&mut w).await;
    w.t.check();
    let log = w.demo.log();
    assert!(!log.contains("ERROR"), "{log}");
}

async fn health_and_a_session(w: &mut Walk) {
    w.t.block("health", "console");
    for path in ["/healthz", "/readyz"] {
        w.show(&Curl::get(path), StatusCode::OK).await;
    }
    w.t.block("create", "console");
    let id = w
        .capture("SESSION", &Curl::post("/v1/sessions"), "/id")
        .await;
    w.t.command("echo $SESSION", &id);
    w.show(&Curl::get("/v1/sessions/$SESSION"), StatusCode::OK)
        .await;
}

/// The second terminal follows the session; the first starts a turn; the second terminal
/// shows it, up to its terminal event.
async fn first_turn(w: &mut Walk) {
    w.t.block("follow", "console");
    let follow = Curl::new("-N", "/v1/sessions/$SESSION/events").sse();
    let follower = w
        .demo
        .stream_until(&follow, |f| f.iter().any(|f| f.seq() == Some(1)))
        .await;
    let frames: Vec<&Frame> = follower.frames.iter().collect();
    w.t.command(&follow.command(), &shown(&frames));

    w.t.block("run", "console");
    let run = Curl::new("-si", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .json(r#"{"input":"What is in this workspace?"}"#);
    let started = w
        .show_as(&run, StatusCode::ACCEPTED, |reply| {
            reply.with_head(&["content-type", "location"], &reply.body)
        })
        .await;
    let run_id = started.value()["id"]
        .as_str()
        .expect("a run id")
        .to_string();

    w.t.block("stream", "");
    let ended = |f: &[Frame]| f.iter().any(|f| f.event_type() == Some("agent.finished"));
    let follower = w.demo.stream_until(&follow, ended).await;
    let events: Vec<&Frame> = follower
        .frames
        .iter()
        .filter(|f| f.seq() > Some(1))
        .collect();
    w.t.push(&condensed_turn(&events));
    let finished = events.last().expect("events");
    assert!(finished.shown().contains(&run_id), "the run's own end");
}

/// The events of the walkthrough's first turn, shortened: the first step and its tool in full,
/// the second step (the same shape) summarised from what it did, the first two text deltas,
/// and the end of the turn in full.
fn condensed_turn(events: &[&Frame]) -> String {
    let position = |kind: &str, nth: usize| {
        events
            .iter()
            .enumerate()
            .filter(|(_, f)| f.event_type() == Some(kind))
            .nth(nth)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("the turn has no {kind} number {}", nth + 1))
    };
    // The first step runs to its tool's result; the second from there to the third step's
    // llm.started.
    let first_tool_done = position("tool.finished", 0);
    let third_step = position("llm.started", 2);
    let second = &events[first_tool_done + 1..=third_step];
    let data = |kind: &str| -> Vec<serde_json::Value> {
        let of_kind = second.iter().filter(|f| f.event_type() == Some(kind));
        let data = of_kind.map(|f| f.field("data").expect("a data line"));
        data.map(|d| serde_json::from_str::<serde_json::Value>(d).expect("JSON")["data"].clone())
            .collect()
    };
    let (calls, results) = (data("tool.started"), data("tool.finished"));
    assert_eq!((calls.len(), results.len()), (1, 1), "one call in step two");
    let what = format!(
        "the second step the same way: the model calls {} {}, the tool answers {}; then the \
         third step starts",
        calls[0]["call"]["name"].as_str().unwrap_or_default(),
        calls[0]["call"]["arguments"],
        results[0]["output"],
    );
    let rest = &events[third_step + 1..];
    let deltas = rest.iter().take_while(|f| is_delta(f)).count();
    assert!(deltas > 3, "the answer streams in pieces");
    let more = format!("{} more agent.assistant-stream deltas", deltas - 2);
    [
        shown(&events[..=first_tool_done]),
        elided(second[0], second[second.len() - 1], &what),
        shown(&rest[..2]),
        elided(rest[2], rest[deltas - 1], &more),
        shown(&rest[deltas..]),
    ]
    .join("\n")
    .trim_end()
    .to_string()
}

/// A turn with `?wait=true`, and one streamed as the answer to its own POST.
async fn more_turns(w: &mut Walk) {
    w.t.block("wait", "console");
    let wait =
        Curl::post("/v1/sessions/$SESSION/runs?wait=true").json(r#"{"input":"Anything else?"}"#);
    w.show(&wait, StatusCode::OK).await;

    w.t.block("run-stream", "console");
    let streamed = Curl::new("-N", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .sse()
        .json(r#"{"input":{"role":"user","content":"Stream this one"}}"#);
    w.show_as(&streamed, StatusCode::OK, |reply| {
        let frames = frames(&reply.body);
        let events: Vec<&Frame> = frames.iter().filter(|f| f.seq().is_some()).collect();
        assert_eq!(
            frames[0].lines[0], "retry: 1000",
            "it starts with its retry"
        );
        assert!(
            frames
                .iter()
                .all(|f| f.field("data").is_some() || f.lines[0].starts_with(':')),
            "every frame but a comment carries data (no retry-only frame): {frames:?}"
        );
        assert_eq!(
            frames[0].seq(),
            events[0].seq(),
            "the retry rides with the first event"
        );
        let (last, before) = (events[events.len() - 1], events[events.len() - 2]);
        assert_eq!(
            last.event_type(),
            Some("agent.finished"),
            "it ends after the run"
        );
        let head: Vec<&Frame> = frames[..2].iter().collect();
        let middle = elided(events[2], before, "the rest of the run");
        [shown(&head), middle, shown(&[last])].join("\n")
    })
    .await;
}

/// Replay after an event id, by header and by query (the streams stay open until Ctrl-C),
/// and the same log as a JSON page.
async fn replay(w: &mut Walk) {
    w.t.block("replay", "console");
    let by_header = Curl::new("-N", "/v1/sessions/$SESSION/events")
        .sse()
        .header("Last-Event-ID: 5");
    let by_query = Curl::new("-N", "/v1/sessions/$SESSION/events?after=5").sse();
    for (curl, events) in [(by_header, 2), (by_query, 1)] {
        let enough = |f: &[Frame]| f.iter().filter(|f| f.seq().is_some()).count() >= events;
        let replay = w.demo.stream_until(&curl, enough).await;
        let frames: Vec<&Frame> = replay.frames.iter().take(events).collect();
        assert_eq!(
            frames[0].seq(),
            Some(6),
            "{}: it starts after 5",
            curl.command()
        );
        w.t.command(&curl.command(), &format!("{}\n…", shown(&frames)));
    }

    w.t.block("page", "console");
    let page = Curl::get("/v1/sessions/$SESSION/events?after=6&limit=2");
    w.show(&page, StatusCode::OK).await;
}

/// The stored history, the steps, one step's rebuilt request, and the runs.
async fn history(w: &mut Walk) {
    w.t.block("history", "console");
    let messages = Curl::get("/v1/sessions/$SESSION/messages?limit=3");
    w.show(&messages, StatusCode::OK).await;
    let steps = Curl::get("/v1/sessions/$SESSION/steps?limit=2");
    w.show_as(&steps, StatusCode::OK, |reply| {
        let times = ["created_at", "finished_at"];
        let steps = reply.json().drop_keys(&times);
        steps.shorten(&["system_prompt"], 6).render()
    })
    .await;
    let all_steps = Curl::get("/v1/sessions/$SESSION/steps");
    w.capture("STEP", &all_steps, "/data/0/id").await;
    let step = Curl::get("/v1/sessions/$SESSION/steps/$STEP");
    w.show_as(&step, StatusCode::OK, |reply| {
        let step = reply.json().keep_in_items("tools", &["name"]);
        let step = step.drop_keys(&["created_at", "finished_at"]);
        step.shorten(&["system_prompt", "content"], 6).render()
    })
    .await;
    let runs = Curl::get("/v1/sessions/$SESSION/runs");
    w.show_as(&runs, StatusCode::OK, |reply| {
        reply.json().first_items("data", 1).render()
    })
    .await;
}

/// Compact, read the summary, cancel (nothing to cancel), resume (the last result), fork,
/// list and delete.
async fn manage(w: &mut Walk) {
    w.t.block("manage", "console");
    let compact = Curl::post("/v1/sessions/$SESSION/compact");
    w.show(&compact, StatusCode::OK).await;
    let session = w.demo.send(&Curl::get("/v1/sessions/$SESSION")).await;
    let count = session.value()["message_count"].as_u64().expect("a count");
    let after = format!("/v1/sessions/$SESSION/messages?after={}", count - 2);
    let summary = w.show(&Curl::get(&after), StatusCode::OK).await;
    assert!(summary
        .body
        .contains("[Summary of the earlier conversation]"));
    let cancel = Curl::post("/v1/sessions/$SESSION/cancel");
    w.show(&cancel, StatusCode::OK).await;
    let resume = Curl::post("/v1/sessions/$SESSION/resume");
    let reply = w.demo.send(&resume).await.expect(StatusCode::OK, "resume");
    let note = "     # a completed session returns its last result";
    w.t.command(&format!("{}{note}", resume.command()), &reply.body);
    let fork = Curl::post("/v1/sessions/$SESSION/fork").json(r#"{"turns":1}"#);
    w.capture("FORK", &fork, "/id").await;
    w.show(&Curl::get("/v1/sessions/$FORK"), StatusCode::OK)
        .await;
    let list = Curl::get("/v1/sessions?limit=1");
    w.show_as(&list, StatusCode::OK, |reply| {
        let list = reply.json().keep_in_items("data", &["id", "parent_id"]);
        list.render()
    })
    .await;
    let delete = Curl::new("-si", "/v1/sessions/$FORK").method("DELETE");
    w.show_as(&delete, StatusCode::NO_CONTENT, |reply| {
        reply.with_head(&[], "").trim_end().to_string()
    })
    .await;
}

/// Problems: an empty input, a body that is not JSON, an unknown session.
async fn errors(w: &mut Walk) {
    w.t.block("errors", "console");
    let empty = Curl::new("-si", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .json(r#"{"input":""}"#);
    w.show_as(&empty, StatusCode::BAD_REQUEST, |reply| {
        reply.with_head(&["content-type"], &reply.body)
    })
    .await;
    // Without -H, curl sends -d as a form.
    let untyped = Curl::post("/v1/sessions/$SESSION/runs").data(r#"{"input":"hi"}"#);
    w.show(&untyped, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;
    let unknown = Curl::get("/v1/sessions/0190f0e4-0000-7000-8000-000000000000");
    w.show(&unknown, StatusCode::NOT_FOUND).await;
}

/// A run while another is active, against a server whose mock streams slowly enough to try.
#[tokio::test]
async fn a_second_run_while_one_streams_is_a_conflict() {
    let dir = scratch();
    demo_workspace(dir.path());
    let mut t = Transcript::new("conflict");
    t.block("serve", "sh");
    let args = ["--workspace", "demo", "--mock-delay-ms", "500"];
    t.push(&format!("cargo run --release -- serve {}", args.join(" ")));
    let demo = Demo::start(dir.path(), &args, &[]).await;
    let mut w = Walk { demo, t };

    w.t.block("console", "console");
    w.capture("SESSION", &Curl::post("/v1/sessions"), "/id")
        .await;
    let first = Curl::post("/v1/sessions/$SESSION/runs")
        .flags(STATUS_ONLY)
        .json(r#"{"input":"a"}"#);
    w.show_as(&first, StatusCode::ACCEPTED, |r| {
        r.status.as_str().to_string()
    })
    .await;
    // A reader types the next command while the answer streams; so does this test.
    let follow = Curl::new("-N", "/v1/sessions/$SESSION/events").sse();
    drop(
        w.demo
            .stream_until(&follow, |f| f.iter().any(is_delta))
            .await,
    );
    let second = Curl::post("/v1/sessions/$SESSION/runs").json(r#"{"input":"b"}"#);
    w.show(&second, StatusCode::CONFLICT).await;
    let delete = Curl::new("-s", "/v1/sessions/$SESSION").method("DELETE");
    w.show(&delete, StatusCode::CONFLICT).await;
    let cancel = Curl::post("/v1/sessions/$SESSION/cancel");
    let reply = w.show(&cancel, StatusCode::OK).await;
    assert_eq!(reply.value()["cancelled"], true, "{}", reply.body);
    w.t.check();
}

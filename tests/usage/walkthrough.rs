//! The README's examples, run against servers started as the README starts them: every
//! checked block (see [`crate::readme`]) is rendered here from the real answers, so the seqs,
//! call ids, entry counts and texts the README shows are the ones a reader gets.

use reqwest::StatusCode;

use crate::demo::{capture, echo_into, scratch, Curl, Demo};
use crate::readme::Transcript;
use crate::shown::{Frame, Json, Style};
use crate::tah;

/// Every scenario this file writes into the README; a marker naming another is a mistake.
pub const SCENARIOS: [&str; 5] = ["walkthrough", "conflict", "context", "auth", "healthcheck"];

/// The walkthrough's workspace: small, so that the mock's read of it stays short.
const DEMO_FILES: [(&str, &str); 2] = [
    ("demo/README.md", "# Demo"),
    ("demo/src/main.rs", "fn main() {}"),
];

/// The frames as curl prints them, one blank line after each.
fn shown(frames: &[&Frame]) -> String {
    frames
        .iter()
        .map(|f| f.shown())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `…` standing for the events from `first` to `last`, saying what they are.
fn elided(first: &Frame, last: &Frame, what: &str) -> String {
    let (a, b) = (first.seq().expect("an id"), last.seq().expect("an id"));
    format!("…  (seq {a}–{b}: {what})\n")
}

fn is_delta(frame: &Frame) -> bool {
    frame.event_type() == Some("agent.assistant-stream")
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
    let field = |frame: &Frame, pointer: &str| {
        let data = frame.field("data").expect("a data line");
        let event: serde_json::Value = serde_json::from_str(data).expect("JSON");
        event.pointer(pointer).cloned().unwrap_or_default()
    };
    let calls: Vec<&&Frame> = second
        .iter()
        .filter(|f| f.event_type() == Some("tool.started"))
        .collect();
    let results: Vec<&&Frame> = second
        .iter()
        .filter(|f| f.event_type() == Some("tool.finished"))
        .collect();
    assert_eq!(
        (calls.len(), results.len()),
        (1, 1),
        "one tool call in the second step"
    );
    let call = field(calls[0], "/data/call");
    let what = format!(
        "the second step the same way: the model calls {} {}, the tool answers {}; then the \
         third step starts",
        call["name"].as_str().unwrap_or_default(),
        call["arguments"],
        field(results[0], "/data/output"),
    );
    let mut text = shown(&events[..=first_tool_done]);
    text.push('\n');
    text.push_str(&elided(second[0], second[second.len() - 1], &what));
    text.push('\n');
    let rest = &events[third_step + 1..];
    let deltas = rest.iter().take_while(|f| is_delta(f)).count();
    assert!(deltas > 3, "the answer streams in pieces");
    text.push_str(&shown(&rest[..2]));
    text.push('\n');
    let more = format!("{} more agent.assistant-stream deltas", deltas - 2);
    text.push_str(&elided(rest[2], rest[deltas - 1], &more));
    text.push('\n');
    text.push_str(&shown(&rest[deltas..]));
    text.trim_end().to_string()
}

#[tokio::test]
async fn the_walkthrough_shows_what_the_server_answers() {
    let dir = scratch();
    let mut t = Transcript::new("walkthrough");
    t.block("setup", "sh");
    let mkdir = DEMO_FILES
        .iter()
        .map(|(path, text)| {
            echo_into(dir.path(), path, text);
            format!("echo '{text}' > {path}")
        })
        .collect::<Vec<_>>()
        .join(" && ");
    t.push(&format!("mkdir -p demo/src && {mkdir}"));
    t.push("cargo run --release -- serve --workspace demo");
    let mut demo = Demo::start(dir.path(), &["--workspace", "demo"], &[]).await;

    t.block("health", "console");
    for path in ["/healthz", "/readyz"] {
        let curl = Curl::get(path);
        let reply = demo.send(&curl).await.expect(StatusCode::OK, path);
        t.command(&curl.command(), &reply.body);
    }

    t.block("create", "console");
    let create = Curl::post("/v1/sessions");
    let session = demo
        .send(&create)
        .await
        .expect(StatusCode::CREATED, "create");
    let id = session.value()["id"].as_str().expect("an id").to_string();
    demo.set("SESSION", &id);
    t.command(&capture("SESSION", &create, r#"["id"]"#), "");
    t.command("echo $SESSION", &id);
    let show = Curl::get("/v1/sessions/$SESSION");
    t.command(&show.command(), &demo.send(&show).await.body);

    // The second terminal follows the session from its first event.
    t.block("follow", "console");
    let follow = Curl::new("-N", "/v1/sessions/$SESSION/events").sse();
    let follower = demo
        .stream_until(&follow, |frames| frames.iter().any(|f| f.seq() == Some(1)))
        .await;
    t.command(
        &follow.command(),
        &shown(&follower.frames.iter().collect::<Vec<_>>()),
    );

    t.block("run", "console");
    let run = Curl::new("-si", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .json(r#"{"input":"What is in this workspace?"}"#);
    let started = demo.send(&run).await.expect(StatusCode::ACCEPTED, "run");
    let run_id = started.value()["id"]
        .as_str()
        .expect("a run id")
        .to_string();
    t.command(
        &run.command(),
        &started.with_head(&["content-type", "location"], &started.body),
    );

    // What the second terminal prints meanwhile, up to the run's terminal event.
    t.block("stream", "");
    let follower = demo
        .stream_until(&follow, |frames| {
            frames
                .iter()
                .any(|f| f.event_type() == Some("agent.finished"))
        })
        .await;
    let events: Vec<&Frame> = follower
        .frames
        .iter()
        .filter(|f| f.seq() > Some(1))
        .collect();
    t.push(&condensed_turn(&events));
    let finished = events.last().expect("events");
    assert_eq!(finished.event_type(), Some("agent.finished"));
    assert!(finished.shown().contains(&run_id));
    drop(follower);

    t.block("wait", "console");
    let wait =
        Curl::post("/v1/sessions/$SESSION/runs?wait=true").json(r#"{"input":"Anything else?"}"#);
    let result = demo.send(&wait).await.expect(StatusCode::OK, "?wait=true");
    t.command(&wait.command(), &result.body);

    t.block("run-stream", "console");
    let streamed = Curl::new("-N", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .sse()
        .json(r#"{"input":{"role":"user","content":"Stream this one"}}"#);
    let reply = demo
        .send(&streamed)
        .await
        .expect(StatusCode::OK, "a run stream");
    let frames = crate::shown::frames(&reply.body);
    let events: Vec<&Frame> = frames.iter().filter(|f| f.seq().is_some()).collect();
    let (head, tail) = (&frames[..3], events[events.len() - 1]);
    assert_eq!(
        frames[0].lines,
        ["retry: 1000"],
        "a stream starts with its retry"
    );
    assert_eq!(
        tail.event_type(),
        Some("agent.finished"),
        "it ends after the run"
    );
    let mut text = shown(&head.iter().collect::<Vec<_>>());
    text.push('\n');
    text.push_str(&elided(
        events[2],
        events[events.len() - 2],
        "the rest of the run",
    ));
    text.push('\n');
    text.push_str(&shown(&[tail]));
    t.command(&streamed.command(), &text);

    // Replay from an event id; both streams stay open until Ctrl-C.
    t.block("replay", "console");
    let by_header = Curl::new("-N", "/v1/sessions/$SESSION/events")
        .sse()
        .header("Last-Event-ID: 5");
    let replay = demo
        .stream_until(&by_header, |f| {
            f.iter().filter(|f| f.seq().is_some()).count() >= 2
        })
        .await;
    let two: Vec<&Frame> = replay.frames.iter().take(3).collect();
    assert_eq!(
        two[1].seq(),
        Some(6),
        "the replay starts after Last-Event-ID"
    );
    t.command(&by_header.command(), &format!("{}\n…", shown(&two)));
    let by_query = Curl::new("-N", "/v1/sessions/$SESSION/events?after=5").sse();
    let replay = demo
        .stream_until(&by_query, |f| f.iter().any(|f| f.seq().is_some()))
        .await;
    let one: Vec<&Frame> = replay.frames.iter().take(2).collect();
    assert_eq!(one[1].seq(), Some(6), "the replay starts after ?after");
    t.command(&by_query.command(), &format!("{}\n…", shown(&one)));

    t.block("page", "console");
    let page = Curl::get("/v1/sessions/$SESSION/events?after=6&limit=2");
    t.command(&page.command(), &demo.send(&page).await.body);

    t.block("history", "console");
    let messages = Curl::get("/v1/sessions/$SESSION/messages?limit=3");
    t.command(&messages.command(), &demo.send(&messages).await.body);
    let steps = Curl::get("/v1/sessions/$SESSION/steps?limit=2");
    let reply = demo.send(&steps).await;
    let shortened = reply
        .json()
        .drop_keys(&["created_at", "finished_at"])
        .shorten(&["system_prompt"], 6)
        .render();
    t.command(&steps.command(), &shortened);
    let all_steps = Curl::get("/v1/sessions/$SESSION/steps");
    let first = demo.send(&all_steps).await.value()["data"][0]["id"]
        .as_str()
        .expect("a step id")
        .to_string();
    demo.set("STEP", &first);
    t.command(&capture("STEP", &all_steps, r#"["data"][0]["id"]"#), "");
    let step = Curl::get("/v1/sessions/$SESSION/steps/$STEP");
    let reply = demo.send(&step).await.expect(StatusCode::OK, "one step");
    let shortened = reply
        .json()
        .keep_in_items("tools", &["name"])
        .drop_keys(&["created_at", "finished_at"])
        .shorten(&["system_prompt", "content"], 6)
        .render();
    t.command(&step.command(), &shortened);
    let runs = Curl::get("/v1/sessions/$SESSION/runs");
    let reply = demo.send(&runs).await;
    t.command(
        &runs.command(),
        &reply.json().first_items("data", 1).render(),
    );

    t.block("manage", "console");
    let compact = Curl::post("/v1/sessions/$SESSION/compact");
    t.command(
        &compact.command(),
        &demo
            .send(&compact)
            .await
            .expect(StatusCode::OK, "compact")
            .body,
    );
    let count = demo.send(&Curl::get("/v1/sessions/$SESSION")).await.value()["message_count"]
        .as_u64()
        .expect("a count");
    let summary = Curl::get(&format!(
        "/v1/sessions/$SESSION/messages?after={}",
        count - 2
    ));
    let reply = demo.send(&summary).await;
    assert!(reply.body.contains("[Summary of the earlier conversation]"));
    t.command(&summary.command(), &reply.body);
    let cancel = Curl::post("/v1/sessions/$SESSION/cancel");
    t.command(&cancel.command(), &demo.send(&cancel).await.body);
    let resume = Curl::post("/v1/sessions/$SESSION/resume");
    let reply = demo
        .send(&resume)
        .await
        .expect(StatusCode::OK, "resume of a completed session");
    t.command(
        &format!(
            "{}     # a completed session returns its last result",
            resume.command()
        ),
        &reply.body,
    );
    let fork = Curl::post("/v1/sessions/$SESSION/fork").json(r#"{"turns":1}"#);
    let reply = demo.send(&fork).await.expect(StatusCode::CREATED, "fork");
    demo.set("FORK", reply.value()["id"].as_str().expect("an id"));
    t.command(&capture("FORK", &fork, r#"["id"]"#), "");
    let show_fork = Curl::get("/v1/sessions/$FORK");
    t.command(&show_fork.command(), &demo.send(&show_fork).await.body);
    let list = Curl::get("/v1/sessions?limit=1");
    let reply = demo.send(&list).await;
    t.command(
        &list.command(),
        &reply
            .json()
            .keep_in_items("data", &["id", "parent_id"])
            .render(),
    );
    let delete = Curl::new("-si", "/v1/sessions/$FORK").method("DELETE");
    let reply = demo
        .send(&delete)
        .await
        .expect(StatusCode::NO_CONTENT, "delete");
    t.command(&delete.command(), reply.with_head(&[], "").trim_end());

    t.block("errors", "console");
    let empty = Curl::new("-si", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .json(r#"{"input":""}"#);
    let reply = demo
        .send(&empty)
        .await
        .expect(StatusCode::BAD_REQUEST, "empty input");
    t.command(
        &empty.command(),
        &reply.with_head(&["content-type"], &reply.body),
    );
    // Without -H, curl sends -d as a form.
    let untyped = Curl::post("/v1/sessions/$SESSION/runs").data(r#"{"input":"hi"}"#);
    let reply = demo.send(&untyped).await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    t.command(&untyped.command(), &reply.body);
    let unknown = Curl::get("/v1/sessions/0190f0e4-0000-7000-8000-000000000000");
    let reply = demo
        .send(&unknown)
        .await
        .expect(StatusCode::NOT_FOUND, "unknown session");
    t.command(&unknown.command(), &reply.body);

    t.check();
    assert!(!demo.log().contains("ERROR"), "{}", demo.log());
}

/// A run while another is active, against a server whose mock streams slowly enough to try.
#[tokio::test]
async fn a_second_run_while_one_streams_is_a_conflict() {
    let dir = scratch();
    for (path, text) in DEMO_FILES {
        echo_into(dir.path(), path, text);
    }
    let mut t = Transcript::new("conflict");
    t.block("serve", "sh");
    let args = ["--workspace", "demo", "--mock-delay-ms", "500"];
    t.push(&format!("cargo run --release -- serve {}", args.join(" ")));
    let mut demo = Demo::start(dir.path(), &args, &[]).await;

    t.block("console", "console");
    let create = Curl::post("/v1/sessions");
    let reply = demo
        .send(&create)
        .await
        .expect(StatusCode::CREATED, "create");
    demo.set("SESSION", reply.value()["id"].as_str().expect("an id"));
    t.command(&capture("SESSION", &create, r#"["id"]"#), "");
    let first = Curl::post("/v1/sessions/$SESSION/runs")
        .flags("-s -o /dev/null -w '%{http_code}\\n'")
        .json(r#"{"input":"a"}"#);
    let reply = demo
        .send(&first)
        .await
        .expect(StatusCode::ACCEPTED, "the first run");
    t.command(&first.command(), reply.status.as_str());
    // A reader types the next command while the answer streams; so does this test.
    let follow = Curl::new("-N", "/v1/sessions/$SESSION/events").sse();
    let streaming = demo.stream_until(&follow, |f| f.iter().any(is_delta)).await;
    drop(streaming);
    let second = Curl::post("/v1/sessions/$SESSION/runs").json(r#"{"input":"b"}"#);
    let reply = demo
        .send(&second)
        .await
        .expect(StatusCode::CONFLICT, "a second run");
    t.command(&second.command(), &reply.body);
    let delete = Curl::new("-s", "/v1/sessions/$SESSION").method("DELETE");
    let reply = demo
        .send(&delete)
        .await
        .expect(StatusCode::CONFLICT, "a delete");
    t.command(&delete.command(), &reply.body);
    let cancel = Curl::post("/v1/sessions/$SESSION/cancel");
    let reply = demo.send(&cancel).await.expect(StatusCode::OK, "cancel");
    assert_eq!(reply.value()["cancelled"], true, "{}", reply.body);
    t.command(&cancel.command(), &reply.body);
    t.check();
}

/// The context-management example: a tight budget over a small workspace.
#[tokio::test]
async fn the_context_example_shows_what_the_server_answers() {
    let dir = scratch();
    let ws = dir.path().join("tmp/demo");
    std::fs::create_dir_all(&ws).expect("mkdir");
    for n in 1..=8 {
        std::fs::write(ws.join(format!("notes-{n}.txt")), "").expect("touch");
    }
    let readme: String = (1..=20)
        .map(|n| format!("Line {n} of a long README.\n"))
        .collect();
    std::fs::write(ws.join("README.md"), readme).expect("write the README");
    let mut t = Transcript::new("context");
    t.block("serve", "sh");
    t.push("mkdir -p /tmp/demo && touch /tmp/demo/notes-{1..8}.txt");
    t.push("seq -f 'Line %g of a long README.' 1 20 > /tmp/demo/README.md");
    t.push("cargo run --release -- serve --workspace /tmp/demo --context-chars 1500");
    let ws_arg = ws.display().to_string();
    let mut demo = Demo::start(
        dir.path(),
        &["--workspace", &ws_arg, "--context-chars", "1500"],
        &[],
    )
    .await;

    t.block("console", "console");
    let create = Curl::post("/v1/sessions");
    let reply = demo
        .send(&create)
        .await
        .expect(StatusCode::CREATED, "create");
    demo.set("SESSION", reply.value()["id"].as_str().expect("an id"));
    t.command(&capture("SESSION", &create, r#"["id"]"#), "");
    let inputs = [
        "What is in this workspace?",
        "And the notes?",
        "Summarise the README",
    ];
    t.command(
        &format!(
            "for q in {}; do\n>   curl -s -o /dev/null -X POST \"localhost:8080/v1/sessions/$SESSION/runs?wait=true\" -H 'Content-Type: application/json' -d \"{{\\\"input\\\":\\\"$q\\\"}}\"\n> done",
            inputs.map(|q| format!("'{q}'")).join(" ")
        ),
        "",
    );
    for input in inputs {
        let body = serde_json::json!({ "input": input }).to_string();
        let run = Curl::post("/v1/sessions/$SESSION/runs?wait=true").json(&body);
        demo.send(&run).await.expect(StatusCode::OK, input);
    }
    let events = Curl::get("/v1/sessions/$SESSION/events?limit=500");
    let reply = demo.send(&events).await;
    let mut lines = Vec::new();
    let mut trimmed_step = None;
    // (seq, dropped_turns, elided_tool_results) of each trim; (seq, turns, auto) of each
    // compaction: what the prose under the example says.
    let (mut trims, mut compactions) = (Vec::new(), Vec::new());
    if let Some(Json::Array(events)) = reply.json().get("data") {
        for event in events {
            let kind = event.get("type").and_then(Json::str).unwrap_or_default();
            if kind.starts_with("agent.context") {
                let data = event.get("data").expect("data");
                if kind == "agent.context.trimmed" && trimmed_step.is_none() {
                    trimmed_step = data.get("step_id").and_then(Json::str).map(str::to_string);
                }
                let seq = event.get("seq").expect("a seq").render();
                lines.push(format!("{seq} {kind} {}", data.render_as(Style::Python)));
                let number = |key: &str| data.get(key).map(Json::render).unwrap_or_default();
                let seq: u64 = seq.parse().expect("a number");
                if kind == "agent.context.trimmed" {
                    trims.push((seq, number("dropped_turns"), number("elided_tool_results")));
                } else if kind == "agent.context.compacted" {
                    compactions.push((seq, number("turns"), number("auto")));
                }
            }
        }
    }
    // The prose: a trim first elides an older tool output, a later one drops a whole turn,
    // and then the third turn begins with an automatic summary of the first two.
    assert!(trims.len() >= 2, "{lines:?}");
    assert_eq!(trims[0].1, "0", "the first trim drops no turn: {lines:?}");
    assert_ne!(
        trims[0].2, "0",
        "the first trim elides a tool output: {lines:?}"
    );
    assert!(
        trims[1..].iter().any(|t| t.1 != "0"),
        "a later trim drops a turn: {lines:?}"
    );
    assert_eq!(compactions.len(), 1, "{lines:?}");
    assert_eq!(
        (&compactions[0].1[..], &compactions[0].2[..]),
        ("2", "true"),
        "{lines:?}"
    );
    let runs = demo
        .send(&Curl::get("/v1/sessions/$SESSION/runs"))
        .await
        .value();
    let starts: Vec<u64> = runs["data"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|run| run["start_seq"].as_u64())
        .collect();
    assert_eq!(starts.len(), 3, "{runs}");
    let in_turn = |seq: u64| starts.iter().filter(|start| **start <= seq).count();
    assert!(
        trims.iter().all(|t| in_turn(t.0) == 2),
        "trims in the second turn: {lines:?}"
    );
    assert_eq!(
        in_turn(compactions[0].0),
        3,
        "the summary opens the third turn"
    );
    t.command(
        &format!(
            "{} | python3 -c '\nimport sys,json\nfor e in json.load(sys.stdin)[\"data\"]:\n    if e[\"type\"].startswith(\"agent.context\"): print(e[\"seq\"], e[\"type\"], json.dumps(e[\"data\"]))'",
            events.command()
        ),
        &lines.join("\n"),
    );
    let messages = demo
        .send(&Curl::get("/v1/sessions/$SESSION/messages?limit=500"))
        .await
        .value();
    let summary = messages["data"]
        .as_array()
        .and_then(|m| {
            m.iter().find(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("[Summary of the earlier conversation]"))
            })
        })
        .and_then(|m| m["index"].as_u64())
        .expect("an automatic summary");
    let around = Curl::get(&format!(
        "/v1/sessions/$SESSION/messages?after={}&limit=2",
        summary - 1
    ));
    t.command(&around.command(), &demo.send(&around).await.body);
    let step_id = trimmed_step.expect("a trimmed step");
    let step = Curl::get(&format!("/v1/sessions/$SESSION/steps/{step_id}"));
    let reply = demo
        .send(&step)
        .await
        .expect(StatusCode::OK, "the trimmed step");
    let shown_step = reply
        .json()
        .keep_in_items("tools", &["name"])
        .drop_keys(&["created_at", "finished_at"])
        .shorten(&["system_prompt", "content"], 6)
        .render();
    t.command(&step.command(), &shown_step);
    let compact = Curl::post("/v1/sessions/$SESSION/compact");
    let reply = demo.send(&compact).await.expect(StatusCode::OK, "compact");
    t.command(&compact.command(), &reply.body);
    let again = compact
        .clone()
        .flags("-s -o /dev/null -w '%{http_code}\\n'");
    let reply = demo
        .send(&again)
        .await
        .expect(StatusCode::NO_CONTENT, "nothing to compact");
    t.command(&again.command(), reply.status.as_str());
    t.check();
}

/// Authentication: a public address without tokens is refused; with tokens, `/v1` needs one.
#[tokio::test]
async fn the_authentication_examples_show_what_the_server_answers() {
    let mut t = Transcript::new("auth");
    t.block("refused", "console");
    let dir = scratch();
    let output = tah()
        .args(["serve", "--listen", "0.0.0.0:8080"])
        .current_dir(dir.path())
        .output()
        .await
        .expect("run tah serve");
    assert_eq!(output.status.code(), Some(1), "refused at start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    t.command("tah serve --listen 0.0.0.0:8080", stderr.trim_end());

    t.block("tokens", "console");
    let token = "a-long-secret-token-for-this-example";
    let mut demo = Demo::start(dir.path(), &[], &[("TAH_API_TOKENS", token)]).await;
    demo.set("TAH_API_TOKENS", token);
    let without = Curl::new("-si", "/v1/sessions");
    let reply = demo
        .send(&without)
        .await
        .expect(StatusCode::UNAUTHORIZED, "no token");
    t.command(
        &without.command(),
        &reply.with_head(&["www-authenticate", "content-type"], &reply.body),
    );
    let with = Curl::post("/v1/sessions").header("Authorization: Bearer $TAH_API_TOKENS");
    let reply = demo
        .send(&with)
        .await
        .expect(StatusCode::CREATED, "with a token");
    t.command(&with.command(), &reply.json().keep(&["id"]).render());

    // Browsers: an origin with a path is refused at start.
    t.block("cors", "console");
    let args = ["serve", "--cors-origin", "http://localhost:5173/app"];
    let output = tah()
        .args(args)
        .current_dir(dir.path())
        .output()
        .await
        .expect("run tah serve");
    assert_eq!(output.status.code(), Some(1), "refused at start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    t.command(&format!("tah {}", args.join(" ")), stderr.trim_end());
    t.check();
}

/// `tah healthcheck` against a ready server (found through `TAH_LISTEN`) and a closed port.
/// The README shows port 8080 for the server and 9999 for the closed port.
#[tokio::test]
async fn the_healthcheck_example_shows_what_it_prints() {
    let dir = scratch();
    let demo = Demo::start(dir.path(), &[], &[]).await;
    let mut t = Transcript::new("healthcheck");
    t.block("console", "console");
    let listen = demo.addr.to_string();
    let output = tah()
        .arg("healthcheck")
        .env("TAH_LISTEN", &listen)
        .output()
        .await
        .expect("run tah healthcheck");
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout).replace(&listen, "127.0.0.1:8080");
    t.command("tah healthcheck", line.trim_end());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("an address").port().to_string();
    drop(closed);
    let url = format!("http://127.0.0.1:{port}/readyz");
    let output = tah()
        .args(["healthcheck", "--url", &url])
        .output()
        .await
        .expect("run tah healthcheck");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout).replace(&format!(":{port}/"), ":9999/");
    t.command(
        "tah healthcheck --url http://127.0.0.1:9999/readyz",
        line.trim_end(),
    );
    t.check();
}

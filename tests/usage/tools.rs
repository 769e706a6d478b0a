//! The manual's tool examples, against servers started as the manual starts them: an approval
//! (the run waits, the approval is listed, answered, the run ends and the file exists; then
//! the other answers: a denial with its reason, `always` and its rule, a repeated and a
//! conflicting answer, a new message that supersedes a waiting call), a client tool (the run
//! streams up to `tool.client-requested`, the client posts the result, the stream goes on),
//! and a `--tool-policy` file (what it allows, what a session adds, what it denies whatever
//! the session says).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::usage::demo::{scratch, Curl, Demo, Walk};
use crate::usage::readme::Transcript;
use crate::usage::shown::{Frame, Json, Style};
use crate::usage::walkthrough::{elided, shown};

/// What `curl -w '%{http_code}\n'` shows: the status alone.
const STATUS_ONLY: &str = "-s -o /dev/null -w '%{http_code}\\n'";

/// How long a hidden poll waits for the server to get where the manual's next command is.
const POLL: Duration = Duration::from_secs(20);

/// `| python3 -c …` that prints one string field of a JSON answer.
fn print_field(field: &str) -> String {
    format!("python3 -c 'import sys,json;print(json.load(sys.stdin)[\"{field}\"])'")
}

/// `| python3 -c …` that prints `seq type data` for the events the Python condition `cond`
/// (on `e["type"]`) keeps.
fn print_events(cond: &str) -> String {
    format!(
        "python3 -c '\nimport sys,json\nfor e in json.load(sys.stdin)[\"data\"]:\n    if \
         {cond}: print(e[\"seq\"], e[\"type\"], json.dumps(e[\"data\"]))'"
    )
}

/// The events of `reply` (a JSON page) that `keep` keeps, as [`print_events`] prints them.
fn event_lines(reply: &crate::usage::demo::Reply, keep: impl Fn(&str) -> bool) -> String {
    let Some(Json::Array(events)) = reply.json().get("data").cloned() else {
        panic!("no events: {}", reply.body);
    };
    events
        .iter()
        .filter(|e| keep(e.get("type").and_then(Json::str).unwrap_or_default()))
        .map(|e| {
            let seq = e.get("seq").map(Json::render).unwrap_or_default();
            let kind = e.get("type").and_then(Json::str).unwrap_or_default();
            let data = e.get("data").map(|d| d.render_as(Style::Python));
            format!("{seq} {kind} {}", data.unwrap_or_default())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asks `curl` (not shown) until `done` holds for its answer, as a reader who waits a moment
/// before the next command; the last answer.
async fn poll(demo: &Demo, curl: &Curl, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + POLL;
    loop {
        let value = demo.send(curl).await.value();
        if done(&value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: never got there: {value}",
            curl.command()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The call id of the one approval the session waits for, once it does.
async fn pending_call(demo: &Demo) -> String {
    let approvals = Curl::get("/v1/sessions/$SESSION/approvals");
    let listed = poll(demo, &approvals, |v| {
        v["data"].as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    let data = listed["data"].as_array().expect("a list");
    assert_eq!(data.len(), 1, "one call waits: {listed}");
    data[0]["call_id"].as_str().expect("a call id").to_string()
}

/// The session's last event (asked, not shown), to show only what follows.
async fn last_seq(demo: &Demo) -> u64 {
    let session = demo.send(&Curl::get("/v1/sessions/$SESSION")).await.value();
    session["last_seq"].as_u64().expect("a last_seq")
}

/// Waits (not shown) until the run in `$RUN` has ended.
async fn run_ended(demo: &Demo) {
    let run = Curl::get("/v1/sessions/$SESSION/runs/$RUN");
    poll(demo, &run, |v| v["status"] != "running").await;
}

fn approve(call_id: &str, body: &str) -> Curl {
    Curl::post(&format!("/v1/sessions/$SESSION/approvals/{call_id}")).json(body)
}

fn run_with(input: &str) -> Curl {
    let body = serde_json::json!({ "input": input }).to_string();
    Curl::post("/v1/sessions/$SESSION/runs").json(&body)
}

#[tokio::test]
async fn the_approval_example_shows_what_the_server_answers() {
    let dir = scratch();
    // A directory of its own: the Quick start's `demo/` has files, which the mock would read
    // first (other call ids, other events).
    std::fs::create_dir(dir.path().join("approval-demo")).expect("mkdir approval-demo");
    let mut t = Transcript::new("approval");
    t.block("serve", "sh");
    t.push("mkdir approval-demo");
    t.push("cargo run --release -- serve --workspace approval-demo");
    let demo = Demo::start(dir.path(), &["--workspace", "approval-demo"], &[]).await;
    let mut w = Walk { demo, t };

    w.t.block("ask", "console");
    w.capture("SESSION", &Curl::post("/v1/sessions"), "/id")
        .await;
    w.capture("RUN", &run_with("Write a note about the release"), "/id")
        .await;
    let call = pending_call(&w.demo).await;
    assert_eq!(call, "call_2_0", "the mock's first call of the session");
    let session = Curl::get("/v1/sessions/$SESSION");
    w.show_as(&session, StatusCode::OK, |reply| {
        reply.json().keep(&["state"]).render()
    })
    .await;
    w.show(
        &Curl::get("/v1/sessions/$SESSION/approvals"),
        StatusCode::OK,
    )
    .await;

    w.t.block("allow", "console");
    w.show(&approve(&call, r#"{"decision":"allow"}"#), StatusCode::OK)
        .await;
    run_ended(&w.demo).await;
    let run = Curl::get("/v1/sessions/$SESSION/runs/$RUN");
    let ended = w
        .show_as(&run, StatusCode::OK, |reply| {
            reply.json().keep(&["status", "text"]).render()
        })
        .await;
    assert_eq!(ended.value()["status"], "completed", "{}", ended.body);
    let note =
        std::fs::read_to_string(dir.path().join("approval-demo/notes.md")).expect("the note");
    assert_eq!(note, "Write a note about the release\n");
    w.t.command("cat approval-demo/notes.md", note.trim_end());
    let events = Curl::get("/v1/sessions/$SESSION/events");
    let reply = w.demo.send(&events).await.expect(StatusCode::OK, "events");
    let lines = event_lines(&reply, |kind| kind.starts_with("tool."));
    let cond = "e[\"type\"].startswith(\"tool.\")";
    w.t.command(
        &format!("{} | {}", events.command(), print_events(cond)),
        &lines,
    );
    for kind in [
        "approval-requested",
        "approval-resolved",
        "started",
        "finished",
    ] {
        assert!(lines.contains(&format!("tool.{kind} ")), "{lines}");
    }

    // The same answer again is taken as it was; another one is a conflict; an unknown call
    // is not found.
    w.t.block("again", "console");
    w.show(&approve(&call, r#"{"decision":"allow"}"#), StatusCode::OK)
        .await;
    w.show(
        &approve(&call, r#"{"decision":"deny"}"#),
        StatusCode::CONFLICT,
    )
    .await;
    let unknown = approve("call_99_0", r#"{"decision":"allow"}"#).flags(STATUS_ONLY);
    w.show_as(&unknown, StatusCode::NOT_FOUND, |r| {
        r.status.as_str().to_string()
    })
    .await;

    denied(&mut w).await;
    superseded(&mut w).await;
    // Last: from then on, the session writes notes.md without asking.
    always(&mut w).await;
    w.t.check();
    let log = w.demo.log();
    assert!(!log.contains("ERROR"), "{log}");
}

/// A denial with a reason: the model is told, and says so.
async fn denied(w: &mut Walk) {
    w.t.block("deny", "console");
    w.capture("RUN", &run_with("Write a note about the budget"), "/id")
        .await;
    let call = pending_call(&w.demo).await;
    let body = r#"{"decision":"deny","reason":"the budget is not final yet"}"#;
    w.show(&approve(&call, body), StatusCode::OK).await;
    run_ended(&w.demo).await;
    let run = Curl::get("/v1/sessions/$SESSION/runs/$RUN");
    let reply = w.demo.send(&run).await.expect(StatusCode::OK, "the run");
    let text = reply.value()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("the user denied this call"), "{text}");
    w.t.command(
        &format!("{} | {}", run.command(), print_field("text")),
        &text,
    );
}

/// `always`: the call runs, the session gets a rule, and the same call later runs unasked.
async fn always(w: &mut Walk) {
    w.t.block("always", "console");
    let before = last_seq(&w.demo).await;
    w.capture("RUN", &run_with("Write a note about the launch"), "/id")
        .await;
    let call = pending_call(&w.demo).await;
    w.show(&approve(&call, r#"{"decision":"always"}"#), StatusCode::OK)
        .await;
    run_ended(&w.demo).await;
    let again = Curl::post("/v1/sessions/$SESSION/runs?wait=true")
        .json(r#"{"input":"Write a note about the launch party"}"#);
    let reply = w.demo.send(&again).await.expect(StatusCode::OK, "a run");
    let text = reply.value()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    w.t.command(
        &format!("{} | {}", again.command(), print_field("text")),
        &text,
    );
    let events = Curl::get(&format!("/v1/sessions/$SESSION/events?after={before}"));
    let reply = w.demo.send(&events).await.expect(StatusCode::OK, "events");
    let kinds = ["tool.approval-resolved", "tool.policy-updated"];
    let lines = event_lines(&reply, |kind| kinds.contains(&kind));
    let cond = "e[\"type\"] in (\"tool.approval-resolved\", \"tool.policy-updated\")";
    w.t.command(
        &format!("{} | {}", events.command(), print_events(cond)),
        &lines,
    );
    assert!(lines.contains("tool.policy-updated "), "{lines}");
    assert_eq!(
        lines.matches("tool.approval-resolved ").count(),
        1,
        "the second write was not asked: {lines}"
    );
}

/// A new message while a call waits: refused, unless it denies what waits.
async fn superseded(w: &mut Walk) {
    w.t.block("supersede", "console");
    let before = last_seq(&w.demo).await;
    let first = run_with("Write a note about lunch").flags(STATUS_ONLY);
    w.show_as(&first, StatusCode::ACCEPTED, |r| {
        r.status.as_str().to_string()
    })
    .await;
    pending_call(&w.demo).await;
    let body = r#"{"input":"Never mind"}"#;
    let refused = Curl::post("/v1/sessions/$SESSION/runs").json(body);
    w.show(&refused, StatusCode::CONFLICT).await;
    let deny = Curl::post("/v1/sessions/$SESSION/runs?pending=deny&wait=true").json(body);
    w.show_as(&deny, StatusCode::OK, |reply| {
        reply.json().keep(&["status", "text"]).render()
    })
    .await;
    let events = Curl::get(&format!("/v1/sessions/$SESSION/events?after={before}"));
    let reply = w.demo.send(&events).await.expect(StatusCode::OK, "events");
    let lines = event_lines(&reply, |kind| kind == "tool.approval-resolved");
    let cond = "e[\"type\"] == \"tool.approval-resolved\"";
    w.t.command(
        &format!("{} | {}", events.command(), print_events(cond)),
        &lines,
    );
    assert!(lines.contains("superseded by a new message"), "{lines}");
}

/// The client tool of the example.
const CLIENT_TOOLS: &str = r#"{"client_tools":[{"name":"ask_user","description":"Ask the person using the app a question and get their answer","input_schema":{"type":"object","properties":{"question":{"type":"string"}},"required":["question"]}}]}"#;

#[tokio::test]
async fn the_client_tool_example_shows_what_the_server_answers() {
    let dir = scratch();
    std::fs::create_dir_all(dir.path().join("demo")).expect("mkdir demo");
    let demo = Demo::start(dir.path(), &["--workspace", "demo"], &[]).await;
    let mut w = Walk {
        demo,
        t: Transcript::new("client"),
    };

    w.t.block("stream", "console");
    let create = Curl::post("/v1/sessions").json(CLIENT_TOOLS);
    w.capture("SESSION", &create, "/id").await;
    let run = Curl::new("-N", "/v1/sessions/$SESSION/runs")
        .method("POST")
        .sse()
        .json(r#"{"input":"Ask the client which branch to deploy"}"#);
    let requested = |f: &Frame| f.event_type() == Some("tool.client-requested");
    let mut stream = w.demo.stream_until(&run, |f| f.iter().any(requested)).await;
    let frames = stream.frames.clone();
    let at = frames.iter().position(requested).expect("the request");
    let events: Vec<&Frame> = frames[..at].iter().collect();
    let what = "the user message, the model's call of ask_user, the session going to \
                waiting_tool";
    let head: Vec<&Frame> = frames[..1].iter().collect();
    let output = [
        shown(&head),
        elided(events[1], events[events.len() - 1], what),
        shown(&[&frames[at]]),
    ]
    .join("\n");
    w.t.command(&run.command(), output.trim_end());
    let call_id = serde_json::from_str::<Value>(frames[at].field("data").expect("data"))
        .expect("JSON")["data"]["call_id"]
        .as_str()
        .expect("a call id")
        .to_string();

    w.t.block("result", "console");
    let result = Curl::post(&format!("/v1/sessions/$SESSION/tool-results/{call_id}"))
        .json(r#"{"output":"main"}"#);
    w.show(&result, StatusCode::OK).await;
    w.show(&result, StatusCode::OK).await;
    let other = Curl::post(&format!("/v1/sessions/$SESSION/tool-results/{call_id}"))
        .json(r#"{"output":"dev"}"#)
        .flags(STATUS_ONLY);
    w.show_as(&other, StatusCode::CONFLICT, |r| {
        r.status.as_str().to_string()
    })
    .await;

    w.t.block("rest", "");
    let ended = |f: &[Frame]| f.iter().any(|f| f.event_type() == Some("agent.finished"));
    stream.until(ended).await;
    let rest: Vec<&Frame> = stream.frames[at + 1..].iter().collect();
    assert_eq!(rest[0].event_type(), Some("tool.finished"), "{rest:?}");
    assert!(rest[0].shown().contains(r#""output":"main""#));
    let last = rest[rest.len() - 1];
    assert!(last.shown().contains("ask_user answered: main"), "{last:?}");
    let what = "the session running again, and the model's next step, which streams \
                \"ask_user answered: main\"";
    w.t.push(
        [
            shown(&rest[..1]),
            elided(rest[1], rest[rest.len() - 2], what),
            shown(&[last]),
        ]
        .join("\n")
        .trim_end(),
    );
    w.t.check();
}

/// The example `--tool-policy` file, one rule a line.
const POLICY: [&str; 6] = [
    r#"{"tool": "shell", "match": "ls", "action": "allow"}"#,
    r#"{"tool": "shell", "match": "git status", "action": "allow"}"#,
    r#"{"tool": "shell", "match": "*rm *", "action": "deny"}"#,
    r#"{"tool": "write_file", "match": "notes/**", "action": "allow"}"#,
    r#"{"tool": "*_file", "match": "**/.env*", "action": "deny"}"#,
    r#"{"tool": "edit_file", "action": "ask"}"#,
];

/// The three commands of the policy example, and who decides each.
const COMMANDS: [&str; 3] = [
    "Please run `ls`",
    "Please run `wc -l README.md`",
    "Please run `rm -rf src`",
];

#[tokio::test]
#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
async fn the_policy_example_shows_what_the_server_answers() {
    let dir = scratch();
    crate::usage::demo::echo_into(dir.path(), "demo/README.md", "# Demo");
    crate::usage::demo::echo_into(dir.path(), "demo/src/main.rs", "fn main() {}");
    let mut t = Transcript::new("policy");
    t.block("file", "json");
    let file = format!("[\n  {}\n]", POLICY.join(",\n  "));
    t.push(&file);
    std::fs::write(dir.path().join("policy.json"), &file).expect("write the policy");
    t.block("serve", "sh");
    let args = ["--workspace", "demo", "--tool-policy", "policy.json"];
    t.push(&format!("cargo run --release -- serve {}", args.join(" ")));
    let demo = Demo::start(dir.path(), &args, &[]).await;
    let mut w = Walk { demo, t };

    w.t.block("console", "console");
    let tools = Curl::get("/v1/tools");
    let reply = w.demo.send(&tools).await.expect(StatusCode::OK, "tools");
    let listed: Vec<String> = reply.value()["data"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let state = match t["available"].as_bool() {
                Some(true) => "available".to_string(),
                _ => format!("unavailable: {}", t["reason"].as_str().unwrap_or_default()),
            };
            format!(
                "{} {} {state}",
                t["name"].as_str().unwrap_or_default(),
                t["source"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let one_liner = "python3 -c '\nimport sys,json\nfor t in json.load(sys.stdin)[\"data\"]:\n    \
                     print(t[\"name\"], t[\"source\"], \"available\" if t[\"available\"] else \
                     \"unavailable: \" + t[\"reason\"])'";
    w.t.command(
        &format!("{} | {one_liner}", tools.command()),
        &listed.join("\n"),
    );
    let create =
        Curl::post("/v1/sessions").json(r#"{"tool_policy":[{"tool":"shell","action":"allow"}]}"#);
    w.capture("SESSION", &create, "/id").await;
    let quoted = COMMANDS.map(|q| format!("'{q}'")).join(" ");
    let mut texts = Vec::new();
    for input in COMMANDS {
        let body = serde_json::json!({ "input": input }).to_string();
        let run = Curl::post("/v1/sessions/$SESSION/runs?wait=true").json(&body);
        let reply = w.demo.send(&run).await.expect(StatusCode::OK, input);
        let text = reply.value()["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        texts.push(text);
    }
    w.t.command(
        &format!(
            "for q in {quoted}; do\n>   curl -s -X POST \
             \"localhost:8080/v1/sessions/$SESSION/runs?wait=true\" -H 'Content-Type: \
             application/json' -d \"{{\\\"input\\\":\\\"$q\\\"}}\" | {}\n> done",
            print_field("text")
        ),
        &texts.join("\n"),
    );
    assert!(texts[0].ends_with("exit code 0"), "{texts:?}");
    assert!(texts[1].ends_with("exit code 0"), "{texts:?}");
    assert!(texts[2].contains("denies shell"), "{texts:?}");
    let events = Curl::get("/v1/sessions/$SESSION/events?limit=500");
    let reply = w.demo.send(&events).await.expect(StatusCode::OK, "events");
    let kinds = ["tool.finished", "tool.approval-resolved"];
    let lines = event_lines(&reply, |kind| kinds.contains(&kind));
    let cond = "e[\"type\"] in (\"tool.finished\", \"tool.approval-resolved\")";
    w.t.command(
        &format!("{} | {}", events.command(), print_events(cond)),
        &lines,
    );
    assert!(lines.contains("\"by\": \"policy\""), "{lines}");
    let started = event_lines(&reply, |kind| kind == "tool.started");
    assert_eq!(
        started.lines().count(),
        2,
        "the denied call never started: {started}"
    );
    w.t.check();
}

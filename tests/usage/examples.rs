//! The manual's other examples, rendered from what servers started as the manual says answer:
//! context management (a tight budget over a small workspace), authentication and a refused
//! `--cors-origin`, and `tah healthcheck`.

use reqwest::StatusCode;

use crate::usage::demo::{scratch, Curl, Demo, Walk};
use crate::usage::readme::Transcript;
use crate::usage::shown::{Json, Style};
use crate::usage::tah;

/// What `curl -w '%{http_code}\n'` shows: the status alone.
const STATUS_ONLY: &str = "-s -o /dev/null -w '%{http_code}\\n'";

/// The three turns of the context example.
const INPUTS: [&str; 3] = [
    "What is in this workspace?",
    "And the notes?",
    "Summarise the README",
];

#[tokio::test]
async fn the_context_example_shows_what_the_server_answers() {
    let dir = scratch();
    let workspace = dir.path().join("tmp/demo");
    std::fs::create_dir_all(&workspace).expect("mkdir");
    for n in 1..=8 {
        std::fs::write(workspace.join(format!("notes-{n}.txt")), "").expect("touch");
    }
    let readme: String = (1..=20)
        .map(|n| format!("Line {n} of a long README.\n"))
        .collect();
    std::fs::write(workspace.join("README.md"), readme).expect("write the README");
    let mut t = Transcript::new("context");
    t.block("serve", "sh");
    t.push("mkdir -p /tmp/demo && touch /tmp/demo/notes-{1..8}.txt");
    t.push("seq -f 'Line %g of a long README.' 1 20 > /tmp/demo/README.md");
    t.push("cargo run --release -- serve --workspace /tmp/demo --context-chars 1500");
    let workspace = workspace.display().to_string();
    let args = ["--workspace", &workspace, "--context-chars", "1500"];
    let demo = Demo::start(dir.path(), &args, &[]).await;
    let mut w = Walk { demo, t };

    w.t.block("console", "console");
    w.capture("SESSION", &Curl::post("/v1/sessions"), "/id")
        .await;
    let quoted = INPUTS.map(|q| format!("'{q}'")).join(" ");
    w.t.command(
        &format!(
            "for q in {quoted}; do\n>   curl -s -o /dev/null -X POST \
             \"localhost:8080/v1/sessions/$SESSION/runs?wait=true\" -H 'Content-Type: \
             application/json' -d \"{{\\\"input\\\":\\\"$q\\\"}}\"\n> done"
        ),
        "",
    );
    for input in INPUTS {
        let body = serde_json::json!({ "input": input }).to_string();
        let run = Curl::post("/v1/sessions/$SESSION/runs?wait=true").json(&body);
        w.demo.send(&run).await.expect(StatusCode::OK, input);
    }
    let trimmed_step = context_events(&mut w).await;
    context_requests(&mut w, &trimmed_step).await;
    w.t.check();
}

/// The context events of the session, as the manual's python one-liner prints them, checked
/// against what the prose under the example says; the first trimmed step's id.
async fn context_events(w: &mut Walk) -> String {
    let events = Curl::get("/v1/sessions/$SESSION/events?limit=500");
    let reply = w.demo.send(&events).await;
    let mut lines = Vec::new();
    // (seq, dropped_turns, elided_tool_results) of each trim, (seq, turns, auto) of each
    // compaction, and the first trimmed step.
    let (mut trims, mut compactions, mut first_trimmed) = (Vec::new(), Vec::new(), None);
    let all = match reply.json().get("data") {
        Some(Json::Array(events)) => events.clone(),
        _ => panic!("no events: {}", reply.body),
    };
    for event in &all {
        let kind = event.get("type").and_then(Json::str).unwrap_or_default();
        let (Some(data), Some(seq)) = (event.get("data"), event.get("seq")) else {
            continue;
        };
        if !kind.starts_with("agent.context") {
            continue;
        }
        lines.push(format!(
            "{} {kind} {}",
            seq.render(),
            data.render_as(Style::Python)
        ));
        let number = |key: &str| data.get(key).map(Json::render).unwrap_or_default();
        let seq: u64 = seq.render().parse().expect("a number");
        if kind == "agent.context.trimmed" {
            trims.push((seq, number("dropped_turns"), number("elided_tool_results")));
            first_trimmed =
                first_trimmed.or(data.get("step_id").and_then(Json::str).map(String::from));
        } else if kind == "agent.context.compacted" {
            compactions.push((seq, number("turns"), number("auto")));
        }
    }
    // The prose: in the second turn a trim first elides an older tool output and a later one
    // drops a whole turn; the third turn begins with an automatic summary of the first two.
    assert!(trims.len() >= 2, "{lines:?}");
    assert_eq!(
        (&trims[0].1[..], trims[0].2 != "0"),
        ("0", true),
        "{lines:?}"
    );
    assert!(
        trims[1..].iter().any(|t| t.1 != "0"),
        "a later trim drops a turn: {lines:?}"
    );
    assert_eq!(compactions.len(), 1, "{lines:?}");
    assert_eq!(
        (&compactions[0].1[..], &compactions[0].2[..]),
        ("2", "true")
    );
    let runs = w
        .demo
        .send(&Curl::get("/v1/sessions/$SESSION/runs"))
        .await
        .value();
    let starts: Vec<u64> = runs["data"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|run| run["start_seq"].as_u64())
        .collect();
    assert_eq!(starts.len(), INPUTS.len(), "{runs}");
    let turn_of = |seq: u64| starts.iter().filter(|start| **start <= seq).count();
    assert!(trims.iter().all(|t| turn_of(t.0) == 2), "{lines:?}");
    assert_eq!(
        turn_of(compactions[0].0),
        3,
        "the summary opens the third turn"
    );
    let one_liner = "python3 -c '\nimport sys,json\nfor e in json.load(sys.stdin)[\"data\"]:\n    \
                     if e[\"type\"].startswith(\"agent.context\"): print(e[\"seq\"], e[\"type\"], \
                     json.dumps(e[\"data\"]))'";
    w.t.command(
        &format!("{} | {one_liner}", events.command()),
        &lines.join("\n"),
    );
    first_trimmed.expect("a trimmed step")
}

/// The summary in the history, the trimmed step's rebuilt request, and a manual compaction
/// (then nothing left to compact).
async fn context_requests(w: &mut Walk, trimmed_step: &str) {
    let messages = Curl::get("/v1/sessions/$SESSION/messages?limit=500");
    let messages = w.demo.send(&messages).await.value();
    let is_summary = |m: &&serde_json::Value| {
        let content = m["content"].as_str().unwrap_or_default();
        content.starts_with("[Summary of the earlier conversation]")
    };
    let summary = messages["data"]
        .as_array()
        .and_then(|m| m.iter().find(is_summary))
        .and_then(|m| m["index"].as_u64())
        .expect("an automatic summary");
    let around = format!(
        "/v1/sessions/$SESSION/messages?after={}&limit=2",
        summary - 1
    );
    w.show(&Curl::get(&around), StatusCode::OK).await;
    let step = Curl::get(&format!("/v1/sessions/$SESSION/steps/{trimmed_step}"));
    w.show_as(&step, StatusCode::OK, |reply| {
        let step = reply.json().keep_in_items("tools", &["name"]);
        let step = step.drop_keys(&["created_at", "finished_at"]);
        step.shorten(&["system_prompt", "content"], 6).render()
    })
    .await;
    let compact = Curl::post("/v1/sessions/$SESSION/compact");
    w.show(&compact, StatusCode::OK).await;
    let again = compact.flags(STATUS_ONLY);
    w.show_as(&again, StatusCode::NO_CONTENT, |r| {
        r.status.as_str().to_string()
    })
    .await;
}

/// `tah ARGS` run in `dir`, expected to refuse to start: the command and what it said.
async fn refused(dir: &std::path::Path, args: &[&str]) -> (String, String) {
    let output = tah()
        .args(args)
        .current_dir(dir)
        .output()
        .await
        .expect("run tah");
    assert_eq!(
        output.status.code(),
        Some(1),
        "tah {args:?} is refused at start"
    );
    let stderr = String::from_utf8_lossy(&output.stderr)
        .trim_end()
        .to_string();
    (format!("tah {}", args.join(" ")), stderr)
}

/// A public address without tokens is refused; with tokens, `/v1` needs one; an origin with
/// a path is refused.
#[tokio::test]
async fn the_authentication_examples_show_what_the_server_answers() {
    let dir = scratch();
    let mut t = Transcript::new("auth");
    t.block("refused", "console");
    let (command, said) = refused(dir.path(), &["serve", "--listen", "0.0.0.0:8080"]).await;
    t.command(&command, &said);

    t.block("tokens", "console");
    let token = "a-long-secret-token-for-this-example";
    let demo = Demo::start(dir.path(), &[], &[("TAH_API_TOKENS", token)]).await;
    let mut w = Walk { demo, t };
    w.demo.set("TAH_API_TOKENS", token);
    let without = Curl::new("-si", "/v1/sessions");
    w.show_as(&without, StatusCode::UNAUTHORIZED, |reply| {
        reply.with_head(&["www-authenticate", "content-type"], &reply.body)
    })
    .await;
    let with = Curl::post("/v1/sessions").header("Authorization: Bearer $TAH_API_TOKENS");
    w.show_as(&with, StatusCode::CREATED, |reply| {
        reply.json().keep(&["id"]).render()
    })
    .await;

    w.t.block("cors", "console");
    let args = ["serve", "--cors-origin", "http://localhost:5173/app"];
    let (command, said) = refused(dir.path(), &args).await;
    w.t.command(&command, &said);
    w.t.check();
}

/// `tah healthcheck` against a ready server (found through `TAH_LISTEN`) and a closed port.
/// The manual shows port 8080 for the server and 9999 for the closed port.
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

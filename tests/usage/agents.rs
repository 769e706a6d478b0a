//! The manual's worked example of agents (`docs/src/agents.md`): two agents on two providers,
//! the mock (the default provider) and `tah fake-model` (an OpenAI-compatible provider of the
//! `--providers` file), a pinned and a following session running at once, and an update that
//! only the following one picks up.

use std::process::Stdio;

use reqwest::StatusCode;
use tah::app::ReadyLine;

use crate::usage::demo::{echo_into, scratch, Curl, Demo, Walk};
use crate::usage::readme::Transcript;
use crate::usage::shown::{Json, Style};
use crate::usage::tah;

/// The fake model's address as the page shows it.
const SHOWN_FAKE: &str = "127.0.0.1:9090";

/// `VAR=$(curl … -d "{\"agent\":…}" | python3 …)`: a session created on the agent that
/// `shown` names with shell variables (double quotes, so that the shell expands them), sent
/// with the variables' values.
async fn session_on(w: &mut Walk, var: &str, shown: &str, values: &[(&str, &str)]) {
    let body = format!("{{\"agent\":{shown}}}");
    let sent = values.iter().fold(body.clone(), |body, (name, value)| {
        body.replace(&format!("${name}"), value)
    });
    let reply = w
        .demo
        .send(&Curl::post("/v1/sessions").json(&sent))
        .await
        .expect(StatusCode::CREATED, &body);
    let id = reply.value()["id"].as_str().expect("an id").to_string();
    w.demo.set(var, &id);
    let command = Curl::post("/v1/sessions").json(&body).command().replace(
        &format!("-d '{body}'"),
        &format!("-d \"{}\"", body.replace('"', "\\\"")),
    );
    w.t.command(
        &format!(
            "{var}=$({command} | python3 -c 'import sys,json;print(json.load(sys.stdin)[\"id\"])')"
        ),
        "",
    );
}

/// The agent, provider and model of each LLM step of session `$var`, as a python one-liner
/// prints them.
async fn show_steps(w: &mut Walk, var: &str) {
    let one_liner = "python3 -c '\nimport sys,json\nfor s in json.load(sys.stdin)[\"data\"]:\n    \
                     if s[\"type\"] == \"llm\": print(json.dumps({k: s[\"request\"][k] for k in \
                     (\"agent\", \"provider\", \"model\")}))'";
    let list = Curl::get(&format!("/v1/sessions/${var}/steps"));
    let reply = w.demo.send(&list).await.expect(StatusCode::OK, "steps");
    let all = reply.json();
    let Some(Json::Array(steps)) = all.get("data") else {
        panic!("no steps: {}", reply.body)
    };
    // As the one-liner prints them: those three fields, in the server's key order.
    let lines: Vec<String> = steps
        .iter()
        .filter(|s| s.get("type").and_then(Json::str) == Some("llm"))
        .map(|s| {
            let request = s.get("request").expect("a request");
            let field = |k: &str| (k.to_string(), request.get(k).expect(k).clone());
            Json::Object(vec![field("agent"), field("provider"), field("model")])
                .render_as(Style::Python)
        })
        .collect();
    w.t.command(
        &format!("{} | {one_liner}", list.command()),
        &lines.join("\n"),
    );
}

#[tokio::test]
async fn the_agents_example_shows_what_the_server_answers() {
    let dir = scratch();
    echo_into(dir.path(), "demo/README.md", "# Demo");
    let mut fake = tah()
        .args(["fake-model", "--listen", "127.0.0.1:0", "--pieces", "3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tah fake-model");
    let stdout = fake.stdout.take().expect("piped stdout");
    let fake_addr = ReadyLine::read(stdout)
        .await
        .expect("the fake model is ready")
        .listening
        .to_string();
    let providers = format!(
        "{{\"providers\": {{\"local\": {{\"type\": \"openai\", \"base_url\": \"http://{fake_addr}/v1\"}}}}}}"
    );
    std::fs::write(dir.path().join("providers.json"), &providers).expect("write providers.json");

    let mut t = Transcript::new("agents");
    t.block("serve", "sh");
    t.push("mkdir -p demo && echo '# Demo' > demo/README.md");
    t.push(&format!(
        "cargo run --release -- fake-model --listen {SHOWN_FAKE} --pieces 3 &"
    ));
    t.push(&format!(
        "echo '{}' > providers.json",
        providers.replace(&fake_addr, SHOWN_FAKE)
    ));
    t.push("cargo run --release -- serve --workspace demo --providers providers.json");
    let args = ["--workspace", "demo", "--providers", "providers.json"];
    let demo = Demo::start(dir.path(), &args, &[]).await;
    let mut w = Walk { demo, t };
    let shown = |text: String| text.replace(&fake_addr, SHOWN_FAKE);

    // The providers, and two agents on them.
    w.t.block("agents", "console");
    w.show_as(&Curl::get("/v1/providers"), StatusCode::OK, |r| {
        shown(r.body.clone())
    })
    .await;
    let reviewer = Curl::post("/v1/agents").json(
        "{\"name\":\"reviewer\",\"model\":\"default/mock\",\"system_prompt\":\"You review \
         code.\",\"tools\":[\"list_files\",\"read_file\"]}",
    );
    let reviewer_id = w.capture("REVIEWER", &reviewer, "/id").await;
    let scout = Curl::post("/v1/agents")
        .json("{\"name\":\"scout\",\"model\":\"local/fake\",\"tools\":[\"list_files\"]}");
    let scout_id = w.capture("SCOUT", &scout, "/id").await;
    w.show(&Curl::get("/v1/agents/$SCOUT"), StatusCode::OK)
        .await;

    // A session pinned to the reviewer, one that follows the scout, a turn of each at once.
    w.t.block("sessions", "console");
    let (reviewer_id, scout_id) = (reviewer_id.as_str(), scout_id.as_str());
    session_on(&mut w, "A", "\"$REVIEWER\"", &[("REVIEWER", reviewer_id)]).await;
    session_on(
        &mut w,
        "B",
        "{\"id\":\"$SCOUT\",\"version\":\"latest\"}",
        &[("SCOUT", scout_id)],
    )
    .await;
    let run = |var: &str| {
        Curl::new(
            "-s -o /dev/null",
            &format!("/v1/sessions/${var}/runs?wait=true"),
        )
        .method("POST")
        .json("{\"input\":\"What is in this workspace?\"}")
    };
    w.t.command(&format!("{} &", run("A").command()), "");
    w.t.command(&format!("{} &", run("B").command()), "");
    w.t.command("wait", "");
    let (run_a, run_b) = (run("A"), run("B"));
    let (a, b) = tokio::join!(w.demo.send(&run_a), w.demo.send(&run_b));
    a.expect(StatusCode::OK, "the reviewer's turn");
    b.expect(StatusCode::OK, "the scout's turn");
    for var in ["A", "B"] {
        let session = Curl::get(&format!("/v1/sessions/${var}"));
        w.show_as(&session, StatusCode::OK, |r| {
            r.json().keep(&["id", "agent", "state"]).render()
        })
        .await;
    }
    for var in ["A", "B"] {
        show_steps(&mut w, var).await;
    }

    // An update: the following session takes it at its next run, the pinned one never.
    w.t.block("update", "console");
    let update = Curl::post("/v1/agents/$SCOUT")
        .header("If-Match: \"1\"")
        .json("{\"system_prompt\":\"You scout, briefly.\"}");
    w.show_as(&update, StatusCode::OK, |r| {
        r.json()
            .keep(&["id", "version", "name", "system_prompt"])
            .render()
    })
    .await;
    let stale = Curl::new("-s -o /dev/null -w '%{http_code}\\n'", "/v1/agents/$SCOUT")
        .method("POST")
        .header("If-Match: \"1\"")
        .json("{\"description\":\"too late\"}");
    w.show_as(&stale, StatusCode::PRECONDITION_FAILED, |r| {
        r.status.as_str().to_string()
    })
    .await;
    let (again_a, again_b) = (run("A"), run("B"));
    w.t.command(&format!("{} &", again_a.command()), "");
    w.t.command(&format!("{} &", again_b.command()), "");
    w.t.command("wait", "");
    let (a, b) = tokio::join!(w.demo.send(&again_a), w.demo.send(&again_b));
    a.expect(StatusCode::OK, "the reviewer's second turn");
    b.expect(StatusCode::OK, "the scout's second turn");
    for var in ["A", "B"] {
        let session = Curl::get(&format!("/v1/sessions/${var}"));
        w.show_as(&session, StatusCode::OK, |r| {
            r.json().keep(&["agent"]).render()
        })
        .await;
    }
    show_steps(&mut w, "B").await;
    w.t.check();
    drop(fake);
}

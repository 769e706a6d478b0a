//! Sub-agents: the `task` tool runs a child session (its own log, `parent_id`, its parent's
//! policy and workspace) to the end and answers its final text; the parent logs
//! `subagent.started` and `subagent.finished`; several children run at once; cancelling the
//! parent cancels them; a child never waits for its parent's run permit; the depth limit
//! decides who is offered `task`; `?parent_id=` lists the children.
//!
//! The mock model asks for `task` when the input says "delegate" (or "delegate N": N calls in
//! one reply), handing the input on as "… (part i of N)", and answers "task answered: …" once
//! every result is in.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::*;

/// A session whose policy lets it start sub-agents without asking.
async fn delegating_session(server: &TestServer) -> String {
    let session = server
        .create_session_with(&json!({"tool_policy": [{"tool": "task", "action": "allow"}]}))
        .await;
    id_of(&session)
}

/// The children of `id`, in the order of the calls that started them.
async fn children_of(server: &TestServer, id: &str) -> Vec<Value> {
    let mut children = server.children(id).await;
    children.sort_by_key(|c| c["task_call_id"].as_str().map(str::to_string));
    children
}

/// Waits until `id` has `n` children and every one of them is streaming its answer; returns
/// them.
async fn until_children_stream(server: &TestServer, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = children_of(server, id).await;
        let mut streaming = 0;
        for child in &children {
            let log = server.events(&id_of(child)).await;
            streaming += usize::from(!of_type(&log, "agent.assistant-stream").is_empty());
        }
        if children.len() == n && streaming == n {
            return children;
        }
        assert!(
            Instant::now() < deadline,
            "children never ran: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn at(event: &Value) -> DateTime<Utc> {
    event["created_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("an event without created_at: {event}"))
}

/// The tools the first LLM step of `id` offered the model.
async fn offered_tools(server: &TestServer, id: &str) -> Vec<String> {
    let views = server.llm_step_views(id).await;
    let first = views
        .first()
        .unwrap_or_else(|| panic!("session {id} has no LLM step"));
    offered_tool_names(first)
}

#[tokio::test]
async fn a_task_runs_a_child_session_and_answers_its_final_text() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = delegating_session(&server).await;
    let result = server.run_wait(&id, "please delegate").await;
    assert_eq!(result["status"], "completed", "{result}");

    let children = children_of(&server, &id).await;
    assert_eq!(children.len(), 1, "{children:?}");
    let child = &children[0];
    let child_id = id_of(child);
    assert_eq!(child["parent_id"], id.as_str(), "{child}");
    assert_eq!(child["depth"], 1, "{child}");
    assert_eq!(child["title"], "part 1 of 1", "{child}");
    assert_eq!(child["state"], "completed", "{child}");
    // The parent's policy and configuration are the child's.
    assert_eq!(
        child["tool_policy"],
        json!([{"tool": "task", "action": "allow"}])
    );
    let parent = server.session(&id).await;
    assert!(parent.get("depth").is_none(), "{parent}");
    assert!(parent["parent_id"].is_null(), "{parent}");

    // The parent's log: the call started, then its child, then the child ended and the call.
    let events = server.events(&id).await;
    assert_contiguous_from_one(&events);
    let call_id = child["task_call_id"].as_str().expect("task_call_id");
    let order: Vec<String> = events
        .iter()
        .filter(|e| {
            e["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("subagent."))
                || (e["type"] == "tool.started" && e["data"]["call"]["id"] == call_id)
                || (e["type"] == "tool.finished" && e["data"]["call_id"] == call_id)
        })
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        order,
        [
            "tool.started",
            "subagent.started",
            "tool.finished",
            "subagent.finished"
        ],
        "{}",
        describe(&events)
    );
    let started = of_type(&events, "subagent.started")[0];
    assert_eq!(
        started["data"],
        json!({"call_id": call_id, "session_id": child_id})
    );
    let finished = of_type(&events, "subagent.finished")[0];
    assert_eq!(
        finished["data"],
        json!({"call_id": call_id, "session_id": child_id, "status": "completed"})
    );

    // The child's own log and history: it was told the prompt, and its answer is the result.
    let child_events = server.events(&child_id).await;
    assert_contiguous_from_one(&child_events);
    assert_eq!(child_events[0]["type"], "session.created");
    let runs = assert_runs("child", &child_events);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].ended_with(), "agent.finished");
    let child_messages = server.messages(&child_id).await;
    assert_eq!(child_messages[1]["role"], "user");
    assert_eq!(
        child_messages[1]["content"],
        "please delegate (part 1 of 1)"
    );
    let child_answer = child_messages.last().expect("messages")["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(child_answer.contains("part 1 of 1"), "{child_answer}");
    let output = of_type(&events, "tool.finished")[0]["data"]["output"].clone();
    assert_eq!(output, child_answer.as_str());
    assert_eq!(
        result["text"],
        format!("task answered: {child_answer}").as_str()
    );
    // None of the child's events is in the parent's log.
    assert!(events
        .iter()
        .all(|e| e["session_id"] == id.as_str() || e["session_id"].is_null()));

    // A child at the depth limit (1 by default) is not offered `task`, so it does the work
    // itself although its prompt says "delegate"; its parent was offered it.
    assert!(offered_tools(&server, &id)
        .await
        .contains(&"task".to_string()));
    let child_tools = offered_tools(&server, &child_id).await;
    assert!(
        !child_tools.contains(&"task".to_string()),
        "{child_tools:?}"
    );
    assert!(
        child_tools.contains(&"list_files".to_string()),
        "{child_tools:?}"
    );

    // How long a child takes to start: from the parent's `subagent.started` to the child's
    // first LLM request.
    let child_llm = of_type(&child_events, "llm.started")[0];
    let startup = at(child_llm) - at(started);
    eprintln!(
        "sub-agent start-up (subagent.started → the child's llm.started): {} µs",
        startup.num_microseconds().unwrap_or_default()
    );
}

#[tokio::test]
async fn several_tasks_of_one_reply_run_at_the_same_time() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let id = delegating_session(&server).await;
    let result = server.run_wait(&id, "delegate 3 pieces of work").await;
    assert_eq!(result["status"], "completed", "{result}");
    let text = result["text"].as_str().unwrap_or_default();
    for part in ["part 1 of 3", "part 2 of 3", "part 3 of 3"] {
        assert!(text.contains(part), "{part} missing from {text}");
    }

    let children = children_of(&server, &id).await;
    assert_eq!(children.len(), 3, "{children:?}");
    assert!(children.iter().all(|c| c["state"] == "completed"));

    // Every child started before any ended: they ran at the same time.
    let events = server.events(&id).await;
    let subagent: Vec<&str> = events
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| t.starts_with("subagent."))
        .collect();
    assert_eq!(
        subagent,
        [
            "subagent.started",
            "subagent.started",
            "subagent.started",
            "subagent.finished",
            "subagent.finished",
            "subagent.finished"
        ],
        "{}",
        describe(&events)
    );
    // Each child's run overlaps every other's.
    let mut spans = Vec::new();
    for child in &children {
        let log = server.events(&id_of(child)).await;
        let start = at(of_type(&log, "agent.started")[0]);
        let end = at(of_type(&log, "agent.finished")[0]);
        spans.push((start, end));
    }
    for a in &spans {
        for b in &spans {
            assert!(a.0 < b.1 && b.0 < a.1, "runs do not overlap: {spans:?}");
        }
    }
}

#[tokio::test]
async fn children_never_wait_for_the_run_permit_their_parent_holds() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--max-concurrent-runs", "1"])).await;
    let id = delegating_session(&server).await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        server.run_wait(&id, "delegate 2 things"),
    )
    .await
    .expect("a parent at --max-concurrent-runs 1 finishes with its two children");
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(children_of(&server, &id).await.len(), 2);

    // The permit is still counted: another top-level run while one runs is refused.
    let slow = TestServer::start(
        ServerOptions::new()
            .mock_delay_ms(100)
            .args(&["--max-concurrent-runs", "1"]),
    )
    .await;
    let first = delegating_session(&slow).await;
    slow.start_run(&first, "delegate 2").await;
    let other = slow.create_session().await;
    let refused = slow.post_run(&other, "hello").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    slow.cancel(&first).await;
}

#[tokio::test]
async fn cancelling_the_parent_cancels_its_children() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(200)).await;
    let id = delegating_session(&server).await;
    let run = server.start_run(&id, "delegate 2 slow things").await;
    let run_id = id_of(&run);

    let children = until_children_stream(&server, &id, 2).await;

    let outcome = server.cancel(&id).await;
    assert_eq!(outcome["cancelled"], true, "{outcome}");
    assert_eq!(server.wait_run(&id, &run_id).await["status"], "cancelled");
    for child in &children {
        let child_id = id_of(child);
        let session = server
            .poll_session(&child_id, "cancelled", Duration::from_secs(10), |s| {
                s["state"] == "cancelled"
            })
            .await;
        assert_eq!(session["state"], "cancelled");
        let log = server.events(&child_id).await;
        let runs = assert_runs("child", &log);
        assert_eq!(runs.last().expect("a run").ended_with(), "agent.cancelled");
    }

    // The parent's log names how each child ended, once, before its own end.
    let events = server.events(&id).await;
    assert_contiguous_from_one(&events);
    let finished = of_type(&events, "subagent.finished");
    assert_eq!(finished.len(), 2, "{}", describe(&events));
    for f in &finished {
        assert_eq!(f["data"]["status"], "cancelled", "{f}");
    }
    assert_eq!(terminal_types(&events, &run_id), ["agent.cancelled"]);
    let last_finished = events
        .iter()
        .rposition(|e| e["type"] == "subagent.finished")
        .expect("subagent.finished");
    let cancelled = events
        .iter()
        .position(|e| e["type"] == "agent.cancelled")
        .expect("agent.cancelled");
    assert!(last_finished < cancelled, "{}", describe(&events));
}

#[tokio::test]
async fn the_depth_limit_decides_who_may_delegate() {
    // Depth 2: a child delegates again, its child may not.
    let server = TestServer::start(ServerOptions::new().args(&["--max-subagent-depth", "2"])).await;
    let id = delegating_session(&server).await;
    let result = server.run_wait(&id, "delegate").await;
    assert_eq!(result["status"], "completed", "{result}");
    let children = children_of(&server, &id).await;
    assert_eq!(children.len(), 1);
    let child_id = id_of(&children[0]);
    let grandchildren = children_of(&server, &child_id).await;
    assert_eq!(grandchildren.len(), 1, "{grandchildren:?}");
    assert_eq!(grandchildren[0]["depth"], 2);
    assert_eq!(grandchildren[0]["parent_id"], child_id.as_str());
    let grandchild_id = id_of(&grandchildren[0]);
    assert!(children_of(&server, &grandchild_id).await.is_empty());
    assert!(!offered_tools(&server, &grandchild_id)
        .await
        .contains(&"task".to_string()));
    assert!(
        result["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("task answered: task answered: ")),
        "{result}"
    );

    // Depth 0: no sub-agents at all; `task` is neither listed nor accepted.
    let none = TestServer::start(ServerOptions::new().args(&["--max-subagent-depth", "0"])).await;
    let tools = none.get_ok("/v1/tools").await;
    assert!(
        tools["data"]
            .as_array()
            .expect("tools")
            .iter()
            .all(|t| t["name"] != "task"),
        "{tools}"
    );
    let refused = none
        .post_json("/v1/sessions", &json!({"tools": ["task"]}))
        .await;
    refused.expect_problem(StatusCode::BAD_REQUEST, "tools: [task] at depth 0");
    let id = delegating_session(&none).await;
    let result = none.run_wait(&id, "delegate").await;
    assert_eq!(result["status"], "completed");
    assert!(children_of(&none, &id).await.is_empty());
    assert!(!offered_tools(&none, &id)
        .await
        .contains(&"task".to_string()));

    // With the default depth `task` is listed, and a session may leave it out.
    let tools = server.get_ok("/v1/tools").await;
    assert!(tools["data"]
        .as_array()
        .expect("tools")
        .iter()
        .any(|t| t["name"] == "task"));
    let narrowed = server
        .create_session_with(&json!({"tools": ["list_files", "read_file"]}))
        .await;
    let narrowed_id = id_of(&narrowed);
    server.run_wait(&narrowed_id, "delegate").await;
    assert!(children_of(&server, &narrowed_id).await.is_empty());
}

#[tokio::test]
async fn the_children_list_takes_only_a_session_id() {
    let server = TestServer::start(ServerOptions::new()).await;
    for bad in ["not-a-uuid", "1", "%00"] {
        server
            .get(&format!("/v1/sessions?parent_id={bad}"))
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &format!("parent_id={bad:?}"));
    }
    // A session without children, and one that does not exist, have none.
    let id = server.create_session().await;
    assert!(children_of(&server, &id).await.is_empty());
    let unknown = "01a00000-0000-7000-8000-000000000000";
    assert!(children_of(&server, unknown).await.is_empty());
    // Top-level sessions are still listed as before, children among them.
    let parent = delegating_session(&server).await;
    server.run_wait(&parent, "delegate").await;
    let all = server.all_pages("/v1/sessions", "cursor", 20).await;
    assert_eq!(all.len(), 3, "{all:?}");
}

#[tokio::test]
async fn after_a_crash_the_parent_continues_the_children_it_had_started() {
    let mut server = TestServer::start(
        ServerOptions::new()
            .process()
            .mock_delay_ms(50)
            .args(&["--auto-resume", "true"]),
    )
    .await;
    let id = delegating_session(&server).await;
    server.start_run(&id, "delegate 2 long jobs").await;
    let before = until_children_stream(&server, &id, 2).await;

    server.kill9().await;
    server.spawn().await;
    let parent = server
        .poll_session(&id, "completed", Duration::from_secs(30), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(parent["state"], "completed");

    // The same two children, each interrupted once and then continued to its end.
    let after = children_of(&server, &id).await;
    let ids = |list: &[Value]| list.iter().map(id_of).collect::<Vec<_>>();
    assert_eq!(ids(&after), ids(&before), "{after:?}");
    for child in &after {
        assert_eq!(child["state"], "completed", "{child}");
        let log = server.events(&id_of(child)).await;
        assert_contiguous_from_one(&log);
        let failed = of_type(&log, "agent.failed");
        assert_eq!(failed.len(), 1, "{}", describe(&log));
        assert_eq!(failed[0]["data"]["error"], "interrupted");
        assert_eq!(
            of_type(&log, "agent.finished").len(),
            1,
            "{}",
            describe(&log)
        );
        let messages = server.messages(&id_of(child)).await;
        let prompts = messages.iter().filter(|m| m["role"] == "user").count();
        assert_eq!(prompts, 1, "the prompt was not given twice: {messages:?}");
    }
    // The parent's answer quotes both children.
    let events = server.events(&id).await;
    let finished = of_type(&events, "agent.finished");
    let text = finished.last().expect("agent.finished")["data"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        text.contains("part 1 of 2") && text.contains("part 2 of 2"),
        "{text}"
    );
    assert!(
        !server
            .log_lines("a sub-agent resumes with its parent")
            .is_empty(),
        "the children were left to their parent's resume: {}",
        server.log_tail(40)
    );
}

#[tokio::test]
async fn a_child_works_in_its_parents_workspace() {
    let server = TestServer::start(ServerOptions::new()).await;
    let dir = server.workspace().join("team");
    std::fs::create_dir_all(&dir).expect("create team/");
    std::fs::write(dir.join("README.md"), "Team notes live here.\n").expect("write README");
    let parent = server
        .create_session_with(&json!({
            "workspace": "team",
            "tool_policy": [{"tool": "task", "action": "allow"}],
        }))
        .await;
    let id = id_of(&parent);
    let result = server.run_wait(&id, "delegate").await;
    let children = children_of(&server, &id).await;
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["workspace"], "team", "{}", children[0]);
    // The child listed and read the parent's directory, not the server's root.
    let text = result["text"].as_str().unwrap_or_default();
    assert!(text.contains("Team notes live here."), "{text}");
    assert!(text.contains("1 top-level entries"), "{text}");
}

/// Every session under `id`, at every depth.
async fn descendants_of(server: &TestServer, id: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut frontier = vec![id.to_string()];
    while let Some(parent) = frontier.pop() {
        for child in children_of(server, &parent).await {
            frontier.push(id_of(&child));
            all.push(child);
        }
    }
    all
}

/// The most LLM steps in progress at once among `sessions`, from their logs.
async fn most_llm_steps_at_once(server: &TestServer, sessions: &[String]) -> usize {
    let mut marks: Vec<(DateTime<Utc>, i32)> = Vec::new();
    for id in sessions {
        for event in server.events(id).await {
            match event["type"].as_str() {
                Some("llm.started") => marks.push((at(&event), 1)),
                Some("llm.completed" | "llm.failed") => marks.push((at(&event), -1)),
                _ => {}
            }
        }
    }
    // At the same instant an end comes before a start.
    marks.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in marks {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or_default()
}

#[tokio::test]
async fn a_tree_of_sub_agents_stops_at_its_limit_and_runs_within_the_permits() {
    // The attack's shape: eight sub-agents per reply, five levels deep (37,449 sessions
    // unbounded), on a server that runs two runs at once.
    let server = TestServer::start(ServerOptions::new().args(&[
        "--max-subagent-depth",
        "5",
        "--max-concurrent-runs",
        "2",
    ]))
    .await;
    let id = delegating_session(&server).await;
    let probe_url = server.url("/readyz");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing_done = done.clone();
    let probing = tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut took = Vec::new();
        while !probing_done.load(std::sync::atomic::Ordering::Relaxed) {
            let started = Instant::now();
            let reply = client.get(&probe_url).send().await.expect("probe");
            assert!(reply.status().is_success(), "{}", reply.status());
            took.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        took
    });
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(50),
        server.run_wait(&id, "delegate 8 pieces"),
    )
    .await
    .expect("the tree finishes at --max-concurrent-runs 2: no deadlock");
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(result["status"], "completed", "{result}");

    // 64 sessions (the default limit) across the levels, each one ended.
    let tree = descendants_of(&server, &id).await;
    assert_eq!(tree.len(), 64, "sessions in the tree");
    assert!(tree.iter().all(|s| s["state"] == "completed"), "{tree:?}");
    let deepest = tree.iter().filter_map(|s| s["depth"].as_u64()).max();
    assert!(deepest.is_some_and(|d| d > 1), "{deepest:?}");

    // The calls past the limit were answered with an error and started nothing.
    let mut sessions = vec![id.clone()];
    sessions.extend(tree.iter().map(id_of));
    let (mut refused, mut started_events) = (0, 0);
    for session in &sessions {
        let log = server.events(session).await;
        started_events += of_type(&log, "subagent.started").len();
        refused += of_type(&log, "tool.finished")
            .iter()
            .filter(|e| {
                e["data"]["is_error"] == true
                    && e["data"]["output"]
                        .as_str()
                        .is_some_and(|o| o.contains("no sub-agent was started"))
            })
            .count();
    }
    assert_eq!(started_events, 64);
    assert!(refused > 0, "no call was refused");

    // Never more than two runs at work at once (their model calls), parents included.
    let most = most_llm_steps_at_once(&server, &sessions).await;
    assert!(
        most <= 2,
        "{most} LLM steps at once at --max-concurrent-runs 2"
    );

    let mut probes = probing.await.expect("probe task");
    probes.sort();
    let p99 = probes[(probes.len() * 99 / 100).min(probes.len() - 1)];
    eprintln!(
        "delegate 8 at depth 5, --max-concurrent-runs 2: {} sessions, {refused} task calls \
         refused, at most {most} LLM steps at once, {took:?}; /readyz p99 {p99:?} of {} probes \
         (max {:?})",
        tree.len(),
        probes.len(),
        probes.last().copied().unwrap_or_default()
    );
}

#[tokio::test]
async fn the_tree_limit_is_a_flag_and_slow_children_share_the_permits() {
    // Four per reply, two levels: 20 sessions unbounded, 10 allowed; model calls that take a
    // while, so that runs would overlap if they could.
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(10).args(&[
        "--max-subagent-depth",
        "2",
        "--max-subagents-per-run",
        "10",
        "--max-concurrent-runs",
        "2",
    ]))
    .await;
    let id = delegating_session(&server).await;
    let result = tokio::time::timeout(
        Duration::from_secs(50),
        server.run_wait(&id, "delegate 4 parts"),
    )
    .await
    .expect("the tree finishes at --max-concurrent-runs 2: no deadlock");
    assert_eq!(result["status"], "completed", "{result}");
    let tree = descendants_of(&server, &id).await;
    assert_eq!(tree.len(), 10, "sessions in the tree");
    let mut sessions = vec![id.clone()];
    sessions.extend(tree.iter().map(id_of));
    let most = most_llm_steps_at_once(&server, &sessions).await;
    eprintln!("delegate 4 at depth 2, limit 10, --max-concurrent-runs 2: at most {most} LLM steps at once");
    assert!(
        most <= 2,
        "{most} LLM steps at once at --max-concurrent-runs 2"
    );

    // The flag takes whole numbers from 1.
    for bad in ["0", "many"] {
        let (status, output) = serve_expecting_exit(&["--max-subagents-per-run", bad], &[]);
        assert!(
            !status.success(),
            "--max-subagents-per-run {bad} was accepted"
        );
        assert!(output.contains("--max-subagents-per-run"), "{output}");
    }
}

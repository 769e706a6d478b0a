//! Schedules (`/v1/schedules`), black-box: CRUD and bad input; fires of a cron every second
//! (6 fields, seconds first) that start runs as the schedule's creator; pause and a manual
//! trigger while paused; overlap `skip` and `allow` with a slow mock; each misfire policy
//! across a restart that spans several fire times (the timelines are printed); who may do
//! what; two replicas on one PostgreSQL database firing each time once; and `overlap: queue`:
//! a queued fire that outlives a restart, and queued fires two replicas start once each.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::principals::{create_key, operated, session_token};
use crate::support::*;

/// Every second.
const EVERY_SECOND: &str = "* * * * * *";
/// Once a year: never during a test.
const YEARLY: &str = "0 0 1 1 *";

async fn create(api: &Api, body: &Value) -> Value {
    api.post_json("/v1/schedules", body)
        .await
        .expect_json(StatusCode::CREATED, &format!("POST /v1/schedules {body}"))
}

fn every_second(overrides: Value) -> Value {
    let mut body = json!({
        "agent": "default",
        "cron": EVERY_SECOND,
        "timezone": "UTC",
        "input": "hello from a schedule",
    });
    for (k, v) in overrides.as_object().expect("an object") {
        body[k] = v.clone();
    }
    body
}

/// The whole fires log of a schedule, oldest first.
async fn fires(api: &Api, id: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/schedules/{id}/fires?limit=100&cursor={c}"),
            None => format!("/v1/schedules/{id}/fires?limit=100"),
        };
        let page = api.get_ok(&path).await;
        all.extend(page["data"].as_array().expect("data").iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return all,
        }
    }
}

/// Polls the fires log until `done` holds of it (at most `limit`).
async fn fires_until(
    api: &Api,
    id: &str,
    limit: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let log = fires(api, id).await;
        if done(&log) {
            return log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fires of {id} did not get there in {limit:?}: {log:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A time field of a fire.
fn at(fire: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    let text = fire[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {fire}"));
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{field} {text:?}: {e}"))
        .to_utc()
}

fn count(log: &[Value], field: &str, value: &str) -> usize {
    log.iter().filter(|f| f[field] == value).count()
}

/// A fires log in a few words per line, for the report of a scenario.
fn timeline(log: &[Value]) -> String {
    log.iter()
        .map(|f| {
            format!(
                "  {} {:<9} {:<9} missed={} created={}{}",
                f["time"].as_str().unwrap_or("-"),
                f["trigger"].as_str().unwrap_or("-"),
                f["outcome"].as_str().unwrap_or("-"),
                f["missed"],
                f["created_at"].as_str().unwrap_or("-"),
                f["error"]
                    .as_str()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_created_read_updated_and_deleted() {
    let server = TestServer::start(ServerOptions::new()).await;
    let made = create(
        &server,
        &json!({"agent": "default", "cron": YEARLY, "timezone": "Europe/Paris",
                "input": {"role": "user", "content": "report"}, "max_cost_usd": 1.5}),
    )
    .await;
    let id = id_of(&made);
    assert_eq!(made["agent"], "default");
    assert_eq!(made["cron"], YEARLY);
    assert_eq!(made["timezone"], "Europe/Paris");
    assert_eq!(made["input"], "report");
    assert_eq!(made["session"], "new");
    assert_eq!(made["misfire"], "skip");
    assert_eq!(made["overlap"], "skip");
    assert_eq!(made["max_cost_usd"], 1.5);
    assert_eq!(made["paused"], false);
    assert_eq!(made["tenant"], "default");
    assert_eq!(made["owner"], "operator");
    // Midnight of January 1st in Paris is 23:00 UTC the day before.
    let next = made["next_fire_at"].as_str().expect("next_fire_at");
    assert!(next.ends_with("-12-31T23:00:00.000Z"), "{made}");
    assert!(made["created_at"].is_string());

    assert_eq!(server.get_ok(&format!("/v1/schedules/{id}")).await, made);
    let other = id_of(&create(&server, &every_second(json!({"paused": true}))).await);
    let listed = server.get_ok("/v1/schedules?limit=1").await;
    assert_eq!(
        listed["data"][0]["id"],
        json!(other),
        "newest first: {listed}"
    );
    let cursor = listed["next_cursor"].as_str().expect("a second page");
    let second = server
        .get_ok(&format!("/v1/schedules?limit=1&cursor={cursor}"))
        .await;
    assert_eq!(second["data"][0]["id"], json!(id), "{second}");
    assert!(second["next_cursor"].is_null(), "{second}");

    let path = format!("/v1/schedules/{id}");
    let updated = server
        .post_json(
            &path,
            &json!({"cron": "30 6 * * 1-5", "timezone": "UTC", "misfire": "catch_up",
                    "overlap": "queue", "paused": true, "max_cost_usd": null}),
        )
        .await
        .expect_json(StatusCode::OK, "an update");
    assert_eq!(updated["cron"], "30 6 * * 1-5");
    assert_eq!(updated["misfire"], "catch_up");
    assert_eq!(updated["overlap"], "queue");
    assert_eq!(updated["paused"], true);
    assert!(updated["max_cost_usd"].is_null());
    assert!(updated["next_fire_at"]
        .as_str()
        .is_some_and(|t| t.contains("T06:30:00")));

    // Bad input: a 400 that names the field.
    let session = server.create_session().await;
    for (body, field) in [
        (every_second(json!({"cron": "* * *"})), "cron"),
        (every_second(json!({"cron": "61 * * * *"})), "cron"),
        (every_second(json!({"cron": "0 0 30 2 *"})), "cron"),
        (
            every_second(json!({"timezone": "Mars/Olympus"})),
            "timezone",
        ),
        (every_second(json!({"misfire": "sometimes"})), "misfire"),
        (every_second(json!({"overlap": 3})), "overlap"),
        (every_second(json!({"max_cost_usd": -1})), "max_cost_usd"),
        (every_second(json!({"max_cost_usd": "1"})), "max_cost_usd"),
        (every_second(json!({"paused": "yes"})), "paused"),
        (every_second(json!({"session": "old"})), "session"),
        (every_second(json!({"input": ""})), "input"),
        (every_second(json!({"input": 7})), "input"),
        (every_second(json!({"colour": "red"})), "colour"),
        (
            json!({"cron": YEARLY, "timezone": "UTC", "input": "x"}),
            "agent",
        ),
        (
            json!({"agent": "default", "timezone": "UTC", "input": "x"}),
            "cron",
        ),
        (
            json!({"agent": "default", "cron": YEARLY, "input": "x"}),
            "timezone",
        ),
        (
            json!({"agent": "default", "cron": YEARLY, "timezone": "UTC"}),
            "input",
        ),
    ] {
        let problem = server
            .post_json("/v1/schedules", &body)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &format!("{body}"));
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(field), "{body}: {problem}");
    }
    let problem = server
        .post_json(&path, &json!({"timezone": "Nowhere/Else"}))
        .await
        .expect_problem(StatusCode::BAD_REQUEST, "an update with a bad zone");
    assert!(problem["detail"].as_str().unwrap().contains("timezone"));
    // What does not exist: 404.
    server
        .post_json(
            "/v1/schedules",
            &every_second(json!({"agent": "0190a0a0-0000-7000-8000-000000000000"})),
        )
        .await
        .expect_problem(StatusCode::NOT_FOUND, "an unknown agent");
    server
        .post_json(
            "/v1/schedules",
            &every_second(json!({"session": "0190a0a0-0000-7000-8000-000000000000"})),
        )
        .await
        .expect_problem(StatusCode::NOT_FOUND, "an unknown session");
    let on_session = create(
        &server,
        &every_second(json!({"session": session, "paused": true})),
    )
    .await;
    assert_eq!(on_session["session"], json!(session));

    let deleted = server.send(server.request(Method::DELETE, &path)).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    server
        .get(&path)
        .await
        .expect_problem(StatusCode::NOT_FOUND, "a deleted schedule");
    server
        .get("/v1/schedules/not-an-id")
        .await
        .expect_problem(StatusCode::NOT_FOUND, "a malformed id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_start_runs_as_the_creator_and_pause_stops_them() {
    let server = TestServer::start(operated()).await;
    let op = server.api.clone();
    let member = create_key(&op, "acme", "member").await;
    let api = member.client(&op);
    let made = create(&api, &every_second(json!({"overlap": "allow"}))).await;
    let id = id_of(&made);
    assert_eq!(made["tenant"], "acme");
    assert_eq!(made["owner"], json!(member.id));
    let log = fires_until(&api, &id, Duration::from_secs(10), |log| {
        count(log, "outcome", "completed") >= 2
    })
    .await;
    let done = log
        .iter()
        .find(|f| f["outcome"] == "completed")
        .expect("a completed fire");
    assert_eq!(done["trigger"], "scheduled");
    let session = done["session"].as_str().expect("a session");
    let run = done["run"].as_str().expect("a run");
    // The fire's session is the member's, in its tenant, and shows the run.
    let shown = api.session(session).await;
    assert_eq!(shown["tenant"], "acme");
    assert_eq!(shown["owner"], json!(member.id));
    assert_eq!(shown["metadata"]["schedule_id"], json!(id));
    assert_eq!(shown["last_run"]["id"], json!(run), "{shown}");
    assert_eq!(shown["last_run"]["input"], "hello from a schedule");
    // Fire times are whole seconds, one second apart.
    let times: Vec<i64> = log
        .iter()
        .map(|f| at(f, "time").timestamp_millis())
        .collect();
    assert!(times.iter().all(|t| t % 1000 == 0), "{times:?}");
    assert!(times.windows(2).all(|w| w[1] - w[0] == 1000), "{log:#?}");

    // Paused: no more fires; a manual trigger fires all the same.
    let path = format!("/v1/schedules/{id}");
    api.post_json(&path, &json!({"paused": true}))
        .await
        .expect_json(StatusCode::OK, "paused");
    let before = fires(&api, &id).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = fires(&api, &id).await;
    assert_eq!(after.len(), before, "fires while paused: {after:#?}");
    let manual = api
        .post_empty(&format!("/v1/schedules/{id}/trigger"))
        .await
        .expect_json(StatusCode::CREATED, "a manual fire");
    assert_eq!(manual["trigger"], "manual");
    assert_eq!(manual["outcome"], "started");
    let run = manual["run"].as_str().expect("a run");
    let session = manual["session"].as_str().expect("a session");
    let ended = server.wait_run(session, run).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    // On one named session: each fire is a run of that session.
    let own = api.create_session().await;
    let on = create(&api, &every_second(json!({"session": own}))).await;
    let log = fires_until(&api, &id_of(&on), Duration::from_secs(10), |log| {
        count(log, "outcome", "completed") >= 2
    })
    .await;
    api.post_json(
        &format!("/v1/schedules/{}", id_of(&on)),
        &json!({"paused": true}),
    )
    .await
    .expect_json(StatusCode::OK, "paused");
    assert!(log
        .iter()
        .filter(|f| f["outcome"] == "completed")
        .all(|f| f["session"] == json!(own)));
    let runs = api.runs(&own).await;
    assert!(runs.len() >= 2, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlap_skip_skips_and_allow_starts_anyway() {
    // Each mock run takes several seconds: a fire every second overlaps the previous run.
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(400)).await;
    let skip = id_of(&create(&server, &every_second(json!({"overlap": "skip"}))).await);
    let allow = id_of(&create(&server, &every_second(json!({"overlap": "allow"}))).await);
    let skipped = fires_until(&server, &skip, Duration::from_secs(15), |log| {
        log.iter()
            .filter(|f| {
                f["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("still running"))
            })
            .count()
            >= 2
    })
    .await;
    let allowed = fires_until(&server, &allow, Duration::from_secs(15), |log| {
        log.iter().filter(|f| f["run"].is_string()).count() >= 3
    })
    .await;
    for id in [&skip, &allow] {
        server
            .post_json(&format!("/v1/schedules/{id}"), &json!({"paused": true}))
            .await
            .expect_json(StatusCode::OK, "paused");
    }
    eprintln!("overlap skip:\n{}", timeline(&skipped));
    eprintln!("overlap allow:\n{}", timeline(&allowed));
    assert!(
        skipped.iter().any(|f| f["outcome"] == "skipped"
            && f["error"]
                .as_str()
                .is_some_and(|e| e.contains("still running"))),
        "{skipped:#?}"
    );
    // With `allow`, runs of several fires were running at once: separate sessions.
    assert_eq!(count(&allowed, "outcome", "skipped"), 0, "{allowed:#?}");
    let sessions: std::collections::HashSet<&str> = allowed
        .iter()
        .filter_map(|f| f["session"].as_str())
        .collect();
    assert!(sessions.len() >= 3, "{allowed:#?}");
}

/// A schedule per misfire policy, every second; the server stops for `GAP` (several fire
/// times) and starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_misfire_policy_holds_across_a_restart() {
    const GAP: Duration = Duration::from_millis(4500);
    let mut server = TestServer::start(ServerOptions::new().process()).await;
    let mut ids = Vec::new();
    for misfire in ["skip", "run_once", "catch_up"] {
        let body = every_second(json!({"misfire": misfire, "overlap": "allow"}));
        ids.push((misfire, id_of(&create(&server, &body).await)));
    }
    for (_, id) in &ids {
        fires_until(&server, id, Duration::from_secs(10), |log| !log.is_empty()).await;
    }
    server.stop().await;
    let stopped = chrono::Utc::now();
    tokio::time::sleep(GAP).await;
    let restarted = chrono::Utc::now();
    server.spawn().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for (_, id) in &ids {
        server
            .post_json(&format!("/v1/schedules/{id}"), &json!({"paused": true}))
            .await
            .expect_json(StatusCode::OK, "paused");
    }
    // Fire times the stop spans (a time up to a second before the first look after the
    // restart is on time).
    let gap_end = restarted - chrono::Duration::seconds(1);
    let in_gap = |f: &Value| at(f, "time") > stopped && at(f, "time") < gap_end;
    for (misfire, id) in &ids {
        let log = fires(&server, id).await;
        eprintln!(
            "misfire {misfire}: stopped {stopped}, restarted {restarted}\n{}",
            timeline(&log)
        );
        let late: Vec<&Value> = log
            .iter()
            .filter(|f| f["trigger"] == "catch_up" || f["outcome"] == "skipped")
            .collect();
        match *misfire {
            "skip" => {
                assert_eq!(late.len(), 1, "one skipped fire: {log:#?}");
                assert_eq!(late[0]["outcome"], "skipped");
                assert!(late[0]["missed"].as_i64().unwrap() >= 3, "{log:#?}");
                assert!(!log.iter().any(|f| in_gap(f) && f["run"].is_string()));
            }
            "run_once" => {
                assert_eq!(late.len(), 1, "one catch-up fire: {log:#?}");
                assert_eq!(late[0]["trigger"], "catch_up");
                assert!(late[0]["run"].is_string(), "{log:#?}");
                assert!(late[0]["missed"].as_i64().unwrap() >= 2, "{log:#?}");
            }
            _ => {
                assert!(late.len() >= 3, "each missed time: {log:#?}");
                assert!(late
                    .iter()
                    .all(|f| f["trigger"] == "catch_up" && f["run"].is_string()));
                assert!(late.iter().all(|f| at(f, "time") > stopped), "{log:#?}");
            }
        }
        // After the restart, fires go on on time.
        assert!(
            log.iter()
                .any(|f| f["trigger"] == "scheduled" && at(f, "created_at") > restarted),
            "{log:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_do_what_to_a_schedule() {
    let server = TestServer::start(operated()).await;
    let op = server.api.clone();
    let admin = create_key(&op, "a", "admin").await.client(&op);
    let m1 = create_key(&op, "a", "member").await.client(&op);
    let m2 = create_key(&op, "a", "member").await.client(&op);
    let viewer = create_key(&op, "a", "viewer").await.client(&op);
    let stranger = create_key(&op, "b", "admin").await.client(&op);
    let body = json!({"agent": "default", "cron": YEARLY, "timezone": "UTC", "input": "x"});
    let id = id_of(&create(&m1, &body).await);
    let path = format!("/v1/schedules/{id}");
    let listed = |api: Api| async move {
        api.get_ok("/v1/schedules").await["data"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(listed(m1.clone()).await, 1);
    assert_eq!(listed(m2.clone()).await, 0, "members see their own");
    assert_eq!(listed(viewer.clone()).await, 1);
    assert_eq!(listed(admin.clone()).await, 1);
    assert_eq!(listed(stranger.clone()).await, 0);
    assert_eq!(listed(op.clone()).await, 1);
    viewer.get_ok(&path).await;
    viewer
        .post_json(&path, &json!({"paused": true}))
        .await
        .expect_problem(StatusCode::FORBIDDEN, "a viewer's update");
    viewer
        .post_json("/v1/schedules", &body)
        .await
        .expect_problem(StatusCode::FORBIDDEN, "a viewer's schedule");
    for (api, what) in [(&m2, "another member"), (&stranger, "another tenant")] {
        api.get(&path)
            .await
            .expect_problem(StatusCode::NOT_FOUND, what);
        api.post_empty(&format!("{path}/trigger"))
            .await
            .expect_problem(StatusCode::NOT_FOUND, what);
    }
    // A session of another tenant is not found.
    let theirs = stranger.create_session().await;
    m1.post_json(
        "/v1/schedules",
        &json!({"agent": "default", "cron": YEARLY,
                                          "timezone": "UTC", "input": "x", "session": theirs}),
    )
    .await
    .expect_problem(StatusCode::NOT_FOUND, "another tenant's session");
    let own = m1.create_session().await;
    let token = session_token(&m1, &own, "interact", None).await;
    let holder = op.with_bearer(&token);
    holder
        .get("/v1/schedules")
        .await
        .expect_problem(StatusCode::FORBIDDEN, "a session token's list");
    holder
        .get(&path)
        .await
        .expect_problem(StatusCode::FORBIDDEN, "a session token's read");
    admin
        .post_json(&path, &json!({"paused": true}))
        .await
        .expect_json(StatusCode::OK, "the admin's update");
    let deleted = m1.send(m1.request(Method::DELETE, &path)).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
}

/// Two replicas on one PostgreSQL database: every fire time of a schedule is fired once.
#[test]
#[cfg_attr(
    not(pg_tests),
    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
)]
fn two_replicas_fire_each_time_once() {
    let db = TestDatabase::new("tah_sched");
    alone::run("two_replicas_fire_each_time_once", async move {
        let replica = |name| {
            ServerOptions::new()
                .process()
                .named(name)
                .database_url(&db.url)
        };
        let a = TestServer::start(replica("A")).await;
        let b = TestServer::start(replica("B")).await;
        let id = id_of(&create(&a, &every_second(json!({"overlap": "allow"}))).await);
        tokio::time::sleep(Duration::from_secs(6)).await;
        b.post_json(&format!("/v1/schedules/{id}"), &json!({"paused": true}))
            .await
            .expect_json(StatusCode::OK, "paused on B");
        let log = fires(&b, &id).await;
        eprintln!("two replicas:\n{}", timeline(&log));
        let mut times: Vec<&str> = log.iter().map(|f| f["time"].as_str().unwrap()).collect();
        let all = times.len();
        times.dedup();
        assert_eq!(times.len(), all, "a time fired twice: {log:#?}");
        assert!(all >= 4, "{log:#?}");
        assert!(log.iter().all(|f| f["trigger"] == "scheduled"), "{log:#?}");
        let runs = log.iter().filter(|f| f["run"].is_string()).count();
        assert_eq!(runs, all, "{log:#?}");
    });
}

/// A paused yearly schedule with `overlap: queue` (so only manual fires happen).
fn queue_schedule() -> Value {
    json!({"agent": "default", "cron": YEARLY, "timezone": "UTC",
           "input": "hello from a schedule", "overlap": "queue", "paused": true})
}

/// A manual fire of schedule `id`; its line.
async fn trigger(api: &Api, id: &str) -> Value {
    api.post_empty(&format!("/v1/schedules/{id}/trigger"))
        .await
        .expect_json(StatusCode::CREATED, "a manual fire")
}

/// The sessions the fires of schedule `id` made.
async fn sessions_of(api: &Api, id: &str) -> Vec<Value> {
    api.sessions()
        .await
        .into_iter()
        .filter(|s| s["metadata"]["schedule_id"] == json!(id))
        .collect()
}

fn ended(fire: &Value) -> bool {
    fire["outcome"] == "completed" || fire["outcome"] == "failed"
}

/// A fire queued behind a long run, the server stopped before that run ends and started
/// again (without auto-resume: the run ahead stays interrupted): the queued line is taken up
/// from the log, its run starts once, at once after the restart, and it ends `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_fire_survives_a_restart_and_runs_once() {
    let (log, first) = queued_across_a_restart(&[]).await;
    assert_eq!(log[0]["outcome"], "failed", "{log:#?}");
    assert_eq!(log[0]["error"], "interrupted", "{log:#?}");
    let ahead = first.as_str().expect("a session");
    assert_eq!(log[0]["session"], ahead);
}

/// The same with `--auto-resume`: the interrupted run ahead is resumed after the restart, its
/// fire's line ends as that resume did, and the queued fire runs once, after that resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_fire_survives_a_restart_with_auto_resume() {
    let (log, _) = queued_across_a_restart(&["--auto-resume=true"]).await;
    assert_eq!(
        log[0]["outcome"], "completed",
        "the resume completed: {log:#?}"
    );
}

/// Two manual fires of a `queue` schedule on a slow mock (the second queued behind the
/// first's run), a stop while that run runs, a restart; checks the queued fire ran once and
/// completed after the restart, prints the timeline, and answers the log and the first
/// fire's session.
async fn queued_across_a_restart(args: &[&str]) -> (Vec<Value>, Value) {
    let options = ServerOptions::new().process().mock_delay_ms(300).args(args);
    let mut server = TestServer::start(options).await;
    let id = id_of(&create(&server, &queue_schedule()).await);
    let first = trigger(&server, &id).await;
    assert_eq!(first["outcome"], "started", "{first}");
    let queued = trigger(&server, &id).await;
    let queued_at = chrono::Utc::now();
    assert_eq!(queued["outcome"], "queued", "{queued}");
    assert!(queued["run"].is_null(), "{queued}");
    let ahead = first["session"].as_str().expect("a session");
    let run = server
        .get_ok(&format!(
            "/v1/sessions/{ahead}/runs/{}",
            first["run"].as_str().expect("a run")
        ))
        .await;
    assert_eq!(run["status"], "running", "the run ahead still runs: {run}");

    server.stop().await;
    let stopped = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restarted = chrono::Utc::now();
    server.spawn().await;
    let log = fires_until(&server, &id, Duration::from_secs(60), |log| {
        log.len() == 2 && log.iter().all(ended)
    })
    .await;
    eprintln!("{}", timeline(&log));
    let line = &log[1];
    assert_eq!(line["id"], queued["id"], "{log:#?}");
    assert_eq!(line["outcome"], "completed", "{log:#?}");
    let session = line["session"].as_str().expect("the queued fire's session");
    assert_ne!(line["session"], first["session"], "{log:#?}");
    // Exactly one run, the line's, and exactly two sessions for two fires.
    let runs = server.runs(session).await;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0]["id"], line["run"], "{runs:#?}");
    assert_eq!(runs[0]["status"], "completed", "{runs:#?}");
    assert_eq!(sessions_of(&server, &id).await.len(), 2);
    let started = at(&runs[0], "created_at");
    let completed = at(&runs[0], "finished_at");
    assert!(
        started > restarted,
        "started {started}, restarted {restarted}"
    );
    // It started once nothing ran ahead of it (a resume of the interrupted run included).
    let ahead_runs = server.runs(ahead).await;
    for run in &ahead_runs {
        assert!(
            run["finished_at"].is_string() && at(run, "finished_at") <= started,
            "a run ahead still ran when the queued fire started at {started}: {ahead_runs:#?}"
        );
    }
    eprintln!(
        "queued fire {args:?}: queued {queued_at}, stopped {stopped}, restarted {restarted}, \
         started {started}, completed {completed}; the fire ahead ended {} ({}), its \
         session's runs: {:?}",
        log[0]["outcome"],
        log[0]["error"].as_str().unwrap_or("-"),
        ahead_runs
            .iter()
            .map(|r| format!(
                "{} {} {}-{}",
                r["kind"], r["status"], r["created_at"], r["finished_at"]
            ))
            .collect::<Vec<_>>()
    );
    (log, first["session"].clone())
}

/// Two replicas on one PostgreSQL database, both looking at the queued fires: each queued
/// fire starts once, in order, after the run ahead of it.
#[test]
#[cfg_attr(
    not(pg_tests),
    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
)]
fn two_replicas_start_each_queued_fire_once() {
    let db = TestDatabase::new("tah_sched_q");
    alone::run("two_replicas_start_each_queued_fire_once", async move {
        let replica = |name| {
            ServerOptions::new()
                .process()
                .named(name)
                .database_url(&db.url)
                .mock_delay_ms(100)
        };
        let a = TestServer::start(replica("A")).await;
        let b = TestServer::start(replica("B")).await;
        let id = id_of(&create(&a, &queue_schedule()).await);
        assert_eq!(trigger(&a, &id).await["outcome"], "started");
        for api in [&a, &b, &a] {
            assert_eq!(trigger(api, &id).await["outcome"], "queued");
        }
        let log = fires_until(&b, &id, Duration::from_secs(90), |log| {
            log.len() == 4 && log.iter().all(ended)
        })
        .await;
        eprintln!("two replicas, queued fires:\n{}", timeline(&log));
        assert!(log.iter().all(|f| f["outcome"] == "completed"), "{log:#?}");
        assert_eq!(sessions_of(&a, &id).await.len(), 4, "one session per fire");
        let mut previous_end = None;
        for fire in &log {
            let runs = a.runs(fire["session"].as_str().expect("a session")).await;
            assert_eq!(runs.len(), 1, "one run per fire: {runs:#?}");
            assert_eq!(runs[0]["id"], fire["run"]);
            let start = at(&runs[0], "created_at");
            if let Some(end) = previous_end {
                assert!(
                    start >= end,
                    "a fire started before the one ahead ended: {log:#?}"
                );
            }
            previous_end = Some(at(&runs[0], "finished_at"));
        }
    });
}

//! How artifacts are stored, through HTTP and the tables: bytes once per sha256 however many
//! versions and sessions name them, and gone with the last session that does; a fork keeps the
//! artifacts of the turns it copies and shares their bytes; what storing the versions of a
//! 100 KB file costs. The model is the mock, driven as in `artifacts`.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;
use crate::tools::artifacts::{
    artifacts, blobs, content, edit_note, file_session, note_content, sha256_hex, turn, versions,
    write_note,
};

#[tokio::test]
async fn the_same_bytes_are_stored_once_and_go_with_the_last_session_naming_them() {
    let server = TestServer::start(ServerOptions::new()).await;
    let a = file_session(&server, json!({})).await;
    let b = file_session(&server, json!({})).await;
    let hello = write_note("same.md", "hello");
    turn(&server, &a, &hello).await;
    turn(&server, &b, &hello).await;
    // Back and forth: the third version has the first one's bytes.
    turn(&server, &a, &edit_note("same.md", "hello", "bye")).await;
    turn(&server, &a, &edit_note("same.md", "bye", "hello")).await;

    let in_a = artifacts(&server, &a, "?all=true").await;
    let in_b = artifacts(&server, &b, "?all=true").await;
    assert_eq!(versions(&in_a).len(), 3);
    assert_eq!(in_a[0]["sha256"], in_a[2]["sha256"]);
    assert_eq!(in_a[0]["sha256"], in_b[0]["sha256"]);
    assert_ne!(in_a[0]["sha256"], in_a[1]["sha256"]);
    assert_eq!(
        server.query_i64("SELECT COUNT(*) FROM artifacts").await,
        4,
        "a record per version"
    );
    assert_eq!(blobs(&server).await, 2, "the bytes once per sha256");

    let path = format!("/v1/sessions/{a}");
    let reply = server.send(server.request(Method::DELETE, &path)).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    // What only `a` named is gone; what `b` names too stays.
    assert_eq!(blobs(&server).await, 1);
    let reply = content(&server, &b, &in_b[0]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), note_content("same.md", "hello"));
    let path = format!("/v1/sessions/{b}");
    let reply = server.send(server.request(Method::DELETE, &path)).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert_eq!(blobs(&server).await, 0);
    assert_eq!(server.query_i64("SELECT COUNT(*) FROM artifacts").await, 0);
}

#[tokio::test]
async fn a_fork_keeps_the_artifacts_of_the_turns_it_copies() {
    let server = TestServer::start(ServerOptions::new()).await;
    let parent = file_session(&server, json!({})).await;
    turn(&server, &parent, &write_note("a.md", "one")).await;
    turn(&server, &parent, &edit_note("a.md", "one", "two")).await;
    turn(&server, &parent, &write_note("b.md", "three")).await;
    let of_parent = artifacts(&server, &parent, "?all=true").await;
    assert_eq!(of_parent.len(), 3);
    let stored = blobs(&server).await;

    let fork = |body: Value| {
        let server = &server;
        let parent = parent.clone();
        async move {
            let reply = server
                .post_json(&format!("/v1/sessions/{parent}/fork"), &body)
                .await;
            id_of(&reply.expect_json(StatusCode::CREATED, "fork"))
        }
    };
    for (body, kept) in [
        (json!({"turns": 0}), 0),
        (json!({"turns": 1}), 1),
        (json!({"turns": 2}), 2),
        (json!({"turns": 3}), 3),
        (json!({}), 3),
    ] {
        let child = fork(body.clone()).await;
        let all = artifacts(&server, &child, "?all=true").await;
        // The very records of the parent (ids, steps and runs included).
        assert_eq!(all, of_parent[..kept], "fork {body}");
        let newest = artifacts(&server, &child, "").await;
        let want: Vec<(String, i64)> = match kept {
            0 => vec![],
            1 => vec![("a.md".into(), 1)],
            2 => vec![("a.md".into(), 2)],
            _ => vec![("a.md".into(), 2), ("b.md".into(), 1)],
        };
        assert_eq!(versions(&newest), want, "fork {body}");
        for artifact in &all {
            let reply = content(&server, &child, artifact).await;
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(
                sha256_hex(&reply.bytes),
                artifact["sha256"].as_str().unwrap()
            );
        }
    }
    assert_eq!(blobs(&server).await, stored, "forks share the bytes");

    // A fork of one turn goes on from there: its next version of a.md is its own 2.
    let child = fork(json!({"turns": 1})).await;
    turn(&server, &child, &edit_note("b.md", "three", "four")).await;
    turn(&server, &child, &edit_note("a.md", "two", "five")).await;
    let of_child = artifacts(&server, &child, "?all=true").await;
    assert_eq!(
        versions(&of_child),
        [
            ("a.md".to_string(), 1),
            ("b.md".to_string(), 1),
            ("a.md".to_string(), 2)
        ]
    );
    assert_eq!(of_child[0], of_parent[0]);
    assert_ne!(of_child[2]["id"], of_parent[1]["id"]);
    assert_eq!(
        artifacts(&server, &parent, "?all=true").await,
        of_parent,
        "the parent is untouched"
    );
    // Deleting the parent leaves the fork's inherited artifacts whole.
    let reply = server
        .send(server.request(Method::DELETE, &format!("/v1/sessions/{parent}")))
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    let reply = content(&server, &child, &of_child[0]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), note_content("a.md", "one"));
}

/// Bytes the rows of the history, the event log and the steps hold.
async fn log_bytes(server: &TestServer) -> i64 {
    let mut total = 0;
    for table in ["messages", "events", "steps"] {
        total += server.row_bytes(table).await;
    }
    total
}

/// Text of `len` pseudo-random lower-case letters and digits (which a database's compression
/// barely shrinks), the same for every run.
fn incompressible(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[(state % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// What storing the versions of a 100 KB file costs (the figures are printed): its bytes once
/// per distinct version, a small record per version, and nothing per step: an edit's steps
/// store the edit, not the file, so ten edit turns' steps hold less than one copy of it.
#[tokio::test]
async fn bytes_stored_per_version_of_a_100_kb_file_edited_10_times() {
    const EDITS: usize = 10;
    let server = TestServer::start(ServerOptions::new()).await;
    let id = file_session(&server, json!({})).await;
    // Upper-case markers never occur in the lower-case filler.
    let text = format!("V0X {}", incompressible(100 * 1024));
    let log_before = log_bytes(&server).await;
    turn(&server, &id, &write_note("big.txt", &text)).await;
    // The call's arguments hold the file: the history, the log and the tool step keep them,
    // as they keep any call's arguments (the artifact's bytes are the blob, counted below).
    let write_turn = log_bytes(&server).await - log_before;
    let steps_before = server.row_bytes("steps").await;
    for edit in 1..=EDITS {
        let (old, new) = (format!("V{}X", edit - 1), format!("V{edit}X"));
        turn(&server, &id, &edit_note("big.txt", &old, &new)).await;
    }
    let steps_added = server.row_bytes("steps").await - steps_before;

    let all = artifacts(&server, &id, "?all=true").await;
    let versions = EDITS as i64 + 1;
    assert_eq!(all.len() as i64, versions);
    let sizes: i64 = all.iter().map(|a| a["size"].as_i64().unwrap()).sum();
    assert!(all.iter().all(|a| a["size"].as_i64().unwrap() > 100 * 1024));
    assert_eq!(
        blobs(&server).await,
        versions,
        "one copy per distinct version"
    );
    let content_bytes = server
        .query_i64("SELECT CAST(SUM(LENGTH(content)) AS BIGINT) FROM blobs")
        .await;
    assert_eq!(content_bytes, sizes, "each version's bytes, once");
    let blob_rows = server.row_bytes("blobs").await;
    let blob_table = server.table_bytes("blobs").await;
    let record_rows = server.row_bytes("artifacts").await;
    let record_table = server.table_bytes("artifacts").await;

    // The edits' tool steps hold the edit (a few hundred bytes), not the file.
    let steps = server.steps(&id).await;
    let edits: Vec<&Value> = steps
        .iter()
        .filter(|s| s["type"] == "tool" && s["tool"] == "edit_file")
        .collect();
    assert_eq!(edits.len(), EDITS);
    for step in &edits {
        let stored = step.to_string().len();
        assert!(stored < 2_000, "an edit step stores {stored} bytes: {step}");
    }
    let file_size = all[0]["size"].as_i64().unwrap();
    assert!(
        steps_added < file_size,
        "the steps of {EDITS} edit turns hold {steps_added} bytes, more than one copy of the \
         {file_size} byte file"
    );
    let per = |bytes: i64| bytes as f64 / versions as f64;
    eprintln!(
        "artifact storage ({}), a {} byte file and {EDITS} edits, {versions} versions: \
         content {content_bytes} B in {versions} blobs ({:.0} B per distinct version; blob rows \
         {blob_rows} B, {:.0} B per version; blobs table with its index and TOAST {blob_table} B, \
         {:.0} B per version); records {record_rows} B ({:.0} B per version; artifacts table \
         with its indexes {record_table} B, {:.0} B per version); steps added by the \
         {EDITS} edit turns {steps_added} B ({:.0} B per turn); messages, events and steps of \
         the turn that wrote the file (its call's arguments) {write_turn} B",
        Backend::current().name(),
        all[0]["size"],
        per(content_bytes),
        per(blob_rows),
        per(blob_table),
        per(record_rows),
        per(record_table),
        steps_added as f64 / EDITS as f64,
    );
}

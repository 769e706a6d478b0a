//! What a long session stores: an LLM step keeps its projection descriptor, not its request, so
//! what a step stores does not grow with the history.

use serde_json::Value;

use crate::support::*;

/// What an LLM step stores does not grow with the history (the figures are printed). Its
/// `request` is the projection descriptor (how to rebuild the request), not the request, so a
/// 30-turn session without `--context-chars` stores about as much per step at the end as at
/// the start.
#[tokio::test]
async fn the_storage_of_an_llm_step_does_not_grow_with_the_history() {
    const TURNS: usize = 30;
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    for turn in 1..=TURNS {
        let result = server
            .run_wait(&id, &format!("turn {turn}: what is in this workspace?"))
            .await;
        assert_eq!(result["status"], "completed", "turn {turn}: {result}");
    }

    let steps = server.steps(&id).await;
    let llm: Vec<&Value> = steps.iter().filter(|s| s["type"] == "llm").collect();
    assert_eq!(llm.len(), 3 * TURNS, "3 LLM steps per turn");
    let sizes: Vec<usize> = llm
        .iter()
        .map(|step| {
            let request = &step["request"];
            assert!(
                request.is_object() && request.get("messages").is_none(),
                "an LLM step stores the projection descriptor, not the request: {step}"
            );
            serde_json::to_string(request)
                .expect("the request as JSON")
                .len()
        })
        .collect();
    let average = |s: &[usize]| s.iter().sum::<usize>() as f64 / s.len() as f64;
    let first = average(&sizes[..5]);
    let last = average(&sizes[sizes.len() - 5..]);
    let messages = server.messages(&id).await;
    let history_chars: usize = messages
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").chars().count())
        .sum();
    // For comparison: the size of the requests rebuilt from those descriptors.
    let mut rebuilt = Vec::new();
    for step in [llm[0], llm[llm.len() - 1]] {
        let view = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(step)))
            .await;
        rebuilt.push(
            serde_json::to_string(&view["request"])
                .expect("the request as JSON")
                .len(),
        );
    }
    eprintln!(
        "bytes per LLM step ({}, {TURNS} turns, {} LLM steps, {} messages, {history_chars} \
         history chars): stored request first 5 average {first:.1} B, last 5 average {last:.1} \
         B; the rebuilt request of the first LLM step {} B, of the last {} B; all {sizes:?}",
        Backend::current().name(),
        llm.len(),
        messages.len(),
        rebuilt[0],
        rebuilt[1],
    );
    assert!(
        last <= first + 64.0,
        "the stored request of an LLM step grows with the history: first 5 average {first:.1} \
         bytes, last 5 average {last:.1} bytes"
    );
}

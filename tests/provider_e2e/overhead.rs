//! The server's overhead per model request: turns through the server against the same reply
//! fetched from the fake directly (printed, not asserted).

use std::time::Instant;

use serde_json::json;

use crate::provider_e2e::*;
use crate::support::fakes::{self, Flavor, Reply};
use crate::support::percentile;

async fn overhead(flavor: Flavor) {
    const TURNS: usize = 20;
    let provider = provider_name(flavor);
    let fake = fakes::start(
        flavor,
        vec![Reply::sse(text_reply(flavor, &["Short ", "reply."]))],
    )
    .await;

    // The fake alone: the same reply fetched directly, body read to the end.
    let direct = reqwest::Client::new();
    let url = match flavor {
        Flavor::OpenAi => format!("{}/chat/completions", fake.base_url),
        Flavor::Anthropic => format!("{}/v1/messages", fake.base_url),
    };
    let mut alone = Vec::new();
    for _ in 0..TURNS + 1 {
        let started = Instant::now();
        let response = direct
            .post(&url)
            .json(&json!({"model": MODEL, "stream": true, "messages": []}))
            .send()
            .await
            .expect("call the fake");
        assert!(response.status().is_success());
        let body = response.bytes().await.expect("the fake's body");
        assert!(!body.is_empty());
        alone.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    alone.remove(0); // connection set-up
    alone.sort_by(f64::total_cmp);
    let fake_median = percentile(&alone, 50.0);
    let direct_requests = fake.request_count();

    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let mut overheads = Vec::new();
    for turn in 0..TURNS {
        let started = Instant::now();
        let result = server.run_wait(&id, &format!("turn {turn}")).await;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(
            result["status"], "completed",
            "{provider} turn {turn}: {result}"
        );
        assert_eq!(result["text"], "Short reply.");
        overheads.push(took - fake_median);
    }
    assert_eq!(fake.request_count() - direct_requests, TURNS);
    overheads.sort_by(f64::total_cmp);
    eprintln!(
        "provider overhead per request: {provider} median {:.2} ms p90 {:.2} ms \
         (fake alone: median {:.2} ms; {TURNS} turns of POST /runs?wait=true, one model call each)",
        percentile(&overheads, 50.0),
        percentile(&overheads, 90.0),
        fake_median,
    );
}

both_providers!(overhead: openai_overhead_per_request, anthropic_overhead_per_request);

//! A 401 fails the run cleanly: not retried, the provider and the cause named, no half
//! assistant message, and the key (which the provider echoes) shown nowhere.

use crate::provider_e2e::*;
use crate::support::fakes::{self, Flavor, Reply};
use crate::support::roles;

async fn unauthorized_fails_cleanly(flavor: Flavor) {
    let provider = provider_name(flavor);
    let key = key_of(flavor);
    // A provider that echoes the key it was given (as some do): it must still not leak.
    let body = match flavor {
        Flavor::OpenAi => format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {key}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
        ),
        Flavor::Anthropic => format!(
            r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {key}"}}}}"#
        ),
    };
    let fake = fakes::start(flavor, vec![Reply::status(401, body)]).await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
    assert_eq!(result["status"], "failed", "{provider}: {result}");
    assert_eq!(fake.request_count(), 1, "{provider}: a 401 is not retried");
    let error = result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {result}"));
    assert!(
        !error.contains(key),
        "{provider}: the key leaks into the run error: {error}"
    );

    let events = server.events(&id).await;
    let failed = of_type(&events, "agent.failed");
    assert_eq!(failed.len(), 1, "{provider}: agent.failed");
    let error = failed[0]["data"]["error"]
        .as_str()
        .expect("agent.failed error");
    assert!(
        error.contains(provider),
        "{provider}: the error should name the provider: {error:?}"
    );
    assert!(
        error.to_lowercase().contains("authentication failed"),
        "{provider}: the error should say authentication failed: {error:?}"
    );
    assert!(!error.contains(key), "{provider}: the key leaks: {error}");
    assert!(of_type(&events, "agent.finished").is_empty());

    let session = server.session(&id).await;
    assert_eq!(session["state"], "failed", "{provider}: {session}");
    let messages = server.messages(&id).await;
    let roles = roles(&messages);
    assert_eq!(
        roles,
        ["system", "user"],
        "{provider}: no half assistant message"
    );
    assert_key_never_shown(&server, flavor, &id).await;
}

both_providers!(unauthorized_fails_cleanly: openai_401_fails_cleanly, anthropic_401_fails_cleanly);

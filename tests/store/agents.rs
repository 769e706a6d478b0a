//! Agents as both stores keep them: versions are kept whole and read back as written, an
//! update from a stale version or of an archived agent changes nothing, lists page newest
//! first and hide archived agents unless asked, and names find the agents that have them.

use std::sync::Arc;

use tah::model::{self, AgentId, AgentRecord, AgentSpec, ClientTool, Rule};
use tah::store::agents::{AgentQuery, Bumped};
use tah::store::Store;

conformance!(
    agent_versions_round_trip_and_updates_are_conditional,
    agents_page_newest_first_and_hide_the_archived,
);

fn agent(name: &str) -> AgentRecord {
    let at = model::now();
    let mut spec = AgentSpec::named(name, "default/mock");
    spec.system_prompt = Some("Réponds en français. 答えてください。".into());
    spec.tools = Some(vec!["read_file".into(), "task".into()]);
    spec.tool_policy =
        vec![
            serde_json::from_value::<Rule>(serde_json::json!({"tool": "shell", "action": "ask"}))
                .unwrap(),
        ];
    spec.client_tools = vec![ClientTool {
        name: "pick".into(),
        description: "Pick one".into(),
        input_schema: serde_json::json!({"type": "object"}),
        timeout_s: Some(5),
    }];
    spec.max_cost_usd = Some(1.25);
    AgentRecord {
        id: AgentId::Stored(model::new_id()),
        version: 1,
        spec,
        created_at: at,
        updated_at: at,
        archived_at: None,
        tenant: model::DEFAULT_TENANT.to_string(),
    }
}

async fn agent_versions_round_trip_and_updates_are_conditional(store: Arc<dyn Store>) {
    let agents = store.agents().expect("the store keeps agents");
    let first = agent("coder");
    let id = first.id.stored().unwrap();
    agents.insert_agent(&first).await.expect("inserts");
    assert_eq!(agents.agent(id, None).await.unwrap(), Some(first.clone()));
    let mut second = first.clone();
    second.version = 2;
    second.spec.model = "other/model-x".into();
    second.spec.name = "coder-2".into();
    second.updated_at = model::now();
    assert_eq!(
        agents.add_agent_version(&second, 1).await.unwrap(),
        Bumped::Done
    );
    // The same update again was made from version 1, which is no longer the latest.
    let mut stale = second.clone();
    stale.spec.model = "lost".into();
    assert_eq!(
        agents.add_agent_version(&stale, 1).await.unwrap(),
        Bumped::Stale
    );
    assert_eq!(agents.agent(id, None).await.unwrap(), Some(second.clone()));
    assert_eq!(
        agents.agent(id, Some(1)).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(agents.agent(id, Some(3)).await.unwrap(), None);
    let versions = agents.agent_versions(id, None, 10).await.unwrap();
    assert_eq!(
        versions.iter().map(|a| a.version).collect::<Vec<_>>(),
        [2, 1]
    );
    let older = agents.agent_versions(id, Some(2), 10).await.unwrap();
    assert_eq!(older, vec![first.clone()]);
    assert_eq!(
        agents.agents_named("default", "coder-2").await.unwrap(),
        vec![id]
    );
    assert!(agents
        .agents_named("default", "coder")
        .await
        .unwrap()
        .is_empty());

    let at = model::now();
    assert!(agents.archive_agent(id, at).await.unwrap());
    assert!(!agents.archive_agent(id, model::now()).await.unwrap());
    let mut third = second.clone();
    third.version = 3;
    assert_eq!(
        agents.add_agent_version(&third, 2).await.unwrap(),
        Bumped::Archived
    );
    let archived = agents.agent(id, None).await.unwrap().unwrap();
    assert_eq!(archived.version, 2);
    assert_eq!(archived.archived_at, Some(at));
    assert!(agents
        .agents_named("default", "coder-2")
        .await
        .unwrap()
        .is_empty());
}

async fn agents_page_newest_first_and_hide_the_archived(store: Arc<dyn Store>) {
    let agents = store.agents().expect("the store keeps agents");
    let mut made = Vec::new();
    for n in 0..5 {
        let a = agent(&format!("a{n}"));
        agents.insert_agent(&a).await.unwrap();
        made.push(a.id.stored().unwrap());
    }
    agents.archive_agent(made[1], model::now()).await.unwrap();
    let page = |before, include_archived| AgentQuery {
        limit: 3,
        before,
        include_archived,
        tenant: None,
    };
    let ids = |records: Vec<AgentRecord>| {
        records
            .into_iter()
            .map(|a| a.id.stored().unwrap())
            .collect::<Vec<_>>()
    };
    let first = ids(agents.agents(&page(None, false)).await.unwrap());
    assert_eq!(first, [made[4], made[3], made[2]]);
    let rest = ids(agents.agents(&page(Some(made[2]), false)).await.unwrap());
    assert_eq!(rest, [made[0]]);
    let with_archived = ids(agents.agents(&page(Some(made[2]), true)).await.unwrap());
    assert_eq!(with_archived, [made[1], made[0]]);
}

//! Vault secrets as both stores keep them: a row is written, replaced and read back as sealed,
//! listed by name within its tenant and vault (never another tenant's), and deleted once.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tah::store::vaults::{SecretListing, SecretRow};
use tah::store::Store;

conformance!(secrets_are_kept_per_tenant_and_vault);

fn row(tenant: &str, vault: &str, name: &str, bytes: &[u8], micros: i64) -> SecretRow {
    SecretRow {
        tenant: tenant.into(),
        vault: vault.into(),
        name: name.into(),
        nonce: vec![7; 24],
        ciphertext: bytes.to_vec(),
        updated_at: DateTime::<Utc>::from_timestamp_micros(micros).unwrap(),
    }
}

async fn secrets_are_kept_per_tenant_and_vault(store: Arc<dyn Store>) {
    let vaults = store.vaults().expect("the store keeps vaults");
    // Every byte value, a NUL among them, comes back as written.
    let all_bytes: Vec<u8> = (0..=255).collect();
    let token = row("default", "prod", "token", &all_bytes, 1_000_001);
    vaults.put_secret(&token).await.expect("put");
    vaults
        .put_secret(&row("default", "prod", "alpha", b"a", 2_000_000))
        .await
        .expect("put");
    vaults
        .put_secret(&row("acme", "prod", "token", b"theirs", 3_000_000))
        .await
        .expect("put");
    vaults
        .put_secret(&row("default", "staging", "token", b"s", 4_000_000))
        .await
        .expect("put");
    assert_eq!(
        vaults.secret("default", "prod", "token").await.unwrap(),
        Some(token.clone())
    );
    assert_eq!(
        vaults.secret("default", "prod", "nope").await.unwrap(),
        None
    );
    let names = |list: Vec<SecretListing>| list.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(
        names(vaults.secrets("default", "prod").await.unwrap()),
        ["alpha", "token"]
    );
    assert_eq!(
        names(vaults.secrets("acme", "prod").await.unwrap()),
        ["token"]
    );
    assert!(vaults.secrets("other", "prod").await.unwrap().is_empty());

    // Writing again replaces the row.
    let replaced = row("default", "prod", "token", b"new", 5_000_000);
    vaults.put_secret(&replaced).await.expect("replace");
    assert_eq!(
        vaults.secret("default", "prod", "token").await.unwrap(),
        Some(replaced.clone())
    );
    let listed = vaults.secrets("default", "prod").await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].updated_at, replaced.updated_at);

    assert!(vaults
        .delete_secret("default", "prod", "token")
        .await
        .unwrap());
    assert!(!vaults
        .delete_secret("default", "prod", "token")
        .await
        .unwrap());
    assert_eq!(
        vaults.secret("default", "prod", "token").await.unwrap(),
        None
    );
    // Another tenant's secret of the same name is untouched.
    assert_eq!(
        vaults
            .secret("acme", "prod", "token")
            .await
            .unwrap()
            .map(|s| s.ciphertext),
        Some(b"theirs".to_vec())
    );
}

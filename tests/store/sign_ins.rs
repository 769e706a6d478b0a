//! The page's sign-ins: a row found by its id until it expires or is deleted, an id used once,
//! and expired rows purged, the same on both backends.

use std::sync::Arc;

use tah::store::sign_ins::NewSignIn;
use tah::store::Store;

conformance!(a_sign_in_lives_until_it_expires_or_is_deleted);

async fn a_sign_in_lives_until_it_expires_or_is_deleted(store: Arc<dyn Store>) {
    let sign_ins = store.sign_ins().expect("the store keeps sign-ins");
    let new = |id: &'static str, expires_at: i64| NewSignIn {
        id,
        token_binding: "binding-of-a",
        created_at: 1_000,
        expires_at,
    };
    sign_ins
        .insert_sign_in(&new("a", 5_000))
        .await
        .expect("insert a");
    sign_ins
        .insert_sign_in(&new("b", 3_000))
        .await
        .expect("insert b");
    assert!(
        sign_ins.insert_sign_in(&new("a", 9_000)).await.is_err(),
        "an id is used once"
    );
    let found = sign_ins.sign_in("a", 2_000).await.expect("read a");
    assert_eq!(found.as_deref(), Some("binding-of-a"));
    assert_eq!(sign_ins.sign_in("nobody", 2_000).await.expect("read"), None);
    // Expired by the time it is asked for: as if it were not there.
    assert_eq!(sign_ins.sign_in("b", 3_000).await.expect("read b"), None);
    assert_eq!(sign_ins.purge_sign_ins(3_000).await.expect("purge"), 1);
    assert!(sign_ins
        .sign_in("a", 3_000)
        .await
        .expect("read a")
        .is_some());

    assert!(sign_ins.delete_sign_in("a").await.expect("delete a"));
    assert!(!sign_ins.delete_sign_in("a").await.expect("delete again"));
    assert_eq!(sign_ins.sign_in("a", 2_000).await.expect("read a"), None);
}

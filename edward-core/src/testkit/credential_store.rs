//! Conformance suite of [`CredentialStore`]: upsert keeps the id, one default
//! per user and provider, revoke and delete, and users never see each other's
//! credentials. Stores keep opaque bytes: the suite uses fake ciphertexts.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::unique;
use crate::{CredentialStore, StoredCredential};

/// Run every check.
pub async fn run_all(store: Arc<dyn CredentialStore>) {
    check_put_get_roundtrip(&*store).await;
    check_upsert_keeps_id(&*store).await;
    check_single_default(&*store).await;
    check_revoke_and_delete(&*store).await;
    check_users_isolated(&*store).await;
}

/// Second precision: every backend keeps at least that.
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap_or_default()
}

/// A credential with fake ciphertext bytes (including 0x00 and 0xff).
pub fn sample(user: &str, provider: &str, name: &str, default: bool) -> StoredCredential {
    StoredCredential {
        id: Uuid::new_v4(),
        user_id: user.to_string(),
        provider: provider.to_string(),
        name: name.to_string(),
        base_url: None,
        key_id: "k1".into(),
        nonce: vec![0, 1, 2, 255],
        ciphertext: vec![0, 0xff, 7, 42, 0],
        is_default: default,
        created_at: now(),
        revoked_at: None,
    }
}

/// What is put comes back byte for byte, by id and by name.
pub async fn check_put_get_roundtrip(store: &dyn CredentialStore) {
    let user = unique("cred-user");
    let mut c = sample(&user, "openai", "main", true);
    c.base_url = Some("http://127.0.0.1:9/v1".into());
    let stored = store.put_credential(c.clone()).await.expect("put");
    assert_eq!(stored, c);
    let got = store.get_credential(&user, c.id).await.expect("get");
    assert_eq!(got.as_ref(), Some(&c));
    let by_name = store
        .find_credential(&user, "openai", Some("main"))
        .await
        .expect("find by name");
    assert_eq!(by_name.as_ref(), Some(&c));
    let by_default = store
        .find_credential(&user, "openai", None)
        .await
        .expect("find default");
    assert_eq!(by_default.as_ref(), Some(&c));
    assert!(
        store
            .find_credential(&user, "anthropic", None)
            .await
            .expect("find other provider")
            .is_none()
    );
    assert!(
        store
            .get_credential(&user, Uuid::new_v4())
            .await
            .expect("get missing")
            .is_none()
    );
}

/// Putting the same (user, provider, name) again replaces the secret but
/// keeps the id and creation time.
pub async fn check_upsert_keeps_id(store: &dyn CredentialStore) {
    let user = unique("cred-user");
    let first = store
        .put_credential(sample(&user, "openai", "main", false))
        .await
        .expect("put first");
    let mut second = sample(&user, "openai", "main", false);
    second.key_id = "k2".into();
    second.ciphertext = vec![9, 9, 9];
    let stored = store.put_credential(second).await.expect("put second");
    assert_eq!(stored.id, first.id, "upsert keeps the id");
    let got = store
        .get_credential(&user, first.id)
        .await
        .expect("get")
        .expect("still there");
    assert_eq!(got.key_id, "k2");
    assert_eq!(got.ciphertext, vec![9, 9, 9]);
    assert_eq!(got.created_at, first.created_at);
    assert_eq!(store.list_credentials(&user).await.expect("list").len(), 1);
}

/// A new default replaces the old one for that provider only.
pub async fn check_single_default(store: &dyn CredentialStore) {
    let user = unique("cred-user");
    let a = store
        .put_credential(sample(&user, "openai", "a", true))
        .await
        .expect("put a");
    let other = store
        .put_credential(sample(&user, "anthropic", "x", true))
        .await
        .expect("put other");
    let b = store
        .put_credential(sample(&user, "openai", "b", true))
        .await
        .expect("put b");
    let default = store
        .find_credential(&user, "openai", None)
        .await
        .expect("find")
        .expect("a default");
    assert_eq!(default.id, b.id);
    let a_now = store.get_credential(&user, a.id).await.expect("get a");
    assert!(!a_now.expect("a kept").is_default);
    let other_default = store
        .find_credential(&user, "anthropic", None)
        .await
        .expect("find other");
    assert_eq!(other_default.map(|c| c.id), Some(other.id));
    let list = store.list_credentials(&user).await.expect("list");
    let names: Vec<_> = list
        .iter()
        .map(|c| (c.provider.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [("anthropic", "x"), ("openai", "a"), ("openai", "b")]
    );
}

/// Revoked credentials stay readable (so callers can say "revoked") but are
/// never the default; deleted ones are gone.
pub async fn check_revoke_and_delete(store: &dyn CredentialStore) {
    let user = unique("cred-user");
    let c = store
        .put_credential(sample(&user, "openai", "main", true))
        .await
        .expect("put");
    assert!(store.revoke_credential(&user, c.id).await.expect("revoke"));
    let got = store
        .get_credential(&user, c.id)
        .await
        .expect("get")
        .expect("kept");
    assert!(got.revoked_at.is_some());
    assert!(!got.is_default);
    assert!(
        store
            .find_credential(&user, "openai", None)
            .await
            .expect("find default")
            .is_none(),
        "a revoked credential is never the default"
    );
    let by_name = store
        .find_credential(&user, "openai", Some("main"))
        .await
        .expect("find by name")
        .expect("found by name");
    assert!(by_name.revoked_at.is_some());
    assert!(store.delete_credential(&user, c.id).await.expect("delete"));
    assert!(
        !store
            .delete_credential(&user, c.id)
            .await
            .expect("delete again")
    );
    assert!(
        !store
            .revoke_credential(&user, c.id)
            .await
            .expect("revoke gone")
    );
    assert!(
        store
            .get_credential(&user, c.id)
            .await
            .expect("get")
            .is_none()
    );
}

/// Another user's id reads, revokes and deletes nothing.
pub async fn check_users_isolated(store: &dyn CredentialStore) {
    let alice = unique("cred-alice");
    let bob = unique("cred-bob");
    let c = store
        .put_credential(sample(&alice, "openai", "main", true))
        .await
        .expect("put");
    store
        .put_credential(sample(&bob, "openai", "main", true))
        .await
        .expect("put bob");
    assert!(
        store
            .get_credential(&bob, c.id)
            .await
            .expect("get")
            .is_none()
    );
    assert!(!store.revoke_credential(&bob, c.id).await.expect("revoke"));
    assert!(!store.delete_credential(&bob, c.id).await.expect("delete"));
    let bobs = store.list_credentials(&bob).await.expect("list");
    assert_eq!(bobs.len(), 1);
    assert_ne!(bobs[0].id, c.id);
    assert!(
        store
            .get_credential(&alice, c.id)
            .await
            .expect("get own")
            .is_some_and(|c| c.revoked_at.is_none() && c.is_default)
    );
}

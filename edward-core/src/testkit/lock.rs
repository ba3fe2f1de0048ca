//! Conformance suite for [`Lock`] adapters. Lock names are fresh per check.
//! The expiry checks wait for real time to pass: expiry is time itself.

use std::sync::Arc;
use std::time::Duration;

use super::{unique, within};
use crate::{Lock, LockGuard};

const TTL: Duration = Duration::from_secs(30);

/// Acquire, a second owner is refused, renew, release; release and renew by
/// a wrong token or after release are `false` and change nothing.
pub async fn check_acquire_renew_release<L: Lock + ?Sized>(lock: &L) {
    let name = unique("lock");
    let guard = lock
        .try_acquire(&name, "alice", TTL)
        .await
        .expect("acquire")
        .expect("a free lock is acquired");
    assert_eq!(guard.name, name);
    assert_eq!(guard.owner, "alice");
    assert!(!guard.token.is_empty());
    assert!(
        lock.try_acquire(&name, "bob", TTL)
            .await
            .expect("acquire")
            .is_none(),
        "a held lock is refused"
    );
    assert!(lock.renew(&guard, TTL).await.expect("renew"));

    let forged = LockGuard {
        token: unique("forged"),
        ..guard.clone()
    };
    assert!(
        !lock.release(&forged).await.expect("release"),
        "wrong token"
    );
    assert!(
        !lock.renew(&forged, TTL).await.expect("renew"),
        "wrong token"
    );
    assert!(
        lock.try_acquire(&name, "bob", TTL)
            .await
            .expect("acquire")
            .is_none(),
        "a wrong-token release releases nothing"
    );

    assert!(lock.release(&guard).await.expect("release"));
    assert!(
        !lock.release(&guard).await.expect("release"),
        "already released"
    );
    assert!(!lock.renew(&guard, TTL).await.expect("renew"), "released");
    let bob = lock
        .try_acquire(&name, "bob", TTL)
        .await
        .expect("acquire")
        .expect("a released lock is free");
    assert_ne!(bob.token, guard.token, "tokens are unique per acquisition");
    assert!(bob.fence > guard.fence, "fences grow across acquisitions");
    assert!(
        !lock.release(&guard).await.expect("release"),
        "old guard, new holder"
    );
    assert!(lock.release(&bob).await.expect("release"));
}

/// An expired lock can be taken by another owner; the old guard can then
/// neither renew nor release it.
pub async fn check_expiry<L: Lock + ?Sized>(lock: &L) {
    let name = unique("lock");
    let short = Duration::from_millis(200);
    let old = lock
        .try_acquire(&name, "alice", short)
        .await
        .expect("acquire")
        .expect("free");
    tokio::time::sleep(short * 2).await;
    let new = lock
        .try_acquire(&name, "bob", TTL)
        .await
        .expect("acquire")
        .expect("an expired lock is free");
    assert!(
        new.fence > old.fence,
        "a take-over gets a greater fence ({} then {})",
        old.fence,
        new.fence
    );
    assert!(
        !lock.renew(&old, TTL).await.expect("renew"),
        "expired guard"
    );
    assert!(!lock.release(&old).await.expect("release"), "expired guard");
    assert!(
        lock.try_acquire(&name, "carol", TTL)
            .await
            .expect("acquire")
            .is_none(),
        "the new holder still holds it"
    );
    assert!(lock.release(&new).await.expect("release"));
}

/// A renewal pushes expiry out.
pub async fn check_renew_extends<L: Lock + ?Sized>(lock: &L) {
    let name = unique("lock");
    let short = Duration::from_millis(300);
    let guard = lock
        .try_acquire(&name, "alice", short)
        .await
        .expect("acquire")
        .expect("free");
    assert!(lock.renew(&guard, TTL).await.expect("renew"));
    tokio::time::sleep(short * 2).await;
    assert!(
        lock.try_acquire(&name, "bob", TTL)
            .await
            .expect("acquire")
            .is_none(),
        "a renewed lock outlives its first ttl"
    );
    assert!(lock.release(&guard).await.expect("release"));
}

/// 20 concurrent acquirers: exactly one wins.
pub async fn check_concurrent_acquire(lock: Arc<dyn Lock>) {
    let name = unique("lock");
    let mut tasks = Vec::new();
    for i in 0..20 {
        let lock = Arc::clone(&lock);
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            lock.try_acquire(&name, &format!("owner-{i}"), TTL).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let Some(guard) = within("a concurrent acquire", task)
            .await
            .expect("acquire task")
            .expect("acquire")
        {
            winners.push(guard);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one acquirer wins");
    assert!(lock.release(&winners[0]).await.expect("release"));
}

/// Every check of this suite.
pub async fn run_all(lock: Arc<dyn Lock>) {
    check_acquire_renew_release(&*lock).await;
    check_expiry(&*lock).await;
    check_renew_extends(&*lock).await;
    check_concurrent_acquire(Arc::clone(&lock)).await;
}

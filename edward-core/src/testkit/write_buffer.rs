//! Conformance suite for [`WriteBuffer`] adapters.
//!
//! The trait takes `now` explicitly, so no check sleeps. Keys are fresh per
//! check and every check takes what it put. Times are whole milliseconds
//! (what a sorted-set score keeps) in the past, so other writers' due
//! entries may precede ours: checks assert on their own keys only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};

use crate::{FlushPolicy, PendingFile, SandboxKey, SandboxPath, WriteBuffer};

/// Enough to list every due key of a shared buffer.
const ALL: usize = 100_000;

/// A fresh sandbox key.
pub fn fresh_key() -> SandboxKey {
    SandboxKey(super::unique("sbx"))
}

/// A pending file.
pub fn file(path: &str, content: &str) -> PendingFile {
    PendingFile {
        path: SandboxPath::new(path).expect("valid test path"),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }
}

/// A base time in whole milliseconds, a day ago.
fn base_time() -> DateTime<Utc> {
    let ms = (Utc::now() - TimeDelta::days(1)).timestamp_millis();
    DateTime::from_timestamp_millis(ms).expect("representable time")
}

fn ms(t0: DateTime<Utc>, n: i64) -> DateTime<Utc> {
    t0 + TimeDelta::milliseconds(n)
}

fn as_map(files: Vec<PendingFile>) -> BTreeMap<String, Bytes> {
    files
        .into_iter()
        .map(|f| (f.path.as_str().to_owned(), f.content))
        .collect()
}

async fn is_due<W: WriteBuffer + ?Sized>(buffer: &W, key: &SandboxKey, now: DateTime<Utc>) -> bool {
    buffer.due(now, ALL).await.expect("due").contains(key)
}

const POLICY: FlushPolicy = FlushPolicy {
    debounce: Duration::from_millis(100),
    max_wait: Duration::from_millis(250),
};

/// `take` returns whole files (a later put of a path replaces it) and
/// empties the key.
pub async fn check_put_take_whole_files<W: WriteBuffer + ?Sized>(buffer: &W) {
    let key = fresh_key();
    let t0 = base_time();
    buffer
        .put(
            &key,
            vec![file("a.txt", "one"), file("src/b.rs", "fn b() {}")],
            t0,
            POLICY,
        )
        .await
        .expect("put");
    buffer
        .put(&key, vec![file("a.txt", "three")], ms(t0, 10), POLICY)
        .await
        .expect("put");
    let taken = as_map(buffer.take(&key).await.expect("take"));
    let expected: BTreeMap<String, Bytes> = [
        ("a.txt".to_owned(), Bytes::from_static(b"three")),
        ("src/b.rs".to_owned(), Bytes::from_static(b"fn b() {}")),
    ]
    .into();
    assert_eq!(taken, expected);
    assert!(
        buffer.take(&key).await.expect("take").is_empty(),
        "take empties"
    );
    assert!(
        buffer.take(&fresh_key()).await.expect("take").is_empty(),
        "an unknown key has nothing pending"
    );

    // Binary content survives untouched.
    let bytes = Bytes::from((0..=255u8).collect::<Vec<_>>());
    buffer
        .put(
            &key,
            vec![PendingFile {
                path: SandboxPath::new("bin/blob").expect("path"),
                content: bytes.clone(),
            }],
            t0,
            POLICY,
        )
        .await
        .expect("put");
    let taken = buffer.take(&key).await.expect("take");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].content, bytes);
}

/// Due time = `min(first_pending + max_wait, now + debounce)`.
pub async fn check_due_debounce_and_max_wait<W: WriteBuffer + ?Sized>(buffer: &W) {
    let key = fresh_key();
    let t0 = base_time();
    buffer
        .put(&key, vec![file("a", "1")], t0, POLICY)
        .await
        .expect("put");
    assert!(!is_due(buffer, &key, ms(t0, 99)).await, "debounce not over");
    assert!(
        is_due(buffer, &key, ms(t0, 100)).await,
        "due after debounce"
    );

    // A write at +90 moves the due time to +190 …
    buffer
        .put(&key, vec![file("a", "2")], ms(t0, 90), POLICY)
        .await
        .expect("put");
    assert!(
        !is_due(buffer, &key, ms(t0, 189)).await,
        "a new write restarts the debounce"
    );
    assert!(is_due(buffer, &key, ms(t0, 190)).await);
    // … one at +180 would move it to +280, but max_wait caps it at +250.
    buffer
        .put(&key, vec![file("a", "3")], ms(t0, 180), POLICY)
        .await
        .expect("put");
    assert!(!is_due(buffer, &key, ms(t0, 249)).await);
    assert!(
        is_due(buffer, &key, ms(t0, 250)).await,
        "max_wait caps the wait"
    );

    // After a take, the next write starts a new max_wait window.
    assert_eq!(as_map(buffer.take(&key).await.expect("take")).len(), 1);
    buffer
        .put(&key, vec![file("a", "4")], ms(t0, 400), POLICY)
        .await
        .expect("put");
    assert!(!is_due(buffer, &key, ms(t0, 499)).await);
    assert!(is_due(buffer, &key, ms(t0, 500)).await);
    buffer.take(&key).await.expect("take");
}

/// `due` is earliest first and honours `limit`.
pub async fn check_due_order_and_limit<W: WriteBuffer + ?Sized>(buffer: &W) {
    let t0 = base_time();
    let keys = [fresh_key(), fresh_key(), fresh_key()];
    // Put in reverse so insertion order differs from due order.
    for (i, key) in keys.iter().enumerate().rev() {
        buffer
            .put(key, vec![file("f", "x")], ms(t0, 10 * i as i64), POLICY)
            .await
            .expect("put");
    }
    let now = ms(t0, 1_000);
    let all = buffer.due(now, ALL).await.expect("due");
    let positions: Vec<_> = keys
        .iter()
        .map(|k| all.iter().position(|x| x == k).expect("every key is due"))
        .collect();
    assert!(
        positions[0] < positions[1] && positions[1] < positions[2],
        "earliest first"
    );
    let two = buffer.due(now, 2).await.expect("due");
    assert_eq!(two.len(), 2.min(all.len()));
    assert_eq!(two[..], all[..two.len()], "limit keeps the earliest");
    assert!(buffer.due(now, 0).await.expect("due").is_empty());
    for key in &keys {
        buffer.take(key).await.expect("take");
    }
}

/// `take` removes the key's due-index entry.
pub async fn check_take_removes_index_entry<W: WriteBuffer + ?Sized>(buffer: &W) {
    let key = fresh_key();
    let t0 = base_time();
    buffer
        .put(&key, vec![file("a", "1")], t0, POLICY)
        .await
        .expect("put");
    assert!(is_due(buffer, &key, ms(t0, 1_000)).await);
    buffer.take(&key).await.expect("take");
    assert!(
        !is_due(buffer, &key, Utc::now() + TimeDelta::days(1)).await,
        "a taken key is no longer due"
    );
}

/// Keys are isolated: same paths, different sandboxes.
pub async fn check_keys_isolated<W: WriteBuffer + ?Sized>(buffer: &W) {
    let (a, b) = (fresh_key(), fresh_key());
    let t0 = base_time();
    buffer
        .put(&a, vec![file("same.txt", "for a")], t0, POLICY)
        .await
        .expect("put");
    buffer
        .put(&b, vec![file("same.txt", "for b")], t0, POLICY)
        .await
        .expect("put");
    let taken_a = buffer.take(&a).await.expect("take");
    assert_eq!(taken_a, vec![file("same.txt", "for a")]);
    assert!(
        is_due(buffer, &b, ms(t0, 1_000)).await,
        "taking a leaves b due"
    );
    let taken_b = buffer.take(&b).await.expect("take");
    assert_eq!(taken_b, vec![file("same.txt", "for b")]);
}

/// A failed flush puts its files back without overwriting writes made
/// since the take, and the sandbox is due again.
pub async fn check_put_back_keeps_newer_writes<W: WriteBuffer + ?Sized>(buffer: &W) {
    let key = fresh_key();
    let t0 = base_time();
    buffer
        .put(
            &key,
            vec![file("a", "old a"), file("b", "old b")],
            t0,
            POLICY,
        )
        .await
        .expect("put");
    let taken = buffer.take(&key).await.expect("take");
    buffer
        .put(&key, vec![file("a", "new a")], ms(t0, 10), POLICY)
        .await
        .expect("put");
    buffer
        .put_back(&key, taken, ms(t0, 20), POLICY)
        .await
        .expect("put_back");
    assert!(is_due(buffer, &key, ms(t0, 1_000)).await, "due again");
    let expected: BTreeMap<String, Bytes> = [
        ("a".to_owned(), Bytes::from_static(b"new a")),
        ("b".to_owned(), Bytes::from_static(b"old b")),
    ]
    .into();
    assert_eq!(as_map(buffer.take(&key).await.expect("take")), expected);
}

/// Every check of this suite.
pub async fn run_all(buffer: Arc<dyn WriteBuffer>) {
    check_put_take_whole_files(&*buffer).await;
    check_due_debounce_and_max_wait(&*buffer).await;
    check_due_order_and_limit(&*buffer).await;
    check_take_removes_index_entry(&*buffer).await;
    check_keys_isolated(&*buffer).await;
    check_put_back_keeps_newer_writes(&*buffer).await;
}

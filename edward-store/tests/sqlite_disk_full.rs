//! A SQLite store on a small file system that fills up: once space is freed,
//! writes work again (the single writer connection is recovered, not left
//! broken for the life of the process).
//!
//! Mounts a 2 MiB tmpfs (needs root, as `scripts/test.sh` and CI run).
#![cfg(feature = "sqlite")]

use std::path::{Path, PathBuf};
use std::process::Command;

use edward_core::{AdmissionLimits, Fence, NewEvent, NewRun, RunId, RunStore};
use edward_store::SqliteStore;

/// A tmpfs mounted for the test, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a small tmpfs failed ({}); this test needs root, as scripts/test.sh runs it",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fill the file system with a filler file until it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

fn new_run(i: usize) -> NewRun {
    NewRun {
        id: RunId::new(),
        user_id: format!("u{i}"),
        chat_id: format!("c{i}"),
        request: serde_json::json!({ "prompt": "x" }),
        first_event: NewEvent::new("run_queued", serde_json::json!({})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_recovers_after_disk_full() {
    let fs = SmallFs::mount("2m");
    let store = SqliteStore::open(fs.path().join("edward.db"))
        .await
        .expect("open");
    let limits = AdmissionLimits {
        global: 1_000_000,
        per_user: 1_000_000,
        per_chat: 1_000_000,
    };
    let run = store.admit(new_run(0), limits).await.expect("admit");
    store.start_run(run.id, Fence(1)).await.expect("start");
    let filler = fill(fs.path());
    // Write until the disk is full.
    let big = "x".repeat(64 * 1024);
    let mut failed = None;
    for _ in 0..200 {
        let events = vec![NewEvent::new(
            "text_delta",
            serde_json::json!({ "content": big }),
        )];
        if let Err(e) = store.append_events(run.id, Fence(1), events).await {
            failed = Some(e);
            break;
        }
    }
    let err = failed.expect("the small file system never filled up");
    assert!(
        err.to_string().contains("full") || err.is_retryable(),
        "disk full is reported as a transient error: {err}"
    );
    // Free the space: the very same store writes again.
    std::fs::remove_file(filler).expect("remove filler");
    let mut last = None;
    for _ in 0..3 {
        match store
            .append_events(
                run.id,
                Fence(1),
                vec![NewEvent::new(
                    "text_delta",
                    serde_json::json!({ "content": "ok" }),
                )],
            )
            .await
        {
            Ok(_) => {
                last = None;
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    assert!(
        last.is_none(),
        "writes still fail after space was freed: {last:?}"
    );
    // New submits work too.
    store
        .admit(new_run(1), limits)
        .await
        .expect("admit after recovery");
    store.close().await;
}

//! Event-append throughput: batched `RunStore::append_events` (64 events per
//! call, one transaction) versus one transaction per event (the naive
//! design), for 1 and 50 concurrent runs, on SQLite and Postgres.
//!
//! ```text
//! EDWARD_TEST_DATABASE_URL=$(scripts/pg.sh start) \
//!   cargo bench -p edward-store --all-features --bench append
//! ```
//!
//! Each cell appends for `EDWARD_BENCH_SECS` seconds (default 3) and reports
//! events per second. Without `--bench` (e.g. `cargo test --all-targets`)
//! it runs a short smoke pass on SQLite only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edward_core::{AdmissionLimits, Fence, NewEvent, NewRun, RunId, RunStore};
use edward_store::{PgOptions, PgStore, SqliteStore, StoreOptions};

const BATCH: usize = 64;

fn delta(n: u64) -> NewEvent {
    NewEvent::new(
        "text_delta",
        serde_json::json!({
            "text": "fn main() { println!(\"hello from a coalesced model delta\"); } // padding..",
            "n": n,
        }),
    )
}

async fn start_runs(store: &Arc<dyn RunStore>, n: usize) -> Vec<RunId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = RunId::new();
        let run = NewRun {
            id,
            user_id: format!("bench-user-{}-{i}", id.0.simple()),
            chat_id: format!("bench-chat-{}-{i}", id.0.simple()),
            request: serde_json::json!({ "prompt": "bench" }),
            first_event: NewEvent::new("run_queued", serde_json::json!({})),
        };
        let limits = AdmissionLimits {
            global: u32::MAX,
            per_user: u32::MAX,
            per_chat: u32::MAX,
        };
        store.admit(run, limits).await.expect("admit");
        store.start_run(id, Fence(1)).await.expect("start_run");
        ids.push(id);
    }
    ids
}

/// Append to `runs` concurrently for `secs`; events per second.
async fn measure(store: &Arc<dyn RunStore>, runs: usize, batch: usize, secs: Duration) -> f64 {
    let ids = start_runs(store, runs).await;
    let started = Instant::now();
    let deadline = started + secs;
    let mut tasks = Vec::new();
    for id in ids {
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let mut appended = 0u64;
            while Instant::now() < deadline {
                let events = (0..batch as u64).map(|i| delta(appended + i)).collect();
                let persisted = store
                    .append_events(id, Fence(1), events)
                    .await
                    .expect("append");
                appended += persisted.len() as u64;
            }
            appended
        }));
    }
    let mut total = 0u64;
    for task in tasks {
        total += task.await.expect("append task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

async fn bench_backend(name: &str, store: Arc<dyn RunStore>, secs: Duration) {
    for runs in [1usize, 50] {
        let batched = measure(&store, runs, BATCH, secs).await;
        let naive = measure(&store, runs, 1, secs).await;
        println!(
            "{name:<8} runs={runs:<3} batched({BATCH}/tx)={batched:>10.0} ev/s   \
             naive(1/tx)={naive:>9.0} ev/s   ratio={:>6.1}x",
            batched / naive
        );
    }
}

fn main() {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let secs = if bench_mode {
        let s = std::env::var("EDWARD_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(3.0);
        Duration::from_secs_f64(s)
    } else {
        Duration::from_millis(100)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let sqlite = SqliteStore::open(dir.path().join("bench.db"))
            .await
            .expect("sqlite");
        bench_backend("sqlite", Arc::new(sqlite), secs).await;
        if !bench_mode {
            return;
        }
        let url = std::env::var("EDWARD_TEST_DATABASE_URL").expect(
            "EDWARD_TEST_DATABASE_URL is not set: start Postgres with `scripts/pg.sh start`",
        );
        let options = PgOptions::default()
            .schema(format!("bench_{}", RunId::new().0.simple()))
            .store(StoreOptions::default().max_connections(60));
        let pg = PgStore::connect_with(&url, options)
            .await
            .expect("postgres");
        bench_backend("postgres", Arc::new(pg), secs).await;
    });
}

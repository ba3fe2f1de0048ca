//! Redis adapter benches, against a real Redis (`EDWARD_TEST_REDIS_URL`):
//!
//! - `due` with 10,000 sandboxes pending and 10 due: the sorted-set index of
//!   [`edward_store::RedisWriteBuffer`] versus a `SCAN`-based lookup (one key
//!   per sandbox holding its due time, scanned and fetched in batches — how
//!   the original system did it);
//! - lock acquire+release and queue claim+ack operations per second, with 1
//!   and 16 concurrent clients (one connection each);
//! - notifier delivery latency across processes: this binary re-executes
//!   itself as a subscriber; each hint carries its send time.
//!
//! ```text
//! EDWARD_TEST_REDIS_URL=$(scripts/redis.sh start) \
//!   cargo bench -p edward-store --features redis --bench redis
//! ```
//!
//! Without `--bench` (e.g. `cargo test --all-targets`) it runs a small
//! smoke pass.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use edward_core::{
    FlushPolicy, Lock, Notifier, PendingFile, RunId, RunQueue, SandboxKey, SandboxPath, WriteBuffer,
};
use edward_store::{RedisBackend, RedisOptions};
use futures::StreamExt;

struct Scale {
    pending: usize,
    due: usize,
    lookups: usize,
    jobs: usize,
    lock_secs: Duration,
    hints: usize,
}

fn url() -> String {
    std::env::var("EDWARD_TEST_REDIS_URL").expect(
        "EDWARD_TEST_REDIS_URL is not set: start Redis with `scripts/redis.sh start` \
         and export EDWARD_TEST_REDIS_URL=<the URL it prints>",
    )
}

fn prefix() -> String {
    format!("bench-{}:", RunId::new().0.simple())
}

async fn backend(prefix: &str) -> RedisBackend {
    RedisBackend::connect_with(&url(), RedisOptions::default().prefix(prefix))
        .await
        .expect("connect to EDWARD_TEST_REDIS_URL")
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Delete every key under `prefix`.
async fn cleanup(prefix: &str) {
    let mut conn = raw().await;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("del");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

// ------------------------------------------------------------ due

/// The `SCAN` design: `{prefix}scan:{sandbox}` holds the due time (ms).
async fn scan_due(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    now_ms: i64,
) -> Vec<String> {
    let mut cursor = 0u64;
    let mut due = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}scan:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("scan");
        if !keys.is_empty() {
            let times: Vec<Option<i64>> = redis::cmd("MGET")
                .arg(&keys)
                .query_async(conn)
                .await
                .expect("mget");
            for (key, at) in keys.into_iter().zip(times) {
                if at.is_some_and(|at| at <= now_ms) {
                    due.push((at, key));
                }
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    due.sort();
    due.into_iter().map(|(_, k)| k).collect()
}

async fn bench_due(scale: &Scale) {
    let prefix = prefix();
    let redis = backend(&prefix).await;
    let buffer = redis.write_buffer();
    let mut conn = raw().await;
    let now = Utc::now();
    let policy = FlushPolicy {
        debounce: Duration::from_millis(100),
        max_wait: Duration::from_secs(1),
    };
    let file = |i: usize| PendingFile {
        path: SandboxPath::new("src/main.rs").expect("path"),
        content: bytes::Bytes::from(format!("fn main() {{ /* {i} */ }}")),
    };
    let mut pipe = redis::pipe();
    for i in 0..scale.pending {
        let key = SandboxKey(format!("sbx-{i:05}"));
        // The first `due` sandboxes wrote a second ago; the rest write in an hour.
        let (at, due_ms) = if i < scale.due {
            let at = now - TimeDelta::seconds(1);
            (at, (at + TimeDelta::milliseconds(100)).timestamp_millis())
        } else {
            let at = now + TimeDelta::hours(1);
            (at, (at + TimeDelta::milliseconds(100)).timestamp_millis())
        };
        buffer
            .put(&key, vec![file(i)], at, policy)
            .await
            .expect("put");
        pipe.cmd("SET")
            .arg(format!("{prefix}scan:{}", key.0))
            .arg(due_ms)
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.expect("pipe");
    let dbsize: i64 = redis::cmd("DBSIZE")
        .query_async(&mut conn)
        .await
        .expect("dbsize");

    let started = Instant::now();
    for _ in 0..scale.lookups {
        let got = buffer.due(now, 100).await.expect("due");
        assert_eq!(got.len(), scale.due);
    }
    let zset = started.elapsed() / scale.lookups as u32;
    let started = Instant::now();
    for _ in 0..scale.lookups {
        let got = scan_due(&mut conn, &prefix, now.timestamp_millis()).await;
        assert_eq!(got.len(), scale.due);
    }
    let scan = started.elapsed() / scale.lookups as u32;
    println!(
        "due ({} pending, {} due, {} keys in the db): sorted set {:>9.1} us/lookup   \
         SCAN {:>9.1} us/lookup   ratio {:>6.1}x",
        scale.pending,
        scale.due,
        dbsize,
        zset.as_secs_f64() * 1e6,
        scan.as_secs_f64() * 1e6,
        scan.as_secs_f64() / zset.as_secs_f64()
    );
    cleanup(&prefix).await;
}

// ------------------------------------------------------------ lock + queue

async fn bench_lock(scale: &Scale, clients: usize) {
    let prefix = prefix();
    let mut tasks = Vec::new();
    let deadline = Instant::now() + scale.lock_secs;
    let started = Instant::now();
    for c in 0..clients {
        let lock = backend(&prefix).await.lock();
        tasks.push(tokio::spawn(async move {
            let mut ops = 0u64;
            let name = format!("lock-{c}");
            while Instant::now() < deadline {
                let guard = lock
                    .try_acquire(&name, "bench", Duration::from_secs(30))
                    .await
                    .expect("acquire")
                    .expect("uncontended");
                assert!(lock.release(&guard).await.expect("release"));
                ops += 1;
            }
            ops
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.expect("task");
    }
    let rate = ops as f64 / started.elapsed().as_secs_f64();
    println!("lock acquire+release  clients={clients:<2} {rate:>9.0} ops/s");
    cleanup(&prefix).await;
}

async fn bench_queue(scale: &Scale, clients: usize) {
    let prefix = prefix();
    let redis = backend(&prefix).await;
    let queue = Arc::new(redis.queue());
    let mut fill = Vec::new();
    for c in 0..16 {
        let queue = Arc::clone(&queue);
        let n = scale.jobs / 16 + usize::from(c < scale.jobs % 16);
        fill.push(tokio::spawn(async move {
            for _ in 0..n {
                queue.enqueue(RunId::new()).await.expect("enqueue");
            }
        }));
    }
    for f in fill {
        f.await.expect("fill");
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let queue = backend(&prefix).await.queue();
        tasks.push(tokio::spawn(async move {
            let mut ops = 0u64;
            let owner = format!("worker-{c}");
            while let Some(lease) = queue
                .claim(&owner, Duration::from_secs(30))
                .await
                .expect("claim")
            {
                queue.ack(&lease).await.expect("ack");
                ops += 1;
            }
            ops
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.expect("task");
    }
    assert_eq!(ops as usize, scale.jobs, "every job claimed and acked once");
    let rate = ops as f64 / started.elapsed().as_secs_f64();
    println!(
        "queue claim+ack       clients={clients:<2} {rate:>9.0} ops/s  ({} jobs)",
        scale.jobs
    );
    cleanup(&prefix).await;
}

// ------------------------------------------------------------ notifier

/// The subscriber process: prints `ready`, then one latency (us) per hint
/// of run `EDWARD_BENCH_RUN`, and exits after `EDWARD_BENCH_HINTS` hints.
async fn subscriber_child(prefix: String) {
    let run: RunId = std::env::var("EDWARD_BENCH_RUN")
        .expect("run")
        .parse()
        .expect("run id");
    let hints: usize = std::env::var("EDWARD_BENCH_HINTS")
        .expect("hints")
        .parse()
        .expect("count");
    let notifier = backend(&prefix).await.notifier().await.expect("notifier");
    let mut stream = notifier.subscribe_events(run).await.expect("subscribe");
    println!("ready");
    for _ in 0..hints {
        let sent_us = stream.next().await.expect("hint");
        let now_us = u64::try_from(Utc::now().timestamp_micros()).expect("time");
        println!("{}", now_us.saturating_sub(sent_us));
    }
}

async fn bench_notifier(scale: &Scale) {
    let prefix = prefix();
    let run = RunId::new();
    let exe = std::env::current_exe().expect("bench binary");
    let mut child = Command::new(exe)
        .env("EDWARD_BENCH_CHILD", &prefix)
        .env("EDWARD_BENCH_RUN", run.to_string())
        .env("EDWARD_BENCH_HINTS", scale.hints.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn subscriber");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("ready line").expect("read"), "ready");
    let notifier = backend(&prefix).await.notifier().await.expect("notifier");
    for _ in 0..scale.hints {
        let now_us = u64::try_from(Utc::now().timestamp_micros()).expect("time");
        notifier.notify_events(run, now_us).await.expect("notify");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut latencies: Vec<u64> = lines
        .map(|l| l.expect("read").parse().expect("latency"))
        .collect();
    child.wait().expect("subscriber exits");
    assert_eq!(latencies.len(), scale.hints, "every hint delivered");
    latencies.sort_unstable();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    println!(
        "notifier cross-process delivery ({} hints): p50 {} us   p99 {} us   max {} us",
        scale.hints,
        pct(50),
        pct(99),
        latencies[latencies.len() - 1]
    );
    cleanup(&prefix).await;
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Ok(prefix) = std::env::var("EDWARD_BENCH_CHILD") {
        runtime.block_on(subscriber_child(prefix));
        return;
    }
    let scale = if std::env::args().any(|a| a == "--bench") {
        Scale {
            pending: 10_000,
            due: 10,
            lookups: 50,
            jobs: 20_000,
            lock_secs: Duration::from_secs(3),
            hints: 1_000,
        }
    } else {
        Scale {
            pending: 200,
            due: 10,
            lookups: 2,
            jobs: 100,
            lock_secs: Duration::from_millis(100),
            hints: 20,
        }
    };
    runtime.block_on(async {
        bench_due(&scale).await;
        for clients in [1, 16] {
            bench_lock(&scale, clients).await;
        }
        for clients in [1, 16] {
            bench_queue(&scale, clients).await;
        }
        bench_notifier(&scale).await;
    });
}

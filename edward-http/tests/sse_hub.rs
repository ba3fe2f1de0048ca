//! The shared per-run SSE tail over real sockets: subscribers joining at any
//! cursor while events are appended switch from the store backlog to the
//! live hub with no gap and no duplicate; the hub goes with its last
//! subscriber.

mod common;

use std::time::{Duration, Instant};

use common::{ALICE, Opts, TestServer};
use edward_core::{Fence, NewEvent, Notifier, RunId, RunStatus, RunStore};
use edward_http::HttpConfig;

async fn append(s: &TestServer, run: RunId, n: usize) -> u64 {
    let evs = (0..n)
        .map(|i| NewEvent::new("bench", serde_json::json!({ "i": i })))
        .collect();
    let done = s
        .mem
        .store
        .append_events(run, Fence(1), evs)
        .await
        .expect("append");
    let seq = done.last().map_or(0, |e| e.seq);
    s.mem
        .notifier
        .notify_events(run, seq)
        .await
        .expect("notify");
    seq
}

async fn finish(s: &TestServer, run: RunId) -> u64 {
    let done = s
        .mem
        .store
        .finish_run(
            run,
            Some(Fence(1)),
            RunStatus::Completed,
            "done",
            vec![NewEvent::new(
                "run_finished",
                serde_json::json!({ "status": "completed" }),
            )],
        )
        .await
        .expect("finish");
    let seq = done.last().map_or(0, |e| e.seq);
    s.mem
        .notifier
        .notify_events(run, seq)
        .await
        .expect("notify");
    seq
}

async fn metric(s: &TestServer, name: &str) -> f64 {
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_joining_during_appends_switch_from_backlog_to_live_without_gap_or_duplicate() {
    // A tiny ring, so joins land before, inside and after it and fast
    // appends overrun slow readers.
    let s = TestServer::start(Opts {
        worker: false,
        http: HttpConfig::default().rate_limit(None).sse_hub_ring(4),
        ..Opts::default()
    })
    .await;
    let run = s.submit(ALICE, "appended by the test").await;
    s.mem.store.start_run(run, Fence(1)).await.expect("start");

    let mut readers = Vec::new();
    let mut last = 1;
    for round in 0..40u64 {
        last = append(&s, run, 1 + (round % 3) as usize).await;
        // Join at the start, a little behind the live end, and at it.
        for after in [0, last.saturating_sub(3 + round % 7), last] {
            let sse = s.sse(run, ALICE, &format!("?after={after}"), None).await;
            readers.push((
                after,
                tokio::spawn(async move {
                    let mut sse = sse;
                    sse.collect_events()
                        .await
                        .iter()
                        .map(|f| f.seq().expect("id"))
                        .collect::<Vec<u64>>()
                }),
            ));
        }
        if round % 5 == 0 {
            tokio::task::yield_now().await;
        }
    }
    // One more batch after every join, then the end.
    append(&s, run, 50).await;
    let end = finish(&s, run).await;
    assert!(end > last);
    for (after, reader) in readers {
        let seqs = reader.await.expect("reader");
        assert_eq!(
            seqs,
            ((after + 1)..=end).collect::<Vec<_>>(),
            "joined after {after}: every later seq exactly once, in order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_tail_goes_with_its_last_subscriber() {
    let s = TestServer::start(Opts {
        worker: false,
        // Heartbeats make the server notice closed connections quickly.
        http: HttpConfig::default()
            .rate_limit(None)
            .heartbeat(Duration::from_millis(50)),
        ..Opts::default()
    })
    .await;
    let run = s.submit(ALICE, "watched").await;
    s.mem.store.start_run(run, Fence(1)).await.expect("start");
    let mut a = s.sse(run, ALICE, "", None).await;
    let mut b = s.sse(run, ALICE, "?after=1", None).await;
    append(&s, run, 1).await;
    for sse in [&mut a, &mut b] {
        loop {
            let f = sse.next_within(Duration::from_secs(5)).await.expect("open");
            if f.seq() == Some(2) {
                break;
            }
        }
    }
    assert_eq!(metric(&s, "edward_sse_subscribers").await, 2.0);
    assert_eq!(
        metric(&s, "edward_sse_hubs").await,
        1.0,
        "two subscribers of one run share one tail"
    );
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&s, "edward_sse_hubs").await != 0.0 {
        assert!(
            Instant::now() < deadline,
            "the hub outlived its subscribers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&s, "edward_sse_subscribers").await, 0.0);
    // A new subscriber gets a new tail and everything after its cursor.
    let mut c = s.sse(run, ALICE, "?after=1", None).await;
    append(&s, run, 2).await;
    let end = finish(&s, run).await;
    let seqs: Vec<u64> = c
        .collect_events()
        .await
        .iter()
        .map(|f| f.seq().expect("id"))
        .collect();
    assert_eq!(seqs, (2..=end).collect::<Vec<_>>());
}

//! Concurrency: many runs on one engine, admission under concurrent submits,
//! tailers joining mid-run.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use edward::core::AdmissionLimits;
use edward::core::engine::{Budgets, EngineConfig, RunRequest, SubmitError};
use edward::core::scripted::ScriptedModel;
use edward::core::{AdmissionError, RunId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_runs_all_finish_with_gap_free_logs() {
    let model = ScriptedModel::demo().with_delay(Duration::ZERO);
    let mut h = Harness::with(|b| {
        b.model_client(Arc::new(model))
            .admission_limits(AdmissionLimits {
                global: 100,
                per_user: 100,
                per_chat: 1,
            })
    });
    h.start_worker(25, Duration::from_secs(10));
    h.start_worker(25, Duration::from_secs(10));
    let ids: Vec<RunId> = futures::future::join_all((0..50).map(|i| {
        h.engine.submit(RunRequest::new(
            "load",
            format!("chat-{i}"),
            "build a todo app",
        ))
    }))
    .await
    .into_iter()
    .map(|r| r.expect("admitted"))
    .collect();
    let logs = futures::future::join_all(ids.iter().map(|id| collect(&h.engine, *id))).await;
    for (id, events) in ids.iter().zip(&logs) {
        assert_log_ok(events);
        assert_eq!(terminal(events)["status"], "completed", "run {id}");
        assert_eq!(kinds(events, "file_written").len(), 3);
        assert!(h.workspace(*id).await.join("app.js").exists());
    }
    h.shutdown().await;
}

async fn concurrent_submits(
    h: &Harness,
    n: usize,
    req: impl Fn(usize) -> RunRequest,
) -> (usize, Vec<AdmissionError>) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let engine = h.engine.clone();
            let r = req(i);
            tokio::spawn(async move { engine.submit(r).await })
        })
        .collect();
    let mut admitted = 0;
    let mut rejected = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(SubmitError::Rejected(e)) => rejected.push(e),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    (admitted, rejected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_admits_exactly_the_limit_under_200_concurrent_submits() {
    let limits = AdmissionLimits {
        global: 7,
        per_user: 2,
        per_chat: 1,
    };
    // No worker: admitted runs stay active.
    let h = Harness::with(|b| b.admission_limits(limits));
    let (ok, rej) = concurrent_submits(&h, 200, |i| {
        RunRequest::new("same-user", format!("chat-{i}"), "p")
    })
    .await;
    assert_eq!(ok, 2);
    assert_eq!(rej.len(), 198);
    assert!(
        rej.iter()
            .all(|e| *e == AdmissionError::UserLimit { limit: 2 })
    );

    // A chat belongs to its user: 200 users' chats named "same-chat" are
    // 200 chats, so only the global limit of 7 binds (2 active so far).
    let (ok, rej) = concurrent_submits(&h, 200, |i| {
        RunRequest::new(format!("u-{i}"), "same-chat", "p")
    })
    .await;
    assert_eq!(ok, 5);
    assert!(
        rej.iter()
            .all(|e| *e == AdmissionError::GlobalLimit { limit: 7 })
    );
    // (One user's chat admits one run: tests/chats.rs, 200 concurrent
    // submits per double-texting policy.)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailer_started_mid_run_sees_every_seq_once_in_order() {
    let model = ScriptedModel::new([
        format!(
            "{}<edward_sandbox><file path=\"a.txt\">a</file></edward_sandbox>",
            "text ".repeat(400)
        ),
        format!("{}<edward_done/>", "more ".repeat(400)),
    ])
    .with_chunk_bytes(16)
    .with_delay(Duration::from_millis(3));
    let mut h = Harness::new(model, EngineConfig::default(), Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    // Wait (by tailing) until the run is well under way.
    let mut first = h.engine.raw_events(id, 0);
    let mut mid = 0;
    while let Some(e) = first.next().await {
        let e = e.unwrap();
        if e.kind == "file_written" {
            mid = e.seq;
            break;
        }
    }
    assert!(mid > 0);
    let from_start = tokio::spawn(collect_after_owned(h.engine.clone(), id, 0));
    let from_mid = tokio::spawn(collect_after_owned(h.engine.clone(), id, mid));
    let all = from_start.await.unwrap();
    let tail = from_mid.await.unwrap();
    assert_log_ok(&all);
    assert!(!tail.is_empty());
    for (i, e) in tail.iter().enumerate() {
        assert_eq!(e.seq, mid + 1 + i as u64);
    }
    assert!(tail.last().unwrap().is_terminal());
    assert_eq!(&all[mid as usize..], &tail[..]);
    h.shutdown().await;
}

async fn collect_after_owned(
    engine: edward::core::engine::Engine,
    id: RunId,
    after: u64,
) -> Vec<edward::core::RunEvent> {
    collect_after(&engine, id, after).await
}

//! Conformance suite for [`RunStore`] adapters.
//!
//! Every check admits runs for fresh users and chats and finishes them before
//! returning (see the [module docs](super) on shared backends). A check that
//! needs concurrency takes an `Arc<dyn RunStore>` to spawn tasks.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde_json::json;

use super::{unique, within};
use crate::{
    AdmissionError, AdmissionLimits, AdmitError, Checkpoint, EffectState, Fence, NewEvent, NewRun,
    RUN_FINISHED, Run, RunFilter, RunId, RunStatus, RunStore, StoreError,
};

/// Limits that never reject.
pub const NO_LIMITS: AdmissionLimits = AdmissionLimits {
    global: u32::MAX,
    per_user: u32::MAX,
    per_chat: u32::MAX,
};

/// Large enough to see every run a check created in `list_runs` of a shared store.
const LIST_ALL: usize = 1_000_000;

/// A `NewRun` with a fresh id for `user_id` in `chat_id`.
pub fn new_run(user_id: &str, chat_id: &str) -> NewRun {
    let id = RunId::new();
    NewRun {
        id,
        user_id: user_id.to_owned(),
        chat_id: chat_id.to_owned(),
        request: json!({ "prompt": "conformance", "run": id.to_string() }),
        first_event: NewEvent::new("run_queued", json!({ "run": id.to_string() })),
    }
}

/// An event of kind `kind` whose payload carries `n`.
pub fn event(kind: &str, n: u64) -> NewEvent {
    NewEvent::new(kind, json!({ "n": n }))
}

/// A `run_finished` event.
pub fn finished_event(status: RunStatus) -> NewEvent {
    NewEvent::new(RUN_FINISHED, json!({ "status": status.as_str() }))
}

/// Admit a run for a fresh user and chat without limits.
pub async fn admit_fresh<S: RunStore + ?Sized>(store: &S) -> Run {
    store
        .admit(new_run(&unique("user"), &unique("chat")), NO_LIMITS)
        .await
        .expect("admit without limits")
}

/// Finish `run_id` out of band (cancelled) unless it already is finished:
/// so a check's runs stop counting against admission limits.
pub async fn cleanup<S: RunStore + ?Sized>(store: &S, run_ids: &[RunId]) {
    for &run_id in run_ids {
        match store
            .finish_run(
                run_id,
                None,
                RunStatus::Cancelled,
                "conformance cleanup",
                vec![finished_event(RunStatus::Cancelled)],
            )
            .await
        {
            Ok(_) | Err(StoreError::Finished { .. }) => {}
            Err(e) => panic!("cleanup of run {run_id} failed: {e}"),
        }
    }
}

/// All events of `run_id`.
pub async fn all_events<S: RunStore + ?Sized>(store: &S, run_id: RunId) -> Vec<crate::RunEvent> {
    store
        .events_after(run_id, 0, 1_000_000)
        .await
        .expect("events_after")
}

fn assert_seqs_gap_free(events: &[crate::RunEvent]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "seqs must be 1, 2, 3 … without gaps");
    }
}

/// Admit inserts the run `queued`, fence 0, with `first_event` as seq 1.
pub async fn check_admit_inserts_queued_with_first_event<S: RunStore + ?Sized>(store: &S) {
    let new = new_run(&unique("user"), &unique("chat"));
    let run = store.admit(new.clone(), NO_LIMITS).await.expect("admit");
    assert_eq!(run.id, new.id);
    assert_eq!(run.user_id, new.user_id);
    assert_eq!(run.chat_id, new.chat_id);
    assert_eq!(run.request, new.request);
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.fence, Fence(0));
    assert_eq!(run.last_seq, 1);
    assert!(run.finished_at.is_none());
    assert!(run.terminal_reason.is_none());

    let got = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("run exists");
    assert_eq!(got.id, run.id);
    assert_eq!(got.status, RunStatus::Queued);
    assert_eq!(got.last_seq, 1);
    assert_eq!(got.request, new.request);

    let events = all_events(store, run.id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].seq, 1);
    assert_eq!(events[0].run_id, run.id);
    assert_eq!(events[0].kind, new.first_event.kind);
    assert_eq!(events[0].payload, new.first_event.payload);

    match store.admit(new.clone(), NO_LIMITS).await {
        Err(AdmitError::Store(StoreError::AlreadyExists { run_id })) => {
            assert_eq!(run_id, new.id)
        }
        other => panic!("a second admit of the same id must be AlreadyExists, got {other:?}"),
    }
    assert_eq!(all_events(store, run.id).await.len(), 1);
    cleanup(store, &[run.id]).await;
}

fn expect_rejected(result: Result<Run, AdmitError>, expected: AdmissionError) {
    match result {
        Err(AdmitError::Rejected(e)) => assert_eq!(e, expected),
        Ok(run) => panic!("expected {expected:?}, but run {} was admitted", run.id),
        Err(e) => panic!("expected {expected:?}, got {e:?}"),
    }
}

/// Limits per chat, per user and global are enforced with typed errors,
/// checked in that order; rejected runs are not inserted; finished runs no
/// longer count.
pub async fn check_admission_limits<S: RunStore + ?Sized>(store: &S) {
    let (user, chat) = (unique("user"), unique("chat"));
    let ones = AdmissionLimits {
        global: u32::MAX,
        per_user: 1,
        per_chat: 1,
    };
    let first = store
        .admit(new_run(&user, &chat), ones)
        .await
        .expect("first admit");

    // Same user, same chat: the chat limit is checked first.
    let same_chat = new_run(&user, &chat);
    let same_chat_id = same_chat.id;
    expect_rejected(
        store.admit(same_chat, ones).await,
        AdmissionError::ChatLimit { limit: 1 },
    );
    assert!(
        store
            .get_run(same_chat_id)
            .await
            .expect("get_run")
            .is_none(),
        "a rejected run must not be inserted"
    );

    // Same user, another chat: the user limit.
    expect_rejected(
        store.admit(new_run(&user, &unique("chat")), ones).await,
        AdmissionError::UserLimit { limit: 1 },
    );

    // Another user and chat: only the global limit applies. `first` is
    // active, so a global limit of 1 is hit whatever else the store holds.
    let global_one = AdmissionLimits {
        global: 1,
        per_user: 1,
        per_chat: 1,
    };
    let other = new_run(&unique("user"), &unique("chat"));
    let other_id = other.id;
    expect_rejected(
        store.admit(other, global_one).await,
        AdmissionError::GlobalLimit { limit: 1 },
    );
    assert!(store.get_run(other_id).await.expect("get_run").is_none());
    expect_rejected(
        store
            .admit(
                new_run(&unique("user"), &unique("chat")),
                AdmissionLimits {
                    global: 0,
                    per_user: 5,
                    per_chat: 5,
                },
            )
            .await,
        AdmissionError::GlobalLimit { limit: 0 },
    );

    // A running run still counts.
    store
        .start_run(first.id, Fence(1))
        .await
        .expect("start_run");
    expect_rejected(
        store.admit(new_run(&user, &unique("chat")), ones).await,
        AdmissionError::UserLimit { limit: 1 },
    );

    // A finished run does not.
    store
        .finish_run(
            first.id,
            Some(Fence(1)),
            RunStatus::Completed,
            "done",
            vec![finished_event(RunStatus::Completed)],
        )
        .await
        .expect("finish_run");
    let again = store
        .admit(new_run(&user, &chat), ones)
        .await
        .expect("admit after the first run finished");
    cleanup(store, &[again.id]).await;
}

/// 200 concurrent admits for one user with `per_user = 2` admit exactly 2;
/// the rest get `UserLimit { limit: 2 }`. Retryable backend errors (e.g. a
/// serialization conflict) are retried, as a caller would.
pub async fn check_concurrent_admits_respect_user_limit(store: Arc<dyn RunStore>) {
    const SUBMITS: usize = 200;
    let user = unique("user");
    let limits = AdmissionLimits {
        global: u32::MAX,
        per_user: 2,
        per_chat: u32::MAX,
    };
    let mut tasks = Vec::with_capacity(SUBMITS);
    for _ in 0..SUBMITS {
        let store = Arc::clone(&store);
        let new = new_run(&user, &unique("chat"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                match store.admit(new.clone(), limits).await {
                    Err(AdmitError::Store(e)) if e.is_retryable() => tokio::task::yield_now().await,
                    other => return other,
                }
            }
            panic!("admit kept failing with retryable errors");
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        match within("a concurrent admit", task)
            .await
            .expect("admit task")
        {
            Ok(run) => admitted.push(run.id),
            Err(AdmitError::Rejected(AdmissionError::UserLimit { limit: 2 })) => {}
            Err(e) => panic!("unexpected admit result: {e:?}"),
        }
    }
    assert_eq!(
        admitted.len(),
        2,
        "exactly per_user runs may be admitted concurrently"
    );
    cleanup(&*store, &admitted).await;
}

/// `start_run` sets `running` and the fence; an older fence is `StaleFence`,
/// an equal or newer one is accepted; a finished run gives `Finished`.
pub async fn check_start_run_fences<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    let started = store.start_run(run.id, Fence(10)).await.expect("start_run");
    assert_eq!(started.status, RunStatus::Running);
    assert_eq!(started.fence, Fence(10));
    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.status, RunStatus::Running);
    assert_eq!(stored.fence, Fence(10));

    // Same fence again (a resumed worker) is fine; a newer one takes over.
    store
        .start_run(run.id, Fence(10))
        .await
        .expect("same fence");
    let taken = store
        .start_run(run.id, Fence(20))
        .await
        .expect("newer fence");
    assert_eq!(taken.fence, Fence(20));

    match store.start_run(run.id, Fence(15)).await {
        Err(StoreError::StaleFence {
            run_id,
            given,
            current,
        }) => {
            assert_eq!(run_id, run.id);
            assert_eq!(given, Fence(15));
            assert_eq!(current, Fence(20));
        }
        other => panic!("an older fence must be StaleFence, got {other:?}"),
    }
    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.fence, Fence(20), "a stale start changes nothing");

    cleanup(store, &[run.id]).await;
    assert!(matches!(
        store.start_run(run.id, Fence(30)).await,
        Err(StoreError::Finished { .. })
    ));
}

/// Many batches get gap-free seqs in order; `last_seq` follows.
pub async fn check_append_gap_free<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(1)).await.expect("start_run");
    let mut expected_seq = 2;
    let mut n = 0;
    for batch in 0..40u64 {
        let size = batch % 5; // includes empty batches
        let events: Vec<_> = (0..size)
            .map(|_| {
                n += 1;
                event("text_delta", n)
            })
            .collect();
        let persisted = store
            .append_events(run.id, Fence(1), events)
            .await
            .expect("append_events");
        assert_eq!(persisted.len() as u64, size);
        for e in &persisted {
            assert_eq!(e.seq, expected_seq);
            assert_eq!(e.run_id, run.id);
            assert_eq!(e.kind, "text_delta");
            expected_seq += 1;
        }
    }
    let events = all_events(store, run.id).await;
    assert_eq!(events.len() as u64, n + 1);
    assert_seqs_gap_free(&events);
    for (i, e) in events.iter().skip(1).enumerate() {
        assert_eq!(e.payload, json!({ "n": i as u64 + 1 }), "order is kept");
    }
    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.last_seq, n + 1);
    cleanup(store, &[run.id]).await;
}

/// Concurrent appenders with the same fence: every seq 1..=N exactly once,
/// each appender's events in its own order.
pub async fn check_concurrent_appends_gap_free(store: Arc<dyn RunStore>) {
    const TASKS: u64 = 10;
    const BATCHES: u64 = 20;
    const PER_BATCH: u64 = 3;
    let run = admit_fresh(&*store).await;
    store.start_run(run.id, Fence(1)).await.expect("start_run");
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            for batch in 0..BATCHES {
                let events: Vec<NewEvent> = (0..PER_BATCH)
                    .map(|i| {
                        NewEvent::new(
                            "text_delta",
                            json!({ "task": task, "i": batch * PER_BATCH + i }),
                        )
                    })
                    .collect();
                let mut attempts = 0;
                loop {
                    match store.append_events(run.id, Fence(1), events.clone()).await {
                        Ok(persisted) => {
                            assert_eq!(persisted.len() as u64, PER_BATCH);
                            for pair in persisted.windows(2) {
                                assert_eq!(pair[1].seq, pair[0].seq + 1, "a batch is contiguous");
                            }
                            break;
                        }
                        Err(e) if e.is_retryable() && attempts < 50 => attempts += 1,
                        Err(e) => panic!("append_events: {e}"),
                    }
                }
            }
        }));
    }
    for task in tasks {
        within("a concurrent appender", task)
            .await
            .expect("append task");
    }
    let events = all_events(&*store, run.id).await;
    assert_eq!(events.len() as u64, 1 + TASKS * BATCHES * PER_BATCH);
    assert_seqs_gap_free(&events);
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    for e in events.iter().skip(1) {
        let task = e.payload["task"].as_u64().expect("task");
        let i = e.payload["i"].as_u64().expect("i");
        let want = next.entry(task).or_insert(0);
        assert_eq!(i, *want, "task {task}'s events out of order");
        *want += 1;
    }
    cleanup(&*store, &[run.id]).await;
}

/// An append with a fence older than the run's is `StaleFence` and writes
/// nothing; unknown runs are `NotFound`.
pub async fn check_stale_fence_append_rejected<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(5)).await.expect("start_run");
    store
        .append_events(run.id, Fence(5), vec![event("a", 1)])
        .await
        .expect("append with the current fence");
    store.start_run(run.id, Fence(6)).await.expect("take over");
    match store
        .append_events(run.id, Fence(5), vec![event("a", 2), event("a", 3)])
        .await
    {
        Err(StoreError::StaleFence { given, current, .. }) => {
            assert_eq!(given, Fence(5));
            assert_eq!(current, Fence(6));
        }
        other => panic!("a stale append must be StaleFence, got {other:?}"),
    }
    let events = all_events(store, run.id).await;
    assert_eq!(events.len(), 2, "a stale append writes nothing");
    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.last_seq, 2);
    // The new owner continues at seq 3.
    let persisted = store
        .append_events(run.id, Fence(6), vec![event("a", 4)])
        .await
        .expect("append with the new fence");
    assert_eq!(persisted[0].seq, 3);

    assert!(matches!(
        store
            .append_events(RunId::new(), Fence(1), vec![event("a", 1)])
            .await,
        Err(StoreError::NotFound { .. })
    ));
    cleanup(store, &[run.id]).await;
}

/// `finish_run` sets the terminal status and appends its events once: the
/// terminal event is last, appends after it are `Finished`, and so is a
/// second finish. A stale fence cannot finish; a non-terminal status is
/// `InvalidTransition`.
pub async fn check_finish_run_exactly_once<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(3)).await.expect("start_run");
    store
        .append_events(run.id, Fence(3), vec![event("a", 1), event("a", 2)])
        .await
        .expect("append");

    match store
        .finish_run(
            run.id,
            Some(Fence(3)),
            RunStatus::Running,
            "not terminal",
            vec![finished_event(RunStatus::Running)],
        )
        .await
    {
        Err(StoreError::InvalidTransition { to, .. }) => assert_eq!(to, RunStatus::Running),
        other => panic!("finishing with a non-terminal status must fail, got {other:?}"),
    }
    store.start_run(run.id, Fence(4)).await.expect("take over");
    assert!(
        matches!(
            store
                .finish_run(
                    run.id,
                    Some(Fence(3)),
                    RunStatus::Failed,
                    "stale",
                    vec![finished_event(RunStatus::Failed)],
                )
                .await,
            Err(StoreError::StaleFence { .. })
        ),
        "a stale fence cannot finish the run"
    );
    assert_eq!(
        store
            .get_run(run.id)
            .await
            .expect("get_run")
            .expect("exists")
            .status,
        RunStatus::Running
    );

    let persisted = store
        .finish_run(
            run.id,
            Some(Fence(4)),
            RunStatus::Completed,
            "model said done",
            vec![event("summary", 9), finished_event(RunStatus::Completed)],
        )
        .await
        .expect("finish_run");
    assert_eq!(persisted.len(), 2);
    assert_eq!(persisted[0].seq, 4);
    assert_eq!(persisted[1].seq, 5);
    assert_eq!(persisted[1].kind, RUN_FINISHED);

    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.status, RunStatus::Completed);
    assert_eq!(stored.last_seq, 5);
    assert!(stored.finished_at.is_some());
    assert_eq!(stored.terminal_reason.as_deref(), Some("model said done"));

    assert!(matches!(
        store
            .append_events(run.id, Fence(4), vec![event("late", 1)])
            .await,
        Err(StoreError::Finished { .. })
    ));
    for fence in [Some(Fence(4)), None] {
        assert!(
            matches!(
                store
                    .finish_run(
                        run.id,
                        fence,
                        RunStatus::Failed,
                        "again",
                        vec![finished_event(RunStatus::Failed)],
                    )
                    .await,
                Err(StoreError::Finished { .. })
            ),
            "a second finish (fence {fence:?}) must be Finished"
        );
    }
    let events = all_events(store, run.id).await;
    assert_eq!(
        events.len(),
        5,
        "nothing is appended after the terminal event"
    );
    assert_seqs_gap_free(&events);
    assert_eq!(events.iter().filter(|e| e.is_terminal()).count(), 1);
    assert!(events.last().expect("events").is_terminal());
    let stored = store
        .get_run(run.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.status, RunStatus::Completed, "the first finish wins");
}

/// Concurrent finishes of one run: exactly one succeeds, the others get
/// `Finished`, and there is exactly one terminal event.
pub async fn check_concurrent_finish_exactly_once(store: Arc<dyn RunStore>) {
    let run = admit_fresh(&*store).await;
    store.start_run(run.id, Fence(1)).await.expect("start_run");
    let mut tasks = Vec::new();
    for i in 0..10u32 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let (fence, status) = if i % 2 == 0 {
                (Some(Fence(1)), RunStatus::Completed)
            } else {
                (None, RunStatus::Cancelled)
            };
            loop {
                match store
                    .finish_run(run.id, fence, status, "race", vec![finished_event(status)])
                    .await
                {
                    Err(e) if e.is_retryable() => tokio::task::yield_now().await,
                    other => return other,
                }
            }
        }));
    }
    let mut ok = 0;
    for task in tasks {
        match within("a concurrent finish", task)
            .await
            .expect("finish task")
        {
            Ok(_) => ok += 1,
            Err(StoreError::Finished { .. }) => {}
            Err(e) => panic!("unexpected finish result: {e:?}"),
        }
    }
    assert_eq!(ok, 1, "exactly one finish succeeds");
    let events = all_events(&*store, run.id).await;
    assert_eq!(events.len(), 2);
    assert_seqs_gap_free(&events);
    assert_eq!(events.iter().filter(|e| e.is_terminal()).count(), 1);
}

/// `finish_run` with fence `None` (cancel of a queued run, the reaper)
/// succeeds without a fence check, on queued and on running runs.
pub async fn check_finish_without_fence<S: RunStore + ?Sized>(store: &S) {
    let queued = admit_fresh(store).await;
    let persisted = store
        .finish_run(
            queued.id,
            None,
            RunStatus::Cancelled,
            "cancelled by user",
            vec![finished_event(RunStatus::Cancelled)],
        )
        .await
        .expect("finish a queued run out of band");
    assert_eq!(persisted.len(), 1);
    assert_eq!(persisted[0].seq, 2);
    let stored = store
        .get_run(queued.id)
        .await
        .expect("get_run")
        .expect("exists");
    assert_eq!(stored.status, RunStatus::Cancelled);
    assert_eq!(stored.terminal_reason.as_deref(), Some("cancelled by user"));
    let kinds: Vec<_> = all_events(store, queued.id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["run_queued", RUN_FINISHED]);

    let running = admit_fresh(store).await;
    store
        .start_run(running.id, Fence(99))
        .await
        .expect("start_run");
    store
        .finish_run(
            running.id,
            None,
            RunStatus::Failed,
            "lease expired too often",
            vec![finished_event(RunStatus::Failed)],
        )
        .await
        .expect("the reaper finishes a running run regardless of fence");
    assert_eq!(
        store
            .get_run(running.id)
            .await
            .expect("get_run")
            .expect("exists")
            .status,
        RunStatus::Failed
    );
}

/// `events_after` pages in order and honours `limit` (0 gives nothing;
/// `usize::MAX` means no limit, so adapters must clamp it, not overflow).
pub async fn check_events_after_paging<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(1)).await.expect("start_run");
    store
        .append_events(run.id, Fence(1), (2..=25).map(|n| event("e", n)).collect())
        .await
        .expect("append");
    let seqs = |events: Vec<crate::RunEvent>| events.into_iter().map(|e| e.seq).collect::<Vec<_>>();
    let page = |after, limit| store.events_after(run.id, after, limit);
    assert_eq!(
        seqs(page(0, 10).await.expect("page")),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(page(10, 10).await.expect("page")),
        (11..=20).collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(page(20, 10).await.expect("page")),
        (21..=25).collect::<Vec<_>>()
    );
    assert!(page(25, 10).await.expect("page").is_empty());
    assert!(page(1000, 10).await.expect("page").is_empty());
    assert!(page(0, 0).await.expect("page").is_empty());
    assert_eq!(seqs(page(24, usize::MAX).await.expect("page")), vec![25]);
    let one = page(6, 1).await.expect("page");
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].payload, json!({ "n": 7 }));
    cleanup(store, &[run.id]).await;
}

/// A checkpoint round-trips, a later save replaces it, a stale fence cannot
/// overwrite it.
pub async fn check_checkpoint_round_trip<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(2)).await.expect("start_run");
    assert_eq!(store.load_checkpoint(run.id).await.expect("load"), None);
    let first = Checkpoint {
        turn: 1,
        state: json!({ "history": ["a"], "tokens": 10 }),
    };
    store
        .save_checkpoint(run.id, Fence(2), first.clone())
        .await
        .expect("save");
    assert_eq!(
        store.load_checkpoint(run.id).await.expect("load"),
        Some(first)
    );
    let second = Checkpoint {
        turn: 2,
        state: json!({ "history": ["a", "b"], "tokens": 25 }),
    };
    store
        .save_checkpoint(run.id, Fence(2), second.clone())
        .await
        .expect("save");
    assert_eq!(
        store.load_checkpoint(run.id).await.expect("load"),
        Some(second.clone())
    );
    store.start_run(run.id, Fence(3)).await.expect("take over");
    assert!(matches!(
        store
            .save_checkpoint(
                run.id,
                Fence(2),
                Checkpoint {
                    turn: 3,
                    state: json!({}),
                },
            )
            .await,
        Err(StoreError::StaleFence { .. })
    ));
    assert_eq!(
        store.load_checkpoint(run.id).await.expect("load"),
        Some(second),
        "a stale save changes nothing"
    );
    cleanup(store, &[run.id]).await;
}

/// `begin_effect` / `complete_effect`: a new key starts with one attempt, a
/// re-begin bumps attempts, a completed effect is returned with its result
/// and not restarted; keys are per run; a stale fence is refused.
pub async fn check_effects<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    store.start_run(run.id, Fence(1)).await.expect("start_run");
    let key = "t1/0/command";
    let request = json!({ "program": "echo", "args": ["hi"] });

    let first = store
        .begin_effect(run.id, Fence(1), key, request.clone())
        .await
        .expect("begin");
    assert_eq!(first.key, key);
    assert_eq!(first.state, EffectState::Started);
    assert_eq!(first.attempts, 1);
    assert_eq!(first.request, request);
    assert_eq!(first.result, None);

    // A resumed worker (newer fence) begins it again: interrupted, attempt 2.
    store.start_run(run.id, Fence(2)).await.expect("take over");
    let second = store
        .begin_effect(run.id, Fence(2), key, request.clone())
        .await
        .expect("begin again");
    assert_eq!(second.state, EffectState::Started);
    assert_eq!(second.attempts, 2);

    assert!(matches!(
        store
            .begin_effect(run.id, Fence(1), "t1/1/command", json!({}))
            .await,
        Err(StoreError::StaleFence { .. })
    ));
    assert!(matches!(
        store
            .complete_effect(run.id, Fence(1), key, json!({ "exit_code": 1 }))
            .await,
        Err(StoreError::StaleFence { .. })
    ));

    let result = json!({ "exit_code": 0, "stdout": "hi\n" });
    store
        .complete_effect(run.id, Fence(2), key, result.clone())
        .await
        .expect("complete");
    let done = store
        .begin_effect(run.id, Fence(2), key, request.clone())
        .await
        .expect("begin after completion");
    assert_eq!(done.state, EffectState::Completed);
    assert_eq!(done.result, Some(result));
    assert_eq!(done.attempts, 2, "a completed effect is not restarted");
    assert_eq!(done.request, request);

    let other = admit_fresh(store).await;
    store
        .start_run(other.id, Fence(1))
        .await
        .expect("start_run");
    let fresh = store
        .begin_effect(other.id, Fence(1), key, json!({}))
        .await
        .expect("same key, other run");
    assert_eq!(fresh.attempts, 1, "effect keys are per run");
    assert_eq!(fresh.state, EffectState::Started);
    cleanup(store, &[run.id, other.id]).await;
}

/// Unknown runs: `get_run` is `None`, writes are `NotFound`.
pub async fn check_unknown_run<S: RunStore + ?Sized>(store: &S) {
    let missing = RunId::new();
    assert!(store.get_run(missing).await.expect("get_run").is_none());
    let not_found = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::NotFound { run_id }) => assert_eq!(run_id, missing),
        other => panic!("{what} of an unknown run must be NotFound, got {other:?}"),
    };
    not_found(
        store.start_run(missing, Fence(1)).await.map(drop),
        "start_run",
    );
    not_found(
        store
            .append_events(missing, Fence(1), vec![event("a", 1)])
            .await
            .map(drop),
        "append_events",
    );
    not_found(
        store
            .finish_run(
                missing,
                None,
                RunStatus::Cancelled,
                "x",
                vec![finished_event(RunStatus::Cancelled)],
            )
            .await
            .map(drop),
        "finish_run",
    );
    not_found(
        store
            .save_checkpoint(
                missing,
                Fence(1),
                Checkpoint {
                    turn: 0,
                    state: json!({}),
                },
            )
            .await,
        "save_checkpoint",
    );
    not_found(
        store
            .begin_effect(missing, Fence(1), "k", json!({}))
            .await
            .map(drop),
        "begin_effect",
    );
    // Reads of an unknown run may be empty or NotFound.
    match store.events_after(missing, 0, 10).await {
        Ok(events) => assert!(events.is_empty()),
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => panic!("events_after of an unknown run: {e:?}"),
    }
    match store.load_checkpoint(missing).await {
        Ok(checkpoint) => assert!(checkpoint.is_none()),
        Err(StoreError::NotFound { .. }) => {}
        Err(e) => panic!("load_checkpoint of an unknown run: {e:?}"),
    }
}

/// `list_runs` returns runs by status, oldest first, honouring `limit`, and
/// follows status changes.
pub async fn check_list_runs_by_status<S: RunStore + ?Sized>(store: &S) {
    let queued_a = admit_fresh(store).await;
    let queued_b = admit_fresh(store).await;
    let running = admit_fresh(store).await;
    store
        .start_run(running.id, Fence(1))
        .await
        .expect("start_run");
    let completed = admit_fresh(store).await;
    store
        .finish_run(
            completed.id,
            None,
            RunStatus::Completed,
            "done",
            vec![finished_event(RunStatus::Completed)],
        )
        .await
        .expect("finish");

    let ids = |runs: Vec<Run>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let list = |status| store.list_runs(status, LIST_ALL);
    let queued = ids(list(RunStatus::Queued).await.expect("list"));
    let pos = |id| queued.iter().position(|&x| x == id);
    let (a, b) = (pos(queued_a.id), pos(queued_b.id));
    assert!(a.is_some() && b.is_some(), "both queued runs are listed");
    assert!(a < b, "oldest first");
    assert!(!queued.contains(&running.id) && !queued.contains(&completed.id));
    let running_ids = ids(list(RunStatus::Running).await.expect("list"));
    assert!(running_ids.contains(&running.id));
    assert!(!running_ids.contains(&queued_a.id));
    let completed_ids = ids(list(RunStatus::Completed).await.expect("list"));
    assert!(completed_ids.contains(&completed.id));
    assert!(!completed_ids.contains(&running.id));
    for run in store
        .list_runs(RunStatus::Running, LIST_ALL)
        .await
        .expect("list")
    {
        assert_eq!(run.status, RunStatus::Running);
    }
    assert_eq!(
        store
            .list_runs(RunStatus::Queued, 1)
            .await
            .expect("list")
            .len(),
        1,
        "limit is honoured"
    );
    assert!(
        store
            .list_runs(RunStatus::Queued, 0)
            .await
            .expect("list")
            .is_empty()
    );

    cleanup(store, &[queued_a.id, queued_b.id, running.id]).await;
    let queued: HashSet<_> = ids(list(RunStatus::Queued).await.expect("list"))
        .into_iter()
        .collect();
    assert!(
        !queued.contains(&queued_a.id),
        "a finished run leaves the queued list"
    );
    let cancelled = ids(list(RunStatus::Cancelled).await.expect("list"));
    assert!(cancelled.contains(&queued_a.id) && cancelled.contains(&running.id));
}

/// `request_cancel` is durable and idempotent: the first call on an active run
/// records the time and appends its event with the next seq; a second call,
/// and a call on a finished run, append nothing; the fence of a worker that
/// started the run still appends after it, gap-free.
pub async fn check_request_cancel_idempotent<S: RunStore + ?Sized>(store: &S) {
    let run = admit_fresh(store).await;
    assert!(run.cancel_requested_at.is_none());
    let started = store.start_run(run.id, Fence(1)).await.expect("start");
    assert!(started.cancel_requested_at.is_none());

    let first = store
        .request_cancel(run.id, event("cancel_requested", 1))
        .await
        .expect("first request");
    assert!(first.cancel_requested_at.is_some());
    assert_eq!(
        first.status,
        RunStatus::Running,
        "a request does not finish"
    );
    assert_eq!(first.last_seq, 2);
    let again = store
        .request_cancel(run.id, event("cancel_requested", 2))
        .await
        .expect("second request");
    assert_eq!(again.last_seq, 2, "a repeated request appends nothing");
    assert_eq!(again.cancel_requested_at, first.cancel_requested_at);
    let reread = store.get_run(run.id).await.expect("get").expect("exists");
    assert_eq!(reread.cancel_requested_at, first.cancel_requested_at);

    let appended = store
        .append_events(run.id, Fence(1), vec![event("after", 3)])
        .await
        .expect("the worker still appends");
    assert_eq!(appended[0].seq, 3);
    let kinds: Vec<String> = all_events(store, run.id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["run_queued", "cancel_requested", "after"]);

    cleanup(store, &[run.id]).await;
    let finished = store
        .request_cancel(run.id, event("cancel_requested", 4))
        .await
        .expect("request on a finished run");
    assert_eq!(finished.status, RunStatus::Cancelled);
    assert_eq!(
        finished.last_seq, 4,
        "nothing is appended after the terminal event"
    );

    match store
        .request_cancel(RunId::new(), event("cancel_requested", 5))
        .await
    {
        Err(StoreError::NotFound { .. }) => {}
        other => panic!("unknown run: expected NotFound, got {other:?}"),
    }
}

/// `list_user_runs` lists only the user's runs, newest first; pages by the
/// `before` cursor without gaps or repeats; filters by chat and status.
pub async fn check_list_user_runs<S: RunStore + ?Sized>(store: &S) {
    let user = unique("user");
    let other = unique("user");
    let (chat_a, chat_b) = (unique("chat"), unique("chat"));
    let mut ids = Vec::new();
    for i in 0..5 {
        let chat = if i % 2 == 0 { &chat_a } else { &chat_b };
        let run = store
            .admit(new_run(&user, chat), NO_LIMITS)
            .await
            .expect("admit");
        ids.push(run.id);
    }
    let foreign = store
        .admit(new_run(&other, &chat_a), NO_LIMITS)
        .await
        .expect("admit");
    store
        .finish_run(
            ids[0],
            None,
            RunStatus::Completed,
            "done",
            vec![finished_event(RunStatus::Completed)],
        )
        .await
        .expect("finish");

    let list = |filter: RunFilter, before: Option<RunId>, limit: usize| {
        let user = user.clone();
        async move {
            store
                .list_user_runs(&user, &filter, before, limit)
                .await
                .expect("list_user_runs")
                .into_iter()
                .map(|r| {
                    assert_eq!(r.user_id, user, "only the user's runs");
                    r.id
                })
                .collect::<Vec<_>>()
        }
    };
    let newest_first: Vec<RunId> = ids.iter().rev().copied().collect();
    assert_eq!(list(RunFilter::new(), None, 100).await, newest_first);
    assert!(!newest_first.contains(&foreign.id));

    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let page = list(RunFilter::new(), cursor, 2).await;
        assert!(page.len() <= 2, "limit is honoured");
        let Some(&last) = page.last() else { break };
        cursor = Some(last);
        paged.extend(page);
    }
    assert_eq!(paged, newest_first, "pages have no gap and no repeat");

    let in_a = list(RunFilter::new().chat(chat_a.clone()), None, 100).await;
    assert_eq!(in_a, vec![ids[4], ids[2], ids[0]]);
    let completed = list(RunFilter::new().status(RunStatus::Completed), None, 100).await;
    assert_eq!(completed, vec![ids[0]]);
    let queued_a = list(
        RunFilter::new()
            .chat(chat_a.clone())
            .status(RunStatus::Queued),
        None,
        100,
    )
    .await;
    assert_eq!(queued_a, vec![ids[4], ids[2]]);
    assert_eq!(
        list(RunFilter::new().chat(chat_a.clone()), Some(ids[4]), 1).await,
        vec![ids[2]],
        "the cursor and the filter combine"
    );
    assert!(list(RunFilter::new(), None, 0).await.is_empty());
    assert!(
        store
            .list_user_runs(&unique("user"), &RunFilter::new(), None, 10)
            .await
            .expect("list")
            .is_empty()
    );

    let mut all = ids.clone();
    all.push(foreign.id);
    cleanup(store, &all).await;
}

/// Every check of this suite.
pub async fn run_all(store: Arc<dyn RunStore>) {
    check_request_cancel_idempotent(&*store).await;
    check_admit_inserts_queued_with_first_event(&*store).await;
    check_admission_limits(&*store).await;
    check_concurrent_admits_respect_user_limit(Arc::clone(&store)).await;
    check_start_run_fences(&*store).await;
    check_append_gap_free(&*store).await;
    check_concurrent_appends_gap_free(Arc::clone(&store)).await;
    check_stale_fence_append_rejected(&*store).await;
    check_finish_run_exactly_once(&*store).await;
    check_concurrent_finish_exactly_once(Arc::clone(&store)).await;
    check_finish_without_fence(&*store).await;
    check_events_after_paging(&*store).await;
    check_checkpoint_round_trip(&*store).await;
    check_effects(&*store).await;
    check_unknown_run(&*store).await;
    check_list_runs_by_status(&*store).await;
    check_list_user_runs(&*store).await;
    super::chat_store::run_all(Arc::clone(&store)).await;
}

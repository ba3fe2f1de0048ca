//! Conformance suite for [`RunQueue`] adapters.
//!
//! A shared queue may hold jobs this suite did not enqueue. Checks only
//! assert on run ids they enqueued: [`claim_mine`] claims until the queue has
//! nothing ready, keeps the leases of the caller's ids and gives foreign
//! leases back at once (a heartbeat with a zero lease), never acking them.
//! Every job a check enqueues is acked or dead-lettered before it returns.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};

use super::{PROMPT, within};
use crate::{Lease, QueueError, RetryOutcome, RetryPolicy, RunId, RunQueue};

/// The lease checks take when they do not test expiry.
pub const LEASE: Duration = Duration::from_secs(60);

/// At most this many claims per sweep.
const MAX_CLAIMS: usize = 200;

/// Claim until nothing is ready (or 200 claims); return the leases on
/// ids in `mine` in claim order and release every other lease.
pub async fn claim_mine<Q: RunQueue + ?Sized>(
    queue: &Q,
    owner: &str,
    lease_for: Duration,
    mine: &HashSet<RunId>,
) -> Vec<Lease> {
    let mut own = Vec::new();
    let mut foreign = Vec::new();
    for _ in 0..MAX_CLAIMS {
        match within("claim", queue.claim(owner, lease_for)).await {
            Ok(Some(lease)) if mine.contains(&lease.run_id) => own.push(lease),
            Ok(Some(lease)) => foreign.push(lease),
            Ok(None) => break,
            Err(e) => panic!("claim failed: {e}"),
        }
    }
    release_foreign(queue, foreign).await;
    own
}

/// Give foreign leases back: a zero-length heartbeat makes them claimable.
async fn release_foreign<Q: RunQueue + ?Sized>(queue: &Q, leases: Vec<Lease>) {
    for lease in leases {
        let _ = queue.heartbeat(&lease, Duration::ZERO).await;
    }
}

fn ids(ids: &[RunId]) -> HashSet<RunId> {
    ids.iter().copied().collect()
}

fn owner(name: &str) -> String {
    super::unique(name)
}

fn assert_lease_lost(result: Result<(), QueueError>, lease: &Lease, what: &str) {
    match result {
        Err(QueueError::LeaseLost { run_id, fence }) => {
            assert_eq!(run_id, lease.run_id);
            assert_eq!(fence, lease.fence);
        }
        other => panic!("{what} must be LeaseLost, got {other:?}"),
    }
}

async fn enqueue_all<Q: RunQueue + ?Sized>(queue: &Q, runs: &[RunId]) {
    for &run in runs {
        queue.enqueue(run).await.expect("enqueue");
    }
}

async fn ack_all<Q: RunQueue + ?Sized>(queue: &Q, leases: &[Lease]) {
    for lease in leases {
        queue.ack(lease).await.expect("ack");
    }
}

/// Enqueue, claim (attempt 1, the owner, a lease in the future), ack; after
/// the ack the lease is lost and the job is gone.
pub async fn check_enqueue_claim_ack<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    let worker = owner("worker");
    queue.enqueue(run).await.expect("enqueue");
    let before = Utc::now();
    let leases = claim_mine(queue, &worker, LEASE, &ids(&[run])).await;
    assert_eq!(leases.len(), 1, "the enqueued job is claimed once");
    let lease = &leases[0];
    assert_eq!(lease.run_id, run);
    assert_eq!(lease.owner, worker);
    assert_eq!(lease.attempt, 1);
    assert!(
        lease.expires_at > before + TimeDelta::seconds(50),
        "the lease lasts lease_for"
    );

    queue.ack(lease).await.expect("ack");
    assert_lease_lost(queue.ack(lease).await, lease, "a second ack");
    assert_lease_lost(
        queue.heartbeat(lease, LEASE).await.map(drop),
        lease,
        "a heartbeat after ack",
    );
    assert_lease_lost(
        queue
            .retry(lease, "late", RetryPolicy::default())
            .await
            .map(drop),
        lease,
        "a retry after ack",
    );
    assert!(
        claim_mine(queue, &worker, LEASE, &ids(&[run]))
            .await
            .is_empty(),
        "an acked job is gone"
    );
}

/// Jobs are claimed oldest first.
pub async fn check_claim_order<Q: RunQueue + ?Sized>(queue: &Q) {
    let runs = [RunId::new(), RunId::new(), RunId::new()];
    enqueue_all(queue, &runs).await;
    let leases = claim_mine(queue, &owner("worker"), LEASE, &ids(&runs)).await;
    let order: Vec<_> = leases.iter().map(|l| l.run_id).collect();
    assert_eq!(order, runs, "oldest first");
    ack_all(queue, &leases).await;
}

/// A leased job is not claimable again while its lease lasts.
pub async fn check_claim_skips_leased<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    queue.enqueue(run).await.expect("enqueue");
    let leases = claim_mine(queue, &owner("a"), LEASE, &ids(&[run])).await;
    assert_eq!(leases.len(), 1);
    assert!(
        claim_mine(queue, &owner("b"), LEASE, &ids(&[run]))
            .await
            .is_empty(),
        "a held job is not ready"
    );
    ack_all(queue, &leases).await;
}

/// 20 concurrent claimers over 10 jobs: every job is leased exactly once.
pub async fn check_concurrent_claims_exclusive(queue: Arc<dyn RunQueue>) {
    const JOBS: usize = 10;
    const CLAIMERS: usize = 20;
    let runs: Vec<RunId> = (0..JOBS).map(|_| RunId::new()).collect();
    let mine = ids(&runs);
    enqueue_all(&*queue, &runs).await;
    let mut tasks = Vec::new();
    for i in 0..CLAIMERS {
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            let worker = format!("claimer-{i}");
            let mut got = Vec::new();
            for _ in 0..3 {
                match queue.claim(&worker, LEASE).await {
                    Ok(Some(lease)) => got.push(lease),
                    Ok(None) => break,
                    Err(e) => panic!("claim failed: {e}"),
                }
            }
            got
        }));
    }
    let mut own = Vec::new();
    let mut foreign = Vec::new();
    for task in tasks {
        for lease in within("a concurrent claimer", task)
            .await
            .expect("claim task")
        {
            if mine.contains(&lease.run_id) {
                own.push(lease);
            } else {
                foreign.push(lease);
            }
        }
    }
    release_foreign(&*queue, foreign).await;
    // Foreign jobs may have kept claimers busy: collect what is left.
    own.extend(claim_mine(&*queue, "sweeper", LEASE, &mine).await);

    let mut count: HashMap<RunId, usize> = HashMap::new();
    for lease in &own {
        *count.entry(lease.run_id).or_default() += 1;
        assert_eq!(lease.attempt, 1, "each job is claimed once");
    }
    for run in &runs {
        assert_eq!(
            count.get(run),
            Some(&1),
            "job {run} must be leased exactly once"
        );
    }
    ack_all(&*queue, &own).await;
}

/// `claim_many` hands out at most `max` leases per call, oldest first, each
/// job once and every lease with its own fence; four concurrent batch
/// claimers never share a job.
pub async fn check_claim_many(queue: Arc<dyn RunQueue>) {
    let runs: Vec<RunId> = (0..7).map(|_| RunId::new()).collect();
    let mine = ids(&runs);
    enqueue_all(&*queue, &runs).await;
    let who = owner("batch");
    assert!(
        within("claim_many 0", queue.claim_many(&who, LEASE, 0))
            .await
            .expect("claim_many")
            .is_empty(),
        "max 0 claims nothing"
    );
    let mut own = Vec::new();
    let mut foreign = Vec::new();
    for _ in 0..MAX_CLAIMS {
        let got = within("claim_many", queue.claim_many(&who, LEASE, 3))
            .await
            .expect("claim_many");
        assert!(got.len() <= 3, "at most max leases, got {}", got.len());
        if got.is_empty() {
            break;
        }
        for lease in got {
            assert_eq!(lease.owner, who);
            if mine.contains(&lease.run_id) {
                own.push(lease);
            } else {
                foreign.push(lease);
            }
        }
    }
    release_foreign(&*queue, foreign).await;
    let order: Vec<RunId> = own.iter().map(|l| l.run_id).collect();
    assert_eq!(order, runs, "oldest first, each job once");
    let fences: HashSet<_> = own.iter().map(|l| l.fence).collect();
    assert_eq!(fences.len(), own.len(), "every lease has its own fence");
    assert!(
        own.iter()
            .all(|l| l.attempt == 1 && l.expires_at > Utc::now())
    );
    ack_all(&*queue, &own).await;

    const JOBS: usize = 12;
    let runs: Vec<RunId> = (0..JOBS).map(|_| RunId::new()).collect();
    let mine = ids(&runs);
    enqueue_all(&*queue, &runs).await;
    let mut tasks = Vec::new();
    for i in 0..4 {
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            let worker = format!("batch-claimer-{i}");
            let mut got = Vec::new();
            for _ in 0..MAX_CLAIMS {
                match queue.claim_many(&worker, LEASE, 4).await {
                    Ok(leases) if leases.is_empty() => break,
                    Ok(leases) => got.extend(leases),
                    Err(e) => panic!("claim_many failed: {e}"),
                }
            }
            got
        }));
    }
    let mut own = Vec::new();
    let mut foreign = Vec::new();
    for task in tasks {
        for lease in within("a batch claimer", task).await.expect("claim task") {
            if mine.contains(&lease.run_id) {
                own.push(lease);
            } else {
                foreign.push(lease);
            }
        }
    }
    release_foreign(&*queue, foreign).await;
    let mut count: HashMap<RunId, usize> = HashMap::new();
    for lease in &own {
        *count.entry(lease.run_id).or_default() += 1;
    }
    for run in &runs {
        assert_eq!(
            count.get(run),
            Some(&1),
            "job {run} must be leased exactly once"
        );
    }
    ack_all(&*queue, &own).await;
}

/// A heartbeat extends the lease (same fence and attempt): the job stays
/// unclaimable past the original expiry.
pub async fn check_heartbeat_extends<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    queue.enqueue(run).await.expect("enqueue");
    let short = Duration::from_millis(300);
    let leases = claim_mine(queue, &owner("worker"), short, &ids(&[run])).await;
    assert_eq!(leases.len(), 1);
    let lease = &leases[0];
    let extended = queue.heartbeat(lease, LEASE).await.expect("heartbeat");
    assert_eq!(extended.run_id, lease.run_id);
    assert_eq!(extended.owner, lease.owner);
    assert_eq!(extended.fence, lease.fence);
    assert_eq!(extended.attempt, lease.attempt);
    assert!(extended.expires_at > lease.expires_at + TimeDelta::seconds(30));
    // Waiting is the point: time must pass the original expiry.
    tokio::time::sleep(short * 2).await;
    assert!(
        claim_mine(queue, &owner("thief"), LEASE, &ids(&[run]))
            .await
            .is_empty(),
        "a renewed lease is not reclaimable"
    );
    queue
        .heartbeat(&extended, LEASE)
        .await
        .expect("heartbeat again");
    queue.ack(&extended).await.expect("ack");
}

/// An expired lease is reclaimed by another owner with a greater fence and
/// the next attempt; the old lease's heartbeat, ack and retry are `LeaseLost`.
pub async fn check_expired_lease_reclaimed<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    queue.enqueue(run).await.expect("enqueue");
    let short = Duration::from_millis(200);
    let first = claim_mine(queue, &owner("crashed"), short, &ids(&[run])).await;
    assert_eq!(first.len(), 1);
    let old = &first[0];
    // Waiting is the point: the lease must lapse.
    tokio::time::sleep(short * 2).await;
    let taker = owner("taker");
    let second = claim_mine(queue, &taker, LEASE, &ids(&[run])).await;
    assert_eq!(second.len(), 1, "an expired lease is reclaimable");
    let new = &second[0];
    assert_eq!(new.run_id, run);
    assert_eq!(new.owner, taker);
    assert!(new.fence > old.fence, "fences grow across claims");
    assert_eq!(
        new.attempt,
        old.attempt + 1,
        "a take-over is another attempt"
    );

    assert_lease_lost(
        queue.heartbeat(old, LEASE).await.map(drop),
        old,
        "the old lease's heartbeat",
    );
    assert_lease_lost(queue.ack(old).await, old, "the old lease's ack");
    assert_lease_lost(
        queue
            .retry(old, "stale", RetryPolicy::default())
            .await
            .map(drop),
        old,
        "the old lease's retry",
    );
    queue.heartbeat(new, LEASE).await.expect("heartbeat");
    queue.ack(new).await.expect("ack");
}

/// A worker that comes back under the same owner name and reclaims its own
/// expired job gets a new fence; the lease with the old fence is lost.
pub async fn check_same_owner_reclaim_needs_new_fence<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    queue.enqueue(run).await.expect("enqueue");
    let worker = owner("restarted");
    let short = Duration::from_millis(200);
    let first = claim_mine(queue, &worker, short, &ids(&[run])).await;
    assert_eq!(first.len(), 1);
    // Waiting is the point: the lease must lapse.
    tokio::time::sleep(short * 2).await;
    let second = claim_mine(queue, &worker, LEASE, &ids(&[run])).await;
    assert_eq!(second.len(), 1);
    let (old, new) = (&first[0], &second[0]);
    assert_eq!(new.owner, old.owner);
    assert!(new.fence > old.fence);
    assert_lease_lost(
        queue.heartbeat(old, LEASE).await.map(drop),
        old,
        "a heartbeat with the old fence",
    );
    assert_lease_lost(queue.ack(old).await, old, "an ack with the old fence");
    queue.ack(new).await.expect("ack");
}

/// A retry schedules the job in the future with backoff (not claimable at
/// once, then claimable with the next attempt), and releases the lease.
pub async fn check_retry_backoff<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    let mine = ids(&[run]);
    queue.enqueue(run).await.expect("enqueue");
    let worker = owner("worker");
    let leases = claim_mine(queue, &worker, LEASE, &mine).await;
    assert_eq!(leases.len(), 1);
    let first = &leases[0];
    let policy = RetryPolicy {
        max_attempts: 5,
        base_delay_ms: 1500,
        max_delay_ms: 1500,
    };
    let before = Utc::now();
    let at = match queue.retry(first, "first failure", policy).await {
        Ok(RetryOutcome::Scheduled { at }) => at,
        other => panic!("a retry below max_attempts must be Scheduled, got {other:?}"),
    };
    assert!(
        at >= before + TimeDelta::milliseconds(1400),
        "scheduled {at}, only {} after the retry",
        at - before
    );
    assert!(at <= before + TimeDelta::seconds(10), "jitter is small");
    assert_lease_lost(queue.ack(first).await, first, "an ack after retry");
    assert!(
        claim_mine(queue, &worker, LEASE, &mine).await.is_empty(),
        "a retried job is not claimable before its time"
    );

    // Waiting is the point: the backoff must pass.
    let deadline = tokio::time::Instant::now() + PROMPT;
    let second = loop {
        let leases = claim_mine(queue, &worker, LEASE, &mine).await;
        if let Some(lease) = leases.into_iter().next() {
            break lease;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the retried job never became claimable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        Utc::now() >= at - TimeDelta::milliseconds(50),
        "claimed before its scheduled time"
    );
    assert_eq!(second.attempt, 2);
    assert!(second.fence > first.fence);
    queue.ack(&second).await.expect("ack");
}

/// Once `max_attempts` claims were made a retry dead-letters the job with
/// its last error; dead letters are newest first; the job is gone.
pub async fn check_dead_letter<Q: RunQueue + ?Sized>(queue: &Q) {
    let twice = RunId::new();
    let once = RunId::new();
    let worker = owner("worker");
    let immediate = |max_attempts| RetryPolicy {
        max_attempts,
        base_delay_ms: 0,
        max_delay_ms: 0,
    };

    queue.enqueue(twice).await.expect("enqueue");
    let first = claim_mine(queue, &worker, LEASE, &ids(&[twice])).await;
    assert_eq!(first.len(), 1);
    assert!(matches!(
        queue.retry(&first[0], "boom 1", immediate(2)).await,
        Ok(RetryOutcome::Scheduled { .. })
    ));
    let second = claim_mine(queue, &worker, LEASE, &ids(&[twice])).await;
    assert_eq!(second.len(), 1, "a zero backoff is claimable at once");
    assert_eq!(second[0].attempt, 2);
    assert_eq!(
        queue
            .retry(&second[0], "boom 2", immediate(2))
            .await
            .expect("retry"),
        RetryOutcome::DeadLettered
    );

    queue.enqueue(once).await.expect("enqueue");
    let only = claim_mine(queue, &worker, LEASE, &ids(&[once])).await;
    assert_eq!(only.len(), 1);
    assert_eq!(
        queue
            .retry(&only[0], "fatal", immediate(1))
            .await
            .expect("retry"),
        RetryOutcome::DeadLettered
    );

    let dead = queue.dead_letters(1000).await.expect("dead_letters");
    let pos = |run| dead.iter().position(|d| d.run_id == run);
    let (p_twice, p_once) = (pos(twice), pos(once));
    let (Some(p_twice), Some(p_once)) = (p_twice, p_once) else {
        panic!("both jobs must be dead-lettered: {dead:?}");
    };
    assert!(p_once < p_twice, "newest first");
    assert_eq!(dead[p_twice].attempts, 2);
    assert_eq!(dead[p_twice].last_error.as_deref(), Some("boom 2"));
    assert_eq!(dead[p_once].attempts, 1);
    assert_eq!(dead[p_once].last_error.as_deref(), Some("fatal"));
    assert!(queue.dead_letters(1).await.expect("dead_letters").len() <= 1);

    assert!(
        claim_mine(queue, &worker, LEASE, &ids(&[twice, once]))
            .await
            .is_empty(),
        "dead-lettered jobs are not claimable"
    );
    assert_lease_lost(
        queue.ack(&second[0]).await,
        &second[0],
        "an ack after dead-lettering",
    );
}

/// Enqueuing an id that is already queued (or leased) is a no-op.
pub async fn check_enqueue_idempotent<Q: RunQueue + ?Sized>(queue: &Q) {
    let run = RunId::new();
    let mine = ids(&[run]);
    queue.enqueue(run).await.expect("enqueue");
    queue.enqueue(run).await.expect("enqueue again");
    let worker = owner("worker");
    let leases = claim_mine(queue, &worker, LEASE, &mine).await;
    assert_eq!(leases.len(), 1, "one job, claimed once");
    queue.enqueue(run).await.expect("enqueue while leased");
    assert!(
        claim_mine(queue, &worker, LEASE, &mine).await.is_empty(),
        "enqueuing a leased job does not make it claimable"
    );
    queue
        .ack(&leases[0])
        .await
        .expect("the lease survives the enqueue");
}

/// Every check of this suite.
pub async fn run_all(queue: Arc<dyn RunQueue>) {
    check_enqueue_claim_ack(&*queue).await;
    check_claim_order(&*queue).await;
    check_claim_skips_leased(&*queue).await;
    check_concurrent_claims_exclusive(Arc::clone(&queue)).await;
    check_claim_many(Arc::clone(&queue)).await;
    check_heartbeat_extends(&*queue).await;
    check_expired_lease_reclaimed(&*queue).await;
    check_same_owner_reclaim_needs_new_fence(&*queue).await;
    check_retry_backoff(&*queue).await;
    check_dead_letter(&*queue).await;
    check_enqueue_idempotent(&*queue).await;
}

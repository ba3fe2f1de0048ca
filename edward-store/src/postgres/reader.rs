//! Grouped reads of events for tailers whose runs are appended by another
//! process: one task gathers every `events_after` that missed this
//! process's recent-events cache and reads them all in one statement.
//!
//! A tailer reads once per hint. When the runs are driven by worker
//! processes, the submitting process's tailers find nothing in its own
//! cache, and a thousand tailers each woken by a `NOTIFY` made a thousand
//! single-row-set queries a few times a second (`--workers 3`, 1,000 runs:
//! p99 chunk→client 681 ms, Postgres busy parsing and planning). The hints
//! of one `pg_notify` statement wake many tailers at once, so their reads
//! arrive together and a tick takes them all (up to [`MAX_BATCH`]), with
//! up to [`MAX_IN_FLIGHT`] ticks on connections of their own. Under light
//! load a tick holds one read and costs what a single read did.

use edward_core::{RunEvent, RunId, StoreError};
use sqlx::Row;
use sqlx::postgres::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::common::{parse_json, to_u64};
use crate::error::store_err;

/// Reads per tick at most (bounds the statement's size).
const MAX_BATCH: usize = 256;

/// Ticks in flight at once, each on its own connection.
const MAX_IN_FLIGHT: usize = 3;

struct Request {
    run_id: RunId,
    after: i64,
    limit: i64,
    reply: oneshot::Sender<Option<Vec<RunEvent>>>,
}

/// Handle on the grouped-read task; the task stops when the last handle is
/// dropped.
#[derive(Debug)]
pub(super) struct Reader {
    requests: mpsc::UnboundedSender<Request>,
}

impl Reader {
    /// Start the task (needs a tokio runtime), reading over
    /// [`MAX_IN_FLIGHT`] connections opened as `pool`'s are (lazily: a
    /// process whose tailers always hit its cache opens none).
    pub(super) fn spawn(pool: &PgPool) -> Self {
        let pool = super::own_pool(pool, MAX_IN_FLIGHT as u32);
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(read_loop(pool, rx));
        Reader { requests }
    }

    /// Up to `limit` events of `run_id` after `after_seq`, in seq order
    /// (empty also when the run does not exist: the caller tells which).
    /// `None`: the tick's statement failed or one of its rows could not be
    /// decoded; the caller reads alone, so one run's bad row fails only
    /// that run's read, with its own error.
    pub(super) async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<RunEvent>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request {
                run_id,
                after: i64::try_from(after_seq).unwrap_or(i64::MAX),
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                reply,
            })
            .map_err(|_| StoreError::transient("postgres event reader stopped"))?;
        answer
            .await
            .map_err(|_| StoreError::transient("postgres event reader stopped"))
    }
}

async fn read_loop(pool: PgPool, rx: mpsc::UnboundedReceiver<Request>) {
    super::tick_loop(
        rx,
        MAX_IN_FLIGHT,
        (),
        |(), waiting| {
            let n = waiting.len().min(MAX_BATCH);
            waiting.drain(..n).collect()
        },
        |tick| {
            let pool = pool.clone();
            async move {
                let started = std::time::Instant::now();
                let reads = tick.len();
                read_tick(&pool, tick).await;
                tracing::trace!(
                    reads,
                    micros = started.elapsed().as_micros() as u64,
                    "postgres grouped read"
                );
            }
        },
        |(), ()| {},
    )
    .await;
}

/// Each read's own `ORDER BY seq LIMIT` in a lateral subquery, so a tick
/// costs one index range scan per read, as the single read did.
const TICK_SQL: &str = "SELECT r.i, e.seq, e.kind, e.at, e.payload::text \
     FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS r(run_id, after, lim, i) \
     CROSS JOIN LATERAL ( \
       SELECT seq, kind, at, payload FROM edward_run_events \
       WHERE run_id = r.run_id AND seq > r.after ORDER BY seq LIMIT r.lim \
     ) e \
     ORDER BY r.i, e.seq";

async fn read_tick(pool: &PgPool, tick: Vec<Request>) {
    let run_ids: Vec<Uuid> = tick.iter().map(|r| r.run_id.0).collect();
    let afters: Vec<i64> = tick.iter().map(|r| r.after).collect();
    let limits: Vec<i64> = tick.iter().map(|r| r.limit).collect();
    let rows = match sqlx::query(TICK_SQL)
        .bind(&run_ids)
        .bind(&afters)
        .bind(&limits)
        .fetch_all(pool)
        .await
    {
        Ok(rows) => rows,
        Err(error) => {
            tracing::debug!(%error, reads = tick.len(), "grouped read failed; reading alone");
            for request in tick {
                let _ = request.reply.send(None);
            }
            return;
        }
    };
    let mut pages: Vec<Vec<RunEvent>> = (0..tick.len()).map(|_| Vec::new()).collect();
    for row in &rows {
        let decoded = (|| {
            let i: i64 = row.try_get(0).map_err(store_err)?;
            let payload: String = row.try_get(4).map_err(store_err)?;
            let index = usize::try_from(i - 1)
                .ok()
                .filter(|&i| i < tick.len())
                .ok_or_else(|| StoreError::transient(format!("grouped read: row for read {i}")))?;
            let event = RunEvent {
                run_id: tick[index].run_id,
                seq: to_u64(row.try_get(1).map_err(store_err)?, "seq")?,
                kind: row.try_get(2).map_err(store_err)?,
                at: row.try_get(3).map_err(store_err)?,
                payload: parse_json(&payload)?,
            };
            Ok::<_, StoreError>((index, event))
        })();
        match decoded {
            Ok((index, event)) => pages[index].push(event),
            // Which read the row belonged to may be what could not be
            // decoded: every read of the tick is retried alone.
            Err(error) => {
                tracing::debug!(%error, reads = tick.len(), "grouped read: undecodable row; reading alone");
                for request in tick {
                    let _ = request.reply.send(None);
                }
                return;
            }
        }
    }
    for (request, page) in tick.into_iter().zip(pages) {
        let _ = request.reply.send(Some(page));
    }
}

#[cfg(test)]
mod tests {
    use edward_core::testkit::run_store::{admit_fresh, event};
    use edward_core::{Fence, RunStore};

    use super::*;
    use crate::{PgOptions, PgStore};

    /// The grouped statement itself answers (`Some`), with each read's own
    /// page: `PgStore::events_after` falls back to single reads when a tick
    /// fails, so the integration tests alone could not tell a broken tick
    /// from a working one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tick_answers_every_read_itself() {
        let url = std::env::var("EDWARD_TEST_DATABASE_URL").expect(
            "EDWARD_TEST_DATABASE_URL is not set: run scripts/test.sh, or scripts/pg.sh start",
        );
        let schema = edward_core::testkit::unique("reader").replace('-', "_");
        let store = PgStore::connect_with(&url, PgOptions::default().schema(schema))
            .await
            .expect("connect");
        let mut runs = Vec::new();
        for n in 1..=3u64 {
            let run = admit_fresh(&store).await;
            store.start_run(run.id, Fence(1)).await.expect("start");
            let events = (0..n * 4).map(|i| event("e", i)).collect();
            store
                .append_events(run.id, Fence(1), events)
                .await
                .expect("append");
            runs.push((run.id, 1 + n * 4));
        }
        let reader = Reader::spawn(store.pool());
        let reads = runs
            .iter()
            .map(|&(id, _)| reader.events_after(id, 2, 5))
            .chain([reader.events_after(RunId::new(), 0, 5)]);
        let pages = futures::future::join_all(reads).await;
        for (page, &(id, last)) in pages.iter().zip(&runs) {
            let page = page
                .as_ref()
                .expect("sent")
                .as_ref()
                .expect("the tick answered");
            let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (3..=last).take(5).collect::<Vec<_>>(), "run {id}");
            assert!(page.iter().all(|e| e.run_id == id));
        }
        let unknown = pages.last().expect("four reads");
        assert!(
            unknown
                .as_ref()
                .expect("sent")
                .as_ref()
                .expect("answered")
                .is_empty()
        );
    }
}

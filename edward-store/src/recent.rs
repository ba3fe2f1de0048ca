//! The events this process appended lately, per run, so that tailers in
//! this process read what was just committed without a database round trip
//! (a thread hand-off per query).
//!
//! Only committed events go in (they are recorded after `append_events`
//! returned), and a read is served only when the cache holds the seq right
//! after the caller's, so what it returns is exactly what the database holds
//! for those seqs. It may return fewer events than the database has (events
//! another process or another write path appended after them): the caller
//! reads on from the last seq it got, and a read the cache cannot serve goes
//! to the database. Finishing, cancelling or a refused append drops the
//! run's entry.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use edward_core::{RunEvent, RunId};

/// Events kept per run (tailers are rarely further behind).
const PER_RUN: usize = 64;

/// Runs kept at most (entries of runs taken over elsewhere are dropped when
/// the map is full).
const MAX_RUNS: usize = 16_384;

#[derive(Debug, Default)]
pub(crate) struct Recent {
    runs: Mutex<HashMap<RunId, VecDeque<RunEvent>>>,
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, VecDeque<RunEvent>>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remember events just committed for `run_id` (consecutive seqs).
    pub(crate) fn record(&self, run_id: RunId, events: &[RunEvent]) {
        let Some(first) = events.first() else {
            return;
        };
        let mut runs = self.lock();
        if !runs.contains_key(&run_id) && runs.len() >= MAX_RUNS {
            runs.clear();
        }
        let kept = runs.entry(run_id).or_default();
        if kept.back().is_some_and(|last| last.seq + 1 != first.seq) {
            // Not right after what we hold (written elsewhere in between).
            kept.clear();
        }
        kept.extend(events.iter().cloned());
        while kept.len() > PER_RUN {
            kept.pop_front();
        }
    }

    /// Drop what is kept for `run_id`.
    pub(crate) fn forget(&self, run_id: RunId) {
        self.lock().remove(&run_id);
    }

    /// Up to `limit` kept events after `after_seq`, starting exactly at
    /// `after_seq + 1`; `None` when that seq is not kept.
    pub(crate) fn after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Option<Vec<RunEvent>> {
        let runs = self.lock();
        let kept = runs.get(&run_id)?;
        let first = kept.front()?.seq;
        let want = after_seq.checked_add(1)?;
        if want < first || limit == 0 {
            return None;
        }
        let skip = usize::try_from(want - first).ok()?;
        if skip >= kept.len() {
            return None;
        }
        Some(kept.iter().skip(skip).take(limit).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(run_id: RunId, seqs: std::ops::RangeInclusive<u64>) -> Vec<RunEvent> {
        seqs.map(|seq| RunEvent {
            run_id,
            seq,
            kind: "text_delta".into(),
            at: chrono::Utc::now(),
            payload: serde_json::json!({ "n": seq }),
        })
        .collect()
    }

    fn seqs(got: Option<Vec<RunEvent>>) -> Option<Vec<u64>> {
        got.map(|v| v.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn serves_only_from_the_next_seq() {
        let recent = Recent::default();
        let run = RunId::new();
        recent.record(run, &events(run, 2..=5));
        assert_eq!(seqs(recent.after(run, 0, 10)), None, "seq 1 is not kept");
        assert_eq!(seqs(recent.after(run, 1, 10)), Some(vec![2, 3, 4, 5]));
        assert_eq!(seqs(recent.after(run, 3, 1)), Some(vec![4]));
        assert_eq!(seqs(recent.after(run, 5, 10)), None, "nothing kept after 5");
        assert_eq!(seqs(recent.after(RunId::new(), 0, 10)), None);
    }

    #[test]
    fn a_gap_restarts_the_entry_and_forget_drops_it() {
        let recent = Recent::default();
        let run = RunId::new();
        recent.record(run, &events(run, 1..=3));
        recent.record(run, &events(run, 7..=8));
        assert_eq!(
            seqs(recent.after(run, 3, 10)),
            None,
            "4..=6 were written elsewhere"
        );
        assert_eq!(seqs(recent.after(run, 6, 10)), Some(vec![7, 8]));
        recent.forget(run);
        assert_eq!(seqs(recent.after(run, 6, 10)), None);
    }

    #[test]
    fn keeps_the_newest_per_run() {
        let recent = Recent::default();
        let run = RunId::new();
        recent.record(run, &events(run, 1..=(PER_RUN as u64 + 10)));
        assert_eq!(
            seqs(recent.after(run, 0, 1)),
            None,
            "the oldest were dropped"
        );
        let last = PER_RUN as u64 + 10;
        assert_eq!(seqs(recent.after(run, last - 1, 5)), Some(vec![last]));
    }
}

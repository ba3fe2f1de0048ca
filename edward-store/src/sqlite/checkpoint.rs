//! The WAL of [`super::SqliteStore`], kept short under load.
//!
//! A checkpoint copies the pages written to the WAL back into the database
//! file; only when *every* frame has been copied can the next write
//! transaction start the WAL over from its beginning. A checkpoint running
//! beside a writer that commits every few milliseconds never sees every
//! frame copied — there are always newer ones — so without help the WAL
//! only grows (2.6 GB in a 20-second load test, with a 50 MB database; and
//! every page read searches a longer WAL index).
//!
//! The checkpointer thread, on a connection of its own, runs passive
//! checkpoints (they never wait for the writer or readers) every
//! [`INTERVAL`], then again at once as long as each pass found many new
//! frames — each pass copies what was written during the previous one, so
//! they get short. When a pass has found only a few new frames and the WAL
//! is long enough to be worth starting over, it asks the writer thread to
//! finish the cycle: between two of its ticks the writer copies the last
//! few frames itself (no frame can be added meanwhile), and its next
//! transaction starts the WAL over. The writer's share is a few
//! milliseconds per cycle; the bulk of the copying and the fsyncs happen
//! beside it. (A reader still using old frames makes a pass stop short;
//! the cycle is then finished later.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use super::writer::WriterConfig;

/// Pause between checkpoint rounds.
pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

/// A WAL shorter than this (frames, ~4 KiB each) is not started over.
const RESET_MIN_FRAMES: i64 = 4096;

/// A pass that found at most this many new frames has caught up.
const CATCH_UP_FRAMES: i64 = 64;

/// Passes in one round at most (a writer faster than the copying would
/// otherwise keep one round going).
const MAX_PASSES: usize = 20;

#[derive(Default)]
struct Shared {
    reset_wanted: AtomicBool,
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// Handle on the checkpointer thread (stopped when dropped).
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
}

impl Checkpointer {
    /// Start the thread. Its connection is opened on the thread; if that
    /// fails, it logs and retries every round.
    pub(crate) fn spawn(config: WriterConfig) -> std::io::Result<Checkpointer> {
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("edward-sqlite-checkpoint".into())
            .spawn(move || run(&config, &thread_shared))?;
        Ok(Checkpointer { shared })
    }

    /// Whether the writer should finish the WAL cycle now (clears the request).
    pub(crate) fn take_reset_request(&self) -> bool {
        self.shared.reset_wanted.load(Ordering::Relaxed)
            && self.shared.reset_wanted.swap(false, Ordering::AcqRel)
    }

    /// Stop the thread (it finishes its current pass first).
    pub(crate) fn stop(&self) {
        let mut stopped = self
            .shared
            .stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *stopped = true;
        self.shared.wake.notify_all();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sleep for `d`; `true` when stopped.
fn sleep(shared: &Shared, d: Duration) -> bool {
    let stopped = shared
        .stopped
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (stopped, _) = shared
        .wake
        .wait_timeout_while(stopped, d, |stopped| !*stopped)
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *stopped
}

fn run(config: &WriterConfig, shared: &Shared) {
    let mut conn: Option<Connection> = None;
    // WAL length after the previous pass, to tell how much each pass found.
    let mut previous = 0i64;
    while !sleep(shared, INTERVAL) {
        // A panic (e.g. a log line to a closed stderr) must not end the
        // checkpointing for the life of the store: drop the connection and
        // go on with the next round.
        let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            round(config, shared, &mut conn, &mut previous)
        }));
        match round {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => conn = None,
        }
    }
}

/// One round of passes; `true` when stopped.
fn round(
    config: &WriterConfig,
    shared: &Shared,
    conn: &mut Option<Connection>,
    previous: &mut i64,
) -> bool {
    if conn.is_none() {
        match config.open() {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "SQLite checkpointer cannot open the database");
                return false;
            }
        }
    }
    let Some(c) = conn.as_ref() else {
        return false;
    };
    for _ in 0..MAX_PASSES {
        let (busy, log, done) = match passive(c) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "WAL checkpoint failed; retrying later");
                break;
            }
        };
        // A shorter WAL than last time: it was started over since.
        let found = if log >= *previous {
            log - *previous
        } else {
            log
        };
        *previous = log;
        tracing::trace!(busy, log, done, found, "WAL checkpoint pass");
        if busy != 0 || done < log {
            // Another checkpoint is running, or a reader still uses
            // frames this pass could not copy: try again next round.
            break;
        }
        if found <= CATCH_UP_FRAMES {
            if log >= RESET_MIN_FRAMES {
                shared.reset_wanted.store(true, Ordering::Release);
            }
            break;
        }
        if *shared
            .stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            return true;
        }
    }
    false
}

/// One passive checkpoint: `(busy, frames in the WAL, frames copied)`.
fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
}

//! Running one command in a local sandbox: a child process in its own process
//! group, output capped, the whole group killed at the end.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use edward_core::{ExecOutput, ExecRequest, SandboxError};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use crate::config::LocalSandboxConfig;

/// Output of one stream: the first `cap` bytes, and a count of the rest.
pub(crate) struct Capture {
    kept: Vec<u8>,
    cap: usize,
    discarded: u64,
}

impl Capture {
    pub(crate) fn new(cap: usize) -> Self {
        Capture {
            kept: Vec::with_capacity(cap.min(64 * 1024)),
            cap,
            discarded: 0,
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        let take = room.min(chunk.len());
        self.kept.extend_from_slice(&chunk[..take]);
        self.discarded += (chunk.len() - take) as u64;
    }

    /// Lossy UTF-8, never longer than `cap` bytes. A replacement character
    /// takes 3 bytes, so invalid input can push kept bytes past the cap; those
    /// are counted as discarded too. A multi-byte character cut by the cap is
    /// dropped whole rather than shown as a replacement character.
    pub(crate) fn finish(mut self) -> (String, u64) {
        if self.discarded > 0 {
            let cut = incomplete_tail(&self.kept);
            self.kept.truncate(self.kept.len() - cut);
            self.discarded += cut as u64;
        }
        let mut text = String::with_capacity(self.kept.len());
        let mut consumed = 0usize;
        'chunks: for chunk in self.kept.utf8_chunks() {
            let valid = chunk.valid();
            if text.len() + valid.len() <= self.cap {
                text.push_str(valid);
                consumed += valid.len();
            } else {
                for c in valid.chars() {
                    if text.len() + c.len_utf8() > self.cap {
                        break 'chunks;
                    }
                    text.push(c);
                    consumed += c.len_utf8();
                }
                break;
            }
            let invalid = chunk.invalid();
            if !invalid.is_empty() {
                if text.len() + char::REPLACEMENT_CHARACTER.len_utf8() > self.cap {
                    break;
                }
                text.push(char::REPLACEMENT_CHARACTER);
                consumed += invalid.len();
            }
        }
        let unshown = (self.kept.len() - consumed) as u64;
        (text, self.discarded + unshown)
    }
}

/// Length of a UTF-8 sequence cut off at the end of `bytes` (0 if none).
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let needed = match byte {
            0xF0..=0xFF => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

/// Read a pipe to its end, keeping what fits. Never stops reading early, so a
/// chatty child never blocks on a full pipe.
async fn drain(pipe: Option<impl AsyncRead + Unpin>, capture: &mut Capture) {
    let Some(mut pipe) = pipe else { return };
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) => return,
            Ok(n) => capture.push(&chunk[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => {
                tracing::warn!(error = %err, "reading command output failed");
                return;
            }
        }
    }
}

/// SIGKILL a whole process group. Never called with a group id ≤ 1
/// (0 would be our own group, 1 init's; `killpg` with those is never right).
fn kill_group(pgid: libc::pid_t) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg only sends a signal; it has no memory-safety preconditions.
    let rc = unsafe { libc::killpg(pgid, libc::SIGKILL) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        // ESRCH: every member is gone already.
        if err.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, error = %err, "killpg failed");
        }
    }
}

/// Kills the process group if the exec future is dropped before it finished
/// (the caller gave up without cancelling). `kill_on_drop` alone would kill
/// only the group leader.
struct GroupGuard {
    pgid: libc::pid_t,
    armed: bool,
}

impl GroupGuard {
    fn kill_now(&mut self) {
        if self.armed {
            kill_group(self.pgid);
            self.armed = false;
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill_now();
    }
}

enum End {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
    WaitFailed(std::io::Error),
}

/// The environment of a command: cleared, then passthrough, fixed, HOME, request.
fn environment(
    config: &LocalSandboxConfig,
    workspace: &Path,
    request: &ExecRequest,
) -> Result<Vec<(std::ffi::OsString, std::ffi::OsString)>, SandboxError> {
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = Vec::new();
    let mut set = |name: std::ffi::OsString, value: std::ffi::OsString| {
        if let Some(slot) = env.iter_mut().find(|(n, _)| *n == name) {
            slot.1 = value;
        } else {
            env.push((name, value));
        }
    };
    set("PATH".into(), config.default_path.clone().into());
    for name in &config.env_passthrough {
        if let Some(value) = std::env::var_os(name) {
            set(name.into(), value);
        }
    }
    for (name, value) in &config.env {
        set(name.into(), value.into());
    }
    let home = config.home.as_deref().unwrap_or(workspace);
    set("HOME".into(), home.as_os_str().to_owned());
    for (name, value) in &request.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
            return Err(SandboxError::Spawn {
                command: request.program.clone(),
                message: format!("invalid environment variable `{name}`"),
            });
        }
        set(name.into(), value.into());
    }
    Ok(env)
}

/// Run `request` with `cwd` as working directory (already validated), inside
/// a bubblewrap jail when `jail` names `bwrap`.
pub(crate) async fn run(
    config: &LocalSandboxConfig,
    jail: Option<&Path>,
    workspace: &Path,
    cwd: &Path,
    request: &ExecRequest,
    cancel: &CancellationToken,
) -> Result<ExecOutput, SandboxError> {
    if cancel.is_cancelled() {
        return Err(SandboxError::Cancelled);
    }
    if request.program.is_empty() {
        return Err(SandboxError::Spawn {
            command: String::new(),
            message: "empty program".into(),
        });
    }
    let env = environment(config, workspace, request)?;
    let path = env
        .iter()
        .find(|(n, _)| n == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    // An absolute program path: std then spawns with posix_spawn (no fork of
    // a large process), and the jail needs it anyway.
    let program = crate::jail::resolve_program(&request.program, &path, cwd).ok_or_else(|| {
        SandboxError::Spawn {
            command: request.program.clone(),
            message: "program not found on the command's PATH".into(),
        }
    })?;
    let mut command = match jail {
        Some(bwrap) => {
            let mut c = tokio::process::Command::new(bwrap);
            c.args(crate::jail::bwrap_args(
                config,
                workspace,
                cwd,
                &request.program,
                &program,
                &request.args,
            ));
            c
        }
        None => {
            let mut c = tokio::process::Command::new(&program);
            c.arg0(&request.program).args(&request.args);
            c
        }
    };
    command
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);

    let started = Instant::now();
    // Spawning blocks the calling thread until the child has exec'd: keep it
    // off the async workers.
    let spawned = tokio::task::spawn_blocking(move || command.spawn())
        .await
        .map_err(|err| SandboxError::Backend {
            message: format!("spawn task failed: {err}"),
            retryable: false,
        })?;
    let mut child = spawned.map_err(|err| SandboxError::Spawn {
        command: request.program.clone(),
        message: err.to_string(),
    })?;
    let pgid = child
        .id()
        .and_then(|pid| libc::pid_t::try_from(pid).ok())
        .unwrap_or(0);
    let mut guard = GroupGuard { pgid, armed: true };
    tracing::debug!(pid = pgid, "command started");

    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut out = Capture::new(request.output_cap);
    let mut err = Capture::new(request.output_cap);
    // A timeout too large to represent means no timeout in practice.
    let deadline = tokio::time::Instant::now()
        .checked_add(request.timeout)
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86_400));

    let (end, status) = {
        let reading = async {
            tokio::join!(drain(stdout, &mut out), drain(stderr, &mut err));
        };
        tokio::pin!(reading);
        let mut reading_done = false;
        let end = loop {
            tokio::select! {
                status = child.wait() => break match status {
                    Ok(status) => End::Exited(status),
                    Err(err) => End::WaitFailed(err),
                },
                () = &mut reading, if !reading_done => reading_done = true,
                () = tokio::time::sleep_until(deadline) => break End::TimedOut,
                () = cancel.cancelled() => break End::Cancelled,
            }
        };
        // Kill the whole group: everything on timeout/cancel, and stray
        // background processes after a normal exit (nothing outlives exec).
        // After a normal exit the leader is already reaped; its pid stays
        // reserved as long as any group member lives, and if none does the
        // kill is a harmless ESRCH (short of the pid space wrapping around
        // in the microseconds in between).
        guard.kill_now();
        let status = match &end {
            End::Exited(status) => Some(*status),
            _ => match tokio::time::timeout(config.kill_grace, child.wait()).await {
                Ok(Ok(status)) => Some(status),
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "reaping killed command failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(
                        pid = pgid,
                        "killed command not reaped within the grace period"
                    );
                    None
                }
            },
        };
        if !reading_done && !matches!(end, End::Cancelled) {
            // A process that left the group may hold a pipe open: bounded.
            if tokio::time::timeout(config.kill_grace, &mut reading)
                .await
                .is_err()
            {
                tracing::warn!("command output pipes still open after the grace period");
            }
        }
        (end, status)
    };

    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let timed_out = match end {
        End::Exited(_) => false,
        End::TimedOut => true,
        End::Cancelled => {
            tracing::debug!(duration_ms, "command cancelled");
            return Err(SandboxError::Cancelled);
        }
        End::WaitFailed(err) => {
            return Err(crate::fs::io_error(
                format!("waiting for `{}`", request.program),
                &err,
            ));
        }
    };
    let exit_code = status.and_then(|status| status.code());
    let (stdout, stdout_truncated) = out.finish();
    let (stderr, stderr_truncated) = err.finish();
    tracing::debug!(?exit_code, timed_out, duration_ms, "command finished");
    Ok(ExecOutput {
        exit_code,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out,
        duration_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::{Capture, incomplete_tail};

    #[test]
    fn capture_keeps_cap_and_counts_rest() {
        let mut capture = Capture::new(5);
        capture.push(b"hel");
        capture.push(b"lo world");
        let (text, discarded) = capture.finish();
        assert_eq!(text, "hello");
        assert_eq!(discarded, 6);
    }

    #[test]
    fn capture_drops_a_character_cut_by_the_cap() {
        let mut capture = Capture::new(4);
        capture.push("abcé".as_bytes()); // é is 2 bytes: cut after its first
        let (text, discarded) = capture.finish();
        assert_eq!(text, "abc");
        assert_eq!(discarded, 2);
    }

    #[test]
    fn capture_output_never_exceeds_cap_with_invalid_bytes() {
        let mut capture = Capture::new(4);
        capture.push(&[0xFF, 0xFF, b'a']);
        let (text, discarded) = capture.finish();
        assert!(text.len() <= 4, "{text:?}");
        assert_eq!(text, "\u{FFFD}");
        assert_eq!(discarded, 2);
    }

    #[test]
    fn incomplete_tail_detection() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"€".as_bytes()[..2]), 2);
        assert_eq!(incomplete_tail(&"😀".as_bytes()[..3]), 3);
    }
}

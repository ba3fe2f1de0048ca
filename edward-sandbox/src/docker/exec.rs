//! Commands in a container: a launcher that leads its own process group,
//! capped output, and a second exec that kills the group on timeout or
//! cancellation (Docker has no API to kill an exec).

use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use edward_core::{ExecOutput, ExecRequest, SandboxError};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::docker::WORKSPACE;
use crate::docker::config::DockerSandboxConfig;
use crate::docker::error::{backend, fatal, is_not_found};
use crate::exec::Capture;

/// The launcher, run as `sh -c LAUNCHER edward-exec CWD env -i VAR=… PROG ARG…`.
///
/// A `docker exec` process leads its own session and process group, so the
/// launcher's pid is the group id of everything the command starts. It marks
/// the sandbox as used, enters `CWD` (refusing one that resolves outside the
/// workspace), prints its pid as the first line of stdout (the caller strips
/// it and uses it to kill the group), runs the command in the background of
/// the same group with an empty environment plus the given variables, waits
/// for it, kills every other member of the group (background jobs must not
/// outlive the command), and exits with the command's status (128 + signal
/// when it was killed, e.g. 137 for the memory limit's SIGKILL).
const LAUNCHER: &str = r#"true 2>/dev/null >/workspace/.edward/last-use
cd "$1" 2>/dev/null || { echo '!nocwd'; exit 0; }
case "$(pwd -P)" in /workspace|/workspace/*) ;; *) echo '!escape'; exit 0 ;; esac
shift
echo "$$"
"$@" &
c=$!
wait "$c"
s=$?
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$$" ] && continue
  read -r l 2>/dev/null < "$d/stat" || continue
  l=${l##*) }
  set -- $l
  [ "$3" = "$$" ] && kill -9 "$p" 2>/dev/null
done
exit "$s"
"#;

/// Longest first stdout line the launcher prints (a pid or a marker).
const MAX_HEADER: usize = 32;

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// Where commands run: one container, as one user.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) docker: Docker,
    pub(crate) container: String,
    pub(crate) key: String,
    pub(crate) user: String,
}

impl Target {
    fn gone_or(&self, what: &str, err: bollard::errors::Error) -> SandboxError {
        if is_not_found(&err) {
            SandboxError::Gone {
                key: self.key.clone(),
            }
        } else {
            backend(what, err)
        }
    }

    /// Create and start an exec of `cmd` attached to stdout and stderr.
    async fn start(&self, cmd: Vec<String>) -> Result<(String, Output), SandboxError> {
        let created = self
            .docker
            .create_exec(
                &self.container,
                CreateExecOptions {
                    attach_stdin: Some(false),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(cmd),
                    user: Some(self.user.clone()),
                    working_dir: Some(WORKSPACE.to_owned()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|err| {
                // 409: the container exists but is not running (stopped by a
                // daemon restart or by hand); provisioning again restarts it.
                if crate::docker::error::status(&err) == Some(409) {
                    SandboxError::Backend {
                        message: format!(
                            "docker: container of sandbox {} is not running: {err}",
                            self.key
                        ),
                        retryable: true,
                    }
                } else {
                    self.gone_or("create exec", err)
                }
            })?;
        match self
            .docker
            .start_exec(&created.id, None)
            .await
            .map_err(|err| self.gone_or("start exec", err))?
        {
            StartExecResults::Attached { output, .. } => Ok((created.id, output)),
            StartExecResults::Detached => Err(fatal("docker: exec started detached")),
        }
    }

    /// The exit code of a finished exec. The output stream can end a moment
    /// before the daemon has recorded the exit, so ask until it has.
    async fn exit_code(&self, exec_id: &str, grace: Duration) -> Result<i64, SandboxError> {
        let give_up = Instant::now() + grace;
        loop {
            let info = self
                .docker
                .inspect_exec(exec_id)
                .await
                .map_err(|err| self.gone_or("inspect exec", err))?;
            match (info.running, info.exit_code) {
                (Some(false), Some(code)) => return Ok(code),
                _ if Instant::now() >= give_up => {
                    return Err(SandboxError::Backend {
                        message: "docker: exec output ended but the process is still running"
                            .into(),
                        retryable: true,
                    });
                }
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// `kill -9 -PGID` in the container, as the sandbox user (with every
    /// capability dropped, no other user could). Failures are logged: the
    /// caller is already on an error or timeout path.
    pub(crate) async fn kill_group(&self, pgid: i64, grace: Duration) {
        let cmd = vec!["kill".into(), "-9".into(), format!("-{pgid}")];
        let result = tokio::time::timeout(grace, async {
            let (_, mut output) = self.start(cmd).await?;
            while let Some(frame) = output.next().await {
                if let Err(err) = frame {
                    return Err(backend("kill output", err));
                }
            }
            Ok::<(), SandboxError>(())
        })
        .await;
        match result {
            Ok(Ok(())) => tracing::debug!(pgid, "process group killed"),
            Ok(Err(err)) => tracing::warn!(pgid, %err, "could not kill the process group"),
            Err(_) => tracing::warn!(pgid, "killing the process group timed out"),
        }
    }

    /// Run a trusted helper script to its end (no launcher): `(exit code,
    /// stdout, stderr)`, each stream capped at 64 KiB.
    pub(crate) async fn run_script(
        &self,
        script: &str,
        args: Vec<String>,
        timeout: Duration,
    ) -> Result<(i64, String, String), SandboxError> {
        let mut cmd = vec![
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "edward".into(),
        ];
        cmd.extend(args);
        let (id, mut output) = self.start(cmd).await?;
        let mut stdout = Capture::new(64 * 1024);
        let mut stderr = Capture::new(64 * 1024);
        let drained = tokio::time::timeout(timeout, async {
            while let Some(frame) = output.next().await {
                match frame.map_err(|err| backend("exec output", err))? {
                    LogOutput::StdOut { message } => stdout.push(&message),
                    LogOutput::StdErr { message } => stderr.push(&message),
                    _ => {}
                }
            }
            Ok::<(), SandboxError>(())
        })
        .await;
        match drained {
            Ok(result) => result?,
            Err(_) => {
                return Err(SandboxError::Backend {
                    message: format!("docker: helper script took longer than {timeout:?}"),
                    retryable: true,
                });
            }
        }
        let code = self.exit_code(&id, Duration::from_secs(5)).await?;
        Ok((code, stdout.finish().0, stderr.finish().0))
    }
}

/// Kills the command's process group if `exec` is dropped mid-flight.
struct KillOnDrop {
    target: Target,
    pgid: Option<i64>,
    grace: Duration,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let (Some(pgid), Ok(handle)) = (self.pgid, tokio::runtime::Handle::try_current()) {
            let target = self.target.clone();
            let grace = self.grace;
            handle.spawn(async move { target.kill_group(pgid, grace).await });
        }
    }
}

fn spawn_error(program: &str, message: impl Into<String>) -> SandboxError {
    SandboxError::Spawn {
        command: program.chars().take(256).collect(),
        message: message.into(),
    }
}

/// `VAR=value` for the command's environment, refusing what `env` would
/// misread (an empty name, `=` in a name, NUL anywhere).
fn assignment(program: &str, name: &str, value: &str) -> Result<String, SandboxError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
        return Err(spawn_error(
            program,
            format!("invalid environment variable name or value: {name:?}"),
        ));
    }
    Ok(format!("{name}={value}"))
}

/// The full argv: launcher, cwd, `env -i`, the environment, the command.
fn command_line(
    config: &DockerSandboxConfig,
    request: &ExecRequest,
    cwd: &str,
) -> Result<Vec<String>, SandboxError> {
    let program = request.program.as_str();
    // `env` would take `A=B` for an assignment and `-x` for an option.
    if program.is_empty() || program.contains('=') || program.contains('\0') {
        return Err(spawn_error(program, "invalid program name"));
    }
    if request.args.iter().any(|a| a.contains('\0')) {
        return Err(spawn_error(program, "an argument contains a NUL byte"));
    }
    let mut cmd: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        LAUNCHER.into(),
        "edward-exec".into(),
        cwd.into(),
        "env".into(),
        "-i".into(),
        assignment(program, "PATH", &config.path)?,
        assignment(program, "HOME", WORKSPACE)?,
    ];
    for (name, value) in config.env.iter().chain(request.env.iter()) {
        cmd.push(assignment(program, name, value)?);
    }
    if program.starts_with('-') {
        return Err(spawn_error(program, "invalid program name"));
    }
    cmd.push(program.into());
    cmd.extend(request.args.iter().cloned());
    Ok(cmd)
}

/// The result of a command: `exit_code: None` means it timed out.
fn exec_output(
    stdout: Capture,
    stderr: Capture,
    exit_code: Option<i32>,
    started: Instant,
) -> ExecOutput {
    let (stdout, stdout_truncated) = stdout.finish();
    let (stderr, stderr_truncated) = stderr.finish();
    ExecOutput {
        exit_code,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out: exit_code.is_none(),
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

enum End {
    Finished,
    TimedOut,
    Cancelled,
}

/// Run `request` in the container. See [`crate::DockerSandbox`] for the
/// process model.
pub(crate) async fn run(
    target: &Target,
    config: &DockerSandboxConfig,
    request: &ExecRequest,
    cancel: &CancellationToken,
) -> Result<ExecOutput, SandboxError> {
    if cancel.is_cancelled() {
        return Err(SandboxError::Cancelled);
    }
    let cwd = match &request.cwd {
        None => WORKSPACE.to_owned(),
        Some(path) => format!("{WORKSPACE}/{}", path.as_str()),
    };
    let cmd = command_line(config, request, &cwd)?;
    let started = Instant::now();
    let (exec_id, mut output) = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(SandboxError::Cancelled),
        started = target.start(cmd) => started?,
    };
    let mut guard = KillOnDrop {
        target: target.clone(),
        pgid: None,
        grace: config.kill_grace,
        armed: true,
    };
    let mut header: Vec<u8> = Vec::new();
    let mut header_done = false;
    let mut stdout = Capture::new(request.output_cap);
    let mut stderr = Capture::new(request.output_cap);
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);

    let shown_cwd = || {
        request
            .cwd
            .as_ref()
            .map_or(String::new(), |c| c.as_str().to_owned())
    };
    // Feed one stdout chunk: the launcher's first line is its pid (or a
    // refusal marker), everything after it is the command's.
    let mut on_stdout = |message: &[u8],
                         header: &mut Vec<u8>,
                         header_done: &mut bool,
                         guard: &mut KillOnDrop|
     -> Result<(), SandboxError> {
        if *header_done {
            stdout.push(message);
            return Ok(());
        }
        header.extend_from_slice(message);
        let Some(newline) = header.iter().position(|b| *b == b'\n') else {
            if header.len() > MAX_HEADER {
                return Err(fatal("docker: the exec launcher printed no pid"));
            }
            return Ok(());
        };
        let line = String::from_utf8_lossy(&header[..newline]).into_owned();
        let rest = header[newline + 1..].to_vec();
        *header_done = true;
        match line.as_str() {
            "!nocwd" => return Err(SandboxError::NotFound { path: shown_cwd() }),
            "!escape" => {
                return Err(SandboxError::InvalidPath {
                    path: shown_cwd(),
                    reason: "resolves outside the workspace through a symlink".into(),
                });
            }
            pid => match pid.parse::<i64>() {
                Ok(pid) if pid > 1 => guard.pgid = Some(pid),
                _ => {
                    return Err(fatal(format!(
                        "docker: unexpected launcher output {line:?}"
                    )));
                }
            },
        }
        stdout.push(&rest);
        Ok(())
    };

    let end = loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break End::Cancelled,
            _ = &mut deadline => break End::TimedOut,
            frame = output.next() => match frame {
                None => break End::Finished,
                Some(Ok(LogOutput::StdOut { message })) => {
                    on_stdout(&message, &mut header, &mut header_done, &mut guard)?;
                }
                Some(Ok(LogOutput::StdErr { message })) => stderr.push(&message),
                Some(Ok(_)) => {}
                Some(Err(err)) => return Err(backend("exec output stream", err)),
            },
        }
    };

    match end {
        End::Finished => {
            guard.armed = false;
            let code = target.exit_code(&exec_id, config.kill_grace).await?;
            if !header_done {
                // The launcher never ran (no /bin/sh in the image, …).
                let (out, _) = stdout.finish();
                let (err, _) = stderr.finish();
                let shown = format!("{}{}", String::from_utf8_lossy(&header), out);
                return Err(spawn_error(
                    &request.program,
                    format!(
                        "the launcher exited with {code}: {} {}",
                        shown.trim(),
                        err.trim()
                    ),
                ));
            }
            let code = i32::try_from(code).unwrap_or(i32::MAX);
            Ok(exec_output(stdout, stderr, Some(code), started))
        }
        End::TimedOut | End::Cancelled => {
            // Learn the pid if it has not arrived yet, then kill the group
            // and keep what the command printed until its stream closes.
            let grace_end = tokio::time::Instant::now() + config.kill_grace;
            while guard.pgid.is_none() && !header_done {
                match tokio::time::timeout_at(grace_end, output.next()).await {
                    Ok(Some(Ok(LogOutput::StdOut { message }))) => {
                        on_stdout(&message, &mut header, &mut header_done, &mut guard)?;
                    }
                    Ok(Some(Ok(LogOutput::StdErr { message }))) => stderr.push(&message),
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(_)) | None) | Err(_) => break,
                }
            }
            if let Some(pgid) = guard.pgid {
                target.kill_group(pgid, config.kill_grace).await;
            }
            guard.armed = false;
            let drain_end = tokio::time::Instant::now() + config.kill_grace;
            loop {
                match tokio::time::timeout_at(drain_end, output.next()).await {
                    Ok(Some(Ok(LogOutput::StdOut { message }))) => {
                        if header_done {
                            stdout.push(&message);
                        }
                    }
                    Ok(Some(Ok(LogOutput::StdErr { message }))) => stderr.push(&message),
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(_)) | None) => break,
                    Err(_) => {
                        tracing::warn!("exec output still open after the kill; dropping it");
                        break;
                    }
                }
            }
            if matches!(end, End::Cancelled) {
                return Err(SandboxError::Cancelled);
            }
            Ok(exec_output(stdout, stderr, None, started))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(program: &str, env: &[(&str, &str)]) -> ExecRequest {
        ExecRequest {
            program: program.into(),
            args: vec!["a b".into(), "$HOME".into()],
            cwd: None,
            env: env
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            timeout: Duration::from_secs(1),
            output_cap: 10,
        }
    }

    #[test]
    fn command_line_is_argv_with_a_cleared_environment() {
        let config = DockerSandboxConfig::default();
        let cmd = command_line(&config, &request("echo", &[("X", "1 2")]), "/workspace/sub")
            .expect("argv");
        assert_eq!(&cmd[..2], ["/bin/sh", "-c"]);
        assert_eq!(cmd[3], "edward-exec");
        assert_eq!(cmd[4], "/workspace/sub");
        assert_eq!(&cmd[5..7], ["env", "-i"]);
        assert!(cmd[7].starts_with("PATH="));
        assert_eq!(cmd[8], "HOME=/workspace");
        assert_eq!(cmd[9], "X=1 2");
        assert_eq!(&cmd[10..], ["echo", "a b", "$HOME"]);
    }

    #[test]
    fn command_line_refuses_what_env_would_misread() {
        let config = DockerSandboxConfig::default();
        for (program, env) in [
            ("A=B", vec![]),
            ("-i", vec![]),
            ("", vec![]),
            ("echo", vec![("", "x")]),
            ("echo", vec![("A=B", "x")]),
            ("echo", vec![("A", "x\0y")]),
        ] {
            assert!(
                matches!(
                    command_line(&config, &request(program, &env), "/workspace"),
                    Err(SandboxError::Spawn { .. })
                ),
                "{program:?} {env:?}"
            );
        }
    }
}

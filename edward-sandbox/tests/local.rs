//! `LocalSandboxProvider`: the shared conformance suite, plus checks that need
//! host access (symlink escapes, process groups, the environment, key names).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edward_core::testkit::sandbox::{self as suite, command, file, fresh_key, path};
use edward_core::{Sandbox, SandboxError, SandboxKey, SandboxProvider};
use edward_sandbox::{Confinement, LocalSandbox, LocalSandboxConfig, LocalSandboxProvider};
use tokio_util::sync::CancellationToken;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create temp dir")
}

// ------------------------------------------------------------ conformance

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_run_all() {
    let root = tempdir();
    let provider = LocalSandboxProvider::new(root.path());
    suite::run_all(&provider).await;
}

/// One test per check as well, so a failure names the check.
macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod conformance {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let root = tempdir();
                    let provider = LocalSandboxProvider::new(root.path());
                    suite::$check(&provider).await;
                }
            )*
        }
    };
}

conformance!(
    provision_is_idempotent,
    write_read_round_trip,
    rewrite_replaces_whole_content,
    read_missing_is_not_found,
    list_sorted_with_sizes,
    invalid_paths_refused,
    exec_echo_and_ls,
    exec_nonzero_exit_code,
    exec_request_env,
    exec_cwd_honoured,
    exec_missing_program,
    exec_output_cap,
    exec_timeout_kills,
    exec_cancel_kills,
    destroy_removes_files,
);

// ------------------------------------------------------------ helpers

async fn local(root: &Path, name: &str) -> (LocalSandboxProvider, LocalSandbox) {
    let provider = LocalSandboxProvider::new(root);
    let sandbox = provider
        .provision_local(&fresh_key(name))
        .await
        .expect("provision");
    (provider, sandbox)
}

fn assert_invalid_path<T: std::fmt::Debug>(result: Result<T, SandboxError>, what: &str) {
    assert!(
        matches!(result, Err(SandboxError::InvalidPath { .. })),
        "{what}: expected InvalidPath, got {result:?}"
    );
}

/// Whether `pid` is gone (or a zombie: killed, waiting for init to reap it).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // Format: `pid (comm) state ...`; comm may contain spaces and parens.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Host processes whose command line contains `marker` (a unique `sleep`
/// argument): pids written from inside a jail are namespace pids, so the
/// tests look processes up by what they run instead.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) && !is_dead(pid) {
                found.push(pid);
            }
        }
    }
    found
}

/// A unique `sleep` duration (about 60 s) to find the process by.
fn marker() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("60.{}{:06}", std::process::id(), n)
}

/// Wait (bounded) until no process runs `marker`.
async fn wait_gone(marker: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if processes_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    processes_with(marker).is_empty()
}

/// A sandbox jailed or not: process tests run in both modes.
async fn local_mode(
    root: &Path,
    name: &str,
    confinement: Confinement,
) -> (LocalSandboxProvider, LocalSandbox) {
    let mut config = LocalSandboxConfig::default();
    config.confinement = confinement;
    let provider = LocalSandboxProvider::with_config(root, config);
    let sandbox = provider
        .provision_local(&fresh_key(name))
        .await
        .expect("provision (Required needs bubblewrap: run scripts/test.sh)");
    (provider, sandbox)
}

const MODES: [Confinement; 2] = [Confinement::Off, Confinement::Required];

async fn read_pid(sandbox: &LocalSandbox, name: &str) -> i32 {
    let bytes = sandbox.read_file(&path(name)).await.expect("pid file");
    std::str::from_utf8(&bytes)
        .expect("utf-8 pid")
        .trim()
        .parse()
        .expect("numeric pid")
}

/// Wait (bounded) until the sandbox has `name`: the command's "I started" signal.
async fn wait_for_file(sandbox: &LocalSandbox, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(bytes) = sandbox.read_file(&path(name)).await {
            if bytes.ends_with(b"\n") {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

// ------------------------------------------------------------ symlinks

#[tokio::test]
async fn write_through_escaping_symlink_is_refused() {
    let root = tempdir();
    let outside = tempdir();
    let (_provider, sandbox) = local(root.path(), "symlink-write").await;
    std::os::unix::fs::symlink(outside.path(), sandbox.workspace().join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", sandbox.workspace().join("etc")).unwrap();

    for target in [
        "link/x.txt",
        "link/new/dir/x.txt",
        "etc/passwd",
        "etc/edward-x",
    ] {
        let result = sandbox.write_files(vec![file(target, "pwned")]).await;
        assert_invalid_path(result, target);
    }
    let leaked: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert!(leaked.is_empty(), "wrote outside the workspace: {leaked:?}");
    assert!(!Path::new("/etc/edward-x").exists());
}

#[tokio::test]
async fn read_through_escaping_symlink_is_refused() {
    let root = tempdir();
    let outside = tempdir();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    let (_provider, sandbox) = local(root.path(), "symlink-read").await;
    let ws = sandbox.workspace();
    std::os::unix::fs::symlink(outside.path(), ws.join("dirlink")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), ws.join("filelink")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", ws.join("hostname")).unwrap();
    std::os::unix::fs::symlink("missing-target", ws.join("dangling")).unwrap();

    for target in ["dirlink/secret.txt", "filelink", "hostname", "dangling"] {
        let result = sandbox.read_file(&path(target)).await;
        assert_invalid_path(result, target);
    }
    // Nor as a working directory.
    let mut request = command("ls", &[]);
    request.cwd = Some(path("dirlink"));
    assert_invalid_path(
        sandbox.exec(request, CancellationToken::new()).await,
        "cwd through symlink",
    );
}

#[tokio::test]
async fn symlinks_inside_the_workspace_are_followed() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "symlink-inside").await;
    sandbox
        .write_files(vec![file("real/a.txt", "a")])
        .await
        .unwrap();
    let ws = sandbox.workspace();
    std::os::unix::fs::symlink("real", ws.join("alias")).unwrap();
    std::os::unix::fs::symlink("real/a.txt", ws.join("a-link")).unwrap();

    sandbox
        .write_files(vec![file("alias/b.txt", "b")])
        .await
        .unwrap();
    assert_eq!(std::fs::read(ws.join("real/b.txt")).unwrap(), b"b");
    assert_eq!(sandbox.read_file(&path("alias/a.txt")).await.unwrap(), "a");
    assert_eq!(sandbox.read_file(&path("a-link")).await.unwrap(), "a");
}

#[tokio::test]
async fn symlink_at_target_is_replaced_not_written_through() {
    let root = tempdir();
    let outside = tempdir();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "original").unwrap();
    let (_provider, sandbox) = local(root.path(), "symlink-target").await;
    let link = sandbox.workspace().join("target.txt");
    std::os::unix::fs::symlink(&victim, &link).unwrap();

    sandbox
        .write_files(vec![file("target.txt", "new")])
        .await
        .unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"original");
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.is_file(), "the link itself must be replaced");
    assert_eq!(sandbox.read_file(&path("target.txt")).await.unwrap(), "new");
}

#[tokio::test]
async fn list_skips_symlinks() {
    let root = tempdir();
    let outside = tempdir();
    std::fs::write(outside.path().join("o.txt"), "o").unwrap();
    let (_provider, sandbox) = local(root.path(), "list-symlinks").await;
    sandbox
        .write_files(vec![file("real.txt", "r")])
        .await
        .unwrap();
    let ws = sandbox.workspace();
    std::os::unix::fs::symlink(outside.path(), ws.join("out-dir")).unwrap();
    std::os::unix::fs::symlink("real.txt", ws.join("in-link")).unwrap();
    std::os::unix::fs::symlink("/", ws.join("slash")).unwrap();

    let listed = sandbox.list_files().await.unwrap();
    let paths: Vec<&str> = listed.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["real.txt"]);
}

// ------------------------------------------------------------ files

#[tokio::test]
async fn list_cap_is_a_deterministic_prefix() {
    let root = tempdir();
    let key = fresh_key("list-cap");
    let full_provider = LocalSandboxProvider::new(root.path());
    let full = full_provider.provision_local(&key).await.unwrap();
    let files = (0..40)
        .map(|i| file(&format!("d{}/f{i:02}.txt", i % 3), "x"))
        .chain([file("d1-x.txt", "y"), file("d1/z/deep.txt", "z")])
        .collect();
    full.write_files(files).await.unwrap();
    let everything = full.list_files().await.unwrap();
    assert_eq!(everything.len(), 42);

    let mut config = LocalSandboxConfig::default();
    config.list_cap = 17;
    let capped_provider = LocalSandboxProvider::with_config(root.path(), config);
    let capped = capped_provider.provision_local(&key).await.unwrap();
    for _ in 0..3 {
        assert_eq!(capped.list_files().await.unwrap(), everything[..17]);
    }
}

#[tokio::test]
async fn rewrite_keeps_permissions_and_leaves_no_temp_files() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "perms").await;
    sandbox
        .write_files(vec![file("run.sh", "#!/bin/sh\necho one\n")])
        .await
        .unwrap();
    let script = sandbox.workspace().join("run.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    sandbox
        .write_files(vec![file("run.sh", "#!/bin/sh\necho two\n")])
        .await
        .unwrap();
    let mode = std::fs::metadata(&script).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let out = sandbox
        .exec(command("./run.sh", &[]), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stdout, "two\n");
    let names: Vec<_> = std::fs::read_dir(sandbox.workspace())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["run.sh"]);
}

#[tokio::test]
async fn sync_writes_round_trip() {
    let root = tempdir();
    let mut config = LocalSandboxConfig::default();
    config.sync_writes = true;
    let provider = LocalSandboxProvider::with_config(root.path(), config);
    let sandbox = provider.provision_local(&fresh_key("sync")).await.unwrap();
    sandbox
        .write_files(vec![file("a/b.txt", "synced")])
        .await
        .unwrap();
    assert_eq!(sandbox.read_file(&path("a/b.txt")).await.unwrap(), "synced");
}

#[tokio::test]
async fn file_and_directory_clashes_are_invalid_paths() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "clash").await;
    sandbox
        .write_files(vec![file("plain.txt", "p"), file("dir/x.txt", "x")])
        .await
        .unwrap();
    assert_invalid_path(
        sandbox
            .write_files(vec![file("plain.txt/child", "c")])
            .await,
        "file used as directory",
    );
    assert_invalid_path(
        sandbox.write_files(vec![file("dir", "d")]).await,
        "directory overwritten by file",
    );
    assert_invalid_path(sandbox.read_file(&path("dir")).await, "read a directory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_are_neither_read_nor_listed() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "fifo").await;
    let out = sandbox
        .exec(command("mkfifo", &["pipe"]), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    // Opening a FIFO for reading would block until a writer appears; the
    // read must refuse it instead of hanging.
    let result = tokio::time::timeout(Duration::from_secs(5), sandbox.read_file(&path("pipe")))
        .await
        .expect("read_file of a FIFO hung");
    assert_invalid_path(result, "FIFO");
    assert!(sandbox.list_files().await.unwrap().is_empty());
}

#[tokio::test]
async fn batch_is_sequential_not_atomic() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "batch").await;
    sandbox
        .write_files(vec![file("blocker", "b")])
        .await
        .unwrap();
    let result = sandbox
        .write_files(vec![
            file("first.txt", "1"),
            file("blocker/inside.txt", "2"),
            file("third.txt", "3"),
        ])
        .await;
    assert_invalid_path(result, "second file of the batch");
    // Documented behaviour: earlier files stay written, later ones are not.
    assert_eq!(sandbox.read_file(&path("first.txt")).await.unwrap(), "1");
    assert!(matches!(
        sandbox.read_file(&path("third.txt")).await,
        Err(SandboxError::NotFound { .. })
    ));
}

#[tokio::test]
async fn operations_after_destroy_are_gone() {
    let root = tempdir();
    let (provider, sandbox) = local(root.path(), "gone").await;
    provider.destroy(sandbox.key()).await.unwrap();
    let gone = |r: &Result<_, SandboxError>| matches!(r, Err(SandboxError::Gone { .. }));
    assert!(gone(
        &sandbox.write_files(vec![file("a", "a")]).await.map(|_| ())
    ));
    assert!(gone(&sandbox.list_files().await.map(|_| ())));
    assert!(gone(&sandbox.read_file(&path("a")).await.map(|_| ())));
    assert!(gone(
        &sandbox
            .exec(command("true", &[]), CancellationToken::new())
            .await
            .map(|_| ())
    ));
    assert!(!sandbox.workspace().exists());
}

// ------------------------------------------------------------ keys

#[tokio::test]
async fn keys_are_sanitised_and_stay_under_the_root() {
    let root = tempdir();
    let canonical_root = std::fs::canonicalize(root.path()).unwrap();
    let provider = LocalSandboxProvider::new(root.path());
    let keys = [
        "../../x",
        "..",
        ".",
        "",
        "/etc/passwd",
        "a/b",
        "a_b",
        "a\\b",
        "ключ",
        "run:1 turn:2",
        &"long".repeat(100),
    ];
    let mut dirs = std::collections::HashSet::new();
    for raw in keys {
        let key = SandboxKey(raw.to_owned());
        let sandbox = provider.provision_local(&key).await.unwrap();
        let ws = sandbox.workspace();
        assert_eq!(ws.parent(), Some(canonical_root.as_path()), "key {raw:?}");
        let name = ws.file_name().unwrap().to_str().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "key {raw:?} gave {name:?}"
        );
        assert!(name.len() <= 48 + 17, "{name:?} too long");
        assert!(dirs.insert(ws.to_path_buf()), "key {raw:?} collided");
        // Same key again: same directory.
        let again = provider.provision_local(&key).await.unwrap();
        assert_eq!(again.workspace(), ws);
    }
    assert!(!root.path().join("../x").exists() || root.path().parent().is_none());
    assert_eq!(
        std::fs::read_dir(&canonical_root).unwrap().count(),
        keys.len()
    );
}

#[test]
fn dir_name_is_stable() {
    // Reattach across restarts depends on this exact value never changing.
    assert_eq!(
        LocalSandboxProvider::dir_name(&SandboxKey("run-1".into())),
        "run-1-7a18676a33931f5c" // FNV-1a 64 of "run-1"
    );
}

// ------------------------------------------------------------ processes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_program_is_a_spawn_error() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "spawn").await;
    let result = sandbox
        .exec(
            command("edward-no-such-program", &[]),
            CancellationToken::new(),
        )
        .await;
    assert!(
        matches!(result, Err(SandboxError::Spawn { .. })),
        "{result:?}"
    );
    let mut bad_env = command("true", &[]);
    bad_env.env = vec![("A=B".into(), "x".into())];
    let result = sandbox.exec(bad_env, CancellationToken::new()).await;
    assert!(
        matches!(result, Err(SandboxError::Spawn { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grandchild_killed_on_timeout() {
    for mode in MODES {
        let root = tempdir();
        let (_provider, sandbox) = local_mode(root.path(), "grandchild-timeout", mode).await;
        let m = marker();
        let script = format!("sleep {m} & echo $! > pid; wait");
        let mut request = command("sh", &["-c", &script]);
        request.timeout = Duration::from_millis(500);
        let out = sandbox
            .exec(request, CancellationToken::new())
            .await
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert!(
            wait_gone(&m).await,
            "{mode:?}: grandchild survived the timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grandchild_killed_on_cancel() {
    for mode in MODES {
        grandchild_killed_on_cancel_in(mode).await;
    }
}

async fn grandchild_killed_on_cancel_in(mode: Confinement) {
    let root = tempdir();
    let (_provider, sandbox) = local_mode(root.path(), "grandchild-cancel", mode).await;
    let m = marker();
    let script = format!("sleep {m} & echo $! > pid; wait");
    let sandbox = Arc::new(sandbox);
    let cancel = CancellationToken::new();
    let canceller = {
        let sandbox = Arc::clone(&sandbox);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let started = wait_for_file(&sandbox, "pid").await;
            cancel.cancel();
            started
        })
    };
    let mut request = command("sh", &["-c", &script]);
    request.timeout = Duration::from_secs(60);
    let started = Instant::now();
    let result = sandbox.exec(request, cancel).await;
    assert!(canceller.await.unwrap(), "command never started");
    assert!(matches!(result, Err(SandboxError::Cancelled)), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        wait_gone(&m).await,
        "{mode:?}: grandchild survived the cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_job_killed_when_command_exits() {
    for mode in MODES {
        let root = tempdir();
        let (_provider, sandbox) = local_mode(root.path(), "background", mode).await;
        // The background `sleep` inherits stdout: without the group kill, the
        // pipe would stay open and exec would wait for 60 s.
        let m = marker();
        let script = format!("sleep {m} & echo $! > pid; echo bye");
        let started = Instant::now();
        let out = sandbox
            .exec(command("sh", &["-c", &script]), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        assert_eq!(out.stdout, "bye\n");
        assert!(!out.timed_out);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            wait_gone(&m).await,
            "{mode:?}: background job outlived exec"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_exec_future_kills_the_group() {
    for mode in MODES {
        dropped_exec_future_kills_the_group_in(mode).await;
    }
}

async fn dropped_exec_future_kills_the_group_in(mode: Confinement) {
    let root = tempdir();
    let (_provider, sandbox) = local_mode(root.path(), "dropped", mode).await;
    let sandbox = Arc::new(sandbox);
    let m = marker();
    let exec = {
        let sandbox = Arc::clone(&sandbox);
        let script = format!("sleep {m} & echo $! > pid; wait");
        tokio::spawn(async move {
            let mut request = command("sh", &["-c", &script]);
            request.timeout = Duration::from_secs(60);
            sandbox.exec(request, CancellationToken::new()).await
        })
    };
    assert!(
        wait_for_file(&sandbox, "pid").await,
        "command never started"
    );
    exec.abort(); // drops the exec future without cancelling
    assert!(exec.await.unwrap_err().is_cancelled());
    assert!(
        wait_gone(&m).await,
        "{mode:?}: grandchild outlived the dropped exec"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_that_left_the_group_cannot_hang_exec() {
    let root = tempdir();
    let mut config = LocalSandboxConfig::default();
    config.kill_grace = Duration::from_millis(300);
    // Unconfined on purpose: in the jail the escapee dies with the namespace
    // (tests/jail.rs), and the pid it writes is not a host pid.
    config.confinement = Confinement::Off;
    let provider = LocalSandboxProvider::with_config(root.path(), config);
    let sandbox = provider
        .provision_local(&fresh_key("setsid"))
        .await
        .unwrap();
    // `setsid` puts sleep in a new session (and group): killpg can't reach it,
    // and it holds stdout open. exec must still return after the grace period.
    let started = Instant::now();
    let out = sandbox
        .exec(
            command("sh", &["-c", "setsid sleep 30 & echo $! > pid; echo hi"]),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let pid = read_pid(&sandbox, "pid").await;
    // Clean up the escapee ourselves.
    // SAFETY: sending a signal to a pid we started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "hi\n");
    assert!(elapsed < Duration::from_secs(5), "exec took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_is_cleared_to_the_allowlist() {
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "cargo sets this for tests; the check below relies on a host-only variable"
    );
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "env").await;
    let mut request = command("env", &[]);
    request.env = vec![("EXTRA".into(), "1".into())];
    let out = sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap();
    // PWD: bubblewrap sets it to the working directory.
    let allowed = [
        "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "NODE_ENV", "HOME", "EXTRA", "PWD",
    ];
    let mut names = Vec::new();
    for line in out.stdout.lines() {
        let (name, value) = line.split_once('=').expect("NAME=value");
        assert!(allowed.contains(&name), "unexpected variable {name}");
        if name == "HOME" {
            assert_eq!(Path::new(value), sandbox.workspace());
        }
        names.push(name);
    }
    for required in ["PATH", "HOME", "EXTRA"] {
        assert!(names.contains(&required), "{required} missing: {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_env_and_home_apply_and_request_wins() {
    let root = tempdir();
    let home = tempdir();
    let mut config = LocalSandboxConfig::default();
    config.env_passthrough.clear();
    config.env = vec![
        ("NODE_ENV".into(), "development".into()),
        ("OVERRIDDEN".into(), "config".into()),
    ];
    config.home = Some(home.path().to_path_buf());
    config.default_path = "/usr/bin:/bin".into();
    let provider = LocalSandboxProvider::with_config(root.path(), config);
    let sandbox = provider
        .provision_local(&fresh_key("env-config"))
        .await
        .unwrap();
    let mut request = command("env", &[]);
    request.env = vec![("OVERRIDDEN".into(), "request".into())];
    let out = sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap();
    // PWD: bubblewrap sets it to the working directory.
    let mut lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("PWD="))
        .collect();
    lines.sort_unstable();
    let home_line = format!("HOME={}", home.path().display());
    let mut expected = vec![
        home_line.as_str(),
        "NODE_ENV=development",
        "OVERRIDDEN=request",
        "PATH=/usr/bin:/bin",
    ];
    expected.sort_unstable();
    assert_eq!(lines, expected);
}

// ------------------------------------------------------------ measurements

/// Rough numbers for the report; `cargo test -p edward-sandbox --test local
/// -- --ignored --nocapture measure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints timings; run by hand"]
async fn measure() {
    let root = tempdir();
    let (_provider, sandbox) = local(root.path(), "measure").await;

    let mut latencies = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        let out = sandbox
            .exec(command("true", &[]), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        latencies.push(started.elapsed());
    }
    latencies.sort();
    println!(
        "exec `true`: p50 {:?}, p90 {:?} (50 runs)",
        latencies[25], latencies[45]
    );

    let files: Vec<_> = (0..1000)
        .map(|i| file(&format!("src/d{}/f{i}.txt", i % 20), vec![b'x'; 1024]))
        .collect();
    let started = Instant::now();
    sandbox.write_files(files).await.unwrap();
    let elapsed = started.elapsed();
    println!(
        "write_files 1000 x 1 KiB in 20 dirs: {elapsed:?} ({:.0} files/s)",
        1000.0 / elapsed.as_secs_f64()
    );

    let started = Instant::now();
    let listed = sandbox.list_files().await.unwrap();
    assert_eq!(listed.len(), 1000);
    println!("list_files 1000 files: {:?}", started.elapsed());

    let started = Instant::now();
    for entry in &listed {
        sandbox.read_file(&path(&entry.path)).await.unwrap();
    }
    println!("read_file x1000: {:?}", started.elapsed());

    let mut request = command("head", &["-c", "200000000", "/dev/zero"]);
    request.output_cap = 64 * 1024;
    let started = Instant::now();
    let out = sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(out.stdout_truncated, 200_000_000 - 64 * 1024);
    println!(
        "drain 200 MB of stdout (cap 64 KiB): {elapsed:?} ({:.0} MB/s)",
        200.0 / elapsed.as_secs_f64()
    );

    let mut request = command("sleep", &["30"]);
    request.timeout = Duration::from_millis(100);
    let started = Instant::now();
    sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap();
    println!(
        "timeout 100 ms on `sleep 30`: returned after {:?}",
        started.elapsed()
    );
}

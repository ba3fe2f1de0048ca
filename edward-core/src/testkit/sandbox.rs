//! Conformance suite for [`SandboxProvider`]/[`Sandbox`] adapters.
//!
//! Every sandbox adapter's tests call [`run_all`] (or single checks) so that
//! `LocalSandbox` and `DockerSandbox` provably behave alike. Each check uses a
//! fresh random key and destroys its sandbox at the end. The commands used
//! (`sh`, `echo`, `ls`, `cat`, `head`, `sleep`, `pwd`, `printenv`) exist in a
//! Debian image and in busybox.
//!
//! Checks that need host file-system access (symlink escapes, grandchild
//! processes, environment clearing) live in the adapter's own tests.
//!
//! The functions panic on a failed expectation, like assertions in a test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::{
    ExecOutput, ExecRequest, FileEntry, FileWrite, Sandbox, SandboxError, SandboxKey, SandboxPath,
    SandboxProvider, SandboxSpec,
};

/// A command must come back this much sooner than its `sleep` would end for
/// "killed" to be credible.
const PROMPT: Duration = Duration::from_secs(10);

/// Run every check, in order.
pub async fn run_all(provider: &dyn SandboxProvider) {
    provision_is_idempotent(provider).await;
    write_read_round_trip(provider).await;
    rewrite_replaces_whole_content(provider).await;
    read_missing_is_not_found(provider).await;
    list_sorted_with_sizes(provider).await;
    invalid_paths_refused(provider).await;
    exec_echo_and_ls(provider).await;
    exec_nonzero_exit_code(provider).await;
    exec_request_env(provider).await;
    exec_cwd_honoured(provider).await;
    exec_missing_program(provider).await;
    exec_output_cap(provider).await;
    exec_timeout_kills(provider).await;
    exec_cancel_kills(provider).await;
    destroy_removes_files(provider).await;
    attach_never_creates(provider).await;
}

/// `attach` finds a provisioned sandbox with its files, and returns `None`
/// for a key never provisioned or destroyed — without creating one.
pub async fn attach_never_creates(provider: &dyn SandboxProvider) {
    let key = fresh_key("attach");
    assert!(
        provider.attach(&key).await.expect("attach").is_none(),
        "attach of an unknown key must be None"
    );
    assert!(
        provider.attach(&key).await.expect("attach").is_none(),
        "a failed attach must not have created the sandbox"
    );
    let sandbox = provision(provider, &key).await;
    write(sandbox.as_ref(), vec![file("kept.txt", "kept")]).await;
    let attached = provider
        .attach(&key)
        .await
        .expect("attach")
        .expect("a provisioned sandbox is attachable");
    assert_eq!(
        attached.read_file(&path("kept.txt")).await.expect("read"),
        Bytes::from_static(b"kept")
    );
    destroy(provider, &key).await;
    assert!(
        provider.attach(&key).await.expect("attach").is_none(),
        "a destroyed sandbox is not attachable"
    );
}

/// A key no other check (or earlier test run) uses.
pub fn fresh_key(check: &str) -> SandboxKey {
    SandboxKey(format!(
        "conformance-{check}-{}",
        uuid::Uuid::new_v4().simple()
    ))
}

/// A validated path; panics on an invalid literal.
pub fn path(raw: &str) -> SandboxPath {
    SandboxPath::new(raw).unwrap_or_else(|err| panic!("test path {raw:?} invalid: {err}"))
}

/// A file to write.
pub fn file(raw: &str, content: impl Into<Bytes>) -> FileWrite {
    FileWrite {
        path: path(raw),
        content: content.into(),
    }
}

/// A command with a 10 s timeout and a 64 KiB output cap.
pub fn command(program: &str, args: &[&str]) -> ExecRequest {
    ExecRequest {
        program: program.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        cwd: None,
        env: Vec::new(),
        timeout: Duration::from_secs(10),
        output_cap: 64 * 1024,
    }
}

async fn provision(provider: &dyn SandboxProvider, key: &SandboxKey) -> Arc<dyn Sandbox> {
    provider
        .provision(key, &SandboxSpec::default())
        .await
        .unwrap_or_else(|err| panic!("provision {key}: {err}"))
}

async fn destroy(provider: &dyn SandboxProvider, key: &SandboxKey) {
    provider
        .destroy(key)
        .await
        .unwrap_or_else(|err| panic!("destroy {key}: {err}"));
}

async fn write(sandbox: &dyn Sandbox, files: Vec<FileWrite>) {
    sandbox
        .write_files(files)
        .await
        .unwrap_or_else(|err| panic!("write_files: {err}"));
}

async fn read(sandbox: &dyn Sandbox, raw: &str) -> Bytes {
    sandbox
        .read_file(&path(raw))
        .await
        .unwrap_or_else(|err| panic!("read_file {raw}: {err}"))
}

async fn list(sandbox: &dyn Sandbox) -> Vec<FileEntry> {
    sandbox
        .list_files()
        .await
        .unwrap_or_else(|err| panic!("list_files: {err}"))
}

async fn exec(sandbox: &dyn Sandbox, request: ExecRequest) -> ExecOutput {
    let shown = format!("{} {:?}", request.program, request.args);
    sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap_or_else(|err| panic!("exec {shown}: {err}"))
}

fn entry(path: &str, size: u64) -> FileEntry {
    FileEntry {
        path: path.into(),
        size,
    }
}

/// Provisioning the same key twice reattaches: files written through the
/// first handle are visible through the second, and a different key is a
/// different, empty sandbox.
pub async fn provision_is_idempotent(provider: &dyn SandboxProvider) {
    let key = fresh_key("idempotent");
    let first = provision(provider, &key).await;
    assert_eq!(first.key(), &key);
    write(first.as_ref(), vec![file("kept.txt", "still here")]).await;

    let second = provision(provider, &key).await;
    assert_eq!(second.key(), &key);
    assert_eq!(read(second.as_ref(), "kept.txt").await, "still here");
    assert_eq!(list(second.as_ref()).await, vec![entry("kept.txt", 10)]);
    // Writes through the second handle are visible through the first.
    write(second.as_ref(), vec![file("more.txt", "x")]).await;
    assert_eq!(read(first.as_ref(), "more.txt").await, "x");

    let other_key = fresh_key("idempotent-other");
    let other = provision(provider, &other_key).await;
    assert!(
        list(other.as_ref()).await.is_empty(),
        "a new key must start with an empty workspace"
    );
    destroy(provider, &other_key).await;
    destroy(provider, &key).await;
}

/// Bytes come back exactly, including NUL and non-UTF-8 bytes, an empty file,
/// and files in nested directories that did not exist.
pub async fn write_read_round_trip(provider: &dyn SandboxProvider) {
    let key = fresh_key("round-trip");
    let sandbox = provision(provider, &key).await;
    let binary: Vec<u8> = (0..=255u8).chain([0, 0xFF, 0xFE, b'\n', b'\r']).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    write(
        sandbox.as_ref(),
        vec![
            file("top.txt", "hello\n"),
            file("src/deep/er/still/bin.dat", binary.clone()),
            file("empty", Bytes::new()),
            file("./a//b/../large.bin", large.clone()),
        ],
    )
    .await;
    assert_eq!(read(sandbox.as_ref(), "top.txt").await, "hello\n");
    assert_eq!(
        read(sandbox.as_ref(), "src/deep/er/still/bin.dat").await,
        binary
    );
    assert_eq!(read(sandbox.as_ref(), "empty").await, Bytes::new());
    assert_eq!(read(sandbox.as_ref(), "a/large.bin").await, large);
    destroy(provider, &key).await;
}

/// A second write replaces the whole content (no leftover tail of a longer
/// old version), also within one batch where the later write wins.
pub async fn rewrite_replaces_whole_content(provider: &dyn SandboxProvider) {
    let key = fresh_key("rewrite");
    let sandbox = provision(provider, &key).await;
    write(
        sandbox.as_ref(),
        vec![file("f.txt", "a much longer first version\n")],
    )
    .await;
    write(sandbox.as_ref(), vec![file("f.txt", "short")]).await;
    assert_eq!(read(sandbox.as_ref(), "f.txt").await, "short");

    write(
        sandbox.as_ref(),
        vec![file("g.txt", "first in batch"), file("g.txt", "second")],
    )
    .await;
    assert_eq!(read(sandbox.as_ref(), "g.txt").await, "second");
    assert_eq!(
        list(sandbox.as_ref()).await,
        vec![entry("f.txt", 5), entry("g.txt", 6)],
        "rewrites must not leave temporary files behind"
    );
    destroy(provider, &key).await;
}

/// Reading a file that does not exist (also below a missing directory) is
/// `NotFound`.
pub async fn read_missing_is_not_found(provider: &dyn SandboxProvider) {
    let key = fresh_key("missing");
    let sandbox = provision(provider, &key).await;
    write(sandbox.as_ref(), vec![file("dir/present.txt", "x")]).await;
    for missing in ["absent.txt", "dir/absent.txt", "nodir/absent.txt"] {
        match sandbox.read_file(&path(missing)).await {
            Err(SandboxError::NotFound { .. }) => {}
            other => panic!("read_file {missing}: expected NotFound, got {other:?}"),
        }
    }
    destroy(provider, &key).await;
}

/// `list_files` returns every regular file with its size, sorted by path
/// bytes (`a-b.txt` before `a/c.txt`, since `-` < `/`), and no directories.
pub async fn list_sorted_with_sizes(provider: &dyn SandboxProvider) {
    let key = fresh_key("list");
    let sandbox = provision(provider, &key).await;
    assert!(list(sandbox.as_ref()).await.is_empty());
    write(
        sandbox.as_ref(),
        vec![
            file("z.txt", "zz"),
            file("a/c.txt", "ccc"),
            file("B.txt", "B"),
            file("a-b.txt", ""),
            file("a/b/d.txt", "dddd"),
            file("m/n/o/p.txt", vec![7u8; 1000]),
        ],
    )
    .await;
    assert_eq!(
        list(sandbox.as_ref()).await,
        vec![
            entry("B.txt", 1),
            entry("a-b.txt", 0),
            entry("a/b/d.txt", 4),
            entry("a/c.txt", 3),
            entry("m/n/o/p.txt", 1000),
            entry("z.txt", 2),
        ]
    );

    // Many files: all listed, still sorted.
    let many: Vec<FileWrite> = (0..300)
        .map(|i| file(&format!("many/{}/f{i}.txt", i % 7), format!("{i}")))
        .collect();
    write(sandbox.as_ref(), many).await;
    let listed = list(sandbox.as_ref()).await;
    assert_eq!(listed.len(), 306);
    assert!(
        listed.windows(2).all(|w| w[0].path < w[1].path),
        "listing not strictly sorted"
    );
    destroy(provider, &key).await;
}

/// Paths that escape or are malformed never reach the sandbox: `SandboxPath`
/// refuses them with `InvalidPath`, and normalisation keeps accepted ones inside.
pub async fn invalid_paths_refused(provider: &dyn SandboxProvider) {
    for bad in [
        "",
        "/etc/passwd",
        "../outside",
        "a/../../outside",
        "C:\\windows",
        "a\0b",
        ".",
    ] {
        match SandboxPath::new(bad) {
            Err(SandboxError::InvalidPath { .. }) => {}
            other => panic!("SandboxPath::new({bad:?}): expected InvalidPath, got {other:?}"),
        }
    }
    let key = fresh_key("paths");
    let sandbox = provision(provider, &key).await;
    // `a/../b.txt` normalises to `b.txt`: it lands inside.
    write(sandbox.as_ref(), vec![file("a/../b.txt", "inside")]).await;
    assert_eq!(read(sandbox.as_ref(), "b.txt").await, "inside");
    assert_eq!(list(sandbox.as_ref()).await, vec![entry("b.txt", 6)]);
    destroy(provider, &key).await;
}

/// `echo` and `ls` run in the workspace; exit code 0 and stdout come back.
pub async fn exec_echo_and_ls(provider: &dyn SandboxProvider) {
    let key = fresh_key("echo");
    let sandbox = provision(provider, &key).await;
    let out = exec(sandbox.as_ref(), command("echo", &["hello", "world"])).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "hello world\n");
    assert_eq!(out.stderr, "");
    assert_eq!((out.stdout_truncated, out.stderr_truncated), (0, 0));
    assert!(!out.timed_out);

    // Arguments are argv, not shell words: no globbing, no variable expansion.
    let out = exec(sandbox.as_ref(), command("echo", &["*", "$HOME", "a  b"])).await;
    assert_eq!(out.stdout, "* $HOME a  b\n");

    write(
        sandbox.as_ref(),
        vec![file("listed.txt", "x"), file("dir/inner.txt", "y")],
    )
    .await;
    let out = exec(sandbox.as_ref(), command("ls", &[])).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "dir\nlisted.txt\n");
    let out = exec(sandbox.as_ref(), command("cat", &["dir/inner.txt"])).await;
    assert_eq!(out.stdout, "y");

    // A command's own writes are visible to read_file and list_files.
    let out = exec(
        sandbox.as_ref(),
        command("sh", &["-c", "echo made > made.txt"]),
    )
    .await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(read(sandbox.as_ref(), "made.txt").await, "made\n");
    destroy(provider, &key).await;
}

/// A failing command is `Ok` with its exit code and stderr.
pub async fn exec_nonzero_exit_code(provider: &dyn SandboxProvider) {
    let key = fresh_key("exit-code");
    let sandbox = provision(provider, &key).await;
    let out = exec(
        sandbox.as_ref(),
        command("sh", &["-c", "echo out; echo oops >&2; exit 3"]),
    )
    .await;
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "oops\n");
    assert!(!out.timed_out);

    let out = exec(sandbox.as_ref(), command("ls", &["does-not-exist"])).await;
    assert!(
        matches!(out.exit_code, Some(code) if code != 0),
        "ls of a missing file: {out:?}"
    );
    assert!(!out.stderr.is_empty());
    destroy(provider, &key).await;
}

/// The request's `env` reaches the command.
pub async fn exec_request_env(provider: &dyn SandboxProvider) {
    let key = fresh_key("env");
    let sandbox = provision(provider, &key).await;
    let mut request = command("printenv", &["EDWARD_CONFORMANCE"]);
    request.env = vec![("EDWARD_CONFORMANCE".into(), "value with spaces".into())];
    let out = exec(sandbox.as_ref(), request).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "value with spaces\n");
    destroy(provider, &key).await;
}

/// `cwd` selects a directory inside the workspace; a missing one is refused.
pub async fn exec_cwd_honoured(provider: &dyn SandboxProvider) {
    let key = fresh_key("cwd");
    let sandbox = provision(provider, &key).await;
    write(sandbox.as_ref(), vec![file("sub/dir/marker.txt", "m")]).await;
    let mut request = command("ls", &[]);
    request.cwd = Some(path("sub/dir"));
    let out = exec(sandbox.as_ref(), request).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "marker.txt\n");

    let mut request = command("pwd", &[]);
    request.cwd = Some(path("sub/dir"));
    let out = exec(sandbox.as_ref(), request).await;
    assert!(
        out.stdout.trim_end().ends_with("/sub/dir"),
        "pwd: {:?}",
        out.stdout
    );

    let mut request = command("ls", &[]);
    request.cwd = Some(path("no/such/dir"));
    let result = sandbox.exec(request, CancellationToken::new()).await;
    assert!(
        matches!(
            result,
            Err(SandboxError::NotFound { .. } | SandboxError::InvalidPath { .. })
        ) || matches!(&result, Ok(out) if out.exit_code != Some(0)),
        "exec in a missing cwd: {result:?}"
    );
    destroy(provider, &key).await;
}

/// A program that does not exist fails: `Err(Spawn)` for process-based
/// sandboxes; a container runtime may instead report exit code 126/127.
pub async fn exec_missing_program(provider: &dyn SandboxProvider) {
    let key = fresh_key("missing-program");
    let sandbox = provision(provider, &key).await;
    let result = sandbox
        .exec(
            command("edward-no-such-program-4a7f", &[]),
            CancellationToken::new(),
        )
        .await;
    assert!(
        matches!(result, Err(SandboxError::Spawn { .. }))
            || matches!(&result, Ok(out) if matches!(out.exit_code, Some(126 | 127))),
        "missing program: {result:?}"
    );
    destroy(provider, &key).await;
}

/// Output beyond `output_cap` is discarded and counted; the command still
/// runs to completion (the pipe never blocks it), and each stream has its own cap.
pub async fn exec_output_cap(provider: &dyn SandboxProvider) {
    let key = fresh_key("output-cap");
    let sandbox = provision(provider, &key).await;
    let mut request = command("head", &["-c", "1000000", "/dev/zero"]);
    request.output_cap = 1000;
    let out = exec(sandbox.as_ref(), request).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout.bytes().all(|b| b == 0));
    assert_eq!(out.stdout_truncated, 999_000);
    assert_eq!((out.stderr.as_str(), out.stderr_truncated), ("", 0));

    // Both streams at once, far beyond any pipe buffer: no deadlock.
    let mut request = command(
        "sh",
        &[
            "-c",
            "head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2; echo done >&2",
        ],
    );
    request.output_cap = 10;
    let out = exec(sandbox.as_ref(), request).await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!((out.stdout.len(), out.stdout_truncated), (10, 299_990));
    assert_eq!((out.stderr.len(), out.stderr_truncated), (10, 199_995));

    // Under the cap nothing is counted.
    let mut request = command("echo", &["12345"]);
    request.output_cap = 6;
    let out = exec(sandbox.as_ref(), request).await;
    assert_eq!((out.stdout.as_str(), out.stdout_truncated), ("12345\n", 0));
    destroy(provider, &key).await;
}

/// A command running past its timeout is killed: the call returns promptly
/// with `timed_out` and no exit code.
pub async fn exec_timeout_kills(provider: &dyn SandboxProvider) {
    let key = fresh_key("timeout");
    let sandbox = provision(provider, &key).await;
    let mut request = command("sleep", &["30"]);
    request.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let out = exec(sandbox.as_ref(), request).await;
    let elapsed = started.elapsed();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, None);
    assert!(
        elapsed >= Duration::from_millis(300),
        "returned after {elapsed:?}"
    );
    assert!(elapsed < PROMPT, "timeout took {elapsed:?}");

    // Output before the timeout is kept.
    let mut request = command("sh", &["-c", "echo before; sleep 30"]);
    request.timeout = Duration::from_millis(500);
    let out = exec(sandbox.as_ref(), request).await;
    assert!(out.timed_out);
    assert_eq!(out.stdout, "before\n");
    destroy(provider, &key).await;
}

/// Cancelling a running command kills it and returns `Err(Cancelled)`
/// promptly. The token is fired from another task once the command has
/// visibly started (it writes a file first).
pub async fn exec_cancel_kills(provider: &dyn SandboxProvider) {
    let key = fresh_key("cancel");
    let sandbox = provision(provider, &key).await;
    let cancel = CancellationToken::new();
    let canceller = {
        let sandbox = Arc::clone(&sandbox);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let give_up = Instant::now() + PROMPT;
            loop {
                if sandbox.read_file(&path("started")).await.is_ok() {
                    cancel.cancel();
                    return true;
                }
                if Instant::now() > give_up {
                    cancel.cancel();
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut request = command("sh", &["-c", "echo go > started; sleep 30"]);
    request.timeout = Duration::from_secs(60);
    let started = Instant::now();
    let result = sandbox.exec(request, cancel).await;
    let elapsed = started.elapsed();
    let saw_start = canceller.await.unwrap_or(false);
    assert!(saw_start, "the command never wrote its start marker");
    assert!(
        matches!(result, Err(SandboxError::Cancelled)),
        "expected Cancelled, got {result:?}"
    );
    assert!(elapsed < PROMPT, "cancel took {elapsed:?}");

    // A token cancelled before the call: nothing runs.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let result = sandbox
        .exec(command("sh", &["-c", "echo ran > ran.txt"]), cancel)
        .await;
    assert!(matches!(result, Err(SandboxError::Cancelled)), "{result:?}");
    assert!(
        matches!(
            sandbox.read_file(&path("ran.txt")).await,
            Err(SandboxError::NotFound { .. })
        ),
        "a pre-cancelled exec must not run the command"
    );
    destroy(provider, &key).await;
}

/// Destroy removes everything; provisioning the key again starts empty;
/// destroying a missing sandbox is Ok.
pub async fn destroy_removes_files(provider: &dyn SandboxProvider) {
    let key = fresh_key("destroy");
    let sandbox = provision(provider, &key).await;
    write(
        sandbox.as_ref(),
        vec![file("a.txt", "a"), file("d/e/f.txt", "f")],
    )
    .await;
    destroy(provider, &key).await;
    destroy(provider, &key).await; // already gone: still Ok
    destroy(provider, &fresh_key("never-provisioned")).await;

    let again = provision(provider, &key).await;
    assert!(
        list(again.as_ref()).await.is_empty(),
        "a destroyed sandbox must come back empty"
    );
    assert!(matches!(
        again.read_file(&path("a.txt")).await,
        Err(SandboxError::NotFound { .. })
    ));
    destroy(provider, &key).await;
}

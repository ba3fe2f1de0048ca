//! The bubblewrap jail of `LocalSandbox`: every bypass of issue 13 (and more
//! of the same kinds) run *directly* in a jailed sandbox — past the engine's
//! command policy — must stay inside the workspace. Each hostile command also
//! writes a marker inside the workspace, proving it really ran.
//!
//! Needs bubblewrap (`scripts/test.sh` installs it); without it these tests
//! fail and say so.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edward_core::testkit::sandbox::{command, fresh_key, path};
use edward_core::{Isolation, Sandbox};
use edward_sandbox::{Confinement, LocalSandbox, LocalSandboxConfig, LocalSandboxProvider};
use tokio_util::sync::CancellationToken;

struct Jail {
    _root: tempfile::TempDir,
    root: PathBuf,
    sandbox: LocalSandbox,
    /// Another run's workspace under the same root, with a secret in it.
    sibling: PathBuf,
}

async fn jail(name: &str) -> Jail {
    let root = tempfile::tempdir().expect("temp dir");
    let mut config = LocalSandboxConfig::default();
    config.confinement = Confinement::Required;
    let provider = LocalSandboxProvider::with_config(root.path(), config);
    let sandbox = match provider.provision_local(&fresh_key(name)).await {
        Ok(s) => s,
        Err(e) => panic!(
            "bubblewrap is needed for the jail tests ({e}); run scripts/test.sh, which installs it"
        ),
    };
    assert_eq!(
        sandbox.isolation(),
        Isolation::Isolated {
            mechanism: "bubblewrap".into()
        }
    );
    let sibling = provider
        .provision_local(&fresh_key("sibling"))
        .await
        .expect("sibling")
        .workspace()
        .to_path_buf();
    std::fs::write(sibling.join("secret.txt"), "sibling secret").expect("secret");
    let root_path = std::fs::canonicalize(root.path()).expect("canonical root");
    Jail {
        _root: root,
        root: root_path,
        sandbox,
        sibling,
    }
}

async fn sh(sandbox: &LocalSandbox, script: &str) -> edward_core::ExecOutput {
    let mut req = command("sh", &["-c", script]);
    req.timeout = Duration::from_secs(30);
    sandbox
        .exec(req, CancellationToken::new())
        .await
        .expect("exec")
}

async fn run(sandbox: &LocalSandbox, program: &str, args: &[&str]) -> edward_core::ExecOutput {
    let mut req = command(program, args);
    req.timeout = Duration::from_secs(60);
    sandbox
        .exec(req, CancellationToken::new())
        .await
        .expect("exec")
}

/// Targets outside the workspace a hostile command tries to write.
fn targets(j: &Jail, tag: &str) -> Vec<PathBuf> {
    vec![
        j.root.join(format!("pwned-{tag}")),
        j.sibling.join(format!("pwned-{tag}")),
        std::env::temp_dir().join(format!("edward-pwned-{tag}-{}", std::process::id())),
    ]
}

fn assert_confined(j: &Jail, tag: &str, out: &edward_core::ExecOutput) {
    for t in targets(j, tag) {
        assert!(
            !t.exists(),
            "{tag}: wrote {} outside the workspace\n{out:?}",
            t.display()
        );
    }
    assert!(
        j.sandbox.workspace().join(format!("ran-{tag}")).exists(),
        "{tag}: the hostile command did not run at all, so the test proves nothing\n{out:?}"
    );
}

/// A shell snippet writing `ran-TAG` in the workspace, then every target.
fn payload(j: &Jail, tag: &str) -> String {
    let mut s = format!("echo ran > ran-{tag};");
    for t in targets(j, tag) {
        s.push_str(&format!(
            " mkdir -p {0} 2>/dev/null; echo pwned > {1};",
            t.parent().unwrap().display(),
            t.display()
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_writes_outside_stay_outside() {
    let j = jail("sh").await;
    let out = sh(&j.sandbox, &payload(&j, "sh")).await;
    assert_confined(&j, "sh", &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glued_option_copies_cannot_reach_the_shared_root() {
    let j = jail("cp").await;
    std::fs::write(j.sandbox.workspace().join("a.txt"), "a").unwrap();
    let root = format!("-t{}", j.root.display());
    // The root exists inside the jail only as an empty mount-point parent
    // on a private tmpfs: the copy may succeed there, never on the host.
    let out = run(&j.sandbox, "cp", &[&root, "a.txt"]).await;
    assert!(!j.root.join("a.txt").exists(), "{out:?}");
    let out = run(&j.sandbox, "cp", &["-t..", "a.txt"]).await;
    assert!(!j.root.join("a.txt").exists(), "{out:?}");
    // Reading other workspaces or host files does not work either.
    let secret = format!("-f{}", j.sibling.join("secret.txt").display());
    let out = run(&j.sandbox, "grep", &[&secret, "a.txt"]).await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    let out = run(&j.sandbox, "cat", &["/etc/hostname"]).await;
    assert_ne!(
        out.exit_code,
        Some(0),
        "host /etc/hostname readable: {out:?}"
    );
    let out = sh(&j.sandbox, &format!("ls {}", j.root.display())).await;
    assert!(
        !out.stdout.contains("sibling"),
        "other workspaces visible: {out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_exec_is_confined() {
    let j = jail("find").await;
    let p = payload(&j, "find");
    let out = run(
        &j.sandbox,
        "find",
        &[".", "-maxdepth", "0", "-exec", "sh", "-c", &p, ";"],
    )
    .await;
    assert_confined(&j, "find", &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_alias_and_config_hooks_are_confined() {
    let j = jail("git").await;
    let p = payload(&j, "gitalias");
    let alias = format!("alias.x=!sh -c '{}'", p.replace('\'', ""));
    let out = run(&j.sandbox, "git", &["-c", &alias, "x"]).await;
    assert_confined(&j, "gitalias", &out);

    // A model-written .git/config with core.fsmonitor runs on `git status`.
    let out = run(&j.sandbox, "git", &["init", "-q"]).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let hook = j.sandbox.workspace().join("hook.sh");
    std::fs::write(&hook, format!("#!/bin/sh\n{}\n", payload(&j, "fsmonitor"))).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = j.sandbox.workspace().join(".git/config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[core]\n\tfsmonitor = {}\n", hook.display()));
    std::fs::write(&config, text).unwrap();
    let out = run(&j.sandbox, "git", &["status"]).await;
    assert_confined(&j, "fsmonitor", &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_eval_and_npm_scripts_are_confined() {
    let j = jail("node").await;
    let mut js = String::from("const fs=require('fs');fs.writeFileSync('ran-node','x');");
    for t in targets(&j, "node") {
        js.push_str(&format!(
            "try{{fs.mkdirSync({:?},{{recursive:true}});fs.writeFileSync({:?},'pwned')}}catch(e){{}}",
            t.parent().unwrap().display().to_string(),
            t.display().to_string()
        ));
    }
    let out = run(&j.sandbox, "node", &["-e", &js]).await;
    assert_confined(&j, "node", &out);

    // npm run of a script the model wrote.
    let pkg = serde_json_lite(&payload(&j, "npmrun"));
    std::fs::write(j.sandbox.workspace().join("package.json"), pkg).unwrap();
    let out = run(&j.sandbox, "npm", &["run", "x"]).await;
    assert_confined(&j, "npmrun", &out);

    // npx -c / npm exec -c run a shell command.
    let out = run(
        &j.sandbox,
        "npm",
        &["exec", "--offline", "-c", &payload(&j, "npmexec")],
    )
    .await;
    assert_confined(&j, "npmexec", &out);
}

/// `{"name":"x","version":"1.0.0","scripts":{"x":SCRIPT}}` with SCRIPT escaped.
fn serde_json_lite(script: &str) -> String {
    let escaped: String = script
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    format!(r#"{{"name":"x","version":"1.0.0","scripts":{{"x":"{escaped}"}}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_children_die_with_the_command() {
    let j = jail("setsid").await;
    let marker = format!("61.{}", std::process::id());
    let started = Instant::now();
    let out = sh(
        &j.sandbox,
        &format!("setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & echo hi"),
    )
    .await;
    assert_eq!(out.stdout, "hi\n", "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !alive(&marker).is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(alive(&marker).is_empty(), "detached children outlived exec");
}

fn alive(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')) {
            continue;
        }
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(marker) {
            found.push(cmd);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_but_loopback_of_its_own() {
    let j = jail("net").await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = run(
        &j.sandbox,
        "bash",
        &[
            "-c",
            &format!("echo ran > ran-net; echo hi > /dev/tcp/127.0.0.1/{port}"),
        ],
    )
    .await;
    assert_ne!(out.exit_code, Some(0), "connected to the host: {out:?}");
    assert!(Path::new(&j.sandbox.workspace().join("ran-net")).exists());
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_tmp_and_workspace_writes_work() {
    let j = jail("tmp").await;
    let name = format!("edward-jail-tmp-{}", std::process::id());
    let out = sh(
        &j.sandbox,
        &format!("echo x > /tmp/{name} && cat /tmp/{name} && echo ok > inside.txt"),
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert!(
        !std::env::temp_dir().join(&name).exists(),
        "jail /tmp is the host's"
    );
    let bytes = j.sandbox.read_file(&path("inside.txt")).await.unwrap();
    assert_eq!(&bytes[..], b"ok\n");
}

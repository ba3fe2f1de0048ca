//! `DockerSandbox` under bad input and faults, against a real daemon: path
//! escapes, huge output, fork bombs, memory hogs, commands that ignore
//! SIGTERM, cancellation, the network, concurrent provisioning, the daemon
//! going away, reaping. Each process check reads the container's process
//! table. Needs `scripts/test.sh` (or `scripts/dockerd.sh start &&
//! scripts/docker-image.sh`).

mod docker_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use docker_common::{config, provider, provider_with};
use edward_core::testkit::sandbox::{command, file, fresh_key, path};
use edward_core::{ExecOutput, ExecRequest, Sandbox, SandboxError, SandboxProvider};
use edward_sandbox::docker::bollard::Docker;
use edward_sandbox::docker::{KEY_LABEL, MANAGED_LABEL};
use edward_sandbox::{DockerSandbox, DockerSandboxConfig, DockerSandboxProvider};
use tokio_util::sync::CancellationToken;

async fn exec(sandbox: &DockerSandbox, request: ExecRequest) -> ExecOutput {
    let shown = format!("{} {:?}", request.program, request.args);
    sandbox
        .exec(request, CancellationToken::new())
        .await
        .unwrap_or_else(|err| panic!("exec {shown}: {err}"))
}

async fn sh(sandbox: &DockerSandbox, script: &str) -> ExecOutput {
    exec(sandbox, command("sh", &["-c", script])).await
}

/// The container's process table (`ps -o pid,args`), minus the `ps` that
/// read it and its launcher.
async fn processes(sandbox: &DockerSandbox) -> Vec<String> {
    let out = exec(sandbox, command("ps", &["-o", "pid,args"])).await;
    assert_eq!(out.exit_code, Some(0), "ps: {out:?}");
    out.stdout
        .lines()
        .skip(1)
        .filter(|l| !l.contains(" ps -o pid,args"))
        .map(str::to_owned)
        .collect()
}

/// Processes whose command line mentions `marker` (a number used only by
/// the command under test).
async fn with_marker(sandbox: &DockerSandbox, marker: &str) -> Vec<String> {
    processes(sandbox)
        .await
        .into_iter()
        .filter(|l| l.contains(marker))
        .collect()
}

async fn assert_invalid_path<T: std::fmt::Debug>(result: Result<T, SandboxError>, what: &str) {
    assert!(
        matches!(result, Err(SandboxError::InvalidPath { .. })),
        "{what}: expected InvalidPath, got {result:?}"
    );
}

// ------------------------------------------------------------ paths

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_planted_by_a_command_is_never_written_or_read_through() {
    let provider = provider().await;
    let key = fresh_key("symlink");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let out = sh(
        &sandbox,
        "ln -s /tmp out && ln -s /etc/passwd passwd && mkdir real && echo in > real/f \
         && ln -s real inner && ln -s /etc etc",
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");

    // Writing through a directory symlink that leaves the workspace: refused,
    // nothing lands in /tmp.
    assert_invalid_path(
        sandbox
            .write_files(vec![file("out/planted.txt", "x")])
            .await,
        "write through out -> /tmp",
    )
    .await;
    let out = exec(&sandbox, command("ls", &["-A", "/tmp"])).await;
    assert!(!out.stdout.contains("planted"), "{out:?}");
    // The whole batch is refused before anything moves.
    assert_invalid_path(
        sandbox
            .write_files(vec![file("ok.txt", "ok"), file("out/x", "x")])
            .await,
        "batch with one escape",
    )
    .await;
    assert!(matches!(
        sandbox.read_file(&path("ok.txt")).await,
        Err(SandboxError::NotFound { .. })
    ));

    // Writing *to* a symlink replaces the link, never its target.
    sandbox
        .write_files(vec![file("passwd", "mine")])
        .await
        .expect("write over a symlink");
    assert_eq!(
        sandbox.read_file(&path("passwd")).await.expect("read"),
        "mine"
    );
    let out = exec(&sandbox, command("head", &["-n", "1", "/etc/passwd"])).await;
    assert!(out.stdout.starts_with("root:"), "{out:?}");

    // Reads: a symlink out is refused, one that stays inside is followed.
    sh(&sandbox, "ln -s /etc/passwd passwd2").await;
    assert_invalid_path(
        sandbox.read_file(&path("passwd2")).await,
        "read symlink to /etc/passwd",
    )
    .await;
    assert_invalid_path(
        sandbox.read_file(&path("etc/passwd")).await,
        "read through etc -> /etc",
    )
    .await;
    assert_eq!(
        sandbox.read_file(&path("inner/f")).await.expect("inside"),
        "in\n"
    );
    // cwd through a symlink out is refused too.
    let mut request = command("ls", &[]);
    request.cwd = Some(path("etc"));
    assert_invalid_path(
        sandbox.exec(request, CancellationToken::new()).await,
        "cwd etc -> /etc",
    )
    .await;

    // Listings never contain symlinks or Edward's private directory.
    let listed: Vec<String> = sandbox
        .list_files()
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(listed, vec!["passwd", "real/f"]);
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_are_data_not_tar_paths_or_shell_words() {
    let provider = provider().await;
    let key = fresh_key("names");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    // Tar-slip names never become paths: `SandboxPath` refuses them…
    for bad in ["../../etc/x", "/etc/x", "a/../../x"] {
        assert!(matches!(
            edward_core::SandboxPath::new(bad),
            Err(SandboxError::InvalidPath { .. })
        ));
    }
    // …and the names that pass are only ever arguments of the rename step,
    // never archive entry names or shell words.
    let names = [
        "-rf",
        "..dots",
        "$(touch pwned)",
        "a b/`id`.txt",
        "semi;colon",
        "*",
    ];
    let files: Vec<_> = names.iter().map(|n| file(n, n.to_string())).collect();
    sandbox.write_files(files).await.expect("write");
    for name in names {
        assert_eq!(
            sandbox.read_file(&path(name)).await.expect("read"),
            name.as_bytes()
        );
    }
    assert!(matches!(
        sandbox.read_file(&path("pwned")).await,
        Err(SandboxError::NotFound { .. })
    ));
    assert_eq!(sandbox.list_files().await.expect("list").len(), names.len());
    // Modes are normalised and files belong to the sandbox user.
    let out = exec(&sandbox, command("stat", &["-c", "%a %u:%g", "..dots"])).await;
    assert_eq!(out.stdout, "644 1000:1000\n");
    // Edward's private directory is reserved.
    assert_invalid_path(
        sandbox
            .write_files(vec![file(".edward/last-use", "x")])
            .await,
        "write into .edward",
    )
    .await;
    provider.destroy(&key).await.expect("destroy");
}

// ------------------------------------------------------------ output, processes, limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_of_output_is_capped_and_counted() {
    let provider = provider().await;
    let key = fresh_key("gigabyte");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let mut request = command(
        "sh",
        &["-c", "head -c 1000000000 /dev/zero; echo after >&2"],
    );
    request.output_cap = 64 * 1024;
    request.timeout = Duration::from_secs(120);
    let out = exec(&sandbox, request).await;
    assert_eq!(out.exit_code, Some(0), "{:?}", out.stderr);
    assert_eq!(out.stdout.len(), 64 * 1024);
    assert_eq!(out.stdout_truncated, 1_000_000_000 - 64 * 1024);
    assert_eq!(out.stderr, "after\n");
    // The sandbox goes on.
    let out = exec(&sandbox, command("echo", &["still here"])).await;
    assert_eq!(out.stdout, "still here\n");
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_loop_stops_at_the_pids_limit() {
    let mut config = config();
    config.pids_limit = 40;
    let provider = provider_with(config).await;
    let key = fresh_key("forks");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let mut request = command(
        "sh",
        &[
            "-c",
            "i=0; while [ $i -lt 500 ]; do sleep 4242 & i=$((i+1)); done; echo forked $i",
        ],
    );
    request.timeout = Duration::from_secs(20);
    let out = exec(&sandbox, request).await;
    assert!(!out.timed_out, "{out:?}");
    assert_ne!(
        out.exit_code,
        Some(0),
        "500 forks under a limit of 40: {out:?}"
    );
    assert!(
        out.stderr.contains("fork"),
        "the shell should report the failed fork: {out:?}"
    );
    // The sleeps it did start were killed with the command's group.
    assert_eq!(with_marker(&sandbox, "4242").await, Vec::<String>::new());
    let out = exec(&sandbox, command("echo", &["alive"])).await;
    assert_eq!(out.stdout, "alive\n");
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_hog_is_killed_with_exit_code_137() {
    let mut config = config();
    config.memory_bytes = 64 << 20;
    let provider = provider_with(config).await;
    let key = fresh_key("memory");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let mut request = command("awk", &["BEGIN { s = \"x\"; while (1) s = s s }"]);
    request.timeout = Duration::from_secs(60);
    let out = exec(&sandbox, request).await;
    assert!(!out.timed_out, "{out:?}");
    assert_eq!(
        out.exit_code,
        Some(137),
        "SIGKILL by the OOM killer: {out:?}"
    );
    let out = exec(&sandbox, command("echo", &["alive"])).await;
    assert_eq!(out.stdout, "alive\n");
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_ignoring_sigterm_is_gone_after_its_timeout() {
    let provider = provider().await;
    let key = fresh_key("sigterm");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let mut request = command(
        "sh",
        &[
            "-c",
            "trap '' TERM INT HUP; (trap '' TERM; sleep 5151) & sleep 5152; wait",
        ],
    );
    request.timeout = Duration::from_millis(1500);
    let started = Instant::now();
    let out = exec(&sandbox, request).await;
    assert!(out.timed_out, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(with_marker(&sandbox, "515").await, Vec::<String>::new());
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_command_leaves_no_process() {
    let provider = provider().await;
    let key = fresh_key("cancel-ps");
    let sandbox = Arc::new(provider.provision_docker(&key).await.expect("provision"));
    let cancel = CancellationToken::new();
    let watcher = {
        let sandbox = Arc::clone(&sandbox);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let give_up = Instant::now() + Duration::from_secs(20);
            while Instant::now() < give_up {
                if !with_marker(&sandbox, "6161").await.is_empty() {
                    break;
                }
            }
            cancel.cancel();
        })
    };
    let request = command("sh", &["-c", "sleep 6161 & sleep 6162 & wait"]);
    let result = sandbox.exec(request, cancel).await;
    watcher.await.expect("watcher");
    assert!(matches!(result, Err(SandboxError::Cancelled)), "{result:?}");
    assert_eq!(with_marker(&sandbox, "616").await, Vec::<String>::new());

    // Dropping an exec future mid-command kills its group as well.
    let request = command("sh", &["-c", "sleep 7171"]);
    let dropped = tokio::time::timeout(
        Duration::from_secs(2),
        sandbox.exec(request, CancellationToken::new()),
    )
    .await;
    assert!(dropped.is_err(), "the sleep should still be running");
    let give_up = Instant::now() + Duration::from_secs(10);
    while !with_marker(&sandbox, "7171").await.is_empty() {
        assert!(Instant::now() < give_up, "dropped exec left its process");
    }
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_jobs_do_not_outlive_their_command() {
    let provider = provider().await;
    let key = fresh_key("background");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let started = Instant::now();
    let out = sh(&sandbox, "sleep 8181 & echo started").await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout, "started\n");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(with_marker(&sandbox, "8181").await, Vec::<String>::new());
    provider.destroy(&key).await.expect("destroy");
}

// ------------------------------------------------------------ isolation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_and_no_privileges_inside() {
    // A service on the host's loopback: unreachable from the sandbox.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port().to_string();
    let provider = provider().await;
    let key = fresh_key("network");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let mut request = command("nc", &["-w", "2", "127.0.0.1", &port]);
    request.timeout = Duration::from_secs(10);
    let out = exec(&sandbox, request).await;
    assert_ne!(
        out.exit_code,
        Some(0),
        "connect to the host's loopback: {out:?}"
    );
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "the host listener saw a connection");
    // Only the loopback interface exists.
    let out = exec(&sandbox, command("ls", &["/sys/class/net"])).await;
    assert_eq!(out.stdout, "lo\n");

    // Non-root, no capabilities, no new privileges, read-only root, small /tmp.
    let out = exec(&sandbox, command("id", &["-u"])).await;
    assert_eq!(out.stdout, "1000\n");
    let out = sh(
        &sandbox,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status",
    )
    .await;
    for line in [
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "{line}: {out:?}");
    }
    let out = sh(&sandbox, "touch /etc/x 2>&1; echo $?").await;
    assert!(out.stdout.contains("Read-only file system"), "{out:?}");
    let out = sh(&sandbox, "touch /tmp/x && touch /workspace/x && echo ok").await;
    assert_eq!(out.stdout, "ok\n");
    let out = sh(&sandbox, "df -k /tmp | tail -n 1").await;
    assert!(out.stdout.contains(" 65536 "), "64 MiB /tmp: {out:?}");
    let out = sh(
        &sandbox,
        "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max",
    )
    .await;
    assert_eq!(out.stdout, "256\n1073741824\n", "{out:?}");
    let out = sh(
        &sandbox,
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max",
    )
    .await;
    assert!(
        out.stdout == "100000\n100000\n" || out.stdout == "100000 100000\n",
        "one CPU: {out:?}"
    );
    // What the daemon was asked for: nothing of the host mounted, only the
    // workspace volume; the limits and hardening above as configuration.
    let inspected = provider
        .docker()
        .inspect_container(sandbox.container_id(), None)
        .await
        .expect("inspect");
    let mounts = inspected.mounts.unwrap_or_default();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].destination.as_deref(), Some("/workspace"));
    assert_eq!(mounts[0].typ.as_deref(), Some("volume"));
    let host = inspected.host_config.expect("host config");
    assert_eq!(host.binds, None);
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(
        host.security_opt,
        Some(vec!["no-new-privileges".to_owned()])
    );
    assert_eq!(
        host.memory_swap, host.memory,
        "no swap beyond the memory limit"
    );
    // The environment is cleared: only what Edward sets.
    let out = exec(&sandbox, command("env", &[])).await;
    let mut names: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    assert_eq!(names, vec!["HOME", "PATH"], "{out:?}");
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_network_is_attached_only_on_request() {
    use edward_sandbox::docker::bollard::models::NetworkCreateRequest;
    // An internal network: no route anywhere, only an interface to see.
    let network = format!("edward-test-{}", &fresh_key("n").0[15..27]);
    let probe = provider().await;
    probe
        .docker()
        .create_network(NetworkCreateRequest {
            name: network.clone(),
            internal: Some(true),
            ..Default::default()
        })
        .await
        .expect("create network");
    let mut config = config();
    config.install_network = Some(network.clone());
    let provider = provider_with(config).await;
    let key = fresh_key("install-net");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    let interfaces = |out: ExecOutput| out.stdout.lines().count();
    let ls = || command("ls", &["/sys/class/net"]);
    assert_eq!(
        interfaces(exec(&sandbox, ls()).await),
        1,
        "only lo at first"
    );
    assert!(sandbox.with_install_network().await.expect("attach"));
    assert_eq!(
        interfaces(exec(&sandbox, ls()).await),
        2,
        "lo + the install network"
    );
    sandbox.without_install_network().await.expect("detach");
    sandbox
        .without_install_network()
        .await
        .expect("detach twice");
    assert_eq!(interfaces(exec(&sandbox, ls()).await), 1, "only lo again");
    // A reattach after an interrupted install detaches too.
    assert!(sandbox.with_install_network().await.expect("attach"));
    let again = provider.provision_docker(&key).await.expect("reattach");
    assert_eq!(interfaces(exec(&again, ls()).await), 1);
    provider.destroy(&key).await.expect("destroy");
    probe
        .docker()
        .remove_network(&network)
        .await
        .expect("remove network");
}

// ------------------------------------------------------------ provisioning

async fn managed_ids(docker: &Docker, key: &edward_core::SandboxKey) -> Vec<String> {
    use edward_sandbox::docker::bollard::query_parameters::ListContainersOptionsBuilder;
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![
            format!("{MANAGED_LABEL}=true"),
            format!("{KEY_LABEL}={}", key.0),
        ],
    )]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list")
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_provisions_make_one_container() {
    // Four providers stand for four processes (separate in-process locks),
    // five concurrent provisions each.
    let mut providers = Vec::new();
    for _ in 0..4 {
        providers.push(provider().await);
    }
    let key = fresh_key("concurrent");
    let mut tasks = Vec::new();
    for i in 0..20 {
        let provider = providers[i % 4].clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            provider
                .provision_docker(&key)
                .await
                .map(|s| s.container_id().to_owned())
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("join").expect("provision"));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(managed_ids(providers[0].docker(), &key).await, ids);
    providers[0].destroy(&key).await.expect("destroy");
    assert!(managed_ids(providers[0].docker(), &key).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_container_is_restarted_with_its_files() {
    let provider = provider().await;
    let key = fresh_key("restart");
    let sandbox = provider.provision_docker(&key).await.expect("provision");
    sandbox
        .write_files(vec![file("kept.txt", "kept")])
        .await
        .expect("write");
    // What a daemon restart does to containers: stop them.
    provider
        .docker()
        .stop_container(sandbox.container_id(), None)
        .await
        .expect("stop");
    let result = sandbox
        .exec(command("true", &[]), CancellationToken::new())
        .await;
    match result {
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
        Ok(out) => panic!("exec in a stopped container: {out:?}"),
    }
    let again = provider.provision_docker(&key).await.expect("reattach");
    assert_eq!(again.container_id(), sandbox.container_id());
    assert_eq!(
        again.read_file(&path("kept.txt")).await.expect("read"),
        "kept"
    );
    let out = exec(&again, command("cat", &["kept.txt"])).await;
    assert_eq!(out.stdout, "kept");
    provider.destroy(&key).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_are_reaped_and_orphans_reconciled() {
    // A namespace of its own, so reaping cannot touch other tests' sandboxes.
    let mut config = config();
    config.namespace = format!("reap{}", &fresh_key("x").0[17..25]);
    let provider = provider_with(config.clone()).await;
    let idle = fresh_key("idle");
    let busy = fresh_key("busy");
    provider.provision_docker(&idle).await.expect("provision");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy_sandbox = provider.provision_docker(&busy).await.expect("provision");
    exec(&busy_sandbox, command("true", &[])).await;
    let reaped = provider
        .reap_older_than(Duration::from_secs(1))
        .await
        .expect("reap");
    assert_eq!(reaped, vec![idle.clone()]);
    assert!(managed_ids(provider.docker(), &idle).await.is_empty());
    assert_eq!(managed_ids(provider.docker(), &busy).await.len(), 1);

    // Another process (a fresh provider) reconciles at start: the busy one is
    // kept (its marker was written by the exec above), and a volume left
    // without its container is removed.
    use edward_sandbox::docker::bollard::models::VolumeCreateRequest;
    let orphan = format!("{}-orphan-workspace", config.namespace);
    provider
        .docker()
        .create_volume(VolumeCreateRequest {
            name: Some(orphan.clone()),
            labels: Some(std::collections::HashMap::from([
                (MANAGED_LABEL.to_owned(), "true".to_owned()),
                (
                    edward_sandbox::docker::NAMESPACE_LABEL.to_owned(),
                    config.namespace.clone(),
                ),
            ])),
            ..Default::default()
        })
        .await
        .expect("volume");
    let restarted = provider_with(config).await;
    let report = restarted.reconcile().await.expect("reconcile");
    assert_eq!(report.kept, vec![busy.clone()]);
    assert!(report.reaped.is_empty(), "{report:?}");
    assert_eq!(report.orphan_volumes, vec![orphan]);
    restarted.destroy(&busy).await.expect("destroy");
}

// ------------------------------------------------------------ daemon outage

/// A unix-socket proxy in front of the daemon's socket, to cut the daemon
/// off and bring it back without disturbing other tests.
struct Proxy {
    path: PathBuf,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn daemon_socket() -> PathBuf {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("unix://") => PathBuf::from(&host["unix://".len()..]),
        Ok(host) if !host.is_empty() => {
            panic!("the outage test proxies a local unix socket; DOCKER_HOST={host} is not one")
        }
        _ => PathBuf::from("/var/run/docker.sock"),
    }
}

fn start_proxy(path: &Path) -> Proxy {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path).expect("bind proxy socket");
    let stop = CancellationToken::new();
    let upstream = daemon_socket();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { break };
                        let upstream = upstream.clone();
                        connections.spawn(async move {
                            if let Ok(mut outbound) = tokio::net::UnixStream::connect(upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            }
                        });
                    }
                }
            }
            connections.abort_all();
        }
    });
    Proxy {
        path: path.to_owned(),
        stop,
        task,
    }
}

impl Proxy {
    async fn cut(self) {
        self.stop.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_outage_is_a_retryable_error_and_nothing_is_reported_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("docker.sock");
    let proxy = start_proxy(&socket);
    let client = Docker::connect_with_unix(
        &format!("unix://{}", socket.display()),
        120,
        edward_sandbox::docker::bollard::API_DEFAULT_VERSION,
    )
    .expect("client");
    let provider = DockerSandboxProvider::with_client(client, config())
        .await
        .unwrap_or_else(|err| panic!("{err}: run scripts/test.sh"));
    let direct = provider_with(DockerSandboxConfig::default()).await;
    let key = fresh_key("outage");
    let sandbox = Arc::new(provider.provision_docker(&key).await.expect("provision"));
    sandbox
        .write_files(vec![file("before.txt", "before")])
        .await
        .expect("write");

    // The daemon goes away mid-command.
    let running = {
        let sandbox = Arc::clone(&sandbox);
        tokio::spawn(async move {
            let mut request = command("sleep", &["9191"]);
            request.timeout = Duration::from_secs(60);
            sandbox.exec(request, CancellationToken::new()).await
        })
    };
    let direct_sandbox = direct.provision_docker(&key).await.expect("same sandbox");
    let give_up = Instant::now() + Duration::from_secs(20);
    while with_marker(&direct_sandbox, "9191").await.is_empty() {
        assert!(Instant::now() < give_up, "the sleep never started");
    }
    proxy.cut().await;
    let result = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("exec returns when the daemon goes away")
        .expect("join");
    match &result {
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
        Ok(out) => panic!("exec survived the outage: {out:?}"),
    }
    // Writes during the outage fail retryably and leave nothing behind.
    match sandbox.write_files(vec![file("during.txt", "x")]).await {
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
        Ok(()) => panic!("write during the outage reported success"),
    }
    match provider.provision_docker(&key).await {
        Err(err) => assert!(err.is_retryable(), "{err:?}"),
        Ok(_) => panic!("provision during the outage succeeded"),
    }

    // The daemon is back: the sandbox resumes where it was.
    let proxy = start_proxy(&socket);
    let again = provider.provision_docker(&key).await.expect("reattach");
    assert_eq!(
        again.read_file(&path("before.txt")).await.expect("read"),
        "before"
    );
    assert!(matches!(
        again.read_file(&path("during.txt")).await,
        Err(SandboxError::NotFound { .. })
    ));
    again
        .write_files(vec![file("after.txt", "after")])
        .await
        .expect("write after");
    provider.destroy(&key).await.expect("destroy");
    proxy.cut().await;
}

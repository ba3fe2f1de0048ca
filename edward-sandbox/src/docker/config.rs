//! Configuration of [`crate::DockerSandboxProvider`].

use std::time::Duration;

/// Settings shared by every sandbox of a [`crate::DockerSandboxProvider`].
///
/// The defaults isolate: no network, 1 GiB of memory (no swap), 256 pids,
/// 1 CPU, uid/gid 1000, every capability dropped, `no-new-privileges`, a
/// read-only root file system with a writable workspace volume and a 64 MiB
/// `/tmp` tmpfs, nothing of the host mounted. Construct with [`Default`] and
/// change fields:
///
/// ```
/// let mut config = edward_sandbox::DockerSandboxConfig::default();
/// config.image = "my-registry.example/edward-node:22".into();
/// config.memory_bytes = 2 << 30;
/// config.runtime = Some("runsc".into()); // gVisor, if the daemon has it
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DockerSandboxConfig {
    /// The image every sandbox runs (default `edward-sandbox:busybox`, built
    /// by `scripts/docker-image.sh`). It needs `/bin/sh`, `env`, `kill`,
    /// `mv`, `mkdir`, `rm` and `sleep`, and a `/workspace` directory owned by
    /// [`user`](Self::user) (copied into the fresh workspace volume).
    pub image: String,
    /// `uid:gid` the container and every command run as (default
    /// `1000:1000`). Never root: with every capability dropped, root in the
    /// container could not kill the sandbox user's processes anyway.
    pub user: String,
    /// Memory limit in bytes, swap included (default 1 GiB).
    pub memory_bytes: i64,
    /// Most processes (and threads) alive at once (default 256).
    pub pids_limit: i64,
    /// CPU quota in billionths of a CPU (default 1,000,000,000 = 1 CPU).
    pub nano_cpus: i64,
    /// Size of the `/tmp` tmpfs in bytes (default 64 MiB).
    pub tmp_bytes: u64,
    /// Docker network mode (default `none`: no interface but loopback).
    pub network_mode: String,
    /// A network to attach only while installs run (see
    /// [`crate::DockerSandbox::with_install_network`]); `None` (default) =
    /// installs get no network either. Containers are then created on this
    /// network and disconnected from it right after start (Docker cannot
    /// connect a network to a container created with mode `none`), so
    /// between installs they still have only the loopback interface.
    pub install_network: Option<String>,
    /// OCI runtime, e.g. `runsc` for gVisor; `None` = the daemon's default.
    pub runtime: Option<String>,
    /// Run a tiny init (`docker-init`) as PID 1 so orphans are reaped
    /// (default true).
    pub init: bool,
    /// `PATH` of every command.
    pub path: String,
    /// Variables set for every command (after `PATH` and `HOME=/workspace`,
    /// before the request's own `env`, which wins). Nothing else is passed:
    /// the image's environment is cleared too.
    pub env: Vec<(String, String)>,
    /// At most this many entries from `list_files` (default 10,000).
    pub list_cap: usize,
    /// `read_file` refuses files larger than this (default 64 MiB).
    pub read_cap: u64,
    /// After killing a command's process group, how long to wait for its
    /// output stream to close before giving up on it. Default 2 s.
    pub kill_grace: Duration,
    /// Timeout of one Docker API request (uploads and downloads included;
    /// an exec's own timeout governs its stream). Default 5 min.
    pub api_timeout: Duration,
    /// Sandboxes unused for this long are removed by
    /// [`reap_idle`](crate::DockerSandboxProvider::reap_idle) (default 24 h).
    pub idle_ttl: Duration,
    /// Separates deployments sharing one daemon (default `edward`): it is
    /// part of container names and the label `edward.namespace`, and a
    /// provider only finds, reaps and reconciles its own namespace.
    pub namespace: String,
}

impl Default for DockerSandboxConfig {
    fn default() -> Self {
        DockerSandboxConfig {
            image: crate::docker::DEFAULT_IMAGE.into(),
            user: "1000:1000".into(),
            memory_bytes: 1 << 30,
            pids_limit: 256,
            nano_cpus: 1_000_000_000,
            tmp_bytes: 64 << 20,
            network_mode: "none".into(),
            install_network: None,
            runtime: None,
            init: true,
            path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            env: Vec::new(),
            list_cap: 10_000,
            read_cap: 64 << 20,
            kill_grace: Duration::from_secs(2),
            api_timeout: Duration::from_secs(300),
            idle_ttl: Duration::from_secs(24 * 3600),
            namespace: "edward".into(),
        }
    }
}

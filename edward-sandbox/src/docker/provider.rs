//! [`DockerSandboxProvider`]: provision / reattach by key, destroy, reap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, CreateContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveVolumeOptionsBuilder,
};
use edward_core::{Sandbox, SandboxError, SandboxKey, SandboxProvider, SandboxSpec};
use tokio_util::sync::CancellationToken;

use crate::LocalSandboxProvider;
use crate::docker::config::DockerSandboxConfig;
use crate::docker::error::{backend, fatal, is_not_found, status};
use crate::docker::sandbox::DockerSandbox;
use crate::docker::{KEY_LABEL, MANAGED_LABEL, NAMESPACE_LABEL, WORKSPACE};

/// State shared by a provider and its sandboxes.
pub(crate) struct Shared {
    pub(crate) docker: Docker,
    pub(crate) config: DockerSandboxConfig,
    /// One provisioning at a time per key in this process.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When this process last used each key.
    last_used: Mutex<HashMap<String, SystemTime>>,
}

impl Shared {
    pub(crate) fn touch(&self, key: &SandboxKey) {
        self.last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.0.clone(), SystemTime::now());
    }

    fn lock_for(&self, key: &SandboxKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(key.0.clone()).or_default())
    }
}

/// What [`DockerSandboxProvider::reconcile`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Managed containers left in place (running, or stopped but not idle
    /// for the TTL yet): the next `provision` of their key reattaches.
    pub kept: Vec<SandboxKey>,
    /// Managed containers removed (with their volumes) as idle.
    pub reaped: Vec<SandboxKey>,
    /// Managed workspace volumes without a container, removed.
    pub orphan_volumes: Vec<String>,
}

/// Creates [`DockerSandbox`]es: one container and one named volume per key,
/// on the daemon that `DOCKER_HOST` names (or the local socket).
///
/// - **Provision / reattach.** Containers carry the labels
///   `edward.managed=true`, `edward.namespace=<namespace>` and
///   `edward.sandbox.key=<key>`, and a name derived from both. Everything
///   below (lookup, reaping, reconciling) only sees the provider's
///   [namespace](DockerSandboxConfig::namespace). `provision` finds the key's container by label and reuses
///   it (starting it if stopped), or creates the volume and the container.
///   Concurrent provisions of one key are serialised by a per-key lock in
///   this process, and across processes by the name: the loser of a create
///   race gets `409 Conflict` and reattaches to the winner's container.
/// - **Destroy** removes the container and its volume.
/// - **Idle sandboxes** are removed by [`reap_idle`](Self::reap_idle) (or the
///   loop of [`spawn_reaper`](Self::spawn_reaper)) after
///   [`idle_ttl`](DockerSandboxConfig::idle_ttl) without use; at start-up,
///   [`reconcile`](Self::reconcile) reaps what was left idle and removes
///   orphaned volumes.
///
/// ```no_run
/// use edward_core::{SandboxKey, SandboxProvider, SandboxSpec};
/// use edward_sandbox::{DockerSandboxConfig, DockerSandboxProvider};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let provider = DockerSandboxProvider::connect(DockerSandboxConfig::default()).await?;
/// provider.reconcile().await?;
/// let sandbox = provider
///     .provision(&SandboxKey("run-1".into()), &SandboxSpec::default())
///     .await?;
/// println!("container {}", sandbox.location());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DockerSandboxProvider {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DockerSandboxProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandboxProvider")
            .field("config", &self.shared.config)
            .finish()
    }
}

fn daemon_address() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into())
}

fn no_daemon(err: &bollard::errors::Error) -> SandboxError {
    SandboxError::Backend {
        message: format!(
            "docker: no daemon answers at {} ({err}); start one, e.g. with scripts/dockerd.sh start",
            daemon_address()
        ),
        retryable: true,
    }
}

impl DockerSandboxProvider {
    /// Connect to the daemon named by `DOCKER_HOST` (`unix://` or `tcp://`;
    /// the local socket when unset) and agree on an API version with it.
    /// Fails with a retryable error when no daemon answers.
    pub async fn connect(config: DockerSandboxConfig) -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|err| match err {
                // The usual "no daemon here": its socket does not exist.
                bollard::errors::Error::SocketNotFoundError(_) => no_daemon(&err),
                err => fatal(format!(
                    "docker: bad DOCKER_HOST {}: {err}",
                    daemon_address()
                )),
            })?
            .with_timeout(config.api_timeout);
        Self::with_client(docker, config).await
    }

    /// Use an already configured bollard client (another daemon, a custom
    /// timeout, TLS).
    pub async fn with_client(
        docker: Docker,
        config: DockerSandboxConfig,
    ) -> Result<Self, SandboxError> {
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|err| no_daemon(&err))?;
        Ok(DockerSandboxProvider {
            shared: Arc::new(Shared {
                docker,
                config,
                locks: Mutex::new(HashMap::new()),
                last_used: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DockerSandboxConfig {
        &self.shared.config
    }

    /// The bollard client.
    pub fn docker(&self) -> &Docker {
        &self.shared.docker
    }

    /// Name of the container of `key`: the namespace (sanitised), a
    /// sanitised prefix of the key and a stable hash of the whole key (valid
    /// as a Docker name, the same in every process). With the default
    /// namespace: `edward-<key prefix>-<hash>`.
    pub fn container_name(&self, key: &SandboxKey) -> String {
        let namespace: String = self
            .shared
            .config
            .namespace
            .chars()
            .take(32)
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{namespace}-{}", LocalSandboxProvider::dir_name(key))
    }

    /// Name of the workspace volume of `key`.
    pub fn volume_name(&self, key: &SandboxKey) -> String {
        format!("{}-workspace", self.container_name(key))
    }

    fn labels(&self, key: &SandboxKey) -> HashMap<String, String> {
        HashMap::from([
            (MANAGED_LABEL.to_owned(), "true".to_owned()),
            (
                NAMESPACE_LABEL.to_owned(),
                self.shared.config.namespace.clone(),
            ),
            (KEY_LABEL.to_owned(), key.0.clone()),
        ])
    }

    /// Managed containers, optionally only those of one key: `(id, key,
    /// running, created)`.
    async fn list_managed(
        &self,
        key: Option<&SandboxKey>,
    ) -> Result<Vec<(String, SandboxKey, bool, SystemTime)>, SandboxError> {
        let mut label = vec![
            format!("{MANAGED_LABEL}=true"),
            format!("{NAMESPACE_LABEL}={}", self.shared.config.namespace),
        ];
        if let Some(key) = key {
            label.push(format!("{KEY_LABEL}={}", key.0));
        }
        let filters = HashMap::from([("label".to_owned(), label)]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self
            .shared
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|err| backend("list containers", err))?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let id = c.id?;
                let key = SandboxKey(c.labels?.get(KEY_LABEL)?.clone());
                let running = matches!(
                    c.state,
                    Some(bollard::models::ContainerSummaryStateEnum::RUNNING)
                );
                let created = SystemTime::UNIX_EPOCH
                    + Duration::from_secs(u64::try_from(c.created.unwrap_or(0)).unwrap_or(0));
                Some((id, key, running, created))
            })
            .collect())
    }

    async fn start(&self, id: &str) -> Result<(), SandboxError> {
        match self.shared.docker.start_container(id, None).await {
            Ok(()) => Ok(()),
            // 304: already running.
            Err(err) if status(&err) == Some(304) => Ok(()),
            Err(err) => Err(backend("start container", err)),
        }
    }

    fn create_body(&self, key: &SandboxKey) -> ContainerCreateBody {
        let config = &self.shared.config;
        // Docker cannot connect a network to a container created with
        // `none`: with an install network, start on it and disconnect at
        // once (see `isolate`), which leaves only the loopback interface.
        let network_mode = config
            .install_network
            .clone()
            .unwrap_or_else(|| config.network_mode.clone());
        let host_config = HostConfig {
            network_mode: Some(network_mode),
            memory: Some(config.memory_bytes),
            memory_swap: Some(config.memory_bytes),
            pids_limit: Some(config.pids_limit),
            nano_cpus: Some(config.nano_cpus),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,nosuid,nodev,size={},mode=1777", config.tmp_bytes),
            )])),
            mounts: Some(vec![Mount {
                target: Some(WORKSPACE.into()),
                source: Some(self.volume_name(key)),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Default::default()
            }]),
            runtime: config.runtime.clone(),
            init: Some(config.init),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(config.image.clone()),
            user: Some(config.user.clone()),
            working_dir: Some(WORKSPACE.into()),
            env: Some(vec![
                format!("PATH={}", config.path),
                format!("HOME={WORKSPACE}"),
            ]),
            // Something that waits forever and exits on SIGTERM.
            entrypoint: Some(vec!["sleep".into()]),
            cmd: Some(vec!["2147483647".into()]),
            labels: Some(self.labels(key)),
            network_disabled: Some(
                config.network_mode == "none" && config.install_network.is_none(),
            ),
            host_config: Some(host_config),
            ..Default::default()
        }
    }

    /// Provision or reattach, returning the concrete type.
    #[tracing::instrument(skip_all, fields(sandbox = %key))]
    pub async fn provision_docker(&self, key: &SandboxKey) -> Result<DockerSandbox, SandboxError> {
        let lock = self.shared.lock_for(key);
        let _held = lock.lock().await;
        self.shared.touch(key);
        let docker = &self.shared.docker;
        if let Some((id, _, running, _)) = self.list_managed(Some(key)).await?.into_iter().next() {
            if !running {
                self.start(&id).await?;
            }
            self.isolate(&id).await?;
            tracing::debug!(container = %id, "sandbox reattached");
            return Ok(self.sandbox(key, id));
        }
        let volume = VolumeCreateRequest {
            name: Some(self.volume_name(key)),
            labels: Some(self.labels(key)),
            ..Default::default()
        };
        docker
            .create_volume(volume)
            .await
            .map_err(|err| backend("create volume", err))?;
        let options = CreateContainerOptionsBuilder::default()
            .name(&self.container_name(key))
            .build();
        let id = match docker
            .create_container(Some(options), self.create_body(key))
            .await
        {
            Ok(created) => created.id,
            // Another process created it first: reattach to theirs.
            Err(err) if status(&err) == Some(409) => self.created_elsewhere(key).await?,
            Err(err) if is_not_found(&err) => {
                return Err(fatal(format!(
                    "docker: image {} not found ({err}); build it with scripts/docker-image.sh",
                    self.shared.config.image
                )));
            }
            Err(err) => return Err(backend("create container", err)),
        };
        self.start(&id).await?;
        self.isolate(&id).await?;
        tracing::debug!(container = %id, "sandbox created");
        Ok(self.sandbox(key, id))
    }

    /// With an install network configured, make sure the container is not
    /// connected to it (it was created on it, or an install was cut short).
    async fn isolate(&self, id: &str) -> Result<(), SandboxError> {
        let Some(network) = &self.shared.config.install_network else {
            return Ok(());
        };
        let request = bollard::models::NetworkDisconnectRequest {
            container: id.to_owned(),
            force: Some(true),
        };
        match self
            .shared
            .docker
            .disconnect_network(network, request)
            .await
        {
            Ok(()) => Ok(()),
            // Not connected (404 on some daemons, 500 "is not connected" on others).
            Err(err) if matches!(status(&err), Some(404 | 500)) => Ok(()),
            Err(err) => Err(backend("disconnect install network", err)),
        }
    }

    /// The id of `key`'s container after losing a create race. The daemon
    /// reserves the name before the container can be inspected, so a lookup
    /// right after the conflict can miss it for a moment: ask again briefly.
    async fn created_elsewhere(&self, key: &SandboxKey) -> Result<String, SandboxError> {
        let name = self.container_name(key);
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.shared.docker.inspect_container(&name, None).await {
                Ok(found) => {
                    return found
                        .id
                        .ok_or_else(|| fatal("docker: container without an id"));
                }
                Err(err) if is_not_found(&err) && std::time::Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => return Err(backend("inspect container", err)),
            }
        }
    }

    fn sandbox(&self, key: &SandboxKey, id: String) -> DockerSandbox {
        DockerSandbox {
            key: key.clone(),
            id,
            shared: Arc::clone(&self.shared),
        }
    }

    /// When `key`'s sandbox was last used: the latest of this process's
    /// record, the container's last-use marker (written by every exec and
    /// write batch, from any process) and the container's creation.
    async fn last_used(&self, id: &str, key: &SandboxKey, created: SystemTime) -> SystemTime {
        let mut last = created;
        if let Some(mine) = self
            .shared
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key.0)
        {
            last = last.max(*mine);
        }
        let options = ContainerArchiveInfoOptionsBuilder::default()
            .path("/workspace/.edward/last-use")
            .build();
        if let Ok(stat) = self
            .shared
            .docker
            .get_container_archive_info(id, Some(options))
            .await
        {
            if let Some(mtime) = stat
                .modification_time
                .as_deref()
                .and_then(|m| chrono::DateTime::parse_from_rfc3339(m).ok())
            {
                last = last.max(SystemTime::from(mtime));
            }
        }
        last
    }

    /// Remove managed sandboxes unused for [`DockerSandboxConfig::idle_ttl`];
    /// returns their keys.
    pub async fn reap_idle(&self) -> Result<Vec<SandboxKey>, SandboxError> {
        self.reap_older_than(self.shared.config.idle_ttl).await
    }

    /// Remove managed sandboxes unused for at least `ttl`; returns their keys.
    pub async fn reap_older_than(&self, ttl: Duration) -> Result<Vec<SandboxKey>, SandboxError> {
        let now = SystemTime::now();
        let mut reaped = Vec::new();
        for (id, key, _, created) in self.list_managed(None).await? {
            let last = self.last_used(&id, &key, created).await;
            if now.duration_since(last).unwrap_or_default() >= ttl {
                let lock = self.shared.lock_for(&key);
                let _held = lock.lock().await;
                self.remove(&key).await?;
                tracing::info!(sandbox = %key, "idle sandbox reaped");
                reaped.push(key);
            }
        }
        Ok(reaped)
    }

    /// Run [`reap_idle`](Self::reap_idle) every `interval` until `stop`
    /// fires. Errors are logged and the loop goes on.
    pub fn spawn_reaper(
        &self,
        interval: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let provider = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
                if let Err(err) = provider.reap_idle().await {
                    tracing::warn!(%err, "reaping idle sandboxes failed");
                }
            }
        })
    }

    /// Start-up reconciliation: managed containers idle for the TTL are
    /// removed, the others are kept (the next `provision` of their key
    /// reattaches and starts them), and managed volumes whose container is
    /// gone are removed.
    pub async fn reconcile(&self) -> Result<ReconcileReport, SandboxError> {
        let mut report = ReconcileReport {
            reaped: self.reap_idle().await?,
            ..Default::default()
        };
        let containers = self.list_managed(None).await?;
        report.kept = containers
            .iter()
            .map(|(_, key, _, _)| key.clone())
            .collect();
        let with_container: std::collections::HashSet<String> = containers
            .iter()
            .map(|(_, key, _, _)| self.volume_name(key))
            .collect();
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![
                format!("{MANAGED_LABEL}=true"),
                format!("{NAMESPACE_LABEL}={}", self.shared.config.namespace),
            ],
        )]);
        let options = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let volumes = self
            .shared
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(|err| backend("list volumes", err))?;
        for volume in volumes.volumes.unwrap_or_default() {
            if with_container.contains(&volume.name) {
                continue;
            }
            // A provision in this process may be between volume and
            // container creation: only touch keys nobody here holds.
            let key = volume.labels.get(KEY_LABEL).cloned().map(SandboxKey);
            let lock = key.as_ref().map(|k| self.shared.lock_for(k));
            let _held = match &lock {
                Some(lock) => Some(lock.lock().await),
                None => None,
            };
            if let Some(key) = &key {
                if !self.list_managed(Some(key)).await?.is_empty() {
                    continue;
                }
            }
            self.remove_volume(&volume.name).await?;
            report.orphan_volumes.push(volume.name);
        }
        Ok(report)
    }

    async fn remove_volume(&self, name: &str) -> Result<(), SandboxError> {
        let options = RemoveVolumeOptionsBuilder::default().force(true).build();
        match self.shared.docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(backend("remove volume", err)),
        }
    }

    /// Remove the container(s) and the volume of `key` (caller holds the lock).
    async fn remove(&self, key: &SandboxKey) -> Result<(), SandboxError> {
        let mut ids: Vec<String> = self
            .list_managed(Some(key))
            .await?
            .into_iter()
            .map(|(id, _, _, _)| id)
            .collect();
        // Also by name: a container created by hand or half-created.
        ids.push(self.container_name(key));
        for id in ids {
            let options = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            match self
                .shared
                .docker
                .remove_container(&id, Some(options))
                .await
            {
                Ok(()) => {}
                Err(err) if is_not_found(&err) => {}
                // 409: removal already in progress elsewhere.
                Err(err) if status(&err) == Some(409) => {}
                Err(err) => return Err(backend("remove container", err)),
            }
        }
        self.remove_volume(&self.volume_name(key)).await?;
        self.shared
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key.0);
        Ok(())
    }
}

#[async_trait]
impl SandboxProvider for DockerSandboxProvider {
    async fn provision(
        &self,
        key: &SandboxKey,
        _spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        // `base` could pick an image per template; today one image serves all.
        Ok(Arc::new(self.provision_docker(key).await?))
    }

    async fn attach(&self, key: &SandboxKey) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let lock = self.shared.lock_for(key);
        let _held = lock.lock().await;
        let Some((id, _, running, _)) = self.list_managed(Some(key)).await?.into_iter().next()
        else {
            return Ok(None);
        };
        self.shared.touch(key);
        if !running {
            self.start(&id).await?;
        }
        self.isolate(&id).await?;
        Ok(Some(Arc::new(self.sandbox(key, id))))
    }

    #[tracing::instrument(skip_all, fields(sandbox = %key))]
    async fn destroy(&self, key: &SandboxKey) -> Result<(), SandboxError> {
        let lock = self.shared.lock_for(key);
        let _held = lock.lock().await;
        self.remove(key).await?;
        tracing::debug!("sandbox destroyed");
        Ok(())
    }
}

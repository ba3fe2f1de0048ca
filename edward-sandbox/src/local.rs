//! [`LocalSandboxProvider`] and [`LocalSandbox`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use edward_core::{
    ExecOutput, ExecRequest, FileEntry, FileWrite, Isolation, Sandbox, SandboxError, SandboxKey,
    SandboxPath, SandboxProvider, SandboxSpec,
};
use tokio_util::sync::CancellationToken;

use crate::config::{Confinement, LocalSandboxConfig};
use crate::jail::JailSupport;

/// Longest sanitised key prefix kept in a directory name.
const MAX_PREFIX: usize = 48;

/// Run a blocking file-system job off the async runtime.
async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, SandboxError> + Send + 'static,
) -> Result<T, SandboxError> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|err| SandboxError::Backend {
            message: format!("sandbox I/O task failed: {err}"),
            retryable: false,
        })?
}

/// Creates [`LocalSandbox`]es: one directory per key under a root directory.
///
/// See the [crate docs](crate) for what it guarantees and, importantly, what it
/// does not (without bubblewrap it is not a security boundary).
#[derive(Debug, Clone)]
pub struct LocalSandboxProvider {
    root: PathBuf,
    config: Arc<LocalSandboxConfig>,
    /// Whether bubblewrap works here (probed once, on first provision).
    jail: Arc<std::sync::OnceLock<JailSupport>>,
}

impl LocalSandboxProvider {
    /// A provider with the default [`LocalSandboxConfig`]. The root is created
    /// on first provision if missing.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_config(root, LocalSandboxConfig::default())
    }

    /// A provider with the given configuration.
    pub fn with_config(root: impl Into<PathBuf>, config: LocalSandboxConfig) -> Self {
        LocalSandboxProvider {
            root: root.into(),
            config: Arc::new(config),
            jail: Arc::default(),
        }
    }

    /// Whether commands of this provider's sandboxes run confined (probes
    /// bubblewrap once).
    pub async fn isolation(&self) -> Isolation {
        match self.jail_support().await {
            JailSupport::Bwrap(_) => Isolation::Isolated {
                mechanism: "bubblewrap".into(),
            },
            JailSupport::Unavailable(reason) => Isolation::None { reason },
        }
    }

    async fn jail_support(&self) -> JailSupport {
        if let Some(j) = self.jail.get() {
            return j.clone();
        }
        let config = Arc::clone(&self.config);
        let detected = tokio::task::spawn_blocking(move || crate::jail::detect(&config))
            .await
            .unwrap_or_else(|e| {
                JailSupport::Unavailable(format!("probing bubblewrap failed: {e}"))
            });
        self.jail.get_or_init(|| detected).clone()
    }

    /// The root directory, as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The configuration.
    pub fn config(&self) -> &LocalSandboxConfig {
        &self.config
    }

    /// The directory name used for `key`: a sanitised prefix (ASCII
    /// alphanumerics, `-`, `_`; at most 48 characters) and a stable hash of the
    /// whole key. Never contains `/` or `.`, so it can't leave the root.
    ///
    /// ```
    /// use edward_core::SandboxKey;
    /// use edward_sandbox::LocalSandboxProvider;
    /// let name = LocalSandboxProvider::dir_name(&SandboxKey("../../etc".into()));
    /// assert!(name.starts_with("______etc-"));
    /// assert!(!name.contains('/') && !name.contains('.'));
    /// ```
    pub fn dir_name(key: &SandboxKey) -> String {
        let prefix: String = key
            .0
            .chars()
            .take(MAX_PREFIX)
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let prefix = if prefix.is_empty() {
            "sandbox".to_owned()
        } else {
            prefix
        };
        let mut name = prefix;
        let _ = write!(
            name,
            "-{:016x}",
            edward_core::hash::fnv1a64(key.0.as_bytes())
        );
        name
    }

    /// Where the workspace of `key` lives (whether or not it exists).
    pub fn workspace_path(&self, key: &SandboxKey) -> PathBuf {
        self.root.join(Self::dir_name(key))
    }

    /// Provision or reattach, returning the concrete type (the trait method
    /// returns it as `Arc<dyn Sandbox>`).
    #[tracing::instrument(skip_all, fields(sandbox = %key))]
    pub async fn provision_local(&self, key: &SandboxKey) -> Result<LocalSandbox, SandboxError> {
        let root = self.root.clone();
        let name = Self::dir_name(key);
        let workspace = blocking(move || {
            std::fs::create_dir_all(&root)
                .map_err(|err| crate::fs::io_error(format!("create {}", root.display()), &err))?;
            // Canonical, so containment checks compare symlink-free paths.
            let root = std::fs::canonicalize(&root)
                .map_err(|err| crate::fs::io_error(format!("resolve {}", root.display()), &err))?;
            let workspace = root.join(name);
            match std::fs::create_dir(&workspace) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(err) => {
                    return Err(crate::fs::io_error(
                        format!("create {}", workspace.display()),
                        &err,
                    ));
                }
            }
            let meta = std::fs::symlink_metadata(&workspace).map_err(|err| {
                crate::fs::io_error(format!("stat {}", workspace.display()), &err)
            })?;
            if !meta.is_dir() {
                return Err(SandboxError::Backend {
                    message: format!("{} exists and is not a directory", workspace.display()),
                    retryable: false,
                });
            }
            Ok(workspace)
        })
        .await?;
        let jail = self.jail_support().await;
        if let (JailSupport::Unavailable(reason), Confinement::Required) =
            (&jail, self.config.confinement)
        {
            return Err(SandboxError::Backend {
                message: format!("confinement is required but unavailable: {reason}"),
                retryable: false,
            });
        }
        tracing::debug!(workspace = %workspace.display(), ?jail, "sandbox provisioned");
        Ok(LocalSandbox {
            key: key.clone(),
            workspace,
            config: Arc::clone(&self.config),
            jail,
        })
    }
}

#[async_trait]
impl SandboxProvider for LocalSandboxProvider {
    async fn provision(
        &self,
        key: &SandboxKey,
        _spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        // `project` and `base` are template hints for image-based sandboxes; a
        // local workspace starts empty.
        Ok(Arc::new(self.provision_local(key).await?))
    }

    async fn attach(&self, key: &SandboxKey) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let path = self.workspace_path(key);
        let exists = blocking(move || match std::fs::symlink_metadata(&path) {
            Ok(meta) => Ok(meta.is_dir()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(crate::fs::io_error(
                format!("stat {}", path.display()),
                &err,
            )),
        })
        .await?;
        if !exists {
            return Ok(None);
        }
        Ok(Some(Arc::new(self.provision_local(key).await?)))
    }

    #[tracing::instrument(skip_all, fields(sandbox = %key))]
    async fn destroy(&self, key: &SandboxKey) -> Result<(), SandboxError> {
        let path = self.workspace_path(key);
        blocking(move || crate::fs::remove_workspace(&path)).await?;
        tracing::debug!("sandbox destroyed");
        Ok(())
    }
}

/// A sandbox that is a directory on the host plus child processes.
///
/// **Confined by bubblewrap when available; otherwise not a security boundary** (see the [crate docs](crate)).
///
/// # Process model of [`exec`](Sandbox::exec)
///
/// - `program` and `args` are passed to `execvp` directly, never to a shell;
///   `program` is looked up on the command's `PATH`.
/// - Working directory: the workspace, or the request's `cwd` inside it
///   (symlinks followed only inside; a missing directory is `NotFound`).
/// - Environment: cleared, then the host's values of
///   [`LocalSandboxConfig::env_passthrough`], then [`LocalSandboxConfig::env`],
///   then `HOME` (the workspace unless configured), then the request's `env`.
/// - stdin is `/dev/null`; stdout and stderr are read concurrently to the end,
///   keeping `output_cap` bytes of each and counting the rest, so the child
///   never blocks on a full pipe.
/// - The child leads a new process group. On timeout (`timed_out: true`,
///   `exit_code: None`) or cancellation (`Err(Cancelled)`) the whole group gets
///   `SIGKILL` and the child is reaped before `exec` returns, so grandchildren
///   die too. When the child exits normally, stray members of its group
///   (background jobs) are killed as well: nothing outlives `exec`. Dropping the
///   `exec` future also kills the group.
/// - A program that can't be started (not found, not executable) is
///   `Err(Spawn)`.
#[derive(Debug, Clone)]
pub struct LocalSandbox {
    key: SandboxKey,
    workspace: PathBuf,
    config: Arc<LocalSandboxConfig>,
    jail: JailSupport,
}

impl LocalSandbox {
    /// The workspace directory (canonical).
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
    fn key(&self) -> &SandboxKey {
        &self.key
    }

    fn location(&self) -> String {
        self.workspace.display().to_string()
    }

    fn isolation(&self) -> Isolation {
        match &self.jail {
            JailSupport::Bwrap(_) => Isolation::Isolated {
                mechanism: "bubblewrap".into(),
            },
            JailSupport::Unavailable(reason) => Isolation::None {
                reason: reason.clone(),
            },
        }
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key, files = files.len()))]
    async fn write_files(&self, files: Vec<FileWrite>) -> Result<(), SandboxError> {
        let workspace = self.workspace.clone();
        let key = self.key.0.clone();
        let sync = self.config.sync_writes;
        blocking(move || crate::fs::write_files(&workspace, &key, &files, sync)).await
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key, path = %path))]
    async fn read_file(&self, path: &SandboxPath) -> Result<Bytes, SandboxError> {
        let workspace = self.workspace.clone();
        let key = self.key.0.clone();
        let path = path.clone();
        let bytes = blocking(move || crate::fs::read_file(&workspace, &key, &path)).await?;
        Ok(Bytes::from(bytes))
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key))]
    async fn list_files(&self) -> Result<Vec<FileEntry>, SandboxError> {
        let workspace = self.workspace.clone();
        let key = self.key.0.clone();
        let cap = self.config.list_cap;
        let (files, capped) =
            blocking(move || crate::fs::list_files(&workspace, &key, cap)).await?;
        if capped {
            tracing::warn!(cap, "file listing cut at the cap");
        }
        Ok(files)
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key, program = %request.program))]
    async fn exec(
        &self,
        request: ExecRequest,
        cancel: CancellationToken,
    ) -> Result<ExecOutput, SandboxError> {
        let workspace = self.workspace.clone();
        let key = self.key.0.clone();
        let cwd = request.cwd.clone();
        let cwd = blocking(move || {
            crate::fs::check_workspace(&workspace, &key)?;
            match &cwd {
                None => Ok(workspace),
                Some(cwd) => {
                    let parts: Vec<&str> = cwd.as_str().split('/').collect();
                    crate::fs::resolve_dir(&workspace, &parts, cwd.as_str(), false)
                }
            }
        })
        .await?;
        let jail = match &self.jail {
            JailSupport::Bwrap(path) => Some(path.as_path()),
            JailSupport::Unavailable(_) => None,
        };
        crate::exec::run(&self.config, jail, &self.workspace, &cwd, &request, &cancel).await
    }
}

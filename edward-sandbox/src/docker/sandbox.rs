//! [`DockerSandbox`]: one container and its workspace volume.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bytes::Bytes;
use edward_core::{
    ExecOutput, ExecRequest, FileEntry, FileWrite, Sandbox, SandboxError, SandboxKey, SandboxPath,
};
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use crate::docker::WORKSPACE;
use crate::docker::archive::{self, PRIVATE_DIR};
use crate::docker::error::{backend, fatal, is_not_found};
use crate::docker::exec::{self, Target};
use crate::docker::provider::Shared;

/// Moves a staged batch into place, run as
/// `sh -c RENAME edward STAGE N DEST… DIR…`: the staged files are
/// `.edward/STAGE/0`, `1`, … for the N destinations (workspace-relative),
/// and the DIRs (absolute) are the distinct parent directories to create,
/// with one `mkdir -p` for all.
///
/// Everything is checked before anything moves: the private and stage
/// directories must be real directories, no directory on a destination's way
/// may be a symlink or a non-directory, and no destination may be a
/// directory. Then each file is renamed over its destination (`mv -T`: a
/// symlink at the destination is replaced, never followed), so a reader sees
/// the old or the new file, never a mix. Refusals print one line `!KIND PATH`
/// and exit 3.
const RENAME: &str = r#"stage="/workspace/.edward/$1"; n=$2; shift 2
fail() { echo "!$1 $2"; rm -rf "$stage"; exit 3; }
{ [ -d /workspace/.edward ] && [ ! -L /workspace/.edward ] && [ -d "$stage" ] && [ ! -L "$stage" ]; } || fail stage "$stage"
i=0
for dst in "$@"; do
  [ "$i" -ge "$n" ] && break
  i=$((i+1))
  p=/workspace; rest=$dst
  while :; do
    case $rest in */*) c=${rest%%/*}; rest=${rest#*/} ;; *) break ;; esac
    p="$p/$c"
    [ -L "$p" ] && fail symlink "$dst"
    [ -e "$p" ] && [ ! -d "$p" ] && fail notdir "$dst"
  done
  [ -d "/workspace/$dst" ] && [ ! -L "/workspace/$dst" ] && fail isdir "$dst"
done
( shift "$n"; [ "$#" -eq 0 ] || mkdir -p "$@" ) || exit 4
i=0
for dst in "$@"; do
  [ "$i" -ge "$n" ] && break
  mv -fT "$stage/$i" "/workspace/$dst" || exit 4
  i=$((i+1))
done
rm -rf "$stage"
: > /workspace/.edward/last-use
"#;

/// Go's `os.ModeSymlink` and `os.ModeDir` bits, as the archive stat reports them.
const MODE_SYMLINK: u32 = 1 << 27;
const MODE_DIR: u32 = 1 << 31;

/// A sandbox that is a Docker container plus a named volume mounted at
/// `/workspace`. Created by [`crate::DockerSandboxProvider`].
///
/// # Writes
/// One [`write_files`](Sandbox::write_files) batch is **one** tar upload
/// (streamed, file contents not copied) into a fresh staging directory
/// inside the workspace volume, then **one** exec that checks every
/// destination and renames the staged files into place. Only regular files
/// with mode `0644`, owned by the sandbox user, are ever uploaded; the
/// archive's entry names are indices, never the requested paths. A batch is
/// checked whole before anything moves; it is not atomic as a whole if the
/// container dies midway (the engine re-writes whole batches on retry).
/// Paths under `.edward/` are reserved.
///
/// # Reads and listing
/// Through `download_from_container` (tar streams read by the `tar` crate,
/// off the async runtime). Each directory on the way to a read is checked
/// first (a symlink is followed only when it resolves inside the workspace),
/// a file over [`read_cap`](crate::DockerSandboxConfig::read_cap) is
/// refused, and listings contain regular files only (never following a
/// symlink), sorted by path bytes, at most
/// [`list_cap`](crate::DockerSandboxConfig::list_cap) of them. A listing
/// downloads the whole workspace: it costs as much as its bytes.
///
/// # Process model of [`exec`](Sandbox::exec)
/// - argv only: `program` and `args` reach `execvp` through `env -i`, never
///   a shell; the environment is `PATH`, `HOME=/workspace`, the configured
///   variables, then the request's (which win) — nothing of the image's.
/// - Working directory: the workspace or `cwd` inside it (a missing one is
///   `NotFound`, one that resolves outside through a symlink `InvalidPath`).
/// - The command runs in the process group of a small launcher (each
///   `docker exec` leads its own group). When the command exits, the rest
///   of its group (background jobs) is killed. On timeout (`timed_out`,
///   `exit_code: None`) or cancellation (`Err(Cancelled)`) a second exec
///   sends `SIGKILL` to the whole group, so nothing the command started
///   keeps running; dropping the `exec` future does the same in the
///   background. A process that leaves the group (`setsid`) is not tracked.
/// - stdout and stderr keep `output_cap` bytes each and count the rest.
/// - A command killed by a signal reports `128 + signal`: 137 when the
///   memory limit's OOM killer (or the pids limit's failed forks, through a
///   dying parent) ended it.
/// - A program that does not exist exits 127 (from `env`).
#[derive(Clone)]
pub struct DockerSandbox {
    pub(crate) key: SandboxKey,
    pub(crate) id: String,
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("key", &self.key)
            .field("container", &self.id)
            .finish()
    }
}

fn reserved(path: &SandboxPath) -> bool {
    let p = path.as_str();
    p == PRIVATE_DIR || p.starts_with(".edward/")
}

impl DockerSandbox {
    /// The full container id.
    pub fn container_id(&self) -> &str {
        &self.id
    }

    fn target(&self) -> Target {
        Target {
            docker: self.shared.docker.clone(),
            container: self.id.clone(),
            key: self.key.0.clone(),
            user: self.shared.config.user.clone(),
        }
    }

    fn gone_or(&self, what: &str, err: bollard::errors::Error) -> SandboxError {
        if is_not_found(&err) {
            SandboxError::Gone {
                key: self.key.0.clone(),
            }
        } else {
            backend(what, err)
        }
    }

    /// Connect the configured
    /// [`install_network`](crate::DockerSandboxConfig::install_network) (for
    /// package installs), returning whether one is configured. Pair with
    /// [`without_install_network`](Self::without_install_network).
    pub async fn with_install_network(&self) -> Result<bool, SandboxError> {
        let Some(network) = self.shared.config.install_network.clone() else {
            return Ok(false);
        };
        let request = bollard::models::NetworkConnectRequest {
            container: self.id.clone(),
            ..Default::default()
        };
        match self.shared.docker.connect_network(&network, request).await {
            Ok(()) => Ok(true),
            Err(err) => Err(self.gone_or("connect install network", err)),
        }
    }

    /// Disconnect the install network again (no-op when none is configured
    /// or it is not connected).
    pub async fn without_install_network(&self) -> Result<(), SandboxError> {
        let Some(network) = self.shared.config.install_network.clone() else {
            return Ok(());
        };
        let request = bollard::models::NetworkDisconnectRequest {
            container: self.id.clone(),
            force: Some(true),
        };
        match self
            .shared
            .docker
            .disconnect_network(&network, request)
            .await
        {
            Ok(()) => Ok(()),
            // Not connected.
            Err(err) if matches!(crate::docker::error::status(&err), Some(404 | 500)) => Ok(()),
            Err(err) => Err(self.gone_or("disconnect install network", err)),
        }
    }

    /// Stat a path in the container (`None` when it does not exist).
    async fn stat(&self, path: &str) -> Result<Option<(u32, String)>, SandboxError> {
        let options = ContainerArchiveInfoOptionsBuilder::default()
            .path(path)
            .build();
        match self
            .shared
            .docker
            .get_container_archive_info(&self.id, Some(options))
            .await
        {
            Ok(stat) => Ok(Some((stat.file_mode, stat.link_target))),
            Err(err) if is_not_found(&err) => {
                // 404 is also "no such container".
                match self.shared.docker.inspect_container(&self.id, None).await {
                    Ok(_) => Ok(None),
                    Err(err) => Err(self.gone_or("inspect container", err)),
                }
            }
            Err(err) => Err(backend("stat", err)),
        }
    }

    /// The absolute container path to download for `path`, following
    /// symlinks only where they stay inside the workspace.
    async fn resolve_for_read(&self, path: &SandboxPath) -> Result<String, SandboxError> {
        let shown = path.as_str();
        let not_found = || SandboxError::NotFound { path: shown.into() };
        let escape = || SandboxError::InvalidPath {
            path: shown.into(),
            reason: "a symlink leads outside the workspace".into(),
        };
        let inside = |target: &str| target == WORKSPACE || target.starts_with("/workspace/");
        let components: Vec<&str> = shown.split('/').collect();
        let mut prefix = WORKSPACE.to_owned();
        for (index, component) in components.iter().enumerate() {
            prefix.push('/');
            prefix.push_str(component);
            let last = index + 1 == components.len();
            let Some((mode, link)) = self.stat(&prefix).await? else {
                return Err(not_found());
            };
            if mode & MODE_SYMLINK != 0 {
                if !inside(&link) {
                    return Err(escape());
                }
                if last {
                    return Ok(link);
                }
            } else if !last && mode & MODE_DIR == 0 {
                return Err(not_found());
            }
        }
        Ok(prefix)
    }

    /// Download `path` and hand the tar stream to `read` on a blocking thread.
    async fn download<T: Send + 'static>(
        &self,
        path: &str,
        read: impl FnOnce(&mut dyn std::io::Read) -> Result<T, SandboxError> + Send + 'static,
    ) -> Result<T, SandboxError> {
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(path)
            .build();
        let mut stream = self
            .shared
            .docker
            .download_from_container(&self.id, Some(options));
        // The first chunk tells a missing path or container from a stream.
        let first = match stream.next().await {
            None => Bytes::new(),
            Some(Ok(chunk)) => chunk,
            Some(Err(err)) if is_not_found(&err) => {
                return Err(SandboxError::NotFound {
                    path: path.trim_start_matches("/workspace/").into(),
                });
            }
            Some(Err(err)) => return Err(self.gone_or("download", err)),
        };
        let rest = futures::stream::iter([Ok(first)])
            .chain(stream)
            .map_err(std::io::Error::other);
        let reader = tokio_util::io::StreamReader::new(rest);
        tokio::task::spawn_blocking(move || {
            let mut bridge = tokio_util::io::SyncIoBridge::new(reader);
            read(&mut bridge)
        })
        .await
        .map_err(|err| fatal(format!("sandbox I/O task failed: {err}")))?
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn key(&self) -> &SandboxKey {
        &self.key
    }

    /// The short container id (as `docker ps` shows it).
    fn location(&self) -> String {
        self.id.chars().take(12).collect()
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key, files = files.len()))]
    async fn write_files(&self, files: Vec<FileWrite>) -> Result<(), SandboxError> {
        if let Some(bad) = files.iter().find(|f| reserved(&f.path)) {
            return Err(SandboxError::InvalidPath {
                path: bad.path.as_str().into(),
                reason: "`.edward/` is reserved for the sandbox".into(),
            });
        }
        // A later write of the same path wins: keep only the last one.
        let mut last: std::collections::HashMap<&str, usize> = Default::default();
        for (index, file) in files.iter().enumerate() {
            last.insert(file.path.as_str(), index);
        }
        let kept: Vec<&FileWrite> = files
            .iter()
            .enumerate()
            .filter(|(index, f)| last.get(f.path.as_str()) == Some(index))
            .map(|(_, f)| f)
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        self.shared.touch(&self.key);
        let stage = format!("stage-{}", uuid::Uuid::new_v4().simple());
        let contents: Vec<Bytes> = kept.iter().map(|f| f.content.clone()).collect();
        let owner = archive::owner_ids(&self.shared.config.user);
        let chunks = archive::staging_archive(&stage, &contents, owner)?;
        let options = UploadToContainerOptionsBuilder::default()
            .path(WORKSPACE)
            .build();
        self.shared
            .docker
            .upload_to_container(
                &self.id,
                Some(options),
                bollard::body_stream(futures::stream::iter(chunks)),
            )
            .await
            .map_err(|err| self.gone_or("upload", err))?;

        let mut args = vec![stage, kept.len().to_string()];
        args.extend(kept.iter().map(|f| f.path.as_str().to_owned()));
        let dirs: std::collections::BTreeSet<&str> = kept
            .iter()
            .filter_map(|f| f.path.as_str().rsplit_once('/').map(|(dir, _)| dir))
            .collect();
        args.extend(dirs.into_iter().map(|dir| format!("{WORKSPACE}/{dir}")));
        let (code, stdout, stderr) = self
            .target()
            .run_script(RENAME, args, Duration::from_secs(120))
            .await?;
        if code == 0 {
            return Ok(());
        }
        let line = stdout.lines().next().unwrap_or("");
        let (kind, path) = line.split_once(' ').unwrap_or((line, ""));
        let reason = match kind {
            "!symlink" => "a directory on the way is a symlink",
            "!notdir" => "a component on the way is not a directory",
            "!isdir" => "a directory is in the way",
            _ => {
                return Err(fatal(format!(
                    "docker: moving the staged files into place failed ({code}): {} {}",
                    stdout.trim(),
                    stderr.trim()
                )));
            }
        };
        Err(SandboxError::InvalidPath {
            path: path.into(),
            reason: reason.into(),
        })
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key, path = %path))]
    async fn read_file(&self, path: &SandboxPath) -> Result<Bytes, SandboxError> {
        if reserved(path) {
            return Err(SandboxError::NotFound {
                path: path.as_str().into(),
            });
        }
        let resolved = self.resolve_for_read(path).await?;
        let shown = path.as_str().to_owned();
        let cap = self.shared.config.read_cap;
        let content = self
            .download(&resolved, move |reader| {
                archive::read_single_file(reader, &shown, cap)
            })
            .await?;
        Ok(Bytes::from(content))
    }

    #[tracing::instrument(skip_all, fields(sandbox = %self.key))]
    async fn list_files(&self) -> Result<Vec<FileEntry>, SandboxError> {
        let cap = self.shared.config.list_cap;
        let (files, capped) = self
            .download(WORKSPACE, move |reader| {
                archive::list_archive(reader, "workspace", cap)
            })
            .await?;
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
        self.shared.touch(&self.key);
        exec::run(&self.target(), &self.shared.config, &request, &cancel).await
    }
}

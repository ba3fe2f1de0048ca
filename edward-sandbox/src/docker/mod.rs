//! The Docker sandbox (feature `docker`): one container plus one workspace
//! volume per sandbox key, on a local or remote daemon (`DOCKER_HOST`).
//!
//! See [`DockerSandboxProvider`] for provisioning and lifecycle,
//! [`DockerSandbox`] for writes, reads and the process model, and
//! [`DockerSandboxConfig`] for the isolation settings (docs/DOCKER.md lists
//! each with the test that proves it).

/// The Docker client crate, re-exported for
/// [`DockerSandboxProvider::with_client`] and
/// [`DockerSandboxProvider::docker`].
pub use bollard;

mod archive;
mod config;
mod error;
mod exec;
mod provider;
mod sandbox;

pub use config::DockerSandboxConfig;
pub use provider::{DockerSandboxProvider, ReconcileReport};
pub use sandbox::DockerSandbox;

/// Label every container and volume Edward creates carries (`true`).
pub const MANAGED_LABEL: &str = "edward.managed";

/// Label holding the [namespace](DockerSandboxConfig::namespace) of a
/// container or volume.
pub const NAMESPACE_LABEL: &str = "edward.namespace";

/// Label holding the sandbox key of a container or volume.
pub const KEY_LABEL: &str = "edward.sandbox.key";

/// The image used when none is configured; `scripts/docker-image.sh` builds it.
pub const DEFAULT_IMAGE: &str = "edward-sandbox:busybox";

/// Where the workspace volume is mounted in every container.
pub const WORKSPACE: &str = "/workspace";

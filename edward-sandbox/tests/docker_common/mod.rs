//! Shared by the Docker test binaries: connecting (failing loudly, never
//! skipping, when no daemon answers) and small helpers.
#![allow(dead_code)]

use edward_sandbox::{DockerSandboxConfig, DockerSandboxProvider};

/// The image under test: `EDWARD_DOCKER_IMAGE` or the default one.
pub fn config() -> DockerSandboxConfig {
    let mut config = DockerSandboxConfig::default();
    if let Ok(image) = std::env::var("EDWARD_DOCKER_IMAGE") {
        if !image.is_empty() {
            config.image = image;
        }
    }
    config
}

/// A provider with `config`; panics with how to get a daemon when none answers.
pub async fn provider_with(config: DockerSandboxConfig) -> DockerSandboxProvider {
    DockerSandboxProvider::connect(config)
        .await
        .unwrap_or_else(|err| {
            panic!(
                "{err}\nThe Docker tests need a Docker daemon and the test image: run \
             scripts/test.sh, or scripts/dockerd.sh start && scripts/docker-image.sh"
            )
        })
}

/// A provider with the default (isolating) configuration.
pub async fn provider() -> DockerSandboxProvider {
    provider_with(config()).await
}

//! Sandboxes: `LocalSandbox` (a directory + child processes) and `DockerSandbox` (feature `docker`). Work in progress.

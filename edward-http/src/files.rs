//! A run's files, read through the engine ([`Engine::files`],
//! [`Engine::read_file`]): they reattach the run's sandbox and never create
//! one. Callers check that the run exists and belongs to the caller first.

use bytes::Bytes;
use edward_core::engine::{Engine, FilesError};
use edward_core::{FileEntry, RunId, SandboxPath};

use crate::error::{ApiError, ErrorCode};
use crate::model::FileView;

/// The run's files, as the API shows them (empty while it has no sandbox).
pub(crate) async fn list(engine: &Engine, run_id: RunId) -> Result<Vec<FileView>, ApiError> {
    match engine.files(run_id).await {
        Ok(files) => Ok(files
            .into_iter()
            .map(|f: FileEntry| FileView {
                path: f.path,
                size: f.size,
            })
            .collect()),
        Err(FilesError::NoSandbox { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// One file's bytes (`404` when it, or the run's sandbox, does not exist).
pub(crate) async fn read(
    engine: &Engine,
    run_id: RunId,
    path: &SandboxPath,
) -> Result<Bytes, ApiError> {
    match engine.read_file(run_id, path.as_str()).await {
        Ok(bytes) => Ok(bytes),
        Err(FilesError::NoSandbox { .. }) => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no such file: {path}"),
        )),
        Err(e) => Err(e.into()),
    }
}

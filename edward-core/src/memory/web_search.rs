//! [`NoWebSearch`]: the web search tool when none is configured.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::InfraError;
use crate::traits::{SearchResult, WebSearch};

/// A [`WebSearch`] that always answers [`InfraError::NotConfigured`], so a
/// `web_search` tag becomes a recorded tool error rather than a crash.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWebSearch;

#[async_trait]
impl WebSearch for NoWebSearch {
    async fn search(
        &self,
        _query: &str,
        _max_results: u8,
        _cancel: CancellationToken,
    ) -> Result<Vec<SearchResult>, InfraError> {
        Err(InfraError::NotConfigured {
            what: "web search".to_owned(),
        })
    }
}

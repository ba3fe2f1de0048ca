//! In-memory [`CredentialStore`].

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use super::lock_state;
use crate::{CredentialStore, StoreError, StoredCredential};

/// Credentials in a `Vec` behind a mutex (ciphertext only, like every store).
#[derive(Debug, Default)]
pub struct MemoryCredentialStore {
    creds: Mutex<Vec<StoredCredential>>,
}

impl MemoryCredentialStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl CredentialStore for MemoryCredentialStore {
    async fn put_credential(
        &self,
        mut cred: StoredCredential,
    ) -> Result<StoredCredential, StoreError> {
        let mut creds = lock_state(&self.creds);
        if cred.is_default {
            for c in creds
                .iter_mut()
                .filter(|c| c.user_id == cred.user_id && c.provider == cred.provider)
            {
                c.is_default = false;
            }
        }
        cred.revoked_at = None;
        match creds.iter_mut().find(|c| {
            c.user_id == cred.user_id && c.provider == cred.provider && c.name == cred.name
        }) {
            Some(existing) => {
                cred.id = existing.id;
                cred.created_at = existing.created_at;
                *existing = cred.clone();
            }
            None => {
                if creds.iter().any(|c| c.id == cred.id) {
                    return Err(StoreError::Backend {
                        message: format!("credential id {} already exists", cred.id),
                        retryable: false,
                    });
                }
                creds.push(cred.clone());
            }
        }
        Ok(cred)
    }

    async fn get_credential(
        &self,
        user_id: &str,
        id: Uuid,
    ) -> Result<Option<StoredCredential>, StoreError> {
        Ok(lock_state(&self.creds)
            .iter()
            .find(|c| c.id == id && c.user_id == user_id)
            .cloned())
    }

    async fn find_credential(
        &self,
        user_id: &str,
        provider: &str,
        name: Option<&str>,
    ) -> Result<Option<StoredCredential>, StoreError> {
        Ok(lock_state(&self.creds)
            .iter()
            .find(|c| {
                c.user_id == user_id
                    && c.provider == provider
                    && match name {
                        Some(n) => c.name == n,
                        None => c.is_default && c.revoked_at.is_none(),
                    }
            })
            .cloned())
    }

    async fn list_credentials(&self, user_id: &str) -> Result<Vec<StoredCredential>, StoreError> {
        let mut out: Vec<_> = lock_state(&self.creds)
            .iter()
            .filter(|c| c.user_id == user_id)
            .cloned()
            .collect();
        out.sort_by(|a, b| (&a.provider, &a.name).cmp(&(&b.provider, &b.name)));
        Ok(out)
    }

    async fn revoke_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let mut creds = lock_state(&self.creds);
        match creds
            .iter_mut()
            .find(|c| c.id == id && c.user_id == user_id)
        {
            Some(c) => {
                if c.revoked_at.is_none() {
                    c.revoked_at = Some(Utc::now());
                }
                c.is_default = false;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn delete_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let mut creds = lock_state(&self.creds);
        let before = creds.len();
        creds.retain(|c| !(c.id == id && c.user_id == user_id));
        Ok(creds.len() != before)
    }
}

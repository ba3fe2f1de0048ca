//! Encryption of users' provider keys at rest: XChaCha20-Poly1305 (AEAD)
//! under the operator's master keys, a random 192-bit nonce per secret, the
//! owner, provider and name bound in as associated data (a ciphertext moved
//! to another user's row does not decrypt), and the master key's id stored
//! with every secret so keys rotate: new secrets use the current key, old
//! ones decrypt with the key they name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use chrono::Utc;
use rand::RngCore;
use uuid::Uuid;

use super::RegistryError;
use crate::engine::RouteError;
use crate::providers::ApiKey;
use crate::{CredentialStore, StoreError, StoredCredential};

/// The environment variable [`MasterKeys::from_env`] reads:
/// `id=<64 hex digits>[,id=<64 hex digits>…]`, the first being current.
pub const MASTER_KEYS_ENV: &str = "EDWARD_CREDENTIAL_KEYS";

/// The operator's master keys: one current key (encrypts new secrets) and
/// older ones (still decrypt). `Debug` shows key ids only.
#[derive(Clone)]
pub struct MasterKeys {
    current: String,
    keys: BTreeMap<String, [u8; 32]>,
}

impl fmt::Debug for MasterKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterKeys")
            .field("current", &self.current)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MasterKeys {
    /// One key, current.
    pub fn new(id: impl Into<String>, key: [u8; 32]) -> Self {
        let id = id.into();
        MasterKeys {
            current: id.clone(),
            keys: BTreeMap::from([(id, key)]),
        }
    }

    /// Keep an older key for decrypting secrets it encrypted.
    pub fn with_previous(mut self, id: impl Into<String>, key: [u8; 32]) -> Self {
        self.keys.entry(id.into()).or_insert(key);
        self
    }

    /// Rotate: `id` becomes the current key; the old ones still decrypt.
    pub fn rotate_to(mut self, id: impl Into<String>, key: [u8; 32]) -> Self {
        let id = id.into();
        self.keys.insert(id.clone(), key);
        self.current = id;
        self
    }

    /// The id new secrets are encrypted under.
    pub fn current_id(&self) -> &str {
        &self.current
    }

    /// Parse `id=<64 hex>[,id=<64 hex>…]` (the first is current).
    pub fn parse(spec: &str) -> Result<Self, RegistryError> {
        let mut out: Option<MasterKeys> = None;
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, hex) = part
                .split_once('=')
                .ok_or(RegistryError::InvalidMasterKey {
                    id: String::new(),
                    reason: "expected `id=<64 hex digits>`",
                })?;
            let id = id.trim();
            if id.is_empty() {
                return Err(RegistryError::InvalidMasterKey {
                    id: String::new(),
                    reason: "empty key id",
                });
            }
            let key = decode_hex32(hex.trim()).ok_or_else(|| RegistryError::InvalidMasterKey {
                id: id.to_string(),
                reason: "the key must be 64 hex digits (32 bytes)",
            })?;
            out = Some(match out {
                None => MasterKeys::new(id, key),
                Some(k) => k.with_previous(id, key),
            });
        }
        out.ok_or(RegistryError::InvalidMasterKey {
            id: String::new(),
            reason: "no keys given",
        })
    }

    /// From [`MASTER_KEYS_ENV`].
    pub fn from_env() -> Result<Self, RegistryError> {
        let v = std::env::var(MASTER_KEYS_ENV).map_err(|_| RegistryError::InvalidMasterKey {
            id: String::new(),
            reason: "EDWARD_CREDENTIAL_KEYS is not set",
        })?;
        Self::parse(&v)
    }

    fn cipher(&self, id: &str) -> Option<XChaCha20Poly1305> {
        self.keys
            .get(id)
            .map(|k| XChaCha20Poly1305::new(Key::from_slice(k)))
    }
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// What binds a ciphertext to its row.
fn aad(user_id: &str, provider: &str, name: &str) -> Vec<u8> {
    format!("edward-credential/v1\0{user_id}\0{provider}\0{name}").into_bytes()
}

/// A new credential to store (the key in plaintext only until encrypted).
#[derive(Clone)]
pub struct NewCredential {
    /// The owner.
    pub user_id: String,
    /// The registry provider name.
    pub provider: String,
    /// The user's name for it.
    pub name: String,
    /// The provider key.
    pub key: ApiKey,
    /// A base URL override (used only where the provider allows it).
    pub base_url: Option<String>,
    /// Make it the user's default for the provider.
    pub is_default: bool,
}

impl fmt::Debug for NewCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewCredential")
            .field("user_id", &self.user_id)
            .field("provider", &self.provider)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("base_url", &self.base_url)
            .field("is_default", &self.is_default)
            .finish()
    }
}

/// A credential as listed to its owner: everything but the key, which shows
/// only its last four characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedCredential {
    /// The stored record (ciphertext included; it is not secret without the master key).
    pub id: Uuid,
    /// The provider.
    pub provider: String,
    /// The name.
    pub name: String,
    /// `…abcd`, or `[undecryptable]`.
    pub masked_key: String,
    /// The base URL override.
    pub base_url: Option<String>,
    /// Whether it is the default.
    pub is_default: bool,
    /// Whether it was revoked.
    pub revoked: bool,
    /// The master key id it is encrypted under.
    pub key_id: String,
}

/// Encrypts credentials into a [`CredentialStore`] and decrypts them per run.
#[derive(Clone)]
pub struct CredentialVault {
    store: Arc<dyn CredentialStore>,
    keys: MasterKeys,
}

impl fmt::Debug for CredentialVault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialVault")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl CredentialVault {
    /// A vault over `store` with `keys`.
    pub fn new(store: Arc<dyn CredentialStore>, keys: MasterKeys) -> Self {
        CredentialVault { store, keys }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn CredentialStore> {
        &self.store
    }

    /// Encrypt `cred` under the current master key and store it (replacing
    /// the user's credential of the same provider and name).
    pub async fn put(&self, cred: NewCredential) -> Result<StoredCredential, StoreError> {
        let stored = self.encrypt(&cred)?;
        self.store.put_credential(stored).await
    }

    /// The encrypted record of `cred` (not stored).
    pub fn encrypt(&self, cred: &NewCredential) -> Result<StoredCredential, StoreError> {
        let key_id = self.keys.current.clone();
        let cipher = self.keys.cipher(&key_id).ok_or(StoreError::Backend {
            message: format!("master key `{key_id}` missing"),
            retryable: false,
        })?;
        let mut nonce = [0u8; 24];
        rand::rng().fill_bytes(&mut nonce);
        let ciphertext = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: cred.key.expose().as_bytes(),
                    aad: &aad(&cred.user_id, &cred.provider, &cred.name),
                },
            )
            .map_err(|_| StoreError::Backend {
                message: "credential encryption failed".into(),
                retryable: false,
            })?;
        Ok(StoredCredential {
            id: Uuid::new_v4(),
            user_id: cred.user_id.clone(),
            provider: cred.provider.clone(),
            name: cred.name.clone(),
            base_url: cred.base_url.clone(),
            key_id,
            nonce: nonce.to_vec(),
            ciphertext,
            is_default: cred.is_default,
            created_at: Utc::now(),
            revoked_at: None,
        })
    }

    /// Decrypt a stored credential's key.
    pub fn decrypt(&self, c: &StoredCredential) -> Result<ApiKey, RouteError> {
        let cipher = self
            .keys
            .cipher(&c.key_id)
            .ok_or_else(|| RouteError::UnknownMasterKey {
                key_id: c.key_id.clone(),
            })?;
        let failed = || RouteError::Decryption {
            key_id: c.key_id.clone(),
        };
        if c.nonce.len() != 24 {
            return Err(failed());
        }
        let plain = cipher
            .decrypt(
                XNonce::from_slice(&c.nonce),
                Payload {
                    msg: &c.ciphertext,
                    aad: &aad(&c.user_id, &c.provider, &c.name),
                },
            )
            .map_err(|_| failed())?;
        String::from_utf8(plain)
            .map(ApiKey::new)
            .map_err(|_| failed())
    }

    /// Re-encrypt every credential of `user_id` not under the current key
    /// (after [`MasterKeys::rotate_to`]); returns how many were rewritten.
    pub async fn reencrypt_user(&self, user_id: &str) -> Result<usize, RouteError> {
        let mut n = 0;
        for c in self
            .store
            .list_credentials(user_id)
            .await
            .map_err(RouteError::Store)?
        {
            if c.key_id == self.keys.current || c.revoked_at.is_some() {
                continue;
            }
            let key = self.decrypt(&c)?;
            let fresh = self
                .encrypt(&NewCredential {
                    user_id: c.user_id.clone(),
                    provider: c.provider.clone(),
                    name: c.name.clone(),
                    key,
                    base_url: c.base_url.clone(),
                    is_default: c.is_default,
                })
                .map_err(RouteError::Store)?;
            self.store
                .put_credential(fresh)
                .await
                .map_err(RouteError::Store)?;
            n += 1;
        }
        Ok(n)
    }

    /// The user's credentials with keys masked to their last four characters.
    pub async fn list_masked(&self, user_id: &str) -> Result<Vec<MaskedCredential>, StoreError> {
        Ok(self
            .store
            .list_credentials(user_id)
            .await?
            .into_iter()
            .map(|c| {
                let masked_key = match self.decrypt(&c) {
                    Ok(k) => {
                        let chars: Vec<char> = k.expose().chars().collect();
                        let tail: String = chars[chars.len().saturating_sub(4)..].iter().collect();
                        if chars.len() >= 12 {
                            format!("…{tail}")
                        } else {
                            "…".to_string()
                        }
                    }
                    Err(_) => "[undecryptable]".to_string(),
                };
                MaskedCredential {
                    id: c.id,
                    provider: c.provider,
                    name: c.name,
                    masked_key,
                    base_url: c.base_url,
                    is_default: c.is_default,
                    revoked: c.revoked_at.is_some(),
                    key_id: c.key_id,
                }
            })
            .collect())
    }

    /// Revoke the user's credential.
    pub async fn revoke(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        self.store.revoke_credential(user_id, id).await
    }

    /// Delete the user's credential.
    pub async fn delete(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        self.store.delete_credential(user_id, id).await
    }
}

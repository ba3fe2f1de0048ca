//! [`CredentialStore`] on the SQLite file (table `credentials`): ciphertext,
//! nonce and master-key id only; one default per user and provider enforced
//! by a partial unique index.

use async_trait::async_trait;
use edward_core::{CredentialStore, StoreError, StoredCredential};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::{SqliteStore, from_micros, micros};
use crate::error::store_err;

const COLUMNS: &str = "id, user_id, provider, name, base_url, key_id, nonce, ciphertext, \
     is_default, created_at, revoked_at";

fn from_row(row: &SqliteRow) -> Result<StoredCredential, StoreError> {
    let revoked_at: Option<i64> = row.try_get("revoked_at").map_err(store_err)?;
    Ok(StoredCredential {
        id: row.try_get("id").map_err(store_err)?,
        user_id: row.try_get("user_id").map_err(store_err)?,
        provider: row.try_get("provider").map_err(store_err)?,
        name: row.try_get("name").map_err(store_err)?,
        base_url: row.try_get("base_url").map_err(store_err)?,
        key_id: row.try_get("key_id").map_err(store_err)?,
        nonce: row.try_get("nonce").map_err(store_err)?,
        ciphertext: row.try_get("ciphertext").map_err(store_err)?,
        is_default: row.try_get::<i64, _>("is_default").map_err(store_err)? != 0,
        created_at: from_micros(row.try_get("created_at").map_err(store_err)?)?,
        revoked_at: revoked_at.map(from_micros).transpose()?,
    })
}

#[async_trait]
impl CredentialStore for SqliteStore {
    async fn put_credential(&self, cred: StoredCredential) -> Result<StoredCredential, StoreError> {
        let mut tx = self.begin_write().await.map_err(store_err)?;
        if cred.is_default {
            sqlx::query("UPDATE credentials SET is_default = 0 WHERE user_id = ? AND provider = ? AND name <> ?")
                .bind(&cred.user_id)
                .bind(&cred.provider)
                .bind(&cred.name)
                .execute(&mut *tx)
                .await
                .map_err(store_err)?;
        }
        let row = sqlx::query(&format!(
            "INSERT INTO credentials ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL) \
             ON CONFLICT (user_id, provider, name) DO UPDATE SET \
               base_url = excluded.base_url, key_id = excluded.key_id, nonce = excluded.nonce, \
               ciphertext = excluded.ciphertext, is_default = excluded.is_default, revoked_at = NULL \
             RETURNING {COLUMNS}"
        ))
        .bind(cred.id)
        .bind(&cred.user_id)
        .bind(&cred.provider)
        .bind(&cred.name)
        .bind(&cred.base_url)
        .bind(&cred.key_id)
        .bind(&cred.nonce)
        .bind(&cred.ciphertext)
        .bind(i64::from(cred.is_default))
        .bind(micros(cred.created_at))
        .fetch_one(&mut *tx)
        .await
        .map_err(store_err)?;
        let stored = from_row(&row)?;
        tx.commit().await.map_err(store_err)?;
        Ok(stored)
    }

    async fn get_credential(
        &self,
        user_id: &str,
        id: Uuid,
    ) -> Result<Option<StoredCredential>, StoreError> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM credentials WHERE id = ? AND user_id = ?"
        ))
        .bind(id)
        .bind(user_id)
        .fetch_optional(&self.reader)
        .await
        .map_err(store_err)?
        .as_ref()
        .map(from_row)
        .transpose()
    }

    async fn find_credential(
        &self,
        user_id: &str,
        provider: &str,
        name: Option<&str>,
    ) -> Result<Option<StoredCredential>, StoreError> {
        let q = match name {
            Some(_) => format!(
                "SELECT {COLUMNS} FROM credentials WHERE user_id = ? AND provider = ? AND name = ?"
            ),
            None => format!(
                "SELECT {COLUMNS} FROM credentials WHERE user_id = ? AND provider = ? \
                 AND is_default = 1 AND revoked_at IS NULL"
            ),
        };
        let mut q = sqlx::query(&q).bind(user_id).bind(provider);
        if let Some(n) = name {
            q = q.bind(n);
        }
        q.fetch_optional(&self.reader)
            .await
            .map_err(store_err)?
            .as_ref()
            .map(from_row)
            .transpose()
    }

    async fn list_credentials(&self, user_id: &str) -> Result<Vec<StoredCredential>, StoreError> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM credentials WHERE user_id = ? ORDER BY provider, name"
        ))
        .bind(user_id)
        .fetch_all(&self.reader)
        .await
        .map_err(store_err)?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn revoke_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE credentials SET revoked_at = COALESCE(revoked_at, ?), is_default = 0 \
             WHERE id = ? AND user_id = ?",
        )
        .bind(micros(chrono::Utc::now()))
        .bind(id)
        .bind(user_id)
        .execute(&self.writer())
        .await
        .map_err(store_err)?;
        Ok(done.rows_affected() > 0)
    }

    async fn delete_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM credentials WHERE id = ? AND user_id = ?")
            .bind(id)
            .bind(user_id)
            .execute(&self.writer())
            .await
            .map_err(store_err)?;
        Ok(done.rows_affected() > 0)
    }
}

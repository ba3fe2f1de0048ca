//! [`CredentialStore`] on Postgres (table `edward_credentials`): ciphertext,
//! nonce and master-key id only; one default per user and provider enforced
//! by a partial unique index.

use async_trait::async_trait;
use edward_core::{CredentialStore, StoreError, StoredCredential};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::PgStore;
use crate::error::store_err;

const COLUMNS: &str = "id, user_id, provider, name, base_url, key_id, nonce, ciphertext, \
     is_default, created_at, revoked_at";

fn from_row(row: &PgRow) -> Result<StoredCredential, StoreError> {
    Ok(StoredCredential {
        id: row.try_get("id").map_err(store_err)?,
        user_id: row.try_get("user_id").map_err(store_err)?,
        provider: row.try_get("provider").map_err(store_err)?,
        name: row.try_get("name").map_err(store_err)?,
        base_url: row.try_get("base_url").map_err(store_err)?,
        key_id: row.try_get("key_id").map_err(store_err)?,
        nonce: row.try_get("nonce").map_err(store_err)?,
        ciphertext: row.try_get("ciphertext").map_err(store_err)?,
        is_default: row.try_get("is_default").map_err(store_err)?,
        created_at: row.try_get("created_at").map_err(store_err)?,
        revoked_at: row.try_get("revoked_at").map_err(store_err)?,
    })
}

#[async_trait]
impl CredentialStore for PgStore {
    async fn put_credential(&self, cred: StoredCredential) -> Result<StoredCredential, StoreError> {
        let mut tx = self.pool().begin().await.map_err(store_err)?;
        if cred.is_default {
            sqlx::query(
                "UPDATE edward_credentials SET is_default = false \
                 WHERE user_id = $1 AND provider = $2 AND name <> $3",
            )
            .bind(&cred.user_id)
            .bind(&cred.provider)
            .bind(&cred.name)
            .execute(&mut *tx)
            .await
            .map_err(store_err)?;
        }
        let row = sqlx::query(&format!(
            "INSERT INTO edward_credentials ({COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL) \
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
        .bind(cred.is_default)
        .bind(cred.created_at)
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
            "SELECT {COLUMNS} FROM edward_credentials WHERE id = $1 AND user_id = $2"
        ))
        .bind(id)
        .bind(user_id)
        .fetch_optional(self.pool())
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
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM edward_credentials WHERE user_id = $1 AND provider = $2 \
             AND (CASE WHEN $3::text IS NULL THEN is_default AND revoked_at IS NULL \
                  ELSE name = $3 END)"
        ))
        .bind(user_id)
        .bind(provider)
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(store_err)?
        .as_ref()
        .map(from_row)
        .transpose()
    }

    async fn list_credentials(&self, user_id: &str) -> Result<Vec<StoredCredential>, StoreError> {
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM edward_credentials WHERE user_id = $1 ORDER BY provider, name"
        ))
        .bind(user_id)
        .fetch_all(self.pool())
        .await
        .map_err(store_err)?
        .iter()
        .map(from_row)
        .collect()
    }

    async fn revoke_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE edward_credentials SET revoked_at = COALESCE(revoked_at, now()), \
             is_default = false WHERE id = $1 AND user_id = $2",
        )
        .bind(id)
        .bind(user_id)
        .execute(self.pool())
        .await
        .map_err(store_err)?;
        Ok(done.rows_affected() > 0)
    }

    async fn delete_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM edward_credentials WHERE id = $1 AND user_id = $2")
            .bind(id)
            .bind(user_id)
            .execute(self.pool())
            .await
            .map_err(store_err)?;
        Ok(done.rows_affected() > 0)
    }
}

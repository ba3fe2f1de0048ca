//! [`CredentialStore`] on the SQLite file (table `credentials`): ciphertext,
//! nonce and master-key id only; one default per user and provider enforced
//! by a partial unique index.

use async_trait::async_trait;
use edward_core::{CredentialStore, StoreError, StoredCredential};
use rusqlite::{Connection, params};
use uuid::Uuid;

use super::rows::Cols;
use super::writer::sqlite_store_err;
use super::{SqliteStore, from_micros, micros};
use crate::error::store_err;

const COLUMNS: &str = "id, user_id, provider, name, base_url, key_id, nonce, ciphertext, \
     is_default, created_at, revoked_at";

fn from_row(row: &impl Cols) -> Result<StoredCredential, StoreError> {
    Ok(StoredCredential {
        id: row.uuid("id")?,
        user_id: row.text("user_id")?,
        provider: row.text("provider")?,
        name: row.text("name")?,
        base_url: row.opt_text("base_url")?,
        key_id: row.text("key_id")?,
        nonce: row.blob("nonce")?,
        ciphertext: row.blob("ciphertext")?,
        is_default: row.int("is_default")? != 0,
        created_at: from_micros(row.int("created_at")?)?,
        revoked_at: row.opt_int("revoked_at")?.map(from_micros).transpose()?,
    })
}

fn se(e: rusqlite::Error) -> StoreError {
    sqlite_store_err(&e)
}

fn put(conn: &Connection, cred: &StoredCredential) -> Result<StoredCredential, StoreError> {
    if cred.is_default {
        conn.prepare_cached(
            "UPDATE credentials SET is_default = 0 WHERE user_id = ?1 AND provider = ?2 AND name <> ?3",
        )
        .map_err(se)?
        .execute(params![cred.user_id, cred.provider, cred.name])
        .map_err(se)?;
    }
    conn.prepare_cached(&format!(
        "INSERT INTO credentials ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL) \
         ON CONFLICT (user_id, provider, name) DO UPDATE SET \
           base_url = excluded.base_url, key_id = excluded.key_id, nonce = excluded.nonce, \
           ciphertext = excluded.ciphertext, is_default = excluded.is_default, revoked_at = NULL \
         RETURNING {COLUMNS}"
    ))
    .map_err(se)?
    .query_row(
        params![
            cred.id,
            cred.user_id,
            cred.provider,
            cred.name,
            cred.base_url,
            cred.key_id,
            cred.nonce,
            cred.ciphertext,
            i64::from(cred.is_default),
            micros(cred.created_at)
        ],
        |row| Ok(from_row(row)),
    )
    .map_err(se)?
}

fn revoke(conn: &Connection, (user_id, id): &(String, Uuid)) -> Result<bool, StoreError> {
    let n = conn
        .prepare_cached(
            "UPDATE credentials SET revoked_at = COALESCE(revoked_at, ?1), is_default = 0 \
             WHERE id = ?2 AND user_id = ?3",
        )
        .map_err(se)?
        .execute(params![micros(chrono::Utc::now()), id, user_id])
        .map_err(se)?;
    Ok(n > 0)
}

fn delete(conn: &Connection, (user_id, id): &(String, Uuid)) -> Result<bool, StoreError> {
    let n = conn
        .prepare_cached("DELETE FROM credentials WHERE id = ?1 AND user_id = ?2")
        .map_err(se)?
        .execute(params![id, user_id])
        .map_err(se)?;
    Ok(n > 0)
}

#[async_trait]
impl CredentialStore for SqliteStore {
    async fn put_credential(&self, cred: StoredCredential) -> Result<StoredCredential, StoreError> {
        self.jobs.run(cred, put).await
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
        self.jobs.run((user_id.to_owned(), id), revoke).await
    }

    async fn delete_credential(&self, user_id: &str, id: Uuid) -> Result<bool, StoreError> {
        self.jobs.run((user_id.to_owned(), id), delete).await
    }
}

//! One process per SQLite database: a lock file beside the database, held (with an advisory
//! exclusive lock) for as long as the store is open, and naming the holder's pid. A second
//! server on the same file would otherwise record the first one's live runs as interrupted.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::store::{StoreError, StoreResult};

pub struct DatabaseLock {
    /// Locked while open; the kernel releases the lock when the process ends, even by kill -9.
    _file: File,
}

impl DatabaseLock {
    /// Takes the lock of the database at `path`, or says which process holds it.
    pub fn take(path: &Path) -> StoreResult<DatabaseLock> {
        let lock_path = lock_path(path);
        let unusable =
            |what: String| StoreError::Unusable(format!("the database {}: {what}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| match e.raw_os_error() {
                Some(EROFS) => unusable(
                    "it is on a read-only file system; tah must be able to write it".to_string(),
                ),
                _ => unusable(format!("cannot open {}: {e}", lock_path.display())),
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "another process".to_string(),
                    pid => format!("another tah process (pid {pid})"),
                };
                return Err(unusable(format!(
                    "it is in use by {holder}; stop that process or give another --database-url"
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(unusable(format!(
                    "cannot lock {}: {e}",
                    lock_path.display()
                )));
            }
        }
        let pid = std::process::id().to_string();
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()));
        written.map_err(|e| unusable(format!("cannot write {}: {e}", lock_path.display())))?;
        Ok(DatabaseLock { _file: file })
    }
}

/// `EROFS` on Linux: the file system is mounted read-only.
const EROFS: i32 = 30;

fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("data.db");
        let first = DatabaseLock::take(&db).expect("the first lock");
        let error = DatabaseLock::take(&db)
            .err()
            .expect("the second is refused");
        let text = error.to_string();
        assert!(text.contains(&db.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first);
        DatabaseLock::take(&db).expect("free again once released");
    }
}

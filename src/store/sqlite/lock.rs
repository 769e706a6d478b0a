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
        match try_lock(&mut file) {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = holder(&mut file);
                let holder = match holder.as_str() {
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

/// Takes the lock; while it is held but the pid the file names is gone, waits a little for it.
/// The lock belongs to the open file, so a process the dead holder was starting (forked, not
/// yet exec'd, when the holder was killed) keeps it until its `exec` closes the descriptor:
/// a server restarted right after a `kill -9` must not be refused for that.
fn try_lock(file: &mut File) -> Result<(), std::fs::TryLockError> {
    let deadline = std::time::Instant::now() + ORPHAN_WAIT;
    loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock)
                if std::time::Instant::now() < deadline && holder_is_gone(file) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// How long a lock whose named holder is gone is waited for.
const ORPHAN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What the lock file says: the holder's pid, or nothing.
fn holder(file: &mut File) -> String {
    let mut holder = String::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.read_to_string(&mut holder);
    holder.trim().to_string()
}

/// Whether the lock file names a pid that no longer exists.
fn holder_is_gone(file: &mut File) -> bool {
    let Ok(pid) = holder(file).parse::<i32>() else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    pid > 0
        && unsafe { libc::kill(pid, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
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

    /// A lock left held by what a killed holder was starting is waited for, not refused.
    #[test]
    fn a_lock_whose_holder_is_gone_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("data.db");
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        let dead = exited.id();
        exited.wait().unwrap();
        std::fs::write(lock_path(&db), dead.to_string()).unwrap();
        let orphan = File::options().read(true).open(lock_path(&db)).unwrap();
        orphan.lock().unwrap();
        let started = std::time::Instant::now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(orphan);
        });
        DatabaseLock::take(&db).expect("taken once the orphan lets go");
        let waited = started.elapsed();
        release.join().unwrap();
        assert!(
            waited >= std::time::Duration::from_millis(250),
            "{waited:?}"
        );
    }
}

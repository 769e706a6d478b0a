//! A VFS shim under the writer's connection that hands each transaction's WAL frames to the
//! file system in one write instead of two per frame.
//!
//! SQLite appends a frame to the WAL as two writes, its 24-byte header and then its page, so a
//! transaction of 14 pages made 28 `pwrite64` calls (13.5% of the server's samples at C=1, about
//! as much at mock C=64: `BENCHMARKS.md`). This shim keeps the frames of a transaction in memory
//! while they are appended one after another, and writes them out with the frame that commits
//! the transaction (the one whose header carries the database's size), inside the very `xWrite`
//! call that SQLite makes for it: an error is that call's error, so a transaction whose frames
//! could not be written fails as it would without the shim, and nothing SQLite has not yet
//! published (in the WAL index, after its last write) is left unwritten when it does publish.
//!
//! Only the writer's connection opens files through it, and only its WAL files are wrapped; the
//! readers, the database file and the shared-memory index use SQLite's own VFS. Every other call
//! on a wrapped WAL file (a read, a sync, a size, a truncation, a lock, a file control, closing)
//! writes what is held first, so SQLite never sees the file differ from what it wrote. What is
//! held is at most [`HELD_AT_MOST`] bytes (a larger transaction writes in several pieces), and
//! the room kept between transactions [`HELD_KEPT`].
//! `synchronous=NORMAL` does not sync the WAL at commit, so the shim changes how many calls
//! write a transaction, not when it is durable.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name the shim is registered under.
const NAME: &CStr = c"tah-wal";

/// Bytes held at most before they are written, whatever the transaction.
const HELD_AT_MOST: usize = 1 << 20;
/// Bytes of room kept between transactions.
const HELD_KEPT: usize = 128 << 10;
/// Bytes per write at most: SQLite's own VFS writes the low 17 bits of a larger amount's size
/// (`seekAndWriteFd`), as it never writes more at once.
const WRITE_AT_MOST: usize = 64 << 10;
/// A WAL frame's header: page number, then the database's size in pages for the frame that
/// commits a transaction (0 for every other frame), salts and checksums (big-endian).
const FRAME_HEADER: usize = 24;

/// Registers the shim (once per process); returns its name, or SQLite's error code.
pub fn register() -> Result<&'static CStr, c_int> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    let rc = *REGISTERED.get_or_init(|| {
        // SAFETY: the default VFS lives as long as the process; the new one is leaked, so it
        // does too, as `sqlite3_vfs_register` requires.
        unsafe {
            let parent = ffi::sqlite3_vfs_find(ptr::null());
            if parent.is_null() {
                return ffi::SQLITE_ERROR;
            }
            let mut vfs: ffi::sqlite3_vfs = *parent;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.pAppData = parent.cast();
            vfs.szOsFile = c_int::try_from(REAL_OFFSET).unwrap_or(c_int::MAX) + (*parent).szOsFile;
            vfs.xOpen = Some(open);
            ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0)
        }
    });
    if rc == ffi::SQLITE_OK {
        Ok(NAME)
    } else {
        Err(rc)
    }
}

/// A wrapped WAL file: the shim's part, then the real file of the default VFS.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    held: *mut Held,
}

/// Where the real file starts in the shim's file object (aligned for any field of it).
const REAL_OFFSET: usize = std::mem::size_of::<WalFile>().next_multiple_of(16);

/// Appended frames not yet written: the bytes, and where in the file they start.
#[derive(Default)]
struct Held {
    bytes: Vec<u8>,
    at: i64,
    /// The last piece held was a frame's header, so its page may follow.
    after_header: bool,
}

fn parent(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: `pAppData` was set to the default VFS at registration.
    unsafe { (*vfs).pAppData.cast() }
}

/// The real file behind a shim's file object.
fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the object is `szOsFile` bytes, of which the real file takes those from
    // `REAL_OFFSET`.
    unsafe { file.cast::<u8>().add(REAL_OFFSET).cast() }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let parent = parent(vfs);
    let Some(parent_open) = (*parent).xOpen else {
        return ffi::SQLITE_ERROR;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // Not a WAL file: the real file in the whole object, with its own methods.
        return parent_open(parent, name, file, flags, out_flags);
    }
    (*file).pMethods = ptr::null();
    let rc = parent_open(parent, name, real(file), flags, out_flags);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let wal = file.cast::<WalFile>();
    (*wal).held = Box::into_raw(Box::default());
    (*wal).base.pMethods = &WAL_METHODS;
    ffi::SQLITE_OK
}

/// The real file's methods (set by its VFS when it was opened).
unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    &*(*real(file)).pMethods
}

unsafe fn held<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Held {
    &mut *(*file.cast::<WalFile>()).held
}

/// Writes `len` bytes at `offset` to the real file.
unsafe fn write_real(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    len: c_int,
    offset: i64,
) -> c_int {
    match methods(file).xWrite {
        Some(write) => write(real(file), data, len, offset),
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

/// Writes what is held, in as few calls as the real file takes.
unsafe fn write_held(file: *mut ffi::sqlite3_file) -> c_int {
    let held = held(file);
    held.after_header = false;
    let mut rc = ffi::SQLITE_OK;
    let mut at = held.at;
    for piece in held.bytes.chunks(WRITE_AT_MOST) {
        // At most `WRITE_AT_MOST` bytes: both fit.
        let len = piece.len() as c_int;
        rc = write_real(file, piece.as_ptr().cast(), len, at);
        if rc != ffi::SQLITE_OK {
            break;
        }
        at += i64::from(len);
    }
    held.bytes.clear();
    // What a large batch needed is given back; a turn's transaction fits in what is kept.
    held.bytes.shrink_to(HELD_KEPT);
    rc
}

unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let bytes = std::slice::from_raw_parts(data.cast::<u8>(), len);
    let held_ref = held(file);
    let follows = held_ref.bytes.is_empty()
        || offset == held_ref.at + i64::try_from(held_ref.bytes.len()).unwrap_or(i64::MAX);
    let header = len == FRAME_HEADER;
    // Held: a frame's header, and the page right after a header held. Anything else (the WAL's
    // own header, a page or header rewritten in place) is written at once, after what is held.
    let holdable = follows && (header || held_ref.after_header);
    if !holdable {
        let rc = write_held(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        return write_real(file, data, amount, offset);
    }
    if held_ref.bytes.is_empty() {
        held_ref.at = offset;
    }
    held_ref.bytes.extend_from_slice(bytes);
    held_ref.after_header = header;
    let commits = header && bytes[4..8] != [0, 0, 0, 0];
    if commits || held_ref.bytes.len() >= HELD_AT_MOST {
        // The frame that commits: it and everything before it are written now, within the
        // call SQLite checks; its page comes next and is written at once (not held).
        return write_held(file);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    let written = write_held(file);
    let closed = match methods(file).xClose {
        Some(close) => close(real(file)),
        None => ffi::SQLITE_OK,
    };
    let wal = file.cast::<WalFile>();
    drop(Box::from_raw((*wal).held));
    (*wal).held = ptr::null_mut();
    (*wal).base.pMethods = ptr::null();
    if written != ffi::SQLITE_OK {
        written
    } else {
        closed
    }
}

/// Defines a method of wrapped WAL files that writes what is held, then calls the real one.
macro_rules! after_held {
    ($name:ident, $method:ident ( $($arg:ident : $ty:ty),* )) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            let rc = write_held(file);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match methods(file).$method {
                Some(method) => method(real(file), $($arg),*),
                None => ffi::SQLITE_ERROR,
            }
        }
    };
}

after_held!(wal_read, xRead(data: *mut c_void, amount: c_int, offset: i64));
after_held!(wal_truncate, xTruncate(size: i64));
after_held!(wal_sync, xSync(flags: c_int));
after_held!(wal_file_size, xFileSize(size: *mut i64));
after_held!(wal_lock, xLock(level: c_int));
after_held!(wal_unlock, xUnlock(level: c_int));
after_held!(wal_check_reserved_lock, xCheckReservedLock(out: *mut c_int));
after_held!(wal_file_control, xFileControl(op: c_int, arg: *mut c_void));

unsafe extern "C" fn wal_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    match methods(file).xSectorSize {
        Some(method) => method(real(file)),
        None => 4096,
    }
}

unsafe extern "C" fn wal_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    match methods(file).xDeviceCharacteristics {
        Some(method) => method(real(file)),
        None => 0,
    }
}

/// Version 1: a WAL file is never mapped nor used for shared memory (the database file is).
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(wal_close),
    xRead: Some(wal_read),
    xWrite: Some(wal_write),
    xTruncate: Some(wal_truncate),
    xSync: Some(wal_sync),
    xFileSize: Some(wal_file_size),
    xLock: Some(wal_lock),
    xUnlock: Some(wal_unlock),
    xCheckReservedLock: Some(wal_check_reserved_lock),
    xFileControl: Some(wal_file_control),
    xSectorSize: Some(wal_sector_size),
    xDeviceCharacteristics: Some(wal_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

#[cfg(test)]
mod tests {
    use rusqlite::{params, Connection, OpenFlags};

    use super::*;

    fn through_shim(path: &std::path::Path) -> Connection {
        let name = register().expect("the shim registers");
        let conn = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::default(),
            name.to_str().expect("an ASCII name"),
        )
        .expect("opens through the shim");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("WAL");
        conn.pragma_update(None, "synchronous", "NORMAL")
            .expect("NORMAL");
        conn
    }

    fn rows(conn: &Connection) -> Vec<(i64, Vec<u8>)> {
        let mut statement = conn
            .prepare("SELECT id, body FROM t ORDER BY id")
            .expect("prepares");
        let rows = statement
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("reads");
        rows.map(|r| r.expect("a row")).collect()
    }

    fn body(id: i64, round: i64) -> Vec<u8> {
        (0..3000)
            .map(|i| ((i + id * 7 + round * 13) % 251) as u8)
            .collect()
    }

    #[test]
    fn what_the_writer_commits_is_what_readers_and_a_reopened_database_see() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("shim.db");
        let writer = through_shim(&path);
        // A small page cache: a large transaction spills frames before it commits and then
        // rewrites some of them in place (the paths that write other than by appending).
        writer.pragma_update(None, "cache_size", 8).expect("cache");
        writer
            .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            .expect("creates");
        let reader = Connection::open(&path).expect("a reader on SQLite's own VFS");
        let mut expected = Vec::new();
        for round in 0..6_i64 {
            let tx = writer.unchecked_transaction().expect("begins");
            for id in 0..60 {
                tx.execute(
                    "INSERT INTO t (id, body) VALUES (?1, ?2) \
                     ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                    params![id, body(id, round)],
                )
                .expect("writes");
            }
            // Rewritten within the same transaction, after the spill.
            for id in 0..60 {
                tx.execute(
                    "UPDATE t SET body = ?2 WHERE id = ?1",
                    params![id, body(id, round + 100)],
                )
                .expect("rewrites");
            }
            if round == 3 {
                tx.rollback().expect("rolls back");
            } else {
                tx.commit().expect("commits");
                expected = (0..60).map(|id| (id, body(id, round + 100))).collect();
            }
            assert_eq!(
                rows(&reader),
                expected,
                "round {round}, as a reader sees it"
            );
        }
        // Checkpoints read the WAL back through the shim.
        writer
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .expect("checkpoints");
        let tx = writer.unchecked_transaction().expect("begins");
        tx.execute("DELETE FROM t WHERE id >= 30", [])
            .expect("deletes");
        tx.commit().expect("commits");
        expected.truncate(30);
        assert_eq!(rows(&reader), expected);
        drop(reader);
        drop(writer);

        let reopened = Connection::open(&path).expect("reopens on SQLite's own VFS");
        let check: String = reopened
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("checks");
        assert_eq!(check, "ok");
        assert_eq!(rows(&reopened), expected);
    }
}

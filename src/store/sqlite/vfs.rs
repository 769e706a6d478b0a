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
//!
//! Every function SQLite calls states SQLite's contract for it as its `# Safety`, and every
//! unsafe operation says why it holds (`SAFETY:`); unsafe operations in unsafe functions are
//! denied outside such blocks.

#![deny(unsafe_op_in_unsafe_fn)]

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
        // SAFETY: `sqlite3_vfs_find` may be called from any thread (it initialises the library
        // and takes its mutex); a null name asks for the default VFS.
        let parent = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if parent.is_null() {
            return ffi::SQLITE_ERROR;
        }
        // SAFETY: a registered VFS stays valid until it is unregistered, and nothing
        // unregisters the default one; this reads a copy of it.
        let mut vfs: ffi::sqlite3_vfs = unsafe { *parent };
        // Every method but `xOpen` is the default VFS's own, called with the shim's object,
        // which has the same fields but for `pAppData`: the unix VFS reads that only in its
        // `xOpen` (to find a file's locking style), which `open` calls with the default VFS.
        vfs.zName = NAME.as_ptr();
        vfs.pNext = ptr::null_mut();
        vfs.pAppData = parent.cast();
        vfs.szOsFile += c_int::try_from(REAL_OFFSET).unwrap_or(c_int::MAX);
        vfs.xOpen = Some(open);
        // SAFETY: the object is leaked, so it outlives its registration (never undone), as
        // `sqlite3_vfs_register` requires; its name is a static string. Registering takes the
        // library's mutex, and `REGISTERED` runs this once.
        unsafe { ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0) }
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
    /// The WAL file's name, by which a test makes its writes fail (`faults`).
    #[cfg(test)]
    name: String,
}

/// The VFS the shim wraps.
///
/// # Safety
///
/// `vfs` is the shim's registered object (SQLite passes it to the shim's `xOpen`).
unsafe fn parent(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: the caller passes the shim's object, which is valid for the process's life and
    // whose `pAppData` `register` set to the default VFS.
    unsafe { (*vfs).pAppData.cast() }
}

/// The real file behind a shim's file object.
///
/// # Safety
///
/// `file` is a file object SQLite allocated for the shim's VFS: `szOsFile` bytes, of which the
/// real file takes those from [`REAL_OFFSET`].
unsafe fn real(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the caller's object is `REAL_OFFSET` bytes and more, so the offset stays inside
    // it.
    unsafe { file.cast::<u8>().add(REAL_OFFSET).cast() }
}

/// The shim's `xOpen`: a WAL file is wrapped, any other file is the default VFS's own.
///
/// # Safety
///
/// SQLite's contract for `xOpen`: `vfs` is the shim's object, `file` points to `szOsFile`
/// writable bytes, zeroed or not, that stay where they are until `xClose`; `name` and
/// `out_flags` are what the default VFS's `xOpen` takes.
unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls `xOpen` with the VFS it was registered with.
    let parent = unsafe { parent(vfs) };
    // SAFETY: the default VFS is valid for the process's life.
    let Some(parent_open) = (unsafe { (*parent).xOpen }) else {
        return ffi::SQLITE_ERROR;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // Not a WAL file: the real file in the whole object, with its own methods.
        // SAFETY: the object is larger than the default VFS's `szOsFile`; the other arguments
        // are SQLite's own, passed on.
        return unsafe { parent_open(parent, name, file, flags, out_flags) };
    }
    // SAFETY: `file` points to at least a `sqlite3_file`. Its methods are null until the real
    // file is open, so that SQLite does not close a file whose open failed.
    unsafe { (*file).pMethods = ptr::null() };
    // SAFETY: `real(file)` is the tail of the caller's object, as large as the default VFS's
    // `szOsFile`; the other arguments are SQLite's own, passed on.
    let rc = unsafe { parent_open(parent, name, real(file), flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let held = Box::into_raw(Box::new(Held {
        // SAFETY: a WAL file has a name: a NUL-terminated string that outlives the call.
        #[cfg(test)]
        name: unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
        ..Held::default()
    }));
    let wal = file.cast::<WalFile>();
    // SAFETY: the object is `REAL_OFFSET` bytes and more, so a `WalFile` fits at its start,
    // aligned (SQLite's allocations are 8-byte aligned, as a `WalFile` needs). Nothing else
    // refers to it yet; `held` is freed by `wal_close`.
    unsafe {
        (*wal).held = held;
        (*wal).base.pMethods = &WAL_METHODS;
    }
    ffi::SQLITE_OK
}

/// The real file's methods (set by its VFS when it was opened).
///
/// # Safety
///
/// `file` is a WAL file that [`open`] opened and [`wal_close`] has not closed; the reference
/// is not kept past that.
unsafe fn methods<'a>(file: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: the real file of an open WAL file is open, so its VFS set its `pMethods` to a
    // valid object (the default VFS's are static).
    unsafe { &*(*real(file)).pMethods }
}

/// What a WAL file holds.
///
/// # Safety
///
/// `file` is a WAL file that [`open`] opened and [`wal_close`] has not closed, and no other
/// reference to its `Held` is live while the one returned is.
unsafe fn held<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Held {
    // SAFETY: `open` set `held` to a live box, freed only by `wal_close`; the caller keeps
    // this reference the only one.
    unsafe { &mut *(*file.cast::<WalFile>()).held }
}

/// Writes `len` bytes at `offset` to the real file.
///
/// # Safety
///
/// `file` is an open WAL file (as for [`methods`]) and `data` points to `len` readable bytes.
unsafe fn write_real(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    len: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: the caller's file is open.
    match unsafe { methods(file) }.xWrite {
        // SAFETY: the real file is open and the caller's `data` holds `len` bytes.
        Some(write) => unsafe { write(real(file), data, len, offset) },
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

/// Writes what is held, in as few calls as the real file takes; nothing is held afterwards,
/// whether the writes succeeded or not.
///
/// # Safety
///
/// `file` is an open WAL file (as for [`methods`]) and `held` is its `Held`.
unsafe fn write_held(file: *mut ffi::sqlite3_file, held: &mut Held) -> c_int {
    held.after_header = false;
    let mut rc = ffi::SQLITE_OK;
    let mut at = held.at;
    for piece in held.bytes.chunks(WRITE_AT_MOST) {
        #[cfg(test)]
        if faults::fails(&held.name) {
            rc = ffi::SQLITE_IOERR_WRITE;
            break;
        }
        // At most `WRITE_AT_MOST` bytes: both fit.
        let len = piece.len() as c_int;
        // SAFETY: the caller's file is open; `piece` is `len` bytes.
        rc = unsafe { write_real(file, piece.as_ptr().cast(), len, at) };
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

/// Writes what a WAL file holds (see [`write_held`]).
///
/// # Safety
///
/// As for [`held`].
unsafe fn write_out(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the caller's file is open and holds no other reference to its `Held`.
    unsafe { write_held(file, held(file)) }
}

/// The shim's `xWrite`: frames appended one after another are held, and written with the
/// frame that commits.
///
/// # Safety
///
/// SQLite's contract for `xWrite`: `file` is a WAL file [`open`] opened and not yet closed,
/// `data` points to `amount` readable bytes, and no other method of the file runs meanwhile
/// (one connection uses it, under its mutex).
unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    if data.is_null() {
        return ffi::SQLITE_IOERR_WRITE;
    }
    // SAFETY: SQLite passes `amount` readable bytes at `data` (checked not null above), which
    // it does not change during the call.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    // SAFETY: SQLite calls one method of a file at a time, so this is the only reference.
    let held = unsafe { held(file) };
    let follows = held.bytes.is_empty()
        || offset == held.at + i64::try_from(held.bytes.len()).unwrap_or(i64::MAX);
    let header = len == FRAME_HEADER;
    // Held: a frame's header, and the page right after a header held. Anything else (the WAL's
    // own header, a page or header rewritten in place) is written at once, after what is held.
    let holdable = follows && (header || held.after_header);
    if !holdable {
        // SAFETY: the file is open and `held` is its own.
        let rc = unsafe { write_held(file, held) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        // SAFETY: the file is open; SQLite's `data` holds `amount` bytes.
        return unsafe { write_real(file, data, amount, offset) };
    }
    if held.bytes.is_empty() {
        held.at = offset;
    }
    held.bytes.extend_from_slice(bytes);
    held.after_header = header;
    let commits = header && bytes[4..8] != [0, 0, 0, 0];
    if commits || held.bytes.len() >= HELD_AT_MOST {
        // The frame that commits: it and everything before it are written now, within the
        // call SQLite checks; its page comes next and is written at once (not held).
        // SAFETY: the file is open and `held` is its own.
        return unsafe { write_held(file, held) };
    }
    ffi::SQLITE_OK
}

/// The shim's `xClose`: writes what is held, closes the real file, frees the shim's part.
///
/// # Safety
///
/// SQLite's contract for `xClose`: `file` is a WAL file [`open`] opened, closed once, and no
/// method of it is called afterwards.
unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the file is still open, and no other method of it runs.
    let written = unsafe { write_out(file) };
    // SAFETY: the file is still open.
    let closed = match unsafe { methods(file) }.xClose {
        // SAFETY: the real file is open, and closed here once.
        Some(close) => unsafe { close(real(file)) },
        None => ffi::SQLITE_OK,
    };
    let wal = file.cast::<WalFile>();
    // SAFETY: `held` is the box `open` made, freed here once (SQLite closes a file once and
    // calls nothing on it afterwards); the pointers are cleared so that nothing uses it.
    unsafe {
        drop(Box::from_raw((*wal).held));
        (*wal).held = ptr::null_mut();
        (*wal).base.pMethods = ptr::null();
    }
    if written != ffi::SQLITE_OK {
        written
    } else {
        closed
    }
}

/// Defines a method of wrapped WAL files that writes what is held, then calls the real one.
macro_rules! after_held {
    ($name:ident, $method:ident ( $($arg:ident : $ty:ty),* )) => {
        #[doc = concat!(
            "The shim's `", stringify!($method), "`: writes what is held, then calls the real ",
            "file's."
        )]
        ///
        /// # Safety
        ///
        #[doc = concat!(
            "SQLite's contract for `", stringify!($method), "`: `file` is a WAL file [`open`] ",
            "opened and not yet closed, the other arguments are valid for the real file's ",
            "method, and no other method of the file runs meanwhile."
        )]
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: the file is open, and no other method of it runs.
            let rc = unsafe { write_out(file) };
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            // SAFETY: the file is open.
            match unsafe { methods(file) }.$method {
                // SAFETY: the real file is open; the arguments are SQLite's own, passed on.
                Some(method) => unsafe { method(real(file), $($arg),*) },
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

/// The shim's `xSectorSize`: the real file's.
///
/// # Safety
///
/// SQLite's contract: `file` is a WAL file [`open`] opened and not yet closed.
unsafe extern "C" fn wal_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the file is open.
    match unsafe { methods(file) }.xSectorSize {
        // SAFETY: the real file is open.
        Some(method) => unsafe { method(real(file)) },
        None => 4096,
    }
}

/// The shim's `xDeviceCharacteristics`: the real file's.
///
/// # Safety
///
/// SQLite's contract: `file` is a WAL file [`open`] opened and not yet closed.
unsafe extern "C" fn wal_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the file is open.
    match unsafe { methods(file) }.xDeviceCharacteristics {
        // SAFETY: the real file is open.
        Some(method) => unsafe { method(real(file)) },
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

/// Writes that fail on purpose, for the tests: a WAL file named here fails a write of what it
/// holds, as a full disk would.
#[cfg(test)]
pub(super) mod faults {
    use std::path::Path;
    use std::sync::Mutex;

    /// WAL files by name, each with the writes of held frames still let through before one
    /// fails.
    static FAILING: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());

    /// Makes a write of the frames the WAL of the database at `database` holds fail, after
    /// `after` that succeed; once.
    pub fn fail_write(database: &Path, after: usize) {
        // SQLite names the WAL after the database's full path, links resolved.
        let database = database.canonicalize().expect("the database exists");
        let wal = format!("{}-wal", database.display());
        lock().push((wal, after));
    }

    /// Whether this write to the WAL file `name` fails.
    pub(super) fn fails(name: &str) -> bool {
        let mut failing = lock();
        let Some(at) = failing.iter().position(|(wal, _)| wal == name) else {
            return false;
        };
        match &mut failing[at].1 {
            0 => {
                failing.remove(at);
                true
            }
            after => {
                *after -= 1;
                false
            }
        }
    }

    fn lock() -> std::sync::MutexGuard<'static, Vec<(String, usize)>> {
        FAILING.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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

    /// Rewrites every row of `t` as of `round` in one transaction: 60 pages, about 240 KB of
    /// frames, written in four pieces.
    fn rewrite(conn: &Connection, round: i64) -> rusqlite::Result<()> {
        let tx = conn.unchecked_transaction()?;
        for id in 0..60 {
            tx.execute(
                "INSERT INTO t (id, body) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                params![id, body(id, round)],
            )?;
        }
        tx.commit()
    }

    /// The rows of `t` once `rewrite` committed `round`.
    fn rewritten(round: i64) -> Vec<(i64, Vec<u8>)> {
        (0..60).map(|id| (id, body(id, round))).collect()
    }

    #[test]
    fn a_write_that_fails_in_the_shim_fails_its_commit_and_readers_keep_the_last_good_state() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("faults.db");
        let writer = through_shim(&path);
        writer
            .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            .expect("creates");
        let reader = Connection::open(&path).expect("a reader on SQLite's own VFS");
        rewrite(&writer, 0).expect("the first commit");
        let good = rewritten(0);
        // The first piece of the frames fails; then the third, after two reached the file.
        for (round, after) in [(1, 0), (2, 2)] {
            faults::fail_write(&path, after);
            let failed = rewrite(&writer, round).expect_err("the commit fails");
            assert_eq!(
                failed.sqlite_error_code(),
                Some(rusqlite::ErrorCode::SystemIoFailure),
                "{failed}"
            );
            assert!(writer.is_autocommit(), "the transaction is rolled back");
            assert_eq!(rows(&reader), good, "round {round}, as a reader sees it");
            assert_eq!(rows(&writer), good, "round {round}, as the writer sees it");
        }
        rewrite(&writer, 3).expect("the next commit");
        let good = rewritten(3);
        assert_eq!(rows(&reader), good);
        drop(reader);
        drop(writer);

        reopens_intact(&path, &good);
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

        reopens_intact(&path, &expected);
    }

    /// The database at `path`, opened again on SQLite's own VFS, passes its integrity check
    /// and holds `expected`.
    fn reopens_intact(path: &std::path::Path, expected: &[(i64, Vec<u8>)]) {
        let reopened = Connection::open(path).expect("reopens on SQLite's own VFS");
        let check: String = reopened
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("checks");
        assert_eq!(check, "ok");
        assert_eq!(rows(&reopened), expected);
    }
}

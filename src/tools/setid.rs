//! Clearing the setuid and setgid bits of what a sandboxed command left in the workspace. Inside
//! the sandbox a command may `chmod u+s` a file it made; outside, that file would run with its
//! owner's rights (root's, when the server runs as root) for anyone who can reach it. So after
//! every `shell` call the workspace is walked and those bits are cleared from regular files.
//!
//! The walk goes through directory descriptors, never following a symlink (`O_NOFOLLOW`), and
//! changes a file's mode through a descriptor of that very file, so a name swapped for a
//! symlink meanwhile cannot point it outside. It is bounded ([`MAX_ENTRIES`], [`MAX_DEPTH`]);
//! a walk cut short is logged.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{chmodat, fstat, openat, statat, AtFlags, Dir, FileType, Mode, OFlags, CWD};

/// Directory entries looked at, at most, per walk.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Directory levels descended, at most (each holds two descriptors while it is read).
pub const MAX_DEPTH: usize = 128;
/// The bits cleared.
const SETID: u32 = 0o6000;

/// What a walk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Files whose setuid or setgid bit was cleared.
    pub files: u64,
    /// Entries looked at.
    pub entries: u64,
    /// Whether every entry was looked at (false: a bound was reached or a directory unreadable).
    pub complete: bool,
}

/// Clears the setuid and setgid bits of every regular file under `root`, and logs what it did
/// when it found any or could not look everywhere.
pub fn clear(root: &Path) -> Cleared {
    let cleared = walk(root);
    if cleared.files > 0 {
        tracing::warn!(
            files = cleared.files,
            "cleared the setuid or setgid bit of files a shell command left in its workspace"
        );
    }
    if !cleared.complete {
        tracing::warn!(
            entries = cleared.entries,
            "the workspace was not wholly checked for setuid or setgid files"
        );
    }
    cleared
}

fn walk(root: &Path) -> Cleared {
    let mut walk = Cleared {
        complete: true,
        ..Cleared::default()
    };
    match openat(CWD, root, directory_flags(), Mode::empty()) {
        Ok(dir) => walk.directory(dir, 0),
        Err(_) => walk.complete = false,
    }
    walk
}

fn directory_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl Cleared {
    fn directory(&mut self, dir: OwnedFd, depth: usize) {
        let Ok(entries) = Dir::new(dir) else {
            self.complete = false;
            return;
        };
        let Ok(fd) = entries.fd() else {
            self.complete = false;
            return;
        };
        // A second descriptor of the directory, for opening its entries while it is read.
        let Ok(parent) = fd.try_clone_to_owned() else {
            self.complete = false;
            return;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                self.complete = false;
                return;
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                self.complete = false;
                return;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => match statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(_) => continue,
                },
                kind => kind,
            };
            match kind {
                FileType::Directory if depth + 1 >= MAX_DEPTH => self.complete = false,
                FileType::Directory => {
                    match openat(&parent, name, directory_flags(), Mode::empty()) {
                        Ok(sub) => self.directory(sub, depth + 1),
                        Err(_) => self.complete = false,
                    }
                }
                FileType::RegularFile => self.file(parent.as_fd(), name),
                _ => {}
            }
        }
    }

    /// Clears the bits of the regular file `name` in `dir`, if it has them.
    fn file(&mut self, dir: BorrowedFd<'_>, name: &std::ffi::CStr) {
        let Ok(stat) = statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            return;
        };
        if stat.st_mode & SETID == 0 {
            return;
        }
        // Checked again, and changed, through a descriptor of the file itself: the name may
        // have been swapped for a symlink since.
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(file) = openat(dir, name, flags, Mode::empty()) else {
            return;
        };
        let Ok(stat) = fstat(&file) else {
            return;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || stat.st_mode & SETID == 0
        {
            return;
        }
        let mode = Mode::from_raw_mode(stat.st_mode & 0o7777 & !SETID);
        // An `O_PATH` descriptor cannot be `fchmod`ed; its `/proc` link leads to that inode.
        let link = format!("/proc/self/fd/{}", file.as_raw_fd());
        if chmodat(CWD, link.as_str(), mode, AtFlags::empty()).is_ok() {
            self.files += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    fn set(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn setid_bits_are_cleared_from_files_and_nothing_else_changes() {
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b/c")).expect("mkdir");
        for (name, bits) in [("top", 0o4755), ("a/b/c/deep", 0o6711), ("a/plain", 0o640)] {
            std::fs::write(r.join(name), "x").expect("write");
            set(&r.join(name), bits);
        }
        // A setgid directory keeps its bit; a symlink to a setuid file outside is not followed.
        set(&r.join("a/b"), 0o2755);
        let target = outside.path().join("target");
        std::fs::write(&target, "x").expect("write");
        set(&target, 0o4755);
        std::os::unix::fs::symlink(&target, r.join("link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), r.join("dirlink")).expect("symlink");

        let cleared = clear(r);
        assert_eq!(
            cleared,
            Cleared {
                files: 2,
                entries: 8,
                complete: true
            }
        );
        assert_eq!(mode(&r.join("top")), 0o755);
        assert_eq!(mode(&r.join("a/b/c/deep")), 0o711);
        assert_eq!(mode(&r.join("a/plain")), 0o640);
        assert_eq!(mode(&r.join("a/b")), 0o2755);
        assert_eq!(mode(&target), 0o4755, "the symlink's target is untouched");
        assert_eq!(clear(r).files, 0, "nothing left to clear");
    }

    #[test]
    fn a_tree_deeper_than_the_bound_is_reported_incomplete() {
        let root = tempfile::tempdir().expect("tempdir");
        let deep: std::path::PathBuf = std::iter::repeat_n("d", MAX_DEPTH + 2).collect();
        std::fs::create_dir_all(root.path().join(&deep)).expect("mkdir");
        let cleared = walk(root.path());
        assert!(!cleared.complete);
        assert_eq!(cleared.entries, MAX_DEPTH as u64);
    }
}

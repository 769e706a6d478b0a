//! The [`Workspace`] a tool call is confined to, and the only way the file tools touch it. This
//! is the security boundary between the model and the host filesystem: every path the model
//! sends is checked here (relative only, no NUL, bounded length, no `..` or symlink that leads
//! outside the canonical root), only regular files and directories are opened, and error
//! messages never reveal where the workspace lives.
//!
//! Checking a path and then using it races with anything that changes the tree in between (a
//! `shell` call running beside a file tool can swap a directory for a symlink). So a path is
//! first resolved to its canonical form inside the root, and then opened one component at a
//! time from the root's descriptor with `O_NOFOLLOW` (`openat`), so a symlink swapped in since
//! the check is refused instead of followed. Writes go to a fresh temporary file in the target's
//! directory (opened the same way) that is renamed over the target: a write never follows a
//! symlink at the final name, never writes through a hard link, and readers never see half a
//! file.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{openat, renameat, statat, unlinkat, AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::ToolError;

/// Longest path argument accepted (bytes), like Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest echo of the model's path in an error message (characters).
const MAX_ECHO_CHARS: usize = 200;

/// The directory a session's tools are confined to, canonicalized once at open.
#[derive(Clone, Debug)]
pub struct Workspace {
    root: Arc<PathBuf>,
}

/// The identity of a file that was read, to tell whether it was replaced since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
    pub mode: u32,
    pub size: u64,
}

impl FileId {
    pub fn of(file: &File) -> io::Result<FileId> {
        let m = file.metadata()?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            size: m.size(),
        })
    }
}

/// Where a write went.
#[derive(Debug)]
pub(crate) struct Written {
    /// Canonical, relative to the root.
    pub path: PathBuf,
    pub created: bool,
}

impl Workspace {
    /// Opens `root` as a workspace; it must exist and be a directory.
    pub fn open(root: &Path) -> io::Result<Workspace> {
        let root = root.canonicalize()?;
        if !fs::metadata(&root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the workspace root is not a directory",
            ));
        }
        Ok(Workspace {
            root: Arc::new(root),
        })
    }

    /// The canonical root. Never put it in a message for the model.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The workspace of the directory `rel` under this one, created if missing; anything that
    /// leaves this workspace is refused. Blocking (it may create directories).
    pub fn subdir(&self, rel: &str) -> Result<Workspace, ToolError> {
        check_path_syntax(rel)?;
        let components: Vec<Component> = Path::new(rel).components().collect();
        let (_, dir) = self.walk_dirs(&components, rel, /*create*/ true)?;
        Ok(Workspace {
            root: Arc::new(self.root.join(dir)),
        })
    }

    /// Where this workspace lies under `outer`, as a canonical `/`-separated relative path
    /// (`.` for `outer` itself); `None` when it is not inside `outer`.
    pub fn relative_to(&self, outer: &Workspace) -> Option<String> {
        self.root
            .strip_prefix(outer.root.as_path())
            .ok()
            .map(display)
    }

    /// Runs blocking filesystem work on the blocking pool.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, ToolError>
    where
        F: FnOnce(&Workspace) -> Result<T, ToolError> + Send + 'static,
        T: Send + 'static,
    {
        let workspace = self.clone();
        tokio::task::spawn_blocking(move || work(&workspace))
            .await
            .map_err(|_| ToolError("internal error while accessing the workspace".into()))?
    }

    /// `rel` resolved to its canonical path relative to the root; it must exist.
    pub(crate) fn locate(&self, rel: &str) -> Result<PathBuf, ToolError> {
        check_path_syntax(rel)?;
        let canonical = fs::canonicalize(self.root.join(rel)).map_err(|e| io_error(rel, &e))?;
        canonical
            .strip_prefix(self.root.as_path())
            .map(Path::to_path_buf)
            .map_err(|_| outside_error(rel))
    }

    /// The directory `rel`, opened without following any symlink after the check.
    pub(crate) fn open_dir(&self, rel: &str) -> Result<(PathBuf, OwnedFd), ToolError> {
        let canon = self.locate(rel)?;
        if let (Some(parent), Some(name)) = (canon.parent(), canon.file_name()) {
            let parent_fd = self.dir_at(parent).map_err(|e| walk_error(rel, &e))?;
            let stat = statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| io_error(rel, &e.into()))?;
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                return Err(ToolError(format!("not a directory: {}", echo(rel))));
            }
        }
        let fd = self.dir_at(&canon).map_err(|e| walk_error(rel, &e))?;
        Ok((canon, fd))
    }

    /// The regular file `rel`, opened for reading without following any symlink after the check
    /// and without ever opening anything but a regular file (a FIFO cannot make it hang).
    pub(crate) fn open_file(&self, rel: &str) -> Result<(PathBuf, File), ToolError> {
        let canon = self.locate(rel)?;
        let (Some(parent), Some(name)) = (canon.parent(), canon.file_name()) else {
            return Err(ToolError(format!(
                "is a directory: {} (use list_files)",
                echo(rel)
            )));
        };
        let parent_fd = self.dir_at(parent).map_err(|e| walk_error(rel, &e))?;
        let stat = statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_error(rel, &e.into()))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => {
                return Err(ToolError(format!(
                    "is a directory: {} (use list_files)",
                    echo(rel)
                )))
            }
            FileType::Symlink => return Err(changed_error(rel)),
            _ => return Err(ToolError(format!("not a regular file: {}", echo(rel)))),
        }
        let file = open_regular(&parent_fd, name).map_err(|e| walk_error(rel, &e))?;
        let opened = file.metadata().map_err(|e| io_error(rel, &e))?;
        if !opened.is_file() || opened.dev() != stat.st_dev || opened.ino() != stat.st_ino {
            return Err(changed_error(rel));
        }
        Ok((canon, file))
    }

    /// The regular file at the canonical relative path `canon` (as a walker found it).
    pub(crate) fn open_file_at(&self, canon: &Path) -> io::Result<File> {
        let (Some(parent), Some(name)) = (canon.parent(), canon.file_name()) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        let file = open_regular(&self.dir_at(parent)?, name)?;
        if !file.metadata()?.is_file() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        Ok(file)
    }

    /// The directory at the canonical relative path `canon`, one `O_NOFOLLOW` step at a time.
    pub(crate) fn dir_at(&self, canon: &Path) -> io::Result<OwnedFd> {
        let mut fd = openat(
            CWD,
            self.root.as_path(),
            dir_flags() & !OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        for component in canon.components() {
            match component {
                Component::Normal(name) => fd = openat(&fd, name, dir_flags(), Mode::empty())?,
                Component::CurDir => {}
                _ => return Err(io::ErrorKind::InvalidInput.into()),
            }
        }
        Ok(fd)
    }

    /// Creates or replaces the file `rel` with `content`, creating missing parents.
    pub(crate) fn write(&self, rel: &str, content: &[u8]) -> Result<Written, ToolError> {
        check_path_syntax(rel)?;
        let components: Vec<Component> = Path::new(rel).components().collect();
        let Some((Component::Normal(name), parents)) = components.split_last() else {
            return Err(ToolError(format!("not a file path: {}", echo(rel))));
        };
        let (dir, dir_rel) = self.walk_dirs(parents, rel, /*create*/ true)?;
        let io_err = |e: Errno| io_error(rel, &e.into());
        match statat(&dir, *name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => {
                replace_in(&dir, name, content, None).map_err(|e| io_error(rel, &e))?;
                Ok(Written {
                    path: dir_rel.join(name),
                    created: true,
                })
            }
            Err(e) => Err(io_err(e)),
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => {
                    replace_in(&dir, name, content, Some(stat.st_mode))
                        .map_err(|e| io_error(rel, &e))?;
                    Ok(Written {
                        path: dir_rel.join(name),
                        created: false,
                    })
                }
                FileType::Symlink => {
                    let target = self.link_target(&dir_rel.join(name), rel)?;
                    self.replace_at(&target, None, content, rel)?;
                    Ok(Written {
                        path: target,
                        created: false,
                    })
                }
                FileType::Directory => Err(ToolError(format!("is a directory: {}", echo(rel)))),
                _ => Err(ToolError(format!("not a regular file: {}", echo(rel)))),
            },
        }
    }

    /// Replaces the regular file at the canonical relative path `canon`; with `expect`, only if
    /// it is still the file that was read.
    pub(crate) fn replace_at(
        &self,
        canon: &Path,
        expect: Option<FileId>,
        content: &[u8],
        rel: &str,
    ) -> Result<(), ToolError> {
        let (Some(parent), Some(name)) = (canon.parent(), canon.file_name()) else {
            return Err(ToolError(format!("is a directory: {}", echo(rel))));
        };
        let dir = self.dir_at(parent).map_err(|e| walk_error(rel, &e))?;
        let stat =
            statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| io_error(rel, &e.into()))?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(ToolError(format!("is a directory: {}", echo(rel)))),
            FileType::Symlink => return Err(changed_error(rel)),
            _ => return Err(ToolError(format!("not a regular file: {}", echo(rel)))),
        }
        if expect.is_some_and(|id| id.dev != stat.st_dev || id.ino != stat.st_ino) {
            return Err(changed_error(rel));
        }
        replace_in(&dir, name, content, Some(stat.st_mode)).map_err(|e| io_error(rel, &e))
    }

    /// Where the symlink at the canonical relative path `link` leads, relative to the root; it
    /// must lead inside and to something that exists.
    fn link_target(&self, link: &Path, rel: &str) -> Result<PathBuf, ToolError> {
        let target = fs::canonicalize(self.root.join(link)).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ToolError(format!(
                "is a symlink to something that does not exist: {}",
                echo(rel)
            )),
            _ => io_error(rel, &e),
        })?;
        target
            .strip_prefix(self.root.as_path())
            .map(Path::to_path_buf)
            .map_err(|_| outside_error(rel))
    }

    /// Walks `components` (of the model's path `rel`) from the root as directories, following
    /// symlinks only where they resolve inside, creating missing ones when `create`. Answers the
    /// last directory and its canonical path relative to the root.
    fn walk_dirs(
        &self,
        components: &[Component],
        rel: &str,
        create: bool,
    ) -> Result<(OwnedFd, PathBuf), ToolError> {
        let mut dir_rel = PathBuf::new();
        let mut fd = self.dir_at(&dir_rel).map_err(|e| io_error(rel, &e))?;
        for (i, component) in components.iter().enumerate() {
            let name = match component {
                Component::Normal(name) => *name,
                Component::CurDir => continue,
                Component::ParentDir => {
                    if !dir_rel.pop() {
                        return Err(outside_error(rel));
                    }
                    fd = self.dir_at(&dir_rel).map_err(|e| walk_error(rel, &e))?;
                    continue;
                }
                Component::RootDir | Component::Prefix(_) => return Err(absolute_error()),
            };
            // A directory that is only passed through (`a/..`) is never created.
            let leaves_it = components.get(i + 1) == Some(&Component::ParentDir);
            match statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                    FileType::Directory => {
                        fd = openat(&fd, name, dir_flags(), Mode::empty())
                            .map_err(|e| walk_error(rel, &e.into()))?;
                        dir_rel.push(name);
                    }
                    FileType::Symlink => {
                        let inside = self.link_target(&dir_rel.join(name), rel)?;
                        fd = self.dir_at(&inside).map_err(|e| match e.raw_os_error() {
                            Some(code) if code == Errno::NOTDIR.raw_os_error() => {
                                ToolError(format!("not a directory: {}", echo(rel)))
                            }
                            _ => walk_error(rel, &e),
                        })?;
                        dir_rel = inside;
                    }
                    _ => return Err(ToolError(format!("not a directory: {}", echo(rel)))),
                },
                Err(Errno::NOENT) if create && !leaves_it => {
                    match rustix::fs::mkdirat(&fd, name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_error(rel, &e.into())),
                    }
                    fd = openat(&fd, name, dir_flags(), Mode::empty())
                        .map_err(|e| walk_error(rel, &e.into()))?;
                    dir_rel.push(name);
                }
                Err(e) => return Err(io_error(rel, &e.into())),
            }
        }
        Ok((fd, dir_rel))
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// `O_NONBLOCK` so that a FIFO swapped in after the type check cannot hang the open; regular
/// file reads ignore it.
fn open_regular(dir: &OwnedFd, name: &OsStr) -> io::Result<File> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    Ok(File::from(openat(dir, name, flags, Mode::empty())?))
}

/// Writes `content` to a fresh file beside `name` in `dir` and renames it over `name`, keeping
/// the permission bits of the file it replaces.
fn replace_in(dir: &OwnedFd, name: &OsStr, content: &[u8], mode: Option<u32>) -> io::Result<()> {
    let temp = format!(".tah-write-{:016x}", rand::random::<u64>());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut file = File::from(openat(dir, &temp, flags, Mode::from_bits_truncate(0o644))?);
    let written = (|| {
        file.write_all(content)?;
        if let Some(mode) = mode {
            rustix::fs::fchmod(&file, Mode::from_bits_truncate(mode & 0o777))?;
        }
        renameat(dir, &temp, dir, name)?;
        Ok(())
    })();
    if written.is_err() {
        // Best effort: a leftover temporary file is harmless.
        let _ = unlinkat(dir, &temp, AtFlags::empty());
    }
    written
}

/// A canonical relative path as the model sees it: `/`-separated, `.` for the root.
pub(crate) fn display(canon: &Path) -> String {
    if canon.as_os_str().is_empty() {
        return ".".into();
    }
    printable(&String::from_utf8_lossy(canon.as_os_str().as_bytes()))
}

/// The model's path as it may appear in a message: bounded, control characters escaped.
pub(crate) fn echo(rel: &str) -> String {
    let mut out = printable(&rel.chars().take(MAX_ECHO_CHARS).collect::<String>());
    if rel.chars().nth(MAX_ECHO_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// `s` with control characters (newlines included) escaped, so one name stays one line.
pub(crate) fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An I/O failure on `rel` as a tool error; the OS message is not used since it may carry paths.
pub(crate) fn io_error(rel: &str, error: &io::Error) -> ToolError {
    match error.kind() {
        io::ErrorKind::NotFound => ToolError(format!("not found: {}", echo(rel))),
        io::ErrorKind::PermissionDenied => ToolError(format!("permission denied: {}", echo(rel))),
        kind => ToolError(format!("cannot access {}: {kind}", echo(rel))),
    }
}

/// A failure while opening a path that was just checked: a symlink in the way means the tree
/// changed under us.
fn walk_error(rel: &str, error: &io::Error) -> ToolError {
    match error.raw_os_error() {
        Some(code)
            if code == Errno::LOOP.raw_os_error() || code == Errno::NOTDIR.raw_os_error() =>
        {
            changed_error(rel)
        }
        _ => io_error(rel, error),
    }
}

fn changed_error(rel: &str) -> ToolError {
    ToolError(format!("changed while being opened: {}", echo(rel)))
}

pub(crate) fn outside_error(rel: &str) -> ToolError {
    ToolError(format!("path leads outside the workspace: {}", echo(rel)))
}

fn absolute_error() -> ToolError {
    // The path itself is not echoed: it may name the workspace's own location.
    ToolError("absolute paths are not allowed; use a path relative to the workspace root".into())
}

/// Syntactic checks before touching the filesystem.
pub(crate) fn check_path_syntax(rel: &str) -> Result<(), ToolError> {
    if rel.len() > MAX_PATH_BYTES {
        return Err(ToolError(format!(
            "path too long ({} bytes, limit {MAX_PATH_BYTES})",
            rel.len()
        )));
    }
    if rel.contains('\0') {
        return Err(ToolError("path contains a NUL byte".into()));
    }
    let path = Path::new(rel);
    if rel.starts_with('/') || path.is_absolute() {
        return Err(absolute_error());
    }
    let mut depth: usize = 0;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or_else(|| outside_error(rel))?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(absolute_error()),
        }
    }
    Ok(())
}

/// `rel` with `.` and `..` removed lexically (`None` if it climbs above the root): the subject
/// of a path that does not exist yet.
pub(crate) fn normalize(rel: &str) -> Option<String> {
    let mut parts: Vec<&OsStr> = Vec::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(name) => parts.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    let joined: PathBuf = parts.iter().collect();
    Some(display(&joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_workspace_is_a_directory_under_the_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = Workspace::open(tmp.path()).expect("root");
        let sub = root.subdir("teams/a/./b").expect("created");
        assert_eq!(sub.root(), root.root().join("teams/a/b"));
        assert!(sub.root().is_dir());
        // Opening it again finds the same directory; "" and "." are the root itself.
        assert_eq!(
            root.subdir("teams/a/b/").expect("exists").root(),
            sub.root()
        );
        assert_eq!(root.subdir("").expect("root").root(), root.root());
        assert_eq!(root.subdir(".").expect("root").root(), root.root());
        assert_eq!(sub.relative_to(&root).as_deref(), Some("teams/a/b"));
        assert_eq!(root.relative_to(&root).as_deref(), Some("."));
        assert_eq!(root.relative_to(&sub), None);
        // A session workspace confines like any other.
        assert!(sub.locate("../x").is_err());
    }

    #[test]
    fn a_session_workspace_never_leaves_the_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root_dir = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&root_dir).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        std::os::unix::fs::symlink(&outside, root_dir.join("away")).expect("symlink");
        std::os::unix::fs::symlink("teams", root_dir.join("alias")).expect("symlink");
        fs::write(root_dir.join("file"), "x").expect("write");
        let root = Workspace::open(&root_dir).expect("root");
        for (rel, expect) in [
            ("..", "outside the workspace"),
            ("a/../../b", "outside the workspace"),
            ("/etc", "absolute paths"),
            ("away", "outside the workspace"),
            ("away/new", "outside the workspace"),
            ("file", "not a directory: file"),
            ("file/x", "not a directory: file/x"),
            ("a\0b", "NUL"),
        ] {
            let err = root.subdir(rel).expect_err(rel);
            assert!(err.0.contains(expect), "{rel}: {err}");
            assert!(!err.0.contains(&*tmp.path().to_string_lossy()), "{err}");
        }
        assert_eq!(fs::read_dir(&outside).expect("ls").count(), 0);
        // A link that stays inside is followed to where it leads.
        fs::create_dir(root_dir.join("teams")).expect("mkdir");
        let via = root.subdir("alias/x").expect("inside");
        assert_eq!(via.root(), root.root().join("teams/x"));
    }

    #[test]
    fn paths_normalise_lexically_for_subjects() {
        assert_eq!(normalize("./a/b/../c/").as_deref(), Some("a/c"));
        assert_eq!(normalize(".").as_deref(), Some("."));
        assert_eq!(normalize("a/../..").as_deref(), None);
        assert_eq!(normalize("/etc").as_deref(), None);
    }

    #[test]
    fn opening_refuses_a_symlink_anywhere_on_a_checked_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(tmp.path()).expect("root");
        fs::create_dir(tmp.path().join("real")).expect("mkdir");
        fs::write(tmp.path().join("real/f"), "x").expect("write");
        std::os::unix::fs::symlink("real", tmp.path().join("link")).expect("symlink");
        // Walkers hand over paths they saw as real directories; one that became a link is
        // refused rather than followed, even when it leads inside.
        assert!(ws.open_file_at(Path::new("real/f")).is_ok());
        assert!(ws.open_file_at(Path::new("link/f")).is_err());
        assert!(ws.dir_at(Path::new("link")).is_err());
        assert!(ws.open_file_at(Path::new("real")).is_err());
    }
}

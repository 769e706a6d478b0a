//! The [`Workspace`] a tool call is confined to, and the only way the file tools touch it. This
//! is the security boundary between the model and the host filesystem: every path the model
//! sends is checked here (relative only, no NUL, bounded length, no `..` or symlink that leads
//! outside the root), only regular files and directories are opened, and error messages never
//! reveal where the workspace lives.
//!
//! A workspace is a directory descriptor, opened once; its path is never resolved again. Every
//! file operation walks from that descriptor one component at a time with `O_NOFOLLOW`
//! (`openat`), reading a symlink it meets and following it only while it leads inside: nothing
//! swapped in meanwhile (a `shell` call beside a file tool can replace a directory with a
//! symlink, even the workspace's own) is ever followed out. The walk yields the canonical path
//! of what it opened, which is what the policy decided on: when a call's path now leads
//! elsewhere than when it was decided, the call is refused. Writes go to a fresh temporary file
//! in the target's directory (opened the same way) that is renamed over the target: a write
//! never follows a symlink at the final name, never writes through a hard link, and readers
//! never see half a file.
//!
//! Names are shown to the model escaped when they hold control or bidirectional-control
//! characters or bytes that are not UTF-8 (see [`escape_name`]); the model may address such a
//! name by the escaped form it was shown.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{
    mkdirat, openat, readlinkat, renameat, statat, unlinkat, AtFlags, FileType, Mode, OFlags, Stat,
    CWD,
};
use rustix::io::Errno;

use super::ToolError;

/// Longest path argument accepted (bytes), like Linux's `PATH_MAX`.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest echo of the model's path in an error message (characters).
const MAX_ECHO_CHARS: usize = 200;
/// Most symlinks one path may pass through, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;

/// The directory a session's tools are confined to: a descriptor opened once, and the path it
/// had then (where the sandbox mounts it).
#[derive(Clone, Debug)]
pub struct Workspace {
    dir: Arc<OwnedFd>,
    /// Canonical when opened; never resolved again. Never put it in a message for the model.
    path: Arc<PathBuf>,
    /// The path the policy decided on for the call this workspace serves: a path of the call
    /// that now leads elsewhere is refused.
    decided: Option<Arc<str>>,
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

/// What a path of the model names, opened.
pub(crate) enum Entry {
    /// A directory, with its canonical path.
    Dir(PathBuf, OwnedFd),
    /// A regular file, with its canonical path.
    File(PathBuf, File),
}

/// What a walk does with a missing component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Stops there: only the last component may be missing.
    Stop,
    /// Creates the model's directories on the way (never the last component).
    Create,
}

/// One step of a walk: a name (with whether the model wrote it, so that its escaped form may
/// be tried) or `..`.
#[derive(Debug, Clone)]
enum Step {
    Name { name: OsString, from_model: bool },
    Parent,
}

/// Where a walk ended.
struct Walked {
    /// The last directory reached: the path's own when it names a directory, else its parent.
    dir: OwnedFd,
    /// Its canonical path, relative to the root.
    dir_rel: PathBuf,
    /// The last component when it is not a directory, with its status (`None`: missing).
    leaf: Option<(OsString, Option<Stat>)>,
    /// Steps left after a missing component (only with [`Workspace::walk_planned`]).
    rest: VecDeque<Step>,
}

impl Workspace {
    /// Opens `root` as a workspace; it must exist and be a directory.
    pub fn open(root: &Path) -> io::Result<Workspace> {
        let root = root.canonicalize()?;
        let dir = openat(CWD, &root, dir_flags() & !OFlags::NOFOLLOW, Mode::empty())?;
        Ok(Workspace {
            dir: Arc::new(dir),
            path: Arc::new(root),
            decided: None,
        })
    }

    /// Where the root was when it was opened. Never put it in a message for the model, and
    /// never open it again: use the descriptor.
    pub fn root(&self) -> &Path {
        &self.path
    }

    /// The root's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// The workspace of the directory `rel` under this one, created if missing; anything that
    /// leaves this workspace is refused. Blocking (it may create directories).
    pub fn subdir(&self, rel: &str) -> Result<Workspace, ToolError> {
        let walked = self.walk_model(rel, Missing::Create)?;
        let (dir, canon) = match walked.leaf {
            None => (walked.dir, walked.dir_rel),
            Some((name, None)) => {
                match mkdirat(&walked.dir, &name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(rel, &e.into())),
                }
                let dir = openat(&walked.dir, &name, dir_flags(), Mode::empty())
                    .map_err(|e| walk_error(rel, &e.into()))?;
                (dir, walked.dir_rel.join(name))
            }
            Some(_) => return Err(ToolError(format!("not a directory: {}", echo(rel)))),
        };
        Ok(Workspace {
            dir: Arc::new(dir),
            path: Arc::new(self.path.join(canon)),
            decided: None,
        })
    }

    /// Where this workspace lies under `outer`, as a canonical `/`-separated relative path
    /// (`.` for `outer` itself); `None` when it is not inside `outer`.
    pub fn relative_to(&self, outer: &Workspace) -> Option<String> {
        self.path
            .strip_prefix(outer.path.as_path())
            .ok()
            .map(display)
    }

    /// This workspace for a call whose path the policy decided on as `decided` (a path
    /// subject): every path of the call must still lead there.
    pub fn deciding(&self, decided: Option<&str>) -> Workspace {
        Workspace {
            decided: decided.map(Arc::from),
            ..self.clone()
        }
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

    /// The canonical path, relative to the root, that `rel` leads to as things are: where it
    /// exists, what it resolves to; past a missing component, the rest lexically. `None` when
    /// it leads nowhere valid.
    pub(crate) fn planned(&self, rel: &str) -> Option<PathBuf> {
        let walked = self.walk_planned(rel).ok()?;
        let mut canon = walked.dir_rel;
        if let Some((name, _)) = walked.leaf {
            canon.push(name);
        }
        for step in walked.rest {
            match step {
                Step::Name { name, .. } => canon.push(name),
                Step::Parent => {
                    if !canon.pop() {
                        return None;
                    }
                }
            }
        }
        Some(canon)
    }

    /// The directory or regular file `rel`, opened.
    pub(crate) fn open_entry(&self, rel: &str) -> Result<Entry, ToolError> {
        let walked = self.walk_model(rel, Missing::Stop)?;
        match walked.leaf {
            None => {
                self.check_decided(rel, &walked.dir_rel)?;
                Ok(Entry::Dir(walked.dir_rel, walked.dir))
            }
            Some((name, stat)) => {
                let (canon, file) =
                    self.open_leaf(rel, &walked.dir, &walked.dir_rel, name, stat)?;
                Ok(Entry::File(canon, file))
            }
        }
    }

    /// The directory `rel`, opened.
    pub(crate) fn open_dir(&self, rel: &str) -> Result<(PathBuf, OwnedFd), ToolError> {
        let walked = self.walk_model(rel, Missing::Stop)?;
        match walked.leaf {
            None => {
                self.check_decided(rel, &walked.dir_rel)?;
                Ok((walked.dir_rel, walked.dir))
            }
            Some((_, None)) => Err(io_error(rel, &io::ErrorKind::NotFound.into())),
            Some(_) => Err(ToolError(format!("not a directory: {}", echo(rel)))),
        }
    }

    /// The regular file `rel`, opened for reading, never anything but a regular file (a FIFO
    /// cannot make it hang).
    pub(crate) fn open_file(&self, rel: &str) -> Result<(PathBuf, File), ToolError> {
        match self.open_entry(rel)? {
            Entry::File(canon, file) => Ok((canon, file)),
            Entry::Dir(..) => Err(ToolError(format!(
                "is a directory: {} (use list_files)",
                echo(rel)
            ))),
        }
    }

    /// The regular file `name` (with status `stat`, `None` if missing) of the directory `dir`
    /// at `dir_rel`, where the model's path `rel` led.
    fn open_leaf(
        &self,
        rel: &str,
        dir: &OwnedFd,
        dir_rel: &Path,
        name: OsString,
        stat: Option<Stat>,
    ) -> Result<(PathBuf, File), ToolError> {
        let Some(stat) = stat else {
            return Err(io_error(rel, &io::ErrorKind::NotFound.into()));
        };
        let canon = dir_rel.join(&name);
        self.check_decided(rel, &canon)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => return Err(changed_error(rel)),
            _ => return Err(ToolError(format!("not a regular file: {}", echo(rel)))),
        }
        let file = open_regular(dir, &name).map_err(|e| walk_error(rel, &e))?;
        let opened = file.metadata().map_err(|e| io_error(rel, &e))?;
        if !opened.is_file() || opened.dev() != stat.st_dev || opened.ino() != stat.st_ino {
            return Err(changed_error(rel));
        }
        Ok((canon, file))
    }

    /// Whether the entry `name` of the directory `dir` (at `canon` under the root) is a
    /// symlink that leads to a directory inside the workspace.
    pub(crate) fn link_leads_to_dir(&self, dir: &OwnedFd, canon: &Path, name: &OsStr) -> bool {
        let Ok(start) = rustix::io::fcntl_dupfd_cloexec(dir, 0) else {
            return false;
        };
        let steps = VecDeque::from([Step::Name {
            name: name.to_owned(),
            from_model: false,
        }]);
        let walked = self.walk(start, canon.to_path_buf(), steps, "", Missing::Stop, false);
        walked.is_ok_and(|w| w.leaf.is_none())
    }

    /// The directory at the canonical relative path `canon`, one `O_NOFOLLOW` step at a time
    /// from the root's descriptor.
    pub(crate) fn dir_at(&self, canon: &Path) -> io::Result<OwnedFd> {
        let mut fd = rustix::io::fcntl_dupfd_cloexec(&*self.dir, 0)?;
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
        if !matches!(
            Path::new(rel).components().next_back(),
            Some(Component::Normal(_))
        ) {
            return Err(ToolError(format!("not a file path: {}", echo(rel))));
        }
        let walked = self.walk_model(rel, Missing::Create)?;
        let Some((name, stat)) = walked.leaf else {
            return Err(ToolError(format!("is a directory: {}", echo(rel))));
        };
        let path = walked.dir_rel.join(&name);
        self.check_decided(rel, &path)?;
        let mode = match stat.map(|s| (FileType::from_raw_mode(s.st_mode), s.st_mode)) {
            None => None,
            Some((FileType::RegularFile, mode)) => Some(mode),
            Some((FileType::Symlink, _)) => return Err(changed_error(rel)),
            Some(_) => return Err(ToolError(format!("not a regular file: {}", echo(rel)))),
        };
        replace_in(&walked.dir, &name, content, mode).map_err(|e| io_error(rel, &e))?;
        Ok(Written {
            path,
            created: mode.is_none(),
        })
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

    /// Refuses `canon` (where the call's path `rel` leads now) when the policy decided on
    /// another path.
    fn check_decided(&self, rel: &str, canon: &Path) -> Result<(), ToolError> {
        let Some(decided) = self.decided.as_deref() else {
            return Ok(());
        };
        let now = display(canon);
        if now == decided {
            return Ok(());
        }
        Err(ToolError(format!(
            "{} now leads to {}, not to {} as when the call was allowed; nothing was done (call \
             again to have the new path decided on)",
            echo(rel),
            printable(&now),
            printable(decided)
        )))
    }

    /// Walks the model's path `rel` from the root.
    fn walk_model(&self, rel: &str, missing: Missing) -> Result<Walked, ToolError> {
        check_path_syntax(rel)?;
        let start = self.dir_at(Path::new("")).map_err(|e| io_error(rel, &e))?;
        self.walk(start, PathBuf::new(), model_steps(rel), rel, missing, false)
    }

    /// Walks the model's path `rel` from the root, stopping at the first missing component
    /// and answering the steps left.
    fn walk_planned(&self, rel: &str) -> Result<Walked, ToolError> {
        check_path_syntax(rel)?;
        let start = self.dir_at(Path::new("")).map_err(|e| io_error(rel, &e))?;
        self.walk(
            start,
            PathBuf::new(),
            model_steps(rel),
            rel,
            Missing::Stop,
            true,
        )
    }

    /// Walks `steps` (of the model's path `rel`) from the directory `fd` at `dir_rel`, one
    /// `O_NOFOLLOW` open at a time, reading each symlink met and going on where it leads while
    /// that stays inside. With `plan`, a missing component ends the walk with the steps left.
    fn walk(
        &self,
        mut fd: OwnedFd,
        mut dir_rel: PathBuf,
        mut steps: VecDeque<Step>,
        rel: &str,
        missing: Missing,
        plan: bool,
    ) -> Result<Walked, ToolError> {
        let mut links = 0;
        while let Some(step) = steps.pop_front() {
            let (name, from_model) = match step {
                Step::Parent => {
                    if !dir_rel.pop() {
                        return Err(outside_error(rel));
                    }
                    fd = self.dir_at(&dir_rel).map_err(|e| walk_error(rel, &e))?;
                    continue;
                }
                Step::Name { name, from_model } => (name, from_model),
            };
            let (name, stat) = find(&fd, name, from_model).map_err(|e| io_error(rel, &e.into()))?;
            let Some(stat) = stat else {
                let passed_through = matches!(steps.front(), Some(Step::Parent));
                if plan || (steps.is_empty() && from_model) {
                    return Ok(Walked {
                        dir: fd,
                        dir_rel,
                        leaf: Some((name, None)),
                        rest: steps,
                    });
                }
                if !from_model {
                    return Err(ToolError(format!(
                        "is a symlink to something that does not exist: {}",
                        echo(rel)
                    )));
                }
                if missing != Missing::Create || passed_through {
                    return Err(io_error(rel, &io::ErrorKind::NotFound.into()));
                }
                match mkdirat(&fd, &name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(io_error(rel, &e.into())),
                }
                fd = openat(&fd, &name, dir_flags(), Mode::empty())
                    .map_err(|e| walk_error(rel, &e.into()))?;
                dir_rel.push(name);
                continue;
            };
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => {
                    fd = openat(&fd, &name, dir_flags(), Mode::empty())
                        .map_err(|e| walk_error(rel, &e.into()))?;
                    dir_rel.push(name);
                }
                FileType::Symlink => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(ToolError(format!(
                            "too many levels of symlinks: {}",
                            echo(rel)
                        )));
                    }
                    let target = readlinkat(&fd, &name, Vec::new())
                        .map_err(|e| walk_error(rel, &e.into()))?;
                    let target = target.as_bytes();
                    let target = match target.strip_prefix(b"/") {
                        None => target,
                        Some(_) => {
                            let inside = Path::new(OsStr::from_bytes(target))
                                .strip_prefix(self.path.as_path())
                                .map_err(|_| outside_error(rel))?;
                            fd = self.dir_at(Path::new("")).map_err(|e| io_error(rel, &e))?;
                            dir_rel = PathBuf::new();
                            inside.as_os_str().as_bytes()
                        }
                    };
                    for step in link_steps(target).into_iter().rev() {
                        steps.push_front(step);
                    }
                }
                _ if steps.is_empty() => {
                    return Ok(Walked {
                        dir: fd,
                        dir_rel,
                        leaf: Some((name, Some(stat))),
                        rest: VecDeque::new(),
                    })
                }
                _ => return Err(ToolError(format!("not a directory: {}", echo(rel)))),
            }
        }
        Ok(Walked {
            dir: fd,
            dir_rel,
            leaf: None,
            rest: VecDeque::new(),
        })
    }
}

/// The steps of the model's path (checked).
fn model_steps(rel: &str) -> VecDeque<Step> {
    Path::new(rel)
        .components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(Step::Name {
                name: name.to_owned(),
                from_model: true,
            }),
            Component::ParentDir => Some(Step::Parent),
            _ => None,
        })
        .collect()
}

/// The steps of a relative symlink target.
fn link_steps(target: &[u8]) -> Vec<Step> {
    target
        .split(|&b| b == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .map(|part| match part {
            b".." => Step::Parent,
            name => Step::Name {
                name: OsStr::from_bytes(name).to_owned(),
                from_model: false,
            },
        })
        .collect()
}

/// The entry `name` of `dir` and its status (`None`: missing). A name the model wrote that does
/// not exist as written is looked up by what it escapes, when that exists.
fn find(
    dir: &OwnedFd,
    name: OsString,
    from_model: bool,
) -> Result<(OsString, Option<Stat>), Errno> {
    match statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => return Ok((name, Some(stat))),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    if from_model && name.as_bytes().contains(&b'\\') {
        if let Some(raw) = unescape_name(name.as_bytes()) {
            let raw = OsString::from_vec(raw);
            if let Ok(stat) = statat(dir, &raw, AtFlags::SYMLINK_NOFOLLOW) {
                return Ok((raw, Some(stat)));
            }
        }
    }
    Ok((name, None))
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

/// The regular file `name` of the directory `dir`, opened for reading without following a
/// symlink; anything but a regular file is refused.
pub(crate) fn open_regular_in(dir: &OwnedFd, name: &OsStr) -> io::Result<File> {
    let file = open_regular(dir, name)?;
    if !file.metadata()?.is_file() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    Ok(file)
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

/// A canonical relative path as the model sees it: `/`-separated, `.` for the root, each name
/// escaped as [`escape_name`] says.
pub(crate) fn display(canon: &Path) -> String {
    if canon.as_os_str().is_empty() {
        return ".".into();
    }
    let names: Vec<Cow<str>> = canon
        .components()
        .map(|c| escape_name(c.as_os_str().as_bytes()))
        .collect();
    names.join("/")
}

/// A file name as the model sees it: as it is when it is UTF-8 without control or
/// bidirectional-control characters; otherwise with those characters escaped as Rust does
/// (`\n`, `\u{202e}`), bytes that are not UTF-8 as `\xNN`, and backslashes doubled, so that
/// one name stays one line, reads in its true order, and can be addressed by what is shown
/// (see [`unescape_name`]).
pub(crate) fn escape_name(name: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(name) {
        if !text.chars().any(needs_escape) {
            return Cow::Borrowed(text);
        }
    }
    let mut out = String::with_capacity(name.len() + 8);
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if needs_escape(c) || c == '\\' {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    Cow::Owned(out)
}

/// The name that `shown` is the escaped form of (see [`escape_name`]); `None` when it is not
/// one.
pub(crate) fn unescape_name(shown: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(shown).ok()?;
    let mut out = Vec::with_capacity(shown.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let decoded = match chars.next()? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            '\\' => '\\',
            '0' => '\0',
            'x' => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(
                    u8::from_str_radix(&hex, 16)
                        .ok()
                        .filter(|_| hex.len() == 2)?,
                );
                continue;
            }
            'u' => {
                if chars.next()? != '{' {
                    return None;
                }
                let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
            }
            _ => return None,
        };
        let mut buf = [0; 4];
        out.extend_from_slice(decoded.encode_utf8(&mut buf).as_bytes());
    }
    Some(out)
}

/// Control characters, and the bidirectional controls that make a name display in another
/// order than its bytes (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The model's path as it may appear in a message: bounded, control characters escaped.
pub(crate) fn echo(rel: &str) -> String {
    let mut out = printable(&rel.chars().take(MAX_ECHO_CHARS).collect::<String>());
    if rel.chars().nth(MAX_ECHO_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// `s` with control and bidirectional-control characters escaped, so one line stays one line
/// and reads in its true order.
pub(crate) fn printable(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if needs_escape(c) {
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
    use std::fs;

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
        assert!(sub.planned("../x").is_none());
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
    fn canonical_paths_are_opened_without_following_any_symlink() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(tmp.path()).expect("root");
        fs::create_dir(tmp.path().join("real")).expect("mkdir");
        std::os::unix::fs::symlink("real", tmp.path().join("link")).expect("symlink");
        // Canonical paths (as walkers hand them over) hold no symlink: one met is refused.
        assert!(ws.dir_at(Path::new("real")).is_ok());
        assert!(ws.dir_at(Path::new("link")).is_err());
        // The model's paths follow links that lead inside, to their canonical place.
        assert_eq!(ws.planned("link/new/x"), Some(PathBuf::from("real/new/x")));
    }

    #[test]
    fn a_workspace_is_its_directory_wherever_that_goes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        fs::write(outside.path().join("secret"), "s").expect("write");
        let root = Workspace::open(tmp.path()).expect("root");
        let sub = root.subdir("sub").expect("sub");
        fs::rename(tmp.path().join("sub"), tmp.path().join("sub.bak")).expect("mv");
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("sub")).expect("ln");
        assert!(sub.open_file("secret").is_err());
        sub.write("x", b"x").expect("write");
        assert!(tmp.path().join("sub.bak/x").is_file());
        assert!(!outside.path().join("x").exists());
    }

    #[test]
    fn names_are_escaped_for_display_and_found_by_what_was_shown() {
        for (raw, shown) in [
            (&b"plain.txt"[..], "plain.txt"),
            (b"back\\slash", "back\\slash"),
            (b"caf\xe9.txt", "caf\\xe9.txt"),
            (b"evil\nname", "evil\\nname"),
            ("a\u{202e}txt.exe".as_bytes(), "a\\u{202e}txt.exe"),
            ("\u{2067}x\\y".as_bytes(), "\\u{2067}x\\\\y"),
        ] {
            assert_eq!(escape_name(raw), shown);
            if shown.contains('\\') && raw != shown.as_bytes() {
                assert_eq!(unescape_name(shown.as_bytes()).as_deref(), Some(raw));
            }
        }
        assert_eq!(unescape_name(b"bad\\q"), None);
        assert_eq!(unescape_name(b"bad\\x4"), None);
        let tmp = tempfile::tempdir().expect("tempdir");
        let name = OsStr::from_bytes(b"d\xe9j\xe0");
        fs::create_dir(tmp.path().join(name)).expect("mkdir");
        fs::write(tmp.path().join(name).join("f\u{202e}txt.sh"), "x").expect("write");
        let ws = Workspace::open(tmp.path()).expect("root");
        let (canon, _) = ws
            .open_file("d\\xe9j\\xe0/f\\u{202e}txt.sh")
            .expect("found");
        assert_eq!(display(&canon), "d\\xe9j\\xe0/f\\u{202e}txt.sh");
    }
}

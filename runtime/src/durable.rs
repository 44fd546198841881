//! Files of the home: writes that survive a crash (atomic replacement of whole files, fsynced
//! appends), and reads that tell a missing file from a damaged one.
//!
//! Everything the home holds may quote a thread's content (prompts, agents' answers, debug
//! logs), so what is created here is private to its owner: directories 0700, files 0600. A
//! file made to be shared (a bundle `build` writes) is made by [`write_shared`] instead, with
//! the permissions the umask allows, as `cargo` and `cc` make theirs.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Permissions of the directories of the home.
const PRIVATE_DIR: u32 = 0o700;
/// Permissions of the files of the home.
pub const PRIVATE_FILE: u32 = 0o600;

use crate::error::{Error, Result};

/// Reads a text file the host keeps or is given: `None` if it does not exist; a file that is
/// not UTF-8 text is [`Error::Corrupt`] (bad data, not an I/O failure).
pub fn read_text(path: &Path, action: &'static str) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(Error::Corrupt {
            path: path.to_path_buf(),
            reason: "not UTF-8 text (a binary file?)".into(),
        }),
        Err(e) => Err(Error::io(action, path)(e)),
    }
}

/// Creates `dir` and its parents that are missing, private to their owner (0700).
pub fn create_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
        .map_err(Error::io("create directory", dir))
}

/// Opens `path` for options `options`, creating it private to its owner (0600) if it is new.
pub fn open_private(options: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    options.mode(PRIVATE_FILE).open(path)
}

/// Replaces `path` with `bytes` atomically: a reader sees the old file or the new one, never
/// a mix, and after return the new content is on disk (temp file + fsync + rename + fsync of
/// the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let (dir, temp) = synced_temp(path, bytes, Sharing::Private)?;
    persist(path, dir, temp)
}

/// [`write_atomic`] for a file made to be shared, outside the home (a built bundle): it gets
/// the permissions the umask gives a new file (0644 under the usual 022), and missing parent
/// directories the umask's too.
pub fn write_shared(path: &Path, bytes: &[u8]) -> Result<()> {
    let (dir, temp) = synced_temp(path, bytes, Sharing::Umask)?;
    persist(path, dir, temp)
}

fn persist(path: &Path, dir: &Path, temp: tempfile::NamedTempFile) -> Result<()> {
    temp.persist(path).map_err(|e| Error::Io {
        action: "replace",
        path: path.to_path_buf(),
        cause: e.error,
    })?;
    sync_dir(dir)
}

/// Who a new file is for.
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    /// Its owner only (the home's files).
    Private,
    /// Whoever the umask lets read it.
    Umask,
}

/// The directory a file at `path` is in: `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// A temporary file beside `path` holding `bytes`, on disk; and the directory.
fn synced_temp<'a>(
    path: &'a Path,
    bytes: &[u8],
    sharing: Sharing,
) -> Result<(&'a Path, tempfile::NamedTempFile)> {
    let dir = parent_dir(path);
    let mut builder = tempfile::Builder::new();
    builder.prefix(".tmp-");
    match sharing {
        Sharing::Private => create_dir(dir)?,
        Sharing::Umask => {
            fs::create_dir_all(dir).map_err(Error::io("create directory", dir))?;
            // The mode asked of open(2), which the umask then narrows.
            builder.permissions(fs::Permissions::from_mode(0o666));
        }
    }
    let mut temp =
        builder.tempfile_in(dir).map_err(Error::io("create a temporary file in", dir))?;
    temp.write_all(bytes).map_err(Error::io("write", temp.path()))?;
    temp.as_file().sync_all().map_err(Error::io("sync", temp.path()))?;
    Ok((dir, temp))
}

/// Creates `path` holding `bytes`, atomically: the file appears whole, on disk, or not at all
/// (temp file, fsync, `prepare` on it — a lock, say — then a rename that fails if `path`
/// exists, and an fsync of the directory). Returns the file, open for reading and writing at
/// its end.
pub fn create_atomic(
    path: &Path,
    bytes: &[u8],
    prepare: impl FnOnce(&File) -> std::io::Result<()>,
) -> Result<File> {
    let (dir, temp) = synced_temp(path, bytes, Sharing::Private)?;
    prepare(temp.as_file()).map_err(Error::io("prepare", temp.path()))?;
    let file = temp.persist_noclobber(path).map_err(|e| Error::Io {
        action: "create",
        path: path.to_path_buf(),
        cause: e.error,
    })?;
    sync_dir(dir)?;
    Ok(file)
}

/// Makes a rename or a file creation in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("sync directory", dir))
}

/// An append-only file whose every [`append`](AppendFile::append) is on disk when it returns,
/// or not in the file at all: an append that fails (a full disk, an I/O error) is cut back
/// off, so that no fragment of it is left for the next record to land after.
#[derive(Debug)]
pub struct AppendFile {
    file: File,
    durable: bool,
    /// Where its last whole record ends: what a failed append is cut back to. (One process
    /// appends to a file at a time, under the file's lock or its thread's.)
    len: u64,
}

impl AppendFile {
    /// Opens (creating if needed) `path` for appending. `durable` fsyncs every append.
    ///
    /// If a crash tore the file's last line, the partial line is terminated first, so the
    /// next record starts on a line of its own and readers can skip the torn one.
    pub fn open(path: &Path, durable: bool) -> Result<Self> {
        let existed = path.exists();
        let mut file = open_private(OpenOptions::new().create(true).append(true).read(true), path)
            .map_err(Error::io("open", path))?;
        if existed && !ends_with_newline(&file).map_err(Error::io("read", path))? {
            file.write_all(b"\n").map_err(Error::io("repair torn last line of", path))?;
        }
        if !existed
            && durable
            && let Some(dir) = path.parent()
        {
            sync_dir(dir)?;
        }
        let len = file.metadata().map_err(Error::io("read", path))?.len();
        Ok(AppendFile { file, durable, len })
    }

    /// Appends to `file`, whose position is its end (a file [`create_atomic`] made).
    pub fn from_file(file: File, durable: bool) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(AppendFile { file, durable, len })
    }

    /// Opens a file that `open` has already checked and repaired, for more appends: one
    /// `open` call, where `open` also inspects the file's tail.
    pub fn reopen(path: &Path, durable: bool) -> Result<Self> {
        let file = OpenOptions::new().append(true).open(path).map_err(Error::io("open", path))?;
        let len = file.metadata().map_err(Error::io("read", path))?.len();
        Ok(AppendFile { file, durable, len })
    }

    /// Takes an exclusive lock on the file, held until it is closed (or the process dies).
    pub fn lock(&self) -> std::io::Result<()> {
        self.file.lock()
    }

    /// Takes the exclusive lock if nobody holds it.
    pub fn try_lock(&self) -> std::result::Result<(), std::fs::TryLockError> {
        self.file.try_lock()
    }

    /// Cuts the file back to its first `len` bytes, on disk when this returns: what a crash
    /// left half-written and nobody was told was stored.
    pub fn cut_to(&mut self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)?;
        self.file.sync_data()?;
        self.len = len;
        Ok(())
    }

    /// Appends one line (a newline is added) and, if the file is durable, fsyncs it.
    pub fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        self.append_synced(line, self.durable)
    }

    /// Appends one line, fsyncing it if `sync`.
    pub fn append_synced(&mut self, line: &[u8], sync: bool) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        // One write call, so that concurrent readers see whole lines or a torn tail, never
        // two interleaved halves.
        let written = self.file.write_all(&buf).and_then(|()| match sync {
            true => self.file.sync_data(),
            false => Ok(()),
        });
        if let Err(e) = written {
            // What reached the file is no record: cut it off, or the next append (once there
            // is room again) would leave it as a damaged line in the middle of the file. A
            // failed cut leaves a torn tail, which readers skip and the next `open` ends.
            let _ = self.file.set_len(self.len).and_then(|()| self.file.sync_data());
            return Err(e);
        }
        self.len += buf.len() as u64;
        Ok(())
    }
}

fn ends_with_newline(file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

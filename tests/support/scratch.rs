//! Where tests keep what they write and throw away: a directory in memory (`/dev/shm`) when
//! the machine has one with room, else the system's temporary directory.
//!
//! Why: the tests' homes and their PostgreSQL server create and delete files by the
//! thousand. On a full, much-churned ext4 disk, creating a file can cost milliseconds
//! (the inode allocator steps over recently deleted inodes): one `CREATE DATABASE` took
//! 220 ms on such a disk and 15 ms in memory. Nothing a test checks depends on the disk being
//! real: durability across crashes is tested by killing processes, not machines.
//! `UNCAGED_TEST_SCRATCH=DIR` puts it all in DIR instead.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Room a memory directory must have free to be used: the CLI suite's databases (about 8 MB
/// each, kept until the test process ends) and homes need a little over 1 GiB at most.
const ROOM: u64 = 2 << 30;

/// The directory tests make their temporary directories in.
pub fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        if let Some(dir) = std::env::var_os("UNCAGED_TEST_SCRATCH") {
            return PathBuf::from(dir);
        }
        let memory = Path::new("/dev/shm");
        match rustix::fs::statvfs(memory) {
            Ok(fs) if fs.f_bavail.saturating_mul(fs.f_frsize) >= ROOM && writable(memory) => {
                memory.to_path_buf()
            }
            _ => std::env::temp_dir(),
        }
    })
}

/// A new temporary directory under [`root`], deleted when dropped.
pub fn tempdir() -> std::io::Result<tempfile::TempDir> {
    tempdir_named("uncaged-test-")
}

/// A new temporary directory under [`root`] named `prefix…`, deleted when dropped.
pub fn tempdir_named(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir_in(root())
}

fn writable(dir: &Path) -> bool {
    tempfile::Builder::new().prefix("uncaged-probe-").tempdir_in(dir).is_ok()
}

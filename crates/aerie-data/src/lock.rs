//! One writer per output, for every command whose output a later run resumes or replaces
//! (capture and conversion datasets, training runs, regenerated chat files, prepared data, GGUF
//! imports). Two processes appending to one output interleave their records or overwrite each
//! other's checkpoints, and both report success: the data loss is silent. So each such command
//! holds an [`OutputLock`] for its whole run, and a second one is refused at once, naming the
//! output, the lock file and, when it can be read, the process holding it.
//!
//! The lock is an advisory `flock` on a lock file (`File::try_lock`), which the kernel releases
//! when its holder exits however it exits: a lock left by a killed process is not a lock, and
//! the next run takes it over without any stale-lock guessing. The holder writes its pid into
//! the file, only to name it in the refusal.
//!
//! A lock is keyed on what is written, not on how its path is spelled: the output's parent is
//! resolved (`canonicalize`: symlinks, `.`, `..`) and a symlink at the output's own name is
//! followed, so `runA`, `./runA/`, `/abs/runA` and a symlink `runB -> runA` all take the one
//! lock `.runA.aerie-lock` beside the directory actually written. A lock inside a directory is
//! one file whatever the directory is called. An output directory that already exists is also
//! locked by its identity (device and inode: `flock` on the directory itself), so a bind mount of
//! it, which no path resolution can tell from another directory, is the same output too.
//!
//! A lock file is never opened through a symbolic link (`O_NOFOLLOW`): a link planted at
//! `.NAME.aerie-lock` or `.aerie-shard.lock` is refused, naming it, and its target is neither
//! truncated nor written. On a file system without `flock` every writer says so on stderr (once
//! per file system and process): the run goes on, unprotected, and is never silently so.
//!
//! Where the lock file lives:
//! - beside the output ([`OutputLock::beside`]): `.<name>.aerie-lock` in the same parent, for
//!   training runs, prepared data, regenerated chat files and GGUF imports. Beside, not inside:
//!   an output replaced whole (`atomic::replace_dir`) would swap a lock inside it away, and a
//!   lock inside would be a stray file in the output's listing. It is removed when the run
//!   ends, which is safe because every taker checks, once it holds the lock, that the path still
//!   names the file it locked, and starts over otherwise.
//! - inside a shard dataset ([`OutputLock::inside`]): `.aerie-shard.lock`, the file the Python
//!   capture worker locks too (docs/shard-format.md §2). It stays behind after the run, empty:
//!   the Python writer does not check what it locked, so deleting the file could let two
//!   writers lock two files of one name.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::paths::parent_dir;
use crate::{Error, Result};

/// An exclusive lock on one output, held until dropped.
#[derive(Debug)]
pub struct OutputLock {
    file: File,
    path: PathBuf,
    /// Remove the lock file on release (locks beside their output).
    remove: bool,
    /// False on a file system without `flock`: the run goes on unprotected ([`Self::is_held`]).
    held: bool,
    /// The output directory itself, locked by its identity ([`Self::beside`]), when it existed.
    _identity: Option<File>,
}

impl OutputLock {
    /// Lock the directory `dir` through its lock file `name` (created if missing, kept after the
    /// run, emptied). `dir` must exist.
    pub fn inside(dir: &Path, name: &str) -> Result<Self> {
        Self::take(dir, dir.join(name), false)
    }

    /// Lock `output` (a file, or a directory that is replaced whole) through
    /// `.<name>.aerie-lock` in its parent directory, created for the run and removed after it.
    /// The lock file is beside what `output` resolves to ([`resolve_output`]).
    pub fn beside(output: &Path) -> Result<Self> {
        let parent = parent_dir(output);
        // The user asked for `output`, not for aerie's lock file: an error says where the
        // output cannot go, and why, in the output's words.
        let cannot = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("{what}, where the output {} goes: {e}", output.display()))
        };
        crate::paths::create_output_dir(parent, output).map_err(|(path, e)| Error::io(path, e))?;
        let resolved = resolve_output(output)?;
        let name = resolved.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let dir = parent_dir(&resolved);
        let mut lock = Self::take(output, dir.join(format!(".{name}.aerie-lock")), true).map_err(|err| match err {
            Error::Io { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                ) =>
            {
                Error::io(dir, cannot("cannot write in this directory", source))
            }
            other => other,
        })?;
        lock._identity = lock_identity(output, &resolved)?;
        Ok(lock)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the lock is really held: false where the file system does not support `flock`
    /// (the run then goes on unprotected, and its caller should warn the user).
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// What to tell the user when the lock is not held ([`Self::is_held`]): that nothing stops
    /// a second `command` writing into `output` at the same time, so that a run on such a file
    /// system is never silently unprotected.
    pub fn unprotected_warning(&self, command: &str, output: &Path) -> Option<String> {
        (!self.held).then(|| {
            format!(
                "{}: the file system does not support locks (flock), so nothing stops a second {command} into {} \
                 from mixing its writes with this one's; run one {command} per output",
                self.path.display(),
                output.display()
            )
        })
    }

    fn take(output: &Path, path: PathBuf, remove: bool) -> Result<Self> {
        loop {
            let mut file = open_no_follow(&path)?;
            let mut held = true;
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(Error::Locked { path: output.to_path_buf(), lock: path, holder: holder(&mut file) });
                }
                // File systems without locks: go on unprotected rather than refuse to work.
                Err(fs::TryLockError::Error(e)) if locks_unsupported(&e) => {
                    held = false;
                    warn_unprotected(&path, output);
                }
                Err(fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            }
            // A releasing holder may have removed (or a new taker re-created) the file between our
            // open and our lock: then we hold a lock nobody else will look at. Start over.
            if !same_file(&file, &path) {
                continue;
            }
            file.set_len(0).map_err(|e| Error::io(&path, e))?;
            file.seek(SeekFrom::Start(0)).map_err(|e| Error::io(&path, e))?;
            file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(|e| Error::io(&path, e))?;
            return Ok(Self { file, path, remove, held, _identity: None });
        }
    }
}

/// What `output` names on disk, however it is spelled: its parent directory canonicalized and a
/// symlink at its own name followed (also a dangling one: the output it will create), so every
/// spelling of one output resolves to one path. The parent must exist.
pub fn resolve_output(output: &Path) -> Result<PathBuf> {
    // As the kernel does (ELOOP): a chain this long is a loop.
    const MAX_LINKS: usize = 40;
    let mut path = output.to_path_buf();
    for _ in 0..MAX_LINKS {
        let Some(name) = path.file_name().map(|n| n.to_owned()) else {
            // `.`, `..`, `/`: a directory that exists, named by its canonical path.
            return fs::canonicalize(&path).map_err(|e| Error::io(&path, e));
        };
        let parent = parent_dir(&path);
        let parent = fs::canonicalize(parent).map_err(|e| Error::io(parent, e))?;
        let here = parent.join(&name);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&here).map_err(|e| Error::io(&here, e))?;
                // An absolute target replaces `parent` in the join.
                path = parent.join(target);
            }
            _ => return Ok(here),
        }
    }
    Err(Error::io(output, std::io::Error::other(format!("more than {MAX_LINKS} symbolic links in a chain"))))
}

/// Open (or create) the lock file `path` for reading and writing, never through a symbolic link
/// at its name: a link planted there is an error naming it, and its target is left untouched.
fn open_no_follow(path: &Path) -> Result<File> {
    let mut opts = OpenOptions::new();
    opts.create(true).truncate(false).read(true).write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    opts.open(path).map_err(|e| match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Error::io(path, link_refused()),
        _ => Error::io(path, e),
    })
}

/// The error for a symbolic link where aerie creates a file of its own.
pub(crate) fn link_refused() -> std::io::Error {
    std::io::Error::other(
        "is a symbolic link where aerie writes a file of its own; aerie never writes through a link \
         (its target is left as it is): remove the link",
    )
}

/// Lock the existing output directory `resolved` itself (`flock` on the directory: keyed on its
/// device and inode), so that a second path to it that no resolution can see (a bind mount) is
/// refused too. Nothing when `resolved` is not an existing directory, or where directories
/// cannot be locked (the lock beside the output still holds).
fn lock_identity(output: &Path, resolved: &Path) -> Result<Option<File>> {
    if !fs::symlink_metadata(resolved).is_ok_and(|m| m.is_dir()) {
        return Ok(None);
    }
    let Ok(dir) = File::open(resolved) else { return Ok(None) };
    match dir.try_lock() {
        Ok(()) => Ok(Some(dir)),
        Err(fs::TryLockError::WouldBlock) => {
            Err(Error::Locked { path: output.to_path_buf(), lock: resolved.to_path_buf(), holder: None })
        }
        Err(fs::TryLockError::Error(_)) => Ok(None),
    }
}

/// Tell the user, on stderr and once per file system, that `lock` could not be taken because
/// the file system has no `flock` ([`OutputLock::unprotected_warning`]'s words): every writer
/// takes its lock here, so none of them runs unprotected silently.
fn warn_unprotected(lock: &Path, output: &Path) {
    use std::sync::Mutex;
    static WARNED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    #[cfg(unix)]
    let device = {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(lock).map(|m| m.dev()).unwrap_or(0)
    };
    #[cfg(not(unix))]
    let device = 0;
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.contains(&device) {
        return;
    }
    warned.push(device);
    eprintln!("warning: {}", unprotected_message(lock, output));
}

/// What [`warn_unprotected`] says.
fn unprotected_message(lock: &Path, output: &Path) -> String {
    format!(
        "{}: the file system does not support locks (flock), so nothing stops a second aerie run writing into {} \
         from mixing its writes with this one's; run one writer per output",
        lock.display(),
        output.display()
    )
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Still holding the lock: the next taker sees no pid, or no file at all.
        if self.remove {
            let _ = fs::remove_file(&self.path);
        } else {
            let _ = self.file.set_len(0);
        }
    }
}

/// Whether a failed `flock` means the file system has no locks: `EOPNOTSUPP` (std's
/// `Unsupported`: FUSE and some network file systems) or `ENOLCK` (NFS without its lock
/// daemon), as opposed to an error the run must stop on.
fn locks_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported || e.raw_os_error() == Some(libc::ENOLCK)
}

/// Whether `path` still names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), fs::symlink_metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// The pid a holder wrote into its lock file, when that process is alive (a pid left by a
/// killed holder, read while another program holds the lock, would name the wrong process).
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let proc = Path::new("/proc");
    (!proc.is_dir() || proc.join(pid.to_string()).exists()).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = ".aerie-shard.lock";

    #[test]
    fn a_second_taker_is_refused_naming_the_holder_and_the_lock_returns_on_release() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("regen.jsonl");
        let first = OutputLock::beside(&out).unwrap();
        assert_eq!(fs::read_to_string(first.path()).unwrap().trim(), std::process::id().to_string());
        let err = OutputLock::beside(&out).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("regen.jsonl") && msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        assert!(matches!(err, Error::Locked { .. }));
        let lock_path = first.path().to_path_buf();
        drop(first);
        assert!(!lock_path.exists(), "a lock beside its output is removed after the run");
        drop(OutputLock::beside(&out).unwrap());
    }

    #[cfg(unix)]
    #[test]
    fn every_spelling_of_one_output_takes_one_lock() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("runA");
        fs::create_dir(&run).unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(&run, dir.path().join("runB")).unwrap();
        std::os::unix::fs::symlink("../runA", dir.path().join("sub/rel")).unwrap();
        // A dangling link: the output a run will create through it.
        std::os::unix::fs::symlink("fresh", dir.path().join("later")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("here")).unwrap();
        let lock = OutputLock::beside(&run).unwrap();
        for other in [
            dir.path().join("runB"),
            dir.path().join("sub/rel"),
            dir.path().join("sub/../runA/"),
            dir.path().join("here/runA"),
            dir.path().join("here/runB"),
        ] {
            let err = OutputLock::beside(&other).unwrap_err();
            assert!(matches!(err, Error::Locked { .. }), "{}: {err}", other.display());
        }
        drop(lock);
        let fresh = OutputLock::beside(&dir.path().join("fresh")).unwrap();
        assert!(OutputLock::beside(&dir.path().join("later")).is_err(), "a dangling link names what it will create");
        drop(fresh);
        // Two different outputs do not share a lock.
        let a = OutputLock::beside(&dir.path().join("runB")).unwrap();
        let _b = OutputLock::beside(&dir.path().join("fresh")).unwrap();
        drop(a);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_loop_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("b", dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("b")).unwrap();
        let err = OutputLock::beside(&dir.path().join("a")).unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");
    }

    #[test]
    fn a_lock_inside_a_directory_stays_empty_after_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let lock = OutputLock::inside(dir.path(), NAME).unwrap();
        assert!(OutputLock::inside(dir.path(), NAME).is_err());
        drop(lock);
        assert_eq!(fs::read(dir.path().join(NAME)).unwrap(), b"");
        drop(OutputLock::inside(dir.path(), NAME).unwrap());
    }

    #[test]
    fn a_file_system_without_flock_is_told_not_an_error_and_never_silent() {
        use std::io::Error as IoError;
        // What `flock` returns where the file system has no locks, against real errors.
        assert!(locks_unsupported(&IoError::from_raw_os_error(libc::EOPNOTSUPP)));
        assert!(locks_unsupported(&IoError::from_raw_os_error(libc::ENOLCK)));
        for real in [libc::EACCES, libc::EIO, libc::EBADF] {
            assert!(!locks_unsupported(&IoError::from_raw_os_error(real)), "errno {real}");
        }
        // A held lock says nothing; the one such a file system leaves says what is unprotected.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("shards");
        let mut lock = OutputLock::beside(&out).unwrap();
        assert!(lock.is_held() && lock.unprotected_warning("capture", &out).is_none());
        lock.held = false;
        let w = lock.unprotected_warning("capture", &out).expect("a warning");
        assert!(w.contains("flock") && w.contains(".shards.aerie-lock") && w.contains("second capture into"), "{w}");
        // What every writer says on stderr when its lock cannot be taken (`take`).
        let w = unprotected_message(lock.path(), &out);
        assert!(w.contains("flock") && w.contains(".shards.aerie-lock") && w.contains("writing into"), "{w}");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_a_lock_file_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("precious.txt");
        fs::write(&victim, "user data\n").unwrap();
        let out = dir.path().join("run");
        fs::create_dir(&out).unwrap();
        // Beside (`.run.aerie-lock`) and inside (`.aerie-shard.lock`), dangling links too.
        std::os::unix::fs::symlink(&victim, dir.path().join(".run.aerie-lock")).unwrap();
        std::os::unix::fs::symlink(&victim, out.join(NAME)).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join(".fresh.aerie-lock")).unwrap();
        for err in [
            OutputLock::beside(&out).unwrap_err(),
            OutputLock::inside(&out, NAME).unwrap_err(),
            OutputLock::beside(&dir.path().join("fresh")).unwrap_err(),
        ] {
            let msg = err.to_string();
            assert!(
                msg.contains("symbolic link") && msg.contains("aerie-") && msg.contains("remove the link"),
                "{msg}"
            );
        }
        assert_eq!(fs::read_to_string(&victim).unwrap(), "user data\n");
        assert!(!dir.path().join("nowhere").exists(), "nothing is created through a dangling link");
    }

    /// A bind mount of an output directory: no path resolution sees that the two are one, the
    /// identity lock (device and inode) does. Needs the right to mount (root); skipped otherwise.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_bind_mount_of_an_output_is_the_same_output() {
        let dir = tempfile::tempdir().unwrap();
        let (run, mnt) = (dir.path().join("runA"), dir.path().join("elsewhere"));
        fs::create_dir(&run).unwrap();
        fs::create_dir_all(mnt.join("runB")).unwrap();
        let bound = std::process::Command::new("mount")
            .args(["--bind".as_ref(), run.as_os_str(), mnt.join("runB").as_os_str()])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !bound {
            eprintln!("skipped: cannot bind-mount here");
            return;
        }
        let result = std::panic::catch_unwind(|| {
            let lock = OutputLock::beside(&run).unwrap();
            let err = OutputLock::beside(&mnt.join("runB")).unwrap_err();
            assert!(matches!(err, Error::Locked { .. }), "{err}");
            assert!(err.to_string().contains("another process"), "{err}");
            drop(lock);
            // Released: the other path takes it, and then the first path is refused.
            let other = OutputLock::beside(&mnt.join("runB")).unwrap();
            assert!(matches!(OutputLock::beside(&run).unwrap_err(), Error::Locked { .. }));
            drop(other);
        });
        let _ = std::process::Command::new("umount").arg(mnt.join("runB")).status();
        result.unwrap();
    }

    #[test]
    fn a_dead_holders_pid_in_the_file_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        // What `kill -9` leaves: the file with a pid, no lock.
        fs::write(dir.path().join(NAME), "4194303\n").unwrap();
        let lock = OutputLock::inside(dir.path(), NAME).unwrap();
        assert_eq!(fs::read_to_string(lock.path()).unwrap().trim(), std::process::id().to_string());
    }
}

//! Files that appear whole or not at all, for every stage of aerie: a temp file beside the
//! target (`.tmp-<name>`), fsynced, renamed over it, then the directory fsynced so the rename
//! itself survives a crash. Readers see the old file or the complete new one, never a torn write,
//! whatever moment a process is killed at; this is what lets every long job resume.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::paths::parent_dir;
use crate::{Error, Result};

/// Temp files start with this; they are never part of a dataset and resume deletes them.
pub const TMP_PREFIX: &str = ".tmp-";

/// The temp file `write_file` fills for `path`: `.tmp-<name>` in the same directory.
pub fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    parent_dir(path).join(format!("{TMP_PREFIX}{name}"))
}

/// Write `path` atomically with whatever `fill` writes to the temp path it is given.
pub fn write_file(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = tmp_path(path);
    let result = fill(&tmp).and_then(|()| {
        File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        sync_dir(parent_dir(path))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Write `bytes` to `path` atomically.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file(path, |tmp| {
        let mut f = File::create(tmp).map_err(|e| Error::io(tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io(tmp, e))
    })
}

/// Persist directory entries (renames, removals). A no-op where directories cannot be opened.
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write_bytes(&p, b"old").unwrap();
        write_bytes(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        let failed = write_file(&p, |tmp| {
            fs::write(tmp, b"partial").unwrap();
            Err(Error::io(tmp, std::io::Error::other("disk full")))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(!tmp_path(&p).exists());
    }
}

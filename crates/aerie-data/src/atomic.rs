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

/// Put the complete directory `tmp` (a sibling of `out`) in place at `out`. An existing `out` is
/// first moved aside into a hidden holder beside it and removed only once `tmp` is in place; if
/// that rename fails, the previous `out` is put back. So `out` is at every instant the old
/// directory or the new one, never a mix (the callers decide whether `out` may be replaced).
pub fn replace_dir(tmp: &Path, out: &Path) -> std::io::Result<()> {
    if !out.exists() {
        return fs::rename(tmp, out);
    }
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let holder = tempfile::Builder::new().prefix(&format!(".{name}.old-")).tempdir_in(parent_dir(out))?;
    let previous = holder.path().join("previous");
    fs::rename(out, &previous)?;
    if let Err(e) = fs::rename(tmp, out) {
        let _ = fs::rename(&previous, out);
        return Err(e);
    }
    Ok(()) // dropping `holder` removes the previous directory
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
    fn replace_dir_swaps_whole_directories() {
        let root = tempfile::tempdir().unwrap();
        let (out, new) = (root.path().join("out"), root.path().join(".new"));
        fs::create_dir(&new).unwrap();
        fs::write(new.join("a"), "1").unwrap();
        replace_dir(&new, &out).unwrap(); // no previous directory
        assert_eq!(fs::read_to_string(out.join("a")).unwrap(), "1");
        fs::create_dir(&new).unwrap();
        fs::write(new.join("b"), "2").unwrap();
        replace_dir(&new, &out).unwrap(); // replaces it whole, and removes the old one
        assert!(!out.join("a").exists() && out.join("b").exists() && !new.exists());
        let left: Vec<_> = fs::read_dir(root.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("out")]);
        // A missing source leaves the previous directory where it was.
        assert!(replace_dir(&new, &out).is_err());
        assert!(out.join("b").exists());
    }

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

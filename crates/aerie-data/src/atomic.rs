//! Files that appear whole or not at all, for every stage of aerie: a temp file beside the
//! target (`.tmp-<name>`), fsynced, renamed over it, then the directory fsynced so the rename
//! itself survives a crash. Readers see the old file or the complete new one, never a torn write,
//! whatever moment a process is killed at; this is what lets every long job resume.
//!
//! A temp file is created new ([`create_tmp`]: `O_CREAT | O_EXCL`, which never follows a link):
//! a stale regular file of a killed run is removed first, and a symbolic link planted at its name
//! is an error naming it, so a write never lands in the link's target.

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

/// `opts` made to refuse a symbolic link at the path's last component (`O_NOFOLLOW`: the open
/// fails instead of writing into the link's target).
pub fn no_follow(opts: &mut fs::OpenOptions) -> &mut fs::OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    opts
}

/// Create the temp file `tmp` new and empty, for writing: an existing regular file there (a
/// temp left by a killed run: the [`TMP_PREFIX`] names are aerie's) is removed first; a symbolic
/// link, a directory or any other file there is an error naming it, and is left as it is.
pub fn create_tmp(tmp: &Path) -> Result<File> {
    match fs::symlink_metadata(tmp) {
        Ok(m) if m.file_type().is_symlink() => return Err(Error::io(tmp, crate::lock::link_refused())),
        Ok(m) if m.is_file() => fs::remove_file(tmp).map_err(|e| Error::io(tmp, e))?,
        Ok(_) => {
            return Err(Error::io(
                tmp,
                std::io::Error::other("is not a regular file where aerie writes a temporary file; remove it"),
            ));
        }
        Err(_) => {}
    }
    // `create_new` (O_EXCL) fails on any file at the name, a link included, dangling or not.
    fs::OpenOptions::new().write(true).create_new(true).open(tmp).map_err(|e| match fs::symlink_metadata(tmp) {
        Ok(m) if m.file_type().is_symlink() => Error::io(tmp, crate::lock::link_refused()),
        _ => Error::io(tmp, e),
    })
}

/// Write `path` atomically with whatever `fill` writes to the temp path it is given (created
/// new and empty by [`create_tmp`] before `fill` runs, so `fill` never writes through a link).
pub fn write_file(path: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = tmp_path(path);
    drop(create_tmp(&tmp)?);
    let result = fill(&tmp).and_then(|()| {
        File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        sync_dir(parent_dir(path))
    });
    if result.is_err() && fs::symlink_metadata(&tmp).is_ok_and(|m| m.is_file()) {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Write `bytes` to `path` atomically.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file(path, |tmp| {
        let mut f = fs::OpenOptions::new().write(true).truncate(true).open(tmp).map_err(|e| Error::io(tmp, e))?;
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

    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_a_temp_name_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("precious.txt");
        fs::write(&victim, "user data\n").unwrap();
        let p = dir.path().join("manifest.json");
        std::os::unix::fs::symlink(&victim, tmp_path(&p)).unwrap();
        let err = write_bytes(&p, b"{}").unwrap_err().to_string();
        assert!(err.contains(".tmp-manifest.json") && err.contains("symbolic link"), "{err}");
        let err = write_file(&p, |_| panic!("never filled through a link")).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "user data\n");
        assert!(!p.exists() && fs::symlink_metadata(tmp_path(&p)).unwrap().file_type().is_symlink());
        // A stale temp file of a killed run is aerie's, and is replaced.
        fs::remove_file(tmp_path(&p)).unwrap();
        fs::write(tmp_path(&p), "half").unwrap();
        write_bytes(&p, b"{}").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{}");
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

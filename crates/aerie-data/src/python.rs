//! Where aerie's own Python packages are (`python/aerie_capture`, the capture worker, and
//! `python/aerie_serve`, the engine launcher) and how their interpreter finds them: both stages
//! that start Python (capture, eval) run them from a source checkout without installing them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding aerie's Python packages: `$AERIE_CAPTURE_PYTHONPATH`, else this
/// checkout's `python/` when it is there (a source build), else none (the packages must then be
/// installed in the interpreter's environment, `pip install ./python`).
pub fn package_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AERIE_CAPTURE_PYTHONPATH") {
        return Some(PathBuf::from(p));
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python");
    dir.join("aerie_capture/__init__.py").is_file().then_some(dir)
}

/// Put `dir` first on the command's `PYTHONPATH`, keeping what the environment already has.
pub fn prepend_pythonpath(c: &mut Command, dir: &Path) {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        paths.extend(std::env::split_paths(&old));
    }
    if let Ok(joined) = std::env::join_paths(paths) {
        c.env("PYTHONPATH", joined);
    }
}

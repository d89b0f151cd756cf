//! Where aerie's own Python packages are (`python/aerie_capture`, the capture worker, and
//! `python/aerie_serve`, the engine launcher), which interpreter runs them, and how it finds
//! them: every process aerie starts in Python (the capture worker, a serving engine) gets its
//! interpreter and `PYTHONPATH` here, so a source checkout runs them without installing them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The interpreter whose environment holds torch and the engines: the one given (`--python`),
/// else `$AERIE_PYTHON`, else `python3` on the `PATH`.
pub fn interpreter(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("AERIE_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"))
}

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

/// `python` as a command, with aerie's packages ([`package_dir`]) first on its `PYTHONPATH`
/// (keeping what the environment already has) when they are not installed.
pub fn command(python: &Path) -> Command {
    let mut c = Command::new(python);
    if let Some(dir) = package_dir() {
        let mut paths = vec![dir];
        if let Some(old) = std::env::var_os("PYTHONPATH") {
            paths.extend(std::env::split_paths(&old));
        }
        if let Ok(joined) = std::env::join_paths(paths) {
            c.env("PYTHONPATH", joined);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_checkout_puts_its_python_dir_first() {
        let c = command(Path::new("python3"));
        let path = c.get_envs().find(|(k, _)| *k == "PYTHONPATH").and_then(|(_, v)| v).map(PathBuf::from);
        let first = std::env::split_paths(path.as_deref().expect("this checkout has python/")).next().unwrap();
        assert!(first.join("aerie_serve").is_dir(), "{}", first.display());
        assert_eq!(interpreter(Some(Path::new("/x/py"))), PathBuf::from("/x/py"));
    }
}

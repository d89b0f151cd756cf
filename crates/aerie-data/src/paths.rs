//! Path helpers shared by the crate's loaders and writers (a leaf: it depends on nothing else
//! in the crate, so the tokenizer loader and the prepared-dataset writer can both use it).

use std::path::{Path, PathBuf};

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Create `dir` and its parents, where the output `output` goes. On failure, the path to name
/// and an error in the output's words: the file in the way when an ancestor is a file (the OS
/// says only "File exists" or "Not a directory"), else why the directory cannot be made.
pub fn create_output_dir(dir: &Path, output: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    std::fs::create_dir_all(dir).map_err(|e| {
        let kind = e.kind();
        match dir.ancestors().find(|a| !a.as_os_str().is_empty() && a.exists()).filter(|a| !a.is_dir()) {
            Some(file) => (
                file.to_path_buf(),
                std::io::Error::new(
                    kind,
                    format!("is a file, not a directory, so the output {} cannot go under it", output.display()),
                ),
            ),
            None => (
                dir.to_path_buf(),
                std::io::Error::new(
                    kind,
                    format!("cannot create this directory, where the output {} goes: {e}", output.display()),
                ),
            ),
        }
    })
}

//! Path helpers shared by the crate's loaders and writers (a leaf: it depends on nothing else
//! in the crate, so the tokenizer loader and the prepared-dataset writer can both use it).

use std::path::Path;

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

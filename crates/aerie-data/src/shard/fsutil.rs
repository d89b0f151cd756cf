//! File-system plumbing for crash safety: every file of a dataset appears under its final name
//! only once complete (temp file in the same directory, fsync, rename, fsync of the directory),
//! and one writer at a time holds a lock. Readers therefore never see a half-written shard or
//! manifest, whatever moment a capture process dies at.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

pub(crate) use crate::atomic::{TMP_PREFIX, sync_dir, write_bytes as write_bytes_atomic, write_file as write_atomic};
use crate::{Error, Result};

/// Name of the manifest inside a dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The lock file a writer holds. It stays behind (empty) after the writer ends: deleting it
/// would let two writers lock different inodes of the same name.
pub(crate) const LOCK_FILE: &str = ".aerie-shard.lock";

/// The file name of shard `index`: `shard-00042.safetensors`.
pub fn shard_file_name(index: usize) -> String {
    format!("shard-{index:05}.safetensors")
}

/// Whether `name` has the shape writers give shards (`shard-<digits>.safetensors`).
pub(crate) fn is_shard_file_name(name: &str) -> bool {
    name.strip_prefix("shard-")
        .and_then(|rest| rest.strip_suffix(".safetensors"))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name` may appear in a manifest: a plain file name, so a manifest can never point
/// outside its directory.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.starts_with(TMP_PREFIX)
        && name != MANIFEST_FILE
}

/// Open `path` for reading only when it is a regular file (a link to one is followed): a FIFO,
/// a device or a socket where a shard or manifest should be is an error naming it, where a plain
/// open would wait for ever for a FIFO's writer (`O_NONBLOCK` opens it at once, the file type
/// is then checked on the open file).
pub(crate) fn open_regular(path: &Path) -> Result<File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| Error::io(path, e))?;
    let kind = file.metadata().map_err(|e| Error::io(path, e))?.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() { "a directory" } else { "not a regular file (a FIFO, a device or a socket)" };
        return Err(Error::io(path, std::io::Error::other(format!("is {what}; a dataset's files are regular files"))));
    }
    Ok(file)
}

/// sha256 of a file as lowercase hex: shard checksums in the manifest, and the
/// `tokenizer_digest` a capture engine computes from `tokenizer.json` (tiktoken tokenizers:
/// [`crate::tokenizer::tiktoken_digest`]).
pub fn sha256_file(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    let mut file = open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(shard_file_name(3), "shard-00003.safetensors");
        assert!(is_shard_file_name("shard-123456.safetensors"));
        assert!(!is_shard_file_name("shard-.safetensors"));
        assert!(!is_shard_file_name(".tmp-shard-00001.safetensors"));
        assert!(is_plain_file_name("shard-00001.safetensors"));
        for bad in ["../x.safetensors", "a/b", "..", "", ".tmp-shard-1.safetensors", "manifest.json"] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }
}

//! Deterministic safetensors headers: `__metadata__` with its keys sorted.
//!
//! The safetensors crate takes metadata as a `HashMap` and writes it in that map's iteration
//! order, which is random per process, so two writes of the same shard or vocabulary file
//! differed in their header bytes and in their sha256 (the manifest's checksums, resume
//! comparisons, and cross-language writers compared byte for byte all need one spelling).
//! Sorting rewrites the header in place: the same entries serialise to the same length, so no
//! offset moves. Readers are unaffected (the format does not order metadata).

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::{Map, Value};

use crate::{Error, Result};

/// Sort the `__metadata__` keys of the safetensors file at `path`, in place.
pub fn sort_metadata_in_file(path: &Path) -> Result<()> {
    let err = |message: String| Error::Safetensors { path: path.into(), message };
    let mut f = OpenOptions::new().read(true).write(true).open(path).map_err(|e| Error::io(path, e))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| Error::io(path, e))?;
    let n = usize::try_from(u64::from_le_bytes(len)).map_err(|_| err("header length overflows".into()))?;
    let mut header = vec![0u8; n];
    f.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
    if sort_header(&mut header).map_err(err)? {
        f.seek(SeekFrom::Start(8)).map_err(|e| Error::io(path, e))?;
        f.write_all(&header).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

/// Sort the `__metadata__` keys of a whole safetensors file held in memory.
pub fn sort_metadata(bytes: &mut [u8]) -> std::result::Result<(), String> {
    let n = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).ok_or("shorter than 8 bytes")?;
    let header = usize::try_from(n).ok().and_then(|n| bytes.get_mut(8..8 + n)).ok_or("header runs past the end")?;
    sort_header(header).map(|_| ())
}

/// Rewrite one header (JSON padded with spaces) with sorted metadata; `false` if unchanged.
fn sort_header(header: &mut [u8]) -> std::result::Result<bool, String> {
    let text = std::str::from_utf8(header).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let Value::Object(top) = serde_json::from_str::<Value>(text.trim_end()).map_err(|e| e.to_string())? else {
        return Err("header is not a JSON object".into());
    };
    let Some(Value::Object(meta)) = top.get("__metadata__") else { return Ok(false) };
    let mut sorted: Vec<(&String, &Value)> = meta.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Map::new();
    out.insert("__metadata__".into(), Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v.clone())).collect()));
    for (k, v) in top.iter().filter(|(k, _)| *k != "__metadata__") {
        out.insert(k.clone(), v.clone());
    }
    let json = serde_json::to_string(&Value::Object(out)).map_err(|e| e.to_string())?;
    if json.len() > header.len() {
        return Err(format!("sorted header is {} bytes, the space is {}", json.len(), header.len()));
    }
    let mut new = json.into_bytes();
    new.resize(header.len(), b' ');
    let changed = new != header;
    header.copy_from_slice(&new);
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::{Dtype, TensorView};
    use std::collections::HashMap;

    fn file(meta: &[(&str, &str)]) -> Vec<u8> {
        let data = [1u8, 2, 3, 4];
        let t = TensorView::new(Dtype::U8, vec![4], &data).unwrap();
        let meta: HashMap<String, String> = meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        safetensors::serialize([("x", t)], Some(meta)).unwrap()
    }

    #[test]
    fn every_write_spells_the_header_the_same_and_stays_readable() {
        let pairs: Vec<(String, String)> = (0..40).map(|i| (format!("key{i:02}"), format!("v{i}"))).collect();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..8 {
            let mut bytes = file(&pairs);
            sort_metadata(&mut bytes).unwrap();
            seen.insert(bytes);
        }
        assert_eq!(seen.len(), 1, "sorted headers differ between writes");
        let bytes = seen.into_iter().next().unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let keys: Vec<&String> = meta.metadata().as_ref().unwrap().keys().collect();
        assert_eq!(keys.len(), 40);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("x").unwrap().data(), &[1, 2, 3, 4]);
        let text = std::str::from_utf8(&bytes[8..]).unwrap();
        assert!(text.find("key00").unwrap() < text.find("key39").unwrap());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        std::fs::write(&path, file(&pairs)).unwrap();
        sort_metadata_in_file(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn a_broken_header_is_an_error() {
        assert!(sort_metadata(&mut [1, 0]).is_err());
        let mut bytes = 100u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(sort_metadata(&mut bytes).is_err());
        let mut bytes = 4u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"[1] ");
        assert!(sort_metadata(&mut bytes).unwrap_err().contains("not a JSON object"));
    }
}

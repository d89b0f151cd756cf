//! Malformed, truncated and unsupported inputs give errors that name the file, the tensor or
//! key and the problem, and never panic.

use aerie_hub::Error;
use aerie_hub::gguf::{GgmlType, GgufFile, ImportOptions, Value, import_gguf};

use crate::model::tiny_llama;
use crate::writer::{GgufWriter, s};

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, Error> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    GgufFile::open(&path)
}

fn import_writer(w: &GgufWriter) -> Result<(), Error> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    w.write(&path);
    import_gguf(&path, &dir.path().join("out"), ImportOptions::default()).map(|_| ())
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = tiny_llama(true, "smollm").writer.to_bytes();
    assert!(open_bytes(&bytes).is_ok());
    // Every cut point in the header and the first keys, then a stride (co-prime with every
    // field size) through the rest of the metadata, the tensor infos and the data.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    let dense = 1024.min(bytes.len());
    for cut in (0..dense).chain((dense..bytes.len()).step_by(29)) {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        match GgufFile::open(&path) {
            Err(Error::GgufFormat { path: p, problem }) => {
                assert_eq!(p, path);
                assert!(problem.contains("truncated") || problem.contains("bad magic"), "cut {cut}: {problem}");
            }
            other => panic!("cut at {cut} of {}: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn truncated_tensor_data_names_the_tensor() {
    let bytes = tiny_llama(true, "smollm").writer.to_bytes();
    let err = open_bytes(&bytes[..bytes.len() - 10]).unwrap_err().to_string();
    assert!(err.contains("bad.gguf") && err.contains("output_norm.weight") && err.contains("truncated"), "{err}");
}

#[test]
fn header_problems() {
    let mut w = GgufWriter::new();
    w.kv("a", Value::U32(1));
    let good = w.to_bytes();
    let with = |at: usize, patch: &[u8]| {
        let mut b = good.clone();
        b[at..at + patch.len()].copy_from_slice(patch);
        open_bytes(&b).unwrap_err().to_string()
    };
    assert!(with(0, b"GGML").contains("bad magic"));
    assert!(with(4, &1u32.to_le_bytes()).contains("v1 is not supported"));
    assert!(with(4, &3u32.to_be_bytes()).contains("big-endian"));
    assert!(with(4, &9u32.to_le_bytes()).contains("unknown GGUF version 9"));
    // kv type at 24 + 8 + 1 = 33: an unknown value type.
    assert!(with(33, &77u32.to_le_bytes()).contains("`a` has unknown value type 77"));
    let mut w = GgufWriter::new();
    w.kv("flag", Value::Bool(true));
    let mut b = w.to_bytes();
    let last = b.len() - 1;
    b[last] = 2;
    assert!(open_bytes(&b).unwrap_err().to_string().contains("bool byte 2"));
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(48));
    assert!(open_bytes(&w.to_bytes()).unwrap_err().to_string().contains("not a power of two"));
    // An array whose length claims more elements than bytes remain.
    let mut w = GgufWriter::new();
    w.kv("arr", Value::Array(vec![Value::U8(1)]));
    let mut b = w.to_bytes();
    let n_at = b.len() - 1 - 8;
    b[n_at..n_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(open_bytes(&b).unwrap_err().to_string().contains("longer than"));
}

#[test]
fn tensor_info_problems() {
    let one = |dims: &[u64], ty: GgmlType, data: Vec<u8>| {
        let mut w = GgufWriter::new();
        w.tensor("x.weight", dims, ty, data);
        open_bytes(&w.to_bytes()).unwrap_err().to_string()
    };
    assert!(one(&[16], GgmlType::Q8_0, vec![0; 34]).contains("blocks of 32"));
    assert!(one(&[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]).contains("5 dimensions"));
    assert!(one(&[u64::MAX, 4], GgmlType::F32, vec![]).contains("impossible shape"));
    let mut w = GgufWriter::new();
    w.tensor("dup", &[1], GgmlType::F32, vec![0; 4]).tensor("dup", &[1], GgmlType::F32, vec![0; 4]);
    assert!(open_bytes(&w.to_bytes()).unwrap_err().to_string().contains("`dup` appears twice"));
}

/// Set the data offset of `tensor` in GGUF `bytes` (its info: name, rank, dims, type, offset).
fn set_offset(bytes: &mut [u8], tensor: &str, offset: u64) {
    let name = tensor.as_bytes();
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let rank = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let field = at + 4 + 8 * rank + 4;
    bytes[field..field + 8].copy_from_slice(&offset.to_le_bytes());
}

#[test]
fn overlapping_tensor_data_is_refused_naming_both_tensors() {
    let m = tiny_llama(true, "smollm");
    let mut bytes = m.writer.to_bytes();
    assert!(open_bytes(&bytes).is_ok());
    // The norm's data laid over the embedding's first bytes: inside the file, read back as
    // "verified" garbage before.
    set_offset(&mut bytes, "output_norm.weight", 0);
    let err = open_bytes(&bytes).unwrap_err().to_string();
    assert!(err.contains("bad.gguf") && err.contains("overlap"), "{err}");
    assert!(err.contains("`output_norm.weight`") && err.contains("`token_embd.weight`"), "{err}");
}

#[test]
fn unsupported_type_names_tensor_and_type() {
    let mut m = tiny_llama(true, "smollm");
    // Re-type one tensor as Q2_K (id 10): 256 values per 84-byte block; 32 × 32 = 1024 values.
    let t = m.writer.tensors.iter_mut().find(|t| t.name == "blk.1.attn_v.weight").unwrap();
    t.dims = vec![256, 2];
    t.ty = 10;
    t.data = vec![0; 2 * 84];
    match import_writer(&m.writer) {
        Err(Error::GgufTensorType { tensor, ggml_type, .. }) => {
            assert_eq!((tensor.as_str(), ggml_type.as_str()), ("blk.1.attn_v.weight", "Q2_K"));
        }
        other => panic!("{other:?}"),
    }
    // An id ggml does not know at all: still named, and the reader does not choke on it.
    let t = m.writer.tensors.iter_mut().find(|t| t.name == "blk.1.attn_v.weight").unwrap();
    t.ty = 1234;
    let err = import_writer(&m.writer).unwrap_err().to_string();
    assert!(err.contains("`blk.1.attn_v.weight`") && err.contains("type#1234") && err.contains("Q4_1"), "{err}");
}

#[test]
fn unsupported_models() {
    let mut m = tiny_llama(true, "smollm");
    m.writer.kv("general.architecture", s("qwen2"));
    assert!(
        matches!(import_writer(&m.writer), Err(Error::GgufUnsupported { problem, .. }) if problem.contains("qwen2"))
    );

    let mut m = tiny_llama(true, "smollm");
    m.writer.kv("tokenizer.ggml.pre", s("made-up"));
    let err = import_writer(&m.writer).unwrap_err().to_string();
    assert!(err.contains("`made-up` has no known HF equivalent"), "{err}");

    let mut m = tiny_llama(true, "smollm");
    m.writer.kv("tokenizer.ggml.model", s("llama"));
    assert!(import_writer(&m.writer).unwrap_err().to_string().contains("byte-level BPE"));

    let mut m = tiny_llama(true, "smollm");
    m.writer.tensor("rope_freqs.weight", &[4], GgmlType::F32, vec![0; 16]);
    assert!(import_writer(&m.writer).unwrap_err().to_string().contains("rope_freqs.weight"));

    let mut m = tiny_llama(true, "smollm");
    m.writer.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    assert!(import_writer(&m.writer).unwrap_err().to_string().contains("missing tensors: blk.1.ffn_up.weight"));

    let mut m = tiny_llama(true, "smollm");
    m.writer.kv("llama.feed_forward_length", Value::U32(96));
    let err = import_writer(&m.writer).unwrap_err().to_string();
    assert!(err.contains("blk.0.ffn_gate.weight") && err.contains("[96, 32]"), "{err}");

    let mut m = tiny_llama(true, "smollm");
    m.writer.kv("llama.attention.head_count", Value::U32(3));
    assert!(import_writer(&m.writer).unwrap_err().to_string().contains("do not split"));
}

#[test]
fn existing_output_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    tiny_llama(true, "smollm").writer.write(&path);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    let err = import_gguf(&path, &out, ImportOptions::default()).unwrap_err();
    assert!(matches!(err, Error::ImportOutputExists { .. }), "{err}");
    assert!(out.join("keep.txt").exists());
    // --force replaces a previous import only: a directory with a file no import writes is
    // refused (it used to be deleted), and left as it was.
    let err = import_gguf(&path, &out, ImportOptions { force: true }).unwrap_err();
    assert!(matches!(err, Error::ImportOutputForeign { .. }), "{err}");
    assert!(err.to_string().contains("`keep.txt`") && err.to_string().contains("out"), "{err}");
    assert!(out.join("keep.txt").exists());
    std::fs::remove_file(out.join("keep.txt")).unwrap();
    // An empty directory, then a previous import, are replaced.
    import_gguf(&path, &out, ImportOptions { force: true }).unwrap();
    let first = std::fs::read(out.join("model.safetensors")).unwrap();
    // A failing forced import leaves the old directory untouched.
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF").unwrap();
    assert!(import_gguf(&bad, &out, ImportOptions { force: true }).is_err());
    assert_eq!(std::fs::read(out.join("model.safetensors")).unwrap(), first);
    import_gguf(&path, &out, ImportOptions { force: true }).unwrap();
    assert!(out.join("model.safetensors").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn force_never_deletes_a_directory_holding_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("models");
    std::fs::create_dir(&out).unwrap();
    let input = out.join("m.gguf");
    tiny_llama(true, "smollm").writer.write(&input);
    let before = std::fs::read(&input).unwrap();
    let err = import_gguf(&input, &out, ImportOptions { force: true }).unwrap_err().to_string();
    assert!(err.contains("models") && err.contains("holds the input") && err.contains("m.gguf"), "{err}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

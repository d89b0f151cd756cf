//! Every way a dataset can be wrong is refused with an error naming the file, the tensor and the
//! problem: on open (structure), on verify (contents), and on push (bad samples).

use super::common::*;
use aerie_data::Error;
use aerie_data::shard::{HiddenDtype, SampleRef, ShardDataset, ShardWriter, Teacher, names};
use safetensors::Dtype;
use serde_json::json;

const TEACHER: Teacher = Teacher::Both { k: 2 };

type ShardEdit = fn(&mut Tensors, &mut Meta);

/// A valid two-shard dataset (samples of 3, 4 | 5 tokens).
fn dataset() -> TempDir {
    let dir = TempDir::new("validation");
    write(dir.path(), metadata(HiddenDtype::BF16, TEACHER), &samples(0, &[3, 4, 5], TEACHER), 8);
    dir
}

fn shard1(dir: &TempDir) -> std::path::PathBuf {
    dir.join("shard-00001.safetensors")
}

/// Open must fail with a `Tensor` error on `tensor` whose message contains `needle`.
#[track_caller]
fn expect_tensor_error(dir: &TempDir, tensor: &str, needle: &str) {
    match ShardDataset::open(dir.path()) {
        Err(Error::Tensor { path, tensor: t, message }) => {
            assert_eq!(t, tensor, "{message}");
            assert!(message.contains(needle), "`{message}` lacks `{needle}`");
            assert!(path.file_name().unwrap().to_string_lossy().starts_with("shard-"));
        }
        Err(other) => panic!("expected a {tensor} error, got: {other}"),
        Ok(_) => panic!("expected a {tensor} error, opened fine"),
    }
}

#[test]
fn the_error_message_names_file_tensor_and_problem() {
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |t, _| {
        let aux = t.get_mut(names::AUX_HIDDEN).unwrap();
        aux.shape[0] = 4;
        aux.data.truncate(4 * 12 * 2);
    });
    let err = ShardDataset::open(dir.path()).unwrap_err().to_string();
    assert!(err.ends_with("shard-00001.safetensors: aux_hidden: has 4 rows but sample_offsets ends at 5"), "{err}");
}

#[test]
fn structural_problems_in_shards() {
    let cases: &[(&str, &str, ShardEdit)] = &[
        (names::LOSS_MASK, "missing", |t, _| {
            t.remove(names::LOSS_MASK);
        }),
        (names::INPUT_IDS, "has dtype I64, expected I32", |t, _| {
            let ids = t.get_mut(names::INPUT_IDS).unwrap();
            ids.dtype = Dtype::I64;
            ids.data = i64_bytes(&[1, 2, 3, 4, 5]);
        }),
        (names::INPUT_IDS, "manifest.json lists 5", |t, _| {
            let ids = t.get_mut(names::INPUT_IDS).unwrap();
            ids.shape = vec![4];
            ids.data.truncate(16);
        }),
        (names::AUX_HIDDEN, "rows are 8 wide, expected 12 (3 layers × hidden_size 4)", |t, _| {
            let aux = t.get_mut(names::AUX_HIDDEN).unwrap();
            aux.shape = vec![5, 8];
            aux.data.truncate(5 * 8 * 2);
        }),
        (names::AUX_HIDDEN, "has dtype F16, expected BF16", |t, _| {
            t.get_mut(names::AUX_HIDDEN).unwrap().dtype = Dtype::F16;
        }),
        (names::FINAL_HIDDEN, "has shape [20]", |t, _| {
            t.get_mut(names::FINAL_HIDDEN).unwrap().shape = vec![20];
        }),
        (names::SAMPLE_OFFSETS, "ends at 4 but input_ids has 5 tokens", |t, _| {
            t.get_mut(names::SAMPLE_OFFSETS).unwrap().data = i64_bytes(&[0, 4]);
        }),
        (names::SAMPLE_OFFSETS, "starts at 1", |t, _| {
            t.get_mut(names::SAMPLE_OFFSETS).unwrap().data = i64_bytes(&[1, 5]);
        }),
        (names::SAMPLE_OFFSETS, "manifest.json lists 1 samples", |t, _| {
            let offsets = t.get_mut(names::SAMPLE_OFFSETS).unwrap();
            offsets.shape = vec![3];
            offsets.data = i64_bytes(&[0, 2, 5]);
        }),
        (names::TOPK_IDS, "rows are 3 wide, expected 2 (teacher `final-hidden+topk:2`)", |t, _| {
            let ids = t.get_mut(names::TOPK_IDS).unwrap();
            ids.shape = vec![5, 3];
            ids.data = i32_bytes(&[1; 15]);
        }),
        (names::TOPK_LOGPROBS, "missing but the metadata teacher is", |t, _| {
            t.remove(names::TOPK_LOGPROBS);
        }),
        (names::TOPK_LOGPROBS, "has dtype BF16, expected F16 or F32", |t, _| {
            let lp = t.get_mut(names::TOPK_LOGPROBS).unwrap();
            lp.dtype = Dtype::BF16;
            lp.data.truncate(lp.data.len() / 2);
        }),
        (names::TOPK_LOGPROBS, "stored as f16 here but f32 in shard-00000", |t, _| {
            let lp = t.get_mut(names::TOPK_LOGPROBS).unwrap();
            lp.dtype = Dtype::F16;
            lp.data.truncate(lp.data.len() / 2);
        }),
        (names::SAMPLE_IDS, "has shape [2], expected [1]", |t, _| {
            let ids = t.get_mut(names::SAMPLE_IDS).unwrap();
            ids.shape = vec![2];
            ids.data = i64_bytes(&[7, 8]);
        }),
        (names::SAMPLE_IDS, "absent here but present in shard-00000", |t, _| {
            t.remove(names::SAMPLE_IDS);
        }),
    ];
    for (tensor, needle, edit) in cases {
        let dir = dataset();
        rewrite_shard(&shard1(&dir), edit);
        expect_tensor_error(&dir, tensor, needle);
    }
}

#[test]
fn empty_and_decreasing_samples() {
    let dir = TempDir::new("offsets");
    write(dir.path(), metadata(HiddenDtype::F32, TEACHER), &samples(0, &[2, 3, 4], TEACHER), 100);
    let path = dir.join("shard-00000.safetensors");
    rewrite_shard(&path, |t, _| t.get_mut(names::SAMPLE_OFFSETS).unwrap().data = i64_bytes(&[0, 5, 5, 9]));
    expect_tensor_error(&dir, names::SAMPLE_OFFSETS, "sample 1 is empty (offsets 5 then 5)");
    rewrite_shard(&path, |t, _| t.get_mut(names::SAMPLE_OFFSETS).unwrap().data = i64_bytes(&[0, 6, 5, 9]));
    expect_tensor_error(&dir, names::SAMPLE_OFFSETS, "sample 1 has a negative length");
}

#[test]
fn teacher_tensors_must_match_the_declared_teacher() {
    let dir = TempDir::new("teacher");
    let teacher = Teacher::TopK { k: 2 };
    write(dir.path(), metadata(HiddenDtype::F16, teacher), &samples(0, &[3], teacher), 100);
    let path = dir.join("shard-00000.safetensors");
    rewrite_shard(&path, |t, _| {
        let fh = Owned { dtype: Dtype::F16, shape: vec![3, HIDDEN], data: vec![0; 3 * HIDDEN * 2] };
        t.insert(names::FINAL_HIDDEN.into(), fh);
    });
    expect_tensor_error(&dir, names::FINAL_HIDDEN, "present but the metadata teacher is `topk:2`");
}

#[test]
fn metadata_problems_in_shards() {
    // A shard that disagrees with the manifest.
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |_, m| {
        m.insert("target".into(), "another/target".into());
        m.insert("aux_layer_ids".into(), "[1, 3, 4]".into()); // same list, other spelling: fine
    });
    match ShardDataset::open(dir.path()).unwrap_err() {
        Error::MetadataMismatch { path, reference, differences } => {
            assert!(path.ends_with("shard-00001.safetensors"));
            assert!(reference.ends_with("manifest.json"));
            assert_eq!(differences, ["target: `another/target` vs `tiny/target`"]);
        }
        other => panic!("{other}"),
    }

    // Another major format.
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |_, m| {
        m.insert("format".into(), "aerie-shard/3".into());
    });
    let err = ShardDataset::open(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::UnsupportedFormat { found, .. } if found == "aerie-shard/3"), "{err}");

    // No metadata at all, or a malformed key.
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |_, m| m.clear());
    let err = ShardDataset::open(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::Metadata { source, .. } if source.key == "format"), "{err}");
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |_, m| {
        m.insert("teacher".into(), "topk:two".into());
    });
    let err = ShardDataset::open(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::Metadata { source, .. } if source.key == "teacher"), "{err}");
}

#[test]
fn manifest_problems() {
    type ManifestEdit = fn(&mut serde_json::Value);
    let cases: &[(&str, ManifestEdit)] = &[
        ("unsupported format `aerie-shard/3`", |m| m["format"] = json!("aerie-shard/3")),
        ("unsupported format `aerie-shard/3`", |m| m["metadata"]["format"] = json!("aerie-shard/3")),
        ("shards add up to 3 / 12", |m| m["samples"] = json!(4)),
        ("is not a plain file name", |m| m["shards"][0]["file"] = json!("../shard-00000.safetensors")),
        ("is listed twice", |m| m["shards"][1]["file"] = json!("shard-00000.safetensors")),
        ("6 masked tokens out of 5", |m| m["shards"][1]["masked_tokens"] = json!(6)),
        ("metadata `hidden_size`: missing", |m| {
            m["metadata"].as_object_mut().unwrap().remove("hidden_size");
        }),
        ("unexpected structure", |m| m["shards"] = json!("all of them")),
    ];
    for (needle, edit) in cases {
        let dir = dataset();
        edit_manifest(dir.path(), edit);
        let err = ShardDataset::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("manifest.json"), "{err}");
        assert!(err.contains(needle), "`{err}` lacks `{needle}`");
    }
    let dir = TempDir::new("no-manifest");
    let err = ShardDataset::open(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::Manifest { path, .. } if path.ends_with("manifest.json")), "{err}");
    assert!(err.to_string().contains("is not a capture shard directory"), "{err}");
}

#[test]
fn unreadable_shard_files() {
    let dir = dataset();
    std::fs::remove_file(shard1(&dir)).unwrap();
    let err = ShardDataset::open(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::Io { path, .. } if path.ends_with("shard-00001.safetensors")), "{err}");

    for garbage in [&b"tiny"[..], &[0xffu8; 64][..], b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}       "] {
        let dir = dataset();
        std::fs::write(shard1(&dir), garbage).unwrap();
        let err = ShardDataset::open(dir.path()).unwrap_err();
        assert!(matches!(&err, Error::Safetensors { path, .. } if path.ends_with("shard-00001.safetensors")), "{err}");
    }
}

#[test]
fn duplicate_sample_ids_across_shards() {
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |t, _| t.get_mut(names::SAMPLE_IDS).unwrap().data = i64_bytes(&[1]));
    match ShardDataset::open(dir.path()).unwrap_err() {
        Error::DuplicateSampleId { path, first, id } => {
            assert_eq!(id, 1);
            assert!(path.ends_with("shard-00001.safetensors"));
            assert!(first.ends_with("shard-00000.safetensors"));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn verify_reads_every_value() {
    let cases: &[(&str, &str, ShardEdit)] = &[
        (names::INPUT_IDS, "input_ids[2] = 1000 is outside", |t, _| {
            t.get_mut(names::INPUT_IDS).unwrap().data[8..12].copy_from_slice(&1000i32.to_le_bytes());
        }),
        (names::LOSS_MASK, "loss_mask[0] = 7", |t, _| t.get_mut(names::LOSS_MASK).unwrap().data[0] = 7),
        (names::LOSS_MASK, "manifest.json lists 3 masked tokens", |t, _| {
            t.get_mut(names::LOSS_MASK).unwrap().data[0] = 1;
        }),
        (names::TOPK_LOGPROBS, "row 0 is not descending", |t, _| {
            let lp = t.get_mut(names::TOPK_LOGPROBS).unwrap();
            lp.data[..8].copy_from_slice(&[(-2.0f32).to_le_bytes(), (-1.0f32).to_le_bytes()].concat());
        }),
        (names::AUX_HIDDEN, "aux_hidden: [1, 0] = NaN is not finite", |t, _| {
            let aux = t.get_mut(names::AUX_HIDDEN).unwrap();
            aux.data[24..26].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        }),
    ];
    for (tensor, needle, edit) in cases {
        let dir = dataset();
        rewrite_shard(&shard1(&dir), edit);
        edit_manifest(dir.path(), |m| {
            m["shards"][1]["sha256"].take();
        });
        let dataset = ShardDataset::open(dir.path()).unwrap();
        match dataset.verify().unwrap_err() {
            Error::Tensor { tensor: t, message, path } => {
                assert_eq!(&t, tensor);
                assert!(format!("{t}: {message}").contains(needle), "`{message}` lacks `{needle}`");
                assert!(path.ends_with("shard-00001.safetensors"));
            }
            other => panic!("{other}"),
        }
    }
    // With the checksum left in place, the first thing verify notices is the checksum.
    let dir = dataset();
    rewrite_shard(&shard1(&dir), |t, _| t.get_mut(names::LOSS_MASK).unwrap().data[0] = 1);
    let err = ShardDataset::open(dir.path()).unwrap().verify().unwrap_err();
    assert!(matches!(&err, Error::Checksum { path, .. } if path.ends_with("shard-00001.safetensors")), "{err}");
}

#[test]
fn bad_samples_are_refused_whole() {
    let dir = TempDir::new("push");
    let mut writer = ShardWriter::create(dir.path(), metadata(HiddenDtype::F16, TEACHER), options(100)).unwrap();
    let good = Sample::new(1, 3, TEACHER);
    let mut nan_aux = good.clone();
    nan_aux.aux[13] = f32::NAN;
    let mut big_final = good.clone();
    big_final.final_hidden.as_mut().unwrap()[5] = 1e6;
    let mut bad_id = good.clone();
    bad_id.input_ids[1] = VOCAB as i32;
    let mut bad_mask = good.clone();
    bad_mask.loss_mask[2] = 2;
    let mut ascending = good.clone();
    ascending.topk_logprobs[..2].copy_from_slice(&[-3.0, -1.0]);
    let mut bad_topk_id = good.clone();
    bad_topk_id.topk_ids[0] = -5;
    let cases: Vec<(SampleRef<'_>, &str)> = vec![
        (SampleRef::new(&[], &[], &[] as &[f32]), "has no tokens"),
        (SampleRef { loss_mask: &good.loss_mask[..2], ..good.as_ref() }, "loss_mask has 2 entries but input_ids has 3"),
        (
            SampleRef { aux_hidden: (&good.aux[..30]).into(), ..good.as_ref() },
            "aux_hidden has 30 values, expected 3 tokens × 12",
        ),
        (SampleRef { final_hidden: None, ..good.as_ref() }, "final_hidden missing"),
        (SampleRef { topk: None, ..good.as_ref() }, "top-k teacher missing"),
        (good.as_ref().with_topk(&good.topk_ids[..4], &good.topk_logprobs), "teacher_topk_ids has 4 values"),
        (nan_aux.as_ref(), "aux_hidden[1, 1] is not finite as f16"),
        (big_final.as_ref(), "final_hidden[1, 1] is not finite as f16"),
        (bad_id.as_ref(), "input_ids[1] = 1000 is outside"),
        (bad_mask.as_ref(), "loss_mask[2] = 2"),
        (ascending.as_ref(), "row 0 is not descending"),
        (bad_topk_id.as_ref(), "teacher_topk_ids[0] = -5"),
    ];
    for (sample, needle) in cases {
        let err = writer.push(sample).unwrap_err();
        assert!(matches!(err, Error::Sample { index: 0, .. }), "{err}");
        assert!(err.to_string().contains(needle), "`{err}` lacks `{needle}`");
        assert_eq!((writer.samples_written(), writer.pending_tokens()), (0, 0));
    }
    writer.push(good.as_ref()).unwrap();
    let err = writer.push(good.as_ref()).unwrap_err();
    assert!(err.to_string().starts_with("sample #1 (id 1): sample id 1 was already written"), "{err}");
    writer.finish().unwrap();
    let dataset = ShardDataset::open(dir.path()).unwrap();
    assert_eq!(dataset.len(), 1);
    dataset.verify().unwrap();

    // A teacher the metadata does not declare.
    let dir = TempDir::new("push-teacher");
    let mut writer =
        ShardWriter::create(dir.path(), metadata(HiddenDtype::F16, Teacher::FinalHidden), options(100)).unwrap();
    let err = writer.push(good.as_ref()).unwrap_err();
    assert!(err.to_string().contains("top-k teacher given but the teacher is `final-hidden`"), "{err}");
}

#[test]
fn bad_writer_setup() {
    let dir = TempDir::new("setup");
    let err = ShardWriter::create(dir.path(), metadata(HiddenDtype::F16, TEACHER), options(0)).unwrap_err();
    assert!(matches!(err, Error::Options(_)), "{err}");
    let mut meta = metadata(HiddenDtype::F16, TEACHER);
    meta.tokenizer_digest = "not a digest".into();
    let err = ShardWriter::create(dir.path(), meta, options(10)).unwrap_err();
    assert!(matches!(&err, Error::Metadata { source, .. } if source.key == "tokenizer_digest"), "{err}");
    // A directory holding stray shard files is not a fresh dataset.
    std::fs::write(dir.join("shard-00000.safetensors"), b"").unwrap();
    let err = ShardWriter::create(dir.path(), metadata(HiddenDtype::F16, TEACHER), options(10)).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
}

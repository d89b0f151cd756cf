//! Crash safety: an interrupted capture leaves only complete shards and a manifest naming them;
//! resuming deletes the leftovers, reports what is done, and appends without corrupting data.

use super::common::*;
use aerie_data::Error;
use aerie_data::shard::{HiddenDtype, ShardDataset, ShardWriter, Teacher};

const TEACHER: Teacher = Teacher::Both { k: 2 };

/// Push `all` until the writer has closed two shards and holds a partial third, then "crash".
fn interrupted_capture(dir: &std::path::Path, all: &[Sample]) -> u64 {
    let mut writer = ShardWriter::create(dir, metadata(HiddenDtype::BF16, TEACHER), options(10)).unwrap();
    for s in all {
        writer.push(s.as_ref()).unwrap();
        if writer.manifest().shards.len() == 2 && writer.pending_tokens() > 0 {
            break;
        }
    }
    let committed = writer.manifest().samples;
    assert!(writer.samples_written() > committed, "a shard was being filled");
    drop(writer); // the pending shard is lost, as in a crash
    committed
}

#[test]
fn resume_after_a_crash_ignores_leftovers_and_completes() {
    let dir = TempDir::new("resume");
    let all = samples(1000, &[4, 5, 3, 6, 2, 7, 4, 4, 9, 1], TEACHER);
    let committed = interrupted_capture(dir.path(), &all);

    // What a crash can leave: a half-written temp shard, a complete shard whose manifest update
    // never happened, and a temp manifest.
    std::fs::write(dir.join(".tmp-shard-00002.safetensors"), b"half a shard").unwrap();
    std::fs::copy(dir.join("shard-00000.safetensors"), dir.join("shard-00002.safetensors")).unwrap();
    std::fs::write(dir.join(".tmp-manifest.json"), b"{\"format\":").unwrap();
    // Readers never look at unlisted files.
    let before = ShardDataset::open(dir.path()).unwrap();
    assert_eq!(before.len() as u64, committed);
    drop(before);

    let (mut writer, info) = ShardWriter::resume(dir.path(), options(10)).unwrap();
    assert_eq!(info.shards, 2);
    assert_eq!(info.samples, committed);
    let mut removed: Vec<String> =
        info.removed.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    removed.sort();
    assert_eq!(removed, [".tmp-manifest.json", ".tmp-shard-00002.safetensors", "shard-00002.safetensors"]);
    for s in &all {
        let id = s.sample_id.unwrap();
        let done = (id - 1000) < committed as i64;
        assert_eq!(writer.contains_sample_id(id), done, "sample {id}");
        if !done {
            writer.push(s.as_ref()).unwrap();
        }
    }
    let manifest = writer.finish().unwrap();
    assert_eq!(manifest.samples, all.len() as u64);

    let dataset = ShardDataset::open(dir.path()).unwrap();
    let ids: Vec<i64> = dataset.iter().map(|v| v.sample_id().unwrap()).collect();
    assert_eq!(ids, (1000..1010).collect::<Vec<_>>());
    for (view, s) in dataset.iter().zip(&all) {
        assert_eq!(&*view.input_ids(), &s.input_ids[..]);
        assert_eq!(&*view.topk().unwrap().ids(), &s.topk_ids[..]);
    }
    dataset.verify().unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(names.is_empty(), "no temp files left: {names:?}");
}

#[test]
fn a_crash_before_the_first_shard_resumes_empty() {
    let dir = TempDir::new("resume-empty");
    let all = samples(0, &[3, 3], TEACHER);
    let mut writer = ShardWriter::create(dir.path(), metadata(HiddenDtype::F32, TEACHER), options(100)).unwrap();
    writer.push(all[0].as_ref()).unwrap();
    drop(writer);
    let (mut writer, info) = ShardWriter::resume(dir.path(), options(100)).unwrap();
    assert_eq!((info.shards, info.samples), (0, 0));
    assert!(!writer.contains_sample_id(0));
    for s in &all {
        writer.push(s.as_ref()).unwrap();
    }
    assert_eq!(writer.finish().unwrap().samples, 2);
}

#[test]
fn resumed_writers_refuse_repeated_ids_and_mixed_id_use() {
    let dir = TempDir::new("resume-ids");
    let all = samples(0, &[3, 3], TEACHER);
    write(dir.path(), metadata(HiddenDtype::F32, TEACHER), &all[..1], 100);
    let (mut writer, _) = ShardWriter::resume(dir.path(), options(100)).unwrap();
    let err = writer.push(all[0].as_ref()).unwrap_err();
    assert!(matches!(&err, Error::Sample { index: 1, sample_id: Some(0), .. }), "{err}");
    assert!(err.to_string().contains("already written"), "{err}");
    let mut anonymous = all[1].clone();
    anonymous.sample_id = None;
    let err = writer.push(anonymous.as_ref()).unwrap_err();
    assert!(err.to_string().contains("has no sample_id"), "{err}");
    writer.push(all[1].as_ref()).unwrap();
    writer.finish().unwrap();
}

#[test]
fn open_or_create_checks_metadata_but_not_created_by() {
    let dir = TempDir::new("open-or-create");
    let meta = metadata(HiddenDtype::BF16, TEACHER);
    let all = samples(0, &[3, 4, 5], TEACHER);
    let (mut writer, info) = ShardWriter::open_or_create(dir.path(), meta.clone(), options(4)).unwrap();
    assert!(info.is_none());
    writer.push(all[0].as_ref()).unwrap();
    writer.push(all[1].as_ref()).unwrap();
    drop(writer);

    let newer = aerie_data::shard::ShardMetadata { created_by: "a newer build".into(), ..meta.clone() };
    let (mut writer, info) = ShardWriter::open_or_create(dir.path(), newer, options(4)).unwrap();
    assert_eq!(info.unwrap().samples, 2);
    assert_eq!(writer.metadata().created_by, "aerie-data tests");
    writer.push(all[2].as_ref()).unwrap();
    writer.finish().unwrap();

    let other = aerie_data::shard::ShardMetadata { hidden_size: 8, ..meta };
    let err = ShardWriter::open_or_create(dir.path(), other, options(4)).unwrap_err();
    match &err {
        Error::MetadataMismatch { differences, .. } => {
            assert_eq!(differences, &["hidden_size: `8` vs `4`".to_string()]);
        }
        other => panic!("{other}"),
    }
    assert_eq!(ShardDataset::open(dir.path()).unwrap().len(), 3);
}

#[test]
fn one_writer_per_directory() {
    let dir = TempDir::new("lock");
    let meta = metadata(HiddenDtype::BF16, TEACHER);
    let writer = ShardWriter::create(dir.path(), meta.clone(), options(4)).unwrap();
    let err = ShardWriter::resume(dir.path(), options(4)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    // A reader is not a writer: it may follow a capture in progress.
    assert!(ShardDataset::open(dir.path()).unwrap().is_empty());
    writer.finish().unwrap();
    let err = ShardWriter::create(dir.path(), meta, options(4)).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    let (writer, _) = ShardWriter::resume(dir.path(), options(4)).unwrap();
    drop(writer);
}

#[test]
fn resume_needs_a_dataset() {
    let dir = TempDir::new("resume-nothing");
    let err = ShardWriter::resume(dir.path(), options(4)).unwrap_err();
    assert!(matches!(&err, Error::Io { path, .. } if path.ends_with("manifest.json")), "{err}");
}

//! Write then read: every storage dtype with every teacher kind, shard rotation, zero-copy
//! access, and a header check that shards are standard safetensors files.

use std::borrow::Cow;

use super::common::*;
use aerie_data::Error;
use aerie_data::shard::{HiddenDtype, ShardDataset, Teacher, names};

fn check_sample(view: &aerie_data::shard::SampleView<'_>, s: &Sample, dtype: HiddenDtype) {
    assert_eq!(&*view.input_ids(), &s.input_ids[..]);
    assert_eq!(view.loss_mask(), &s.loss_mask[..]);
    assert_eq!(view.sample_id(), s.sample_id);
    assert_eq!(view.len(), s.input_ids.len());
    let aux = view.aux_hidden();
    assert_eq!((aux.rows(), aux.width(), aux.dtype()), (view.len(), LAYERS * HIDDEN, dtype));
    let expected: Vec<f32> = s.aux.iter().map(|&x| quantize(x, dtype)).collect();
    assert_eq!(&*aux.to_f32(), &expected[..]);
    let mut buf = vec![0f32; expected.len()];
    aux.decode_into(&mut buf).unwrap();
    assert_eq!(buf, expected);
    match (&s.final_hidden, view.final_hidden()) {
        (Some(f), Some(rows)) => {
            let expected: Vec<f32> = f.iter().map(|&x| quantize(x, dtype)).collect();
            assert_eq!(rows.width(), HIDDEN);
            assert_eq!(&*rows.to_f32(), &expected[..]);
        }
        (None, None) => {}
        (f, rows) => panic!("final_hidden: wrote {:?}, read {:?}", f.is_some(), rows.is_some()),
    }
    match view.topk() {
        Some(topk) => {
            assert_eq!(topk.rows(), view.len());
            assert_eq!(&*topk.ids(), &s.topk_ids[..]);
            assert_eq!(topk.logprobs_dtype(), aerie_data::shard::FloatDtype::F32);
            assert_eq!(&*topk.logprobs(), &s.topk_logprobs[..]);
        }
        None => assert!(s.topk_ids.is_empty()),
    }
}

#[test]
fn round_trip_every_dtype_and_teacher() {
    let teachers = [Teacher::FinalHidden, Teacher::TopK { k: 3 }, Teacher::Both { k: 5 }];
    for dtype in [HiddenDtype::F32, HiddenDtype::F16, HiddenDtype::BF16] {
        for teacher in teachers {
            let dir = TempDir::new("roundtrip");
            let written = samples(100, &[5, 1, 17, 8, 3, 30], teacher);
            let manifest = write(dir.path(), metadata(dtype, teacher), &written, 32);
            assert_eq!(manifest.samples, 6);
            assert_eq!(manifest.tokens, 64);
            let masked: u64 = written.iter().map(Sample::masked).sum();
            assert_eq!(manifest.masked_tokens(), masked);

            let dataset = ShardDataset::open(dir.path()).unwrap();
            assert_eq!(dataset.len(), 6);
            assert_eq!(dataset.num_tokens(), 64);
            assert_eq!(dataset.metadata(), &metadata(dtype, teacher));
            assert!(dataset.has_sample_ids());
            for (view, s) in dataset.iter().zip(&written) {
                check_sample(&view, s, dtype);
            }
            assert!(dataset.sample(6).is_none());
            let report = dataset.verify().unwrap();
            assert_eq!(report.samples, 6);
            assert_eq!(report.masked_tokens, masked);
            assert_eq!(report.checksums, dataset.num_shards());
        }
    }
}

#[test]
fn native_half_inputs_are_stored_bit_for_bit() {
    let dir = TempDir::new("native");
    let meta = metadata(HiddenDtype::BF16, Teacher::FinalHidden);
    let s = Sample::new(1, 4, Teacher::FinalHidden);
    let aux: Vec<half::bf16> = s.aux.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let last: Vec<half::f16> = s.final_hidden.as_ref().unwrap().iter().map(|&x| half::f16::from_f32(x)).collect();
    let mut writer = aerie_data::shard::ShardWriter::create(dir.path(), meta, options(100)).unwrap();
    let sample = aerie_data::shard::SampleRef::new(&s.input_ids, &s.loss_mask, &aux[..]).with_final_hidden(&last[..]);
    writer.push(sample).unwrap();
    writer.finish().unwrap();
    let dataset = ShardDataset::open(dir.path()).unwrap();
    let view = dataset.sample(0).unwrap();
    assert_eq!(view.aux_hidden().as_bytes(), bytemuck::cast_slice::<_, u8>(&aux));
    let back: Vec<f32> = last.iter().map(|x| half::bf16::from_f32(x.to_f32()).to_f32()).collect();
    assert_eq!(&*view.final_hidden().unwrap().to_f32(), &back[..]);
    assert_eq!(view.sample_id(), None);
    assert!(!dataset.has_sample_ids());
}

#[test]
fn f32_reads_borrow_the_mapped_pages() {
    let dir = TempDir::new("zerocopy");
    let teacher = Teacher::Both { k: 2 };
    let written = samples(0, &[3, 9], teacher);
    write(dir.path(), metadata(HiddenDtype::F32, teacher), &written, 100);
    let dataset = ShardDataset::open(dir.path()).unwrap();
    let view = dataset.sample(1).unwrap();
    let aux = view.aux_hidden();
    let direct = aux.as_f32().expect("aligned f32 is readable in place");
    assert_eq!(direct.as_ptr() as *const u8, aux.as_bytes().as_ptr());
    assert!(matches!(aux.to_f32(), Cow::Borrowed(_)));
    assert!(matches!(view.input_ids(), Cow::Borrowed(_)));
    assert!(matches!(view.topk().unwrap().ids(), Cow::Borrowed(_)));
    assert!(matches!(view.topk().unwrap().logprobs(), Cow::Borrowed(_)));

    let window = aux.slice_rows(2..5).unwrap();
    assert_eq!(window.rows(), 3);
    assert_eq!(window.as_f32().unwrap(), &written[1].aux[2 * 12..5 * 12]);
    assert!(aux.slice_rows(5..10).is_none());
    let mut short = vec![0f32; 5];
    assert!(matches!(aux.decode_into(&mut short), Err(Error::BufferLength { expected: 108, found: 5, .. })));
}

#[test]
fn shards_rotate_at_shard_tokens() {
    let dir = TempDir::new("rotate");
    let teacher = Teacher::FinalHidden;
    let written = samples(0, &[4, 4, 4, 12, 3, 10, 2], teacher);
    let manifest = write(dir.path(), metadata(HiddenDtype::F16, teacher), &written, 10);
    let tokens: Vec<u64> = manifest.shards.iter().map(|s| s.tokens).collect();
    // 4+4 | 4 (12 would not fit) | 12 alone (longer than a shard) | 3 | 10 (full) | 2 (finish).
    assert_eq!(tokens, [8, 4, 12, 3, 10, 2]);
    let files: Vec<&str> = manifest.shards.iter().map(|s| s.file.as_str()).collect();
    assert_eq!(files[0], "shard-00000.safetensors");
    assert_eq!(files[5], "shard-00005.safetensors");
    let dataset = ShardDataset::open(dir.path()).unwrap();
    assert_eq!(dataset.num_shards(), 6);
    for (view, s) in dataset.iter().rev().zip(written.iter().rev()) {
        check_sample(&view, s, HiddenDtype::F16);
    }
    assert_eq!((&dataset).into_iter().len(), 7);
    assert_eq!(dataset.sample(3).unwrap().shard_path().file_name().unwrap(), "shard-00002.safetensors");
}

#[test]
fn an_empty_dataset_opens() {
    let dir = TempDir::new("empty");
    let writer = aerie_data::shard::ShardWriter::create(
        dir.path(),
        metadata(HiddenDtype::BF16, Teacher::FinalHidden),
        options(10),
    )
    .unwrap();
    let manifest = writer.finish().unwrap();
    assert!(manifest.shards.is_empty());
    let dataset = ShardDataset::open(dir.path()).unwrap();
    assert!(dataset.is_empty());
    assert_eq!(dataset.iter().count(), 0);
}

/// Python's `safetensors` is not installed here, so check the layout that any reader relies on
/// by hand, and with the `safetensors` crate (the same parser the Python package wraps).
#[test]
fn shards_are_standard_safetensors() {
    let dir = TempDir::new("standard");
    let teacher = Teacher::Both { k: 3 };
    write(dir.path(), metadata(HiddenDtype::BF16, teacher), &samples(7, &[5, 6], teacher), 100);
    let bytes = std::fs::read(dir.join("shard-00000.safetensors")).unwrap();

    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(n % 8, 0, "header padded to 8 bytes");
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let header = header.as_object().unwrap();
    let meta = header["__metadata__"].as_object().unwrap();
    assert_eq!(meta["format"], "aerie-shard/1");
    assert_eq!(meta["teacher"], "final-hidden+topk:3");
    assert_eq!(meta["aux_layer_ids"], "[1,3,4]");
    assert!(meta.values().all(|v| v.is_string()), "metadata values are strings");
    let mut spans = Vec::new();
    for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let offsets = info["data_offsets"].as_array().unwrap();
        let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
        let size = match info["dtype"].as_str().unwrap() {
            "I64" => 8,
            "I32" | "F32" => 4,
            "BF16" | "F16" => 2,
            "U8" => 1,
            other => panic!("{name}: unexpected dtype {other}"),
        };
        let numel: u64 = info["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).product();
        assert_eq!(end - start, numel as usize * size, "{name}");
        assert_eq!((8 + n + start) % size, 0, "{name} aligned in the file");
        spans.push((start, end));
    }
    spans.sort();
    assert_eq!(spans[0].0, 0);
    assert!(spans.windows(2).all(|w| w[0].1 == w[1].0), "contiguous data");
    assert_eq!(8 + n + spans.last().unwrap().1, bytes.len());

    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let expect = [
        (names::INPUT_IDS, safetensors::Dtype::I32, vec![11]),
        (names::LOSS_MASK, safetensors::Dtype::U8, vec![11]),
        (names::SAMPLE_OFFSETS, safetensors::Dtype::I64, vec![3]),
        (names::AUX_HIDDEN, safetensors::Dtype::BF16, vec![11, 12]),
        (names::FINAL_HIDDEN, safetensors::Dtype::BF16, vec![11, 4]),
        (names::TOPK_IDS, safetensors::Dtype::I32, vec![11, 3]),
        (names::TOPK_LOGPROBS, safetensors::Dtype::F32, vec![11, 3]),
        (names::SAMPLE_IDS, safetensors::Dtype::I64, vec![2]),
    ];
    assert_eq!(st.len(), expect.len());
    for (name, dtype, shape) in expect {
        let t = st.tensor(name).unwrap();
        assert_eq!((t.dtype(), t.shape()), (dtype, &shape[..]), "{name}");
    }
    let offsets: Vec<i64> = st
        .tensor(names::SAMPLE_OFFSETS)
        .unwrap()
        .data()
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(offsets, [0, 5, 11]);

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "aerie-shard/1");
    assert_eq!(manifest["metadata"], serde_json::Value::Object(meta.clone()));
    assert_eq!(manifest["shards"][0]["sha256"].as_str().unwrap().len(), 64);
}

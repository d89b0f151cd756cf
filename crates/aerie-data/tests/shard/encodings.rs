//! The compact encodings of format 2 (fp8-e4m3, int4): round trips within each encoding's
//! documented error bound computed against the f32 input, format versioning, re-encoding with
//! `convert` (and its resume), the fused batch decode, and every bad-input case of the scales,
//! each an error naming the file.

use super::common::*;
use aerie_data::shard::batch::{TeacherRows, gather};
use aerie_data::shard::{
    ConvertOptions, FORMAT, FORMAT_V2, HiddenDtype, INT4_GROUP, Manifest, SampleRef, ShardDataset, ShardMetadata,
    ShardWriter, Teacher, convert, names,
};
use safetensors::Dtype;

/// Wide enough for two int4 groups per layer row.
const HT: usize = 64;
const A: usize = 3;
const TEACHER: Teacher = Teacher::Both { k: 4 };

fn meta(dtype: HiddenDtype, teacher: Teacher) -> ShardMetadata {
    ShardMetadata { hidden_size: HT, dtype, teacher, ..metadata(HiddenDtype::BF16, teacher) }
}

/// Rows shaped like residual streams: mostly small values, a few large outliers per layer, and
/// per-token magnitudes varying over two decades.
fn features(seed: u64, rows: usize, width: usize) -> Vec<f32> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    (0..rows * width)
        .map(|i| {
            let token_scale = 10f32.powf(((i / width) % 5) as f32 / 2.0 - 1.0);
            let v = next();
            if i % 61 == 7 { 80.0 * v * token_scale } else { v * token_scale }
        })
        .collect()
}

struct Capture {
    ids: Vec<i32>,
    mask: Vec<u8>,
    aux: Vec<f32>,
    fin: Vec<f32>,
    topk_ids: Vec<i32>,
    topk_lp: Vec<f32>,
    id: i64,
}

fn capture(seed: u64, len: usize) -> Capture {
    Capture {
        ids: (0..len).map(|i| ((seed as usize * 31 + i * 7) % VOCAB) as i32).collect(),
        mask: (0..len).map(|i| u8::from(i % 4 != 0)).collect(),
        aux: features(seed, len, A * HT),
        fin: features(seed + 1000, len, HT),
        topk_ids: (0..len * 4).map(|i| (i % VOCAB) as i32).collect(),
        topk_lp: (0..len).flat_map(|_| [-0.1f32, -1.0, -2.5, -4.0]).collect(),
        id: seed as i64,
    }
}

impl Capture {
    fn as_ref(&self) -> SampleRef<'_> {
        let mut s = SampleRef::new(&self.ids, &self.mask, &self.aux).with_final_hidden(&self.fin);
        s = s.with_topk(&self.topk_ids, &self.topk_lp);
        s.with_sample_id(self.id)
    }
}

fn captures() -> Vec<Capture> {
    [9, 1, 14, 5, 3].iter().enumerate().map(|(i, &len)| capture(i as u64, len)).collect()
}

fn write_dataset(dir: &std::path::Path, dtype: HiddenDtype, shard_tokens: usize) -> Manifest {
    let mut writer = ShardWriter::create(dir, meta(dtype, TEACHER), options(shard_tokens)).unwrap();
    for c in captures() {
        writer.push(c.as_ref()).unwrap();
    }
    writer.finish().unwrap()
}

/// Every decoded value within `dtype`'s bound of the f32 it was captured from, groups of
/// `group` values sharing their amax.
fn assert_within_bound(dtype: HiddenDtype, x: &[f32], y: &[f32], group: usize, what: &str) {
    assert_eq!(x.len(), y.len());
    let mut worst = 0f32;
    for (g, (xs, ys)) in x.chunks(group).zip(y.chunks(group)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (j, (&a, &b)) in xs.iter().zip(ys).enumerate() {
            let bound = dtype.error_bound(a, amax);
            assert!((a - b).abs() <= bound, "{dtype} {what} group {g}[{j}]: {a} → {b} (bound {bound})");
            worst = worst.max((a - b).abs() / amax.max(f32::MIN_POSITIVE));
        }
    }
    // The bound is not vacuous: the encodings do lose precision, and not more than a code step.
    if dtype.is_scaled() {
        assert!(worst > 0.0, "{dtype}: suspiciously exact");
    }
}

#[test]
fn scaled_round_trips_stay_within_the_documented_bound() {
    for dtype in HiddenDtype::ALL {
        let dir = TempDir::new("enc-roundtrip");
        let manifest = write_dataset(dir.path(), dtype, 16);
        assert_eq!(manifest.format, dtype.format());
        assert!(manifest.shards.len() > 1);
        let dataset = ShardDataset::open(dir.path()).unwrap();
        dataset.verify().unwrap();
        let group = dtype.group(HT).unwrap_or(HT);
        for (view, c) in dataset.iter().zip(captures()) {
            let aux = view.aux_hidden();
            assert_eq!((aux.rows(), aux.width(), aux.dtype()), (c.ids.len(), A * HT, dtype));
            assert_within_bound(dtype, &c.aux, &aux.to_f32(), group, "aux_hidden");
            let fin = view.final_hidden().unwrap();
            assert_within_bound(dtype, &c.fin, &fin.to_f32(), group, "final_hidden");
            assert_eq!(aux.scales().map(|s| s.len()), dtype.is_scaled().then(|| c.ids.len() * A * HT / group));
            // A window of rows decodes to the same values as the whole sample.
            if aux.rows() > 3 {
                let whole = aux.to_f32();
                let part = aux.slice_rows(1..3).unwrap();
                assert_eq!(&*part.to_f32(), &whole[A * HT..3 * A * HT]);
            }
        }
        // Bytes per token as documented: the files hold exactly that plus headers and offsets.
        let bytes: u64 =
            manifest.shards.iter().map(|s| std::fs::metadata(dir.join(&s.file)).unwrap().len()).sum::<u64>();
        let per_token = meta(dtype, TEACHER).bytes_per_token() as u64;
        let overhead = bytes - per_token * manifest.tokens;
        assert!(overhead < 4096 * manifest.shards.len() as u64, "{dtype}: {bytes} bytes vs {per_token}/token");
    }
}

#[test]
fn compact_encodings_are_smaller_and_declare_format_2() {
    let sizes: Vec<usize> =
        HiddenDtype::ALL.iter().map(|&d| meta(d, Teacher::TopK { k: 4 }).bytes_per_token()).collect();
    // f32, f16, bf16, fp8, int4: 5 + A·Ht·s (+ scales) + 8·K.
    assert_eq!(sizes, [5 + 768 + 32, 5 + 384 + 32, 5 + 384 + 32, 5 + 192 + 12 + 32, 5 + 96 + 24 + 32]);
    let dir = TempDir::new("enc-format");
    write_dataset(dir.path(), HiddenDtype::Fp8E4m3, 100);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], FORMAT_V2);
    assert_eq!(manifest["metadata"]["format"], FORMAT_V2);
    let bytes = std::fs::read(dir.join("shard-00000.safetensors")).unwrap();
    let (_, info) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(info.metadata().as_ref().unwrap()["format"], FORMAT_V2);
    assert_eq!(info.info(names::AUX_HIDDEN).unwrap().dtype, Dtype::F8_E4M3);
    assert_eq!(info.info(names::AUX_HIDDEN_SCALES).unwrap().shape, [9 + 1 + 14 + 5 + 3, A]);
    assert_eq!(info.info(names::FINAL_HIDDEN_SCALES).unwrap().shape, [32, 1]);
    // Plain floats keep format 1, so that every existing reader reads them.
    let dir = TempDir::new("enc-format1");
    assert_eq!(write_dataset(dir.path(), HiddenDtype::BF16, 100).format, FORMAT);
}

#[test]
fn convert_re_encodes_and_resumes_byte_identically() {
    let src = TempDir::new("conv-src");
    write_dataset(src.path(), HiddenDtype::BF16, 12);
    let opts = |dtype| ConvertOptions { dtype, teacher: None, checksums: true };
    let out = TempDir::new("conv-out");
    let fp8 = out.join("fp8");
    let report = convert(src.path(), &fp8, &opts(HiddenDtype::Fp8E4m3), &mut |_, _| {}).unwrap();
    assert_eq!((report.shards, report.resumed_shards, report.converted_samples), (3, 0, 5));
    assert!(report.dst_bytes_per_token() < 0.7 * report.src_bytes_per_token(), "{report:?}");
    let (a, b) = (ShardDataset::open(src.path()).unwrap(), ShardDataset::open(&fp8).unwrap());
    b.verify().unwrap();
    assert_eq!(b.metadata().dtype, HiddenDtype::Fp8E4m3);
    assert_eq!(b.manifest().shards.iter().map(|s| s.samples).collect::<Vec<_>>(), [2, 1, 2]);
    for (x, y) in a.iter().zip(b.iter()) {
        assert_eq!((x.input_ids(), x.loss_mask(), x.sample_id()), (y.input_ids(), y.loss_mask(), y.sample_id()));
        assert_within_bound(HiddenDtype::Fp8E4m3, &x.aux_hidden().to_f32(), &y.aux_hidden().to_f32(), HT, "aux");
        assert_eq!(x.topk().unwrap().logprobs(), y.topk().unwrap().logprobs());
    }

    // Interrupted after its first shard (the state a kill -9 leaves: a committed prefix and a
    // stray temp file), a rerun finishes to the same bytes.
    let partial = out.join("partial");
    convert(src.path(), &partial, &opts(HiddenDtype::Fp8E4m3), &mut |_, _| {}).unwrap();
    let manifest = |dir: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
    };
    let mut m = manifest(&partial);
    let dropped: Vec<serde_json::Value> = m["shards"].as_array_mut().unwrap().drain(1..).collect();
    m["samples"] = m["shards"][0]["samples"].clone();
    m["tokens"] = m["shards"][0]["tokens"].clone();
    std::fs::write(partial.join("manifest.json"), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    std::fs::write(partial.join(".tmp-shard-00001.safetensors"), b"half a shard").unwrap();
    assert_eq!(dropped.len(), 2);
    let report = convert(src.path(), &partial, &opts(HiddenDtype::Fp8E4m3), &mut |_, _| {}).unwrap();
    assert_eq!((report.resumed_shards, report.converted_samples), (1, 3));
    // The same tensors byte for byte (file digests differ only by the order safetensors gives
    // the metadata keys, a HashMap's).
    let (x, y) = (ShardDataset::open(&partial).unwrap(), ShardDataset::open(&fp8).unwrap());
    assert_eq!(x.manifest().shards.len(), y.manifest().shards.len());
    for (p, q) in x.iter().zip(y.iter()) {
        let (pa, qa) = (p.aux_hidden(), q.aux_hidden());
        assert_eq!((pa.as_bytes(), pa.scales_bytes()), (qa.as_bytes(), qa.scales_bytes()));
        let (pf, qf) = (p.final_hidden().unwrap(), q.final_hidden().unwrap());
        assert_eq!((pf.as_bytes(), pf.scales_bytes()), (qf.as_bytes(), qf.scales_bytes()));
        assert_eq!((p.input_ids(), p.sample_id()), (q.input_ids(), q.sample_id()));
    }

    // Back to bf16 and to int4; and a teacher subset.
    let int4 = out.join("int4");
    convert(&fp8, &int4, &opts(HiddenDtype::Int4), &mut |_, _| {}).unwrap();
    ShardDataset::open(&int4).unwrap().verify().unwrap();
    let topk = out.join("topk");
    let teacher = Some(Teacher::TopK { k: 2 });
    convert(src.path(), &topk, &ConvertOptions { teacher, ..opts(HiddenDtype::BF16) }, &mut |_, _| {}).unwrap();
    let t = ShardDataset::open(&topk).unwrap();
    assert_eq!(t.metadata().teacher, Teacher::TopK { k: 2 });
    assert!(t.sample(0).unwrap().final_hidden().is_none());
    assert_eq!(&*t.sample(0).unwrap().topk().unwrap().logprobs(), &[-0.1, -1.0].repeat(9)[..]);
    // bf16 → bf16 is lossless.
    let same = out.join("same");
    convert(src.path(), &same, &opts(HiddenDtype::BF16), &mut |_, _| {}).unwrap();
    let c = ShardDataset::open(&same).unwrap();
    for (x, y) in a.iter().zip(c.iter()) {
        assert_eq!(x.aux_hidden().as_bytes(), y.aux_hidden().as_bytes());
    }

    // Refusals: a teacher the data does not hold, a DST holding something else.
    let bad = ConvertOptions { teacher: Some(Teacher::TopK { k: 8 }), ..opts(HiddenDtype::BF16) };
    let e = convert(src.path(), &out.join("k8"), &bad, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("does not contain `topk:8`"), "{e}");
    let other = TempDir::new("conv-other");
    write_dataset(other.path(), HiddenDtype::Fp8E4m3, 100);
    let e = convert(src.path(), other.path(), &opts(HiddenDtype::Fp8E4m3), &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("not a conversion of"), "{e}");
}

#[test]
fn batches_decode_every_encoding_and_report_non_finite_values() {
    for dtype in HiddenDtype::ALL {
        let dir = TempDir::new("enc-batch");
        write_dataset(dir.path(), dtype, 100);
        let d = ShardDataset::open(dir.path()).unwrap();
        let samples: Vec<_> = d.iter().collect();
        let batch = gather(&samples, A * HT, HT, TeacherRows::FinalHidden).unwrap();
        assert_eq!((batch.batch, batch.len), (5, 14));
        assert!(batch.non_finite.is_none());
        batch.ensure_finite(&samples).unwrap();
        for (i, s) in samples.iter().enumerate() {
            let n = s.len();
            let row = &batch.aux[i * 14 * A * HT..(i * 14 + n) * A * HT];
            assert_eq!(row, &*s.aux_hidden().to_f32(), "{dtype} sample {i}");
            assert!(batch.aux[(i * 14 + n) * A * HT..(i + 1) * 14 * A * HT].iter().all(|&v| v == 0.0), "padding");
            let fin = &batch.final_hidden[i * 14 * HT..(i * 14 + n) * HT];
            assert_eq!(fin, &*s.final_hidden().unwrap().to_f32());
        }
    }
    // A NaN code in an fp8 shard: found while decoding, named by shard, sample and position.
    let dir = TempDir::new("enc-nan");
    write_dataset(dir.path(), HiddenDtype::Fp8E4m3, 100);
    rewrite_shard(&dir.join("shard-00000.safetensors"), |t, _| {
        // Sample 2 starts at token 10; value [1, 5] of it.
        t.get_mut(names::AUX_HIDDEN).unwrap().data[11 * A * HT + 5] = 0x7f;
    });
    edit_manifest(dir.path(), |m| {
        m["shards"][0]["sha256"].take();
    });
    let d = ShardDataset::open(dir.path()).unwrap();
    let samples: Vec<_> = d.iter().collect();
    let batch = gather(&samples, A * HT, HT, TeacherRows::TopK).unwrap();
    let nf = batch.non_finite.clone().unwrap();
    assert_eq!((nf.sample, nf.tensor, nf.row, nf.col), (2, names::AUX_HIDDEN, 1, 5));
    let e = batch.ensure_finite(&samples).unwrap_err().to_string();
    assert!(e.contains("shard-00000.safetensors: sample 2 (id 2): aux_hidden[1, 5] = NaN is not finite"), "{e}");
    let e = d.verify().unwrap_err().to_string();
    assert!(e.contains("shard-00000.safetensors: aux_hidden: [11, 5] = NaN is not finite"), "{e}");
}

type Edit = fn(&mut Tensors, &mut Meta);

/// Every bad input of the scaled encodings, with the message it must produce. Opening catches
/// the structural ones; `verify` and every batch decode catch the values.
#[test]
fn bad_scales_and_encodings_are_refused_naming_the_file() {
    let on_open: &[(&str, Edit)] = &[
        ("aux_hidden_scales: missing, but dtype `fp8-e4m3` stores its values scaled", |t, _| {
            t.remove(names::AUX_HIDDEN_SCALES);
        }),
        ("final_hidden_scales: missing", |t, _| {
            t.remove(names::FINAL_HIDDEN_SCALES);
        }),
        ("aux_hidden_scales: rows are 1 wide, expected 3 (one scale per token and captured layer)", |t, _| {
            let s = t.get_mut(names::AUX_HIDDEN_SCALES).unwrap();
            s.shape[1] = 1;
            s.data.truncate(s.shape[0] * 4);
        }),
        // A truncated scales tensor: rows missing at the end.
        ("aux_hidden_scales: has 13 rows but sample_offsets ends at 14", |t, _| {
            let s = t.get_mut(names::AUX_HIDDEN_SCALES).unwrap();
            s.shape[0] -= 1;
            s.data.truncate(s.shape[0] * A * 4);
        }),
        ("aux_hidden_scales: has dtype BF16, expected F32", |t, _| {
            let s = t.get_mut(names::AUX_HIDDEN_SCALES).unwrap();
            s.dtype = Dtype::BF16;
            s.data.truncate(s.data.len() / 2);
        }),
        ("aux_hidden: has dtype BF16, expected F8_E4M3", |t, _| {
            let s = t.get_mut(names::AUX_HIDDEN).unwrap();
            s.dtype = Dtype::BF16;
            s.data.extend(vec![0; s.data.len()]);
        }),
        // An encoding mixed within one dataset: this shard says bf16.
        ("dtype: `bf16` vs `fp8-e4m3`", |t, m| {
            m.insert("dtype".into(), "bf16".into());
            m.insert("format".into(), "aerie-shard/1".into());
            t.remove(names::AUX_HIDDEN_SCALES);
            t.remove(names::FINAL_HIDDEN_SCALES);
        }),
        ("`dtype`: `fp4` is not a known encoding", |_, m| {
            m.insert("dtype".into(), "fp4".into());
        }),
        ("`aerie-shard/1` cannot hold dtype `fp8-e4m3`", |_, m| {
            m.insert("format".into(), "aerie-shard/1".into());
        }),
    ];
    for (needle, edit) in on_open {
        let dir = TempDir::new("enc-bad");
        write_dataset(dir.path(), HiddenDtype::Fp8E4m3, 12);
        rewrite_shard(&dir.join("shard-00001.safetensors"), edit);
        let e = ShardDataset::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("shard-00001.safetensors") && e.contains(needle), "`{e}` lacks `{needle}`");
    }

    // Values: zero, negative, NaN, infinite scales. verify names the file, tensor and position;
    // a batch decode names the shard and the sample.
    for (bad, shown) in [(0.0f32, "0"), (-1.0, "-1"), (f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let dir = TempDir::new("enc-scale");
        write_dataset(dir.path(), HiddenDtype::Int4, 12);
        let shard = dir.join("shard-00001.safetensors");
        rewrite_shard(&shard, |t, _| {
            // Token 3 of the shard (its only sample, dataset sample 2), group 4.
            let s = t.get_mut(names::AUX_HIDDEN_SCALES).unwrap();
            let per_row = A * HT / INT4_GROUP;
            let at = 4 * (3 * per_row + 4);
            s.data[at..at + 4].copy_from_slice(&bad.to_le_bytes());
        });
        edit_manifest(dir.path(), |m| {
            m["shards"][1]["sha256"].take();
        });
        let d = ShardDataset::open(dir.path()).unwrap();
        let e = d.verify().unwrap_err().to_string();
        let needle =
            format!("shard-00001.safetensors: aux_hidden_scales: [3, 4] = {shown} is not a positive finite scale");
        assert!(e.contains(&needle), "`{e}` lacks `{needle}`");
        let samples: Vec<_> = d.iter().collect();
        let e = gather(&samples, A * HT, HT, TeacherRows::TopK).unwrap_err().to_string();
        let needle = format!("shard-00001.safetensors: sample 2 (id 2): aux_hidden_scales[3, 4] = {shown}");
        assert!(e.contains(&needle), "`{e}` lacks `{needle}`");
    }

    // A file cut short inside its scales is not a readable safetensors file.
    let dir = TempDir::new("enc-trunc");
    write_dataset(dir.path(), HiddenDtype::Fp8E4m3, 12);
    let shard = dir.join("shard-00001.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 10]).unwrap();
    let e = ShardDataset::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("shard-00001.safetensors: not a readable safetensors file"), "{e}");

    // The writer refuses int4 for a hidden size its groups do not divide.
    let dir = TempDir::new("enc-int4");
    let m = ShardMetadata { hidden_size: 48, ..meta(HiddenDtype::Int4, TEACHER) };
    let e = ShardWriter::create(dir.path(), m, options(10)).unwrap_err().to_string();
    assert!(e.contains("hidden_size must be a multiple of 32"), "{e}");
}

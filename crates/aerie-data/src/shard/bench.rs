//! `aerie bench shards`: how fast a dataset is read and decoded into training batches, against
//! how fast the disk reads the same files. A compact encoding only pays if decoding keeps up
//! with the disk: fp8 shards are half the bytes of bf16, so they feed a trainer twice as many
//! tokens per second from the same disk, unless the decode is slower than that.
//!
//! Two passes over the same shard files, in this order:
//! 1. `read`: every file read front to back with `read(2)` into one 16 MiB buffer, nothing
//!    else: what `dd if=FILE of=/dev/null bs=16M` measures.
//! 2. `decode`: the dataset opened and every sample gathered into host batches
//!    ([`batch::gather`]: the fused, multi-threaded decode into f32 that training and every
//!    evaluation use), length-sorted as training batches are.
//!
//! With `drop_caches` (root only: it writes `/proc/sys/vm/drop_caches`) both passes start from
//! a cold page cache, so pass 1 is the disk's sequential rate and pass 2 the end-to-end rate of
//! the loader reading that disk. Without it, pass 2 reads what pass 1 left in the page cache and
//! measures the decode alone; the report says which happened.

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use super::batch::{self, TeacherRows};
use super::reader::ShardDataset;
use crate::{Error, Result};

/// How to run the benchmark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Tokens per gathered batch (samples are added until the next would pass this).
    pub batch_tokens: usize,
    /// Try to drop the page cache before each pass.
    pub drop_caches: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self { batch_tokens: 16_384, drop_caches: false }
    }
}

/// What [`bench_shards`] measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShardBench {
    /// The dataset's `dtype`.
    pub dtype: String,
    /// Its teacher.
    pub teacher: String,
    /// Shard files.
    pub shards: usize,
    /// Tokens in the dataset.
    pub tokens: u64,
    /// Bytes of the shard files.
    pub bytes: u64,
    /// Bytes per token on disk.
    pub bytes_per_token: f64,
    /// Whether the page cache was dropped before each pass (else pass 2 reads cached pages).
    pub cold_cache: bool,
    /// Decode threads (rayon's pool: `RAYON_NUM_THREADS`).
    pub threads: usize,
    /// Pass 1: seconds to read every file.
    pub read_seconds: f64,
    /// Pass 1: GB/s (10^9 bytes) of file read.
    pub read_gb_per_second: f64,
    /// Pass 1: tokens/s the disk delivers at that rate.
    pub read_tokens_per_second: f64,
    /// Pass 2: seconds to open the dataset and gather every sample into f32 batches.
    pub decode_seconds: f64,
    /// Pass 2: GB/s of shard file consumed.
    pub decode_gb_per_second: f64,
    /// Pass 2: tokens/s decoded into batches.
    pub decode_tokens_per_second: f64,
    /// Pass 2: GB/s of f32 batch written (aux features and teacher).
    pub decoded_gb_per_second: f64,
    /// decode tokens/s ÷ read tokens/s: ≥ 1 when the loader keeps up with the disk.
    pub decode_over_read: f64,
}

/// Drop the page cache (clean pages only; a `sync` first writes dirty ones). True when it
/// worked, which needs root.
fn drop_caches() -> bool {
    // Failure (not root) is reported in the result, not fatal.
    std::process::Command::new("sync").status().is_ok_and(|s| s.success())
        && std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Run both passes over the dataset in `dir`.
pub fn bench_shards(dir: &Path, opts: &BenchOptions) -> Result<ShardBench> {
    let dataset = ShardDataset::open(dir)?;
    if dataset.is_empty() {
        return Err(Error::Options(format!("{}: the dataset has no samples", dir.display())));
    }
    let files: Vec<_> = dataset.manifest().shards.iter().map(|s| dir.join(&s.file)).collect();
    let meta = dataset.metadata().clone();
    let tokens = dataset.num_tokens();
    drop(dataset);

    let cold = opts.drop_caches && drop_caches();
    let start = Instant::now();
    let mut buf = vec![0u8; 16 << 20];
    let mut bytes = 0u64;
    for path in &files {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
        }
    }
    let read_seconds = start.elapsed().as_secs_f64();

    let cold = cold && drop_caches();
    let start = Instant::now();
    let dataset = ShardDataset::open(dir)?;
    let (aw, ht) = (meta.aux_width(), meta.hidden_size);
    let rows = if meta.teacher.has_final_hidden() { TeacherRows::FinalHidden } else { TeacherRows::TopK };
    let mut decoded = 0u64;
    // As training batches: samples sorted by length, as many per batch as fit `batch_tokens`
    // once padded to the longest (at least one), so padding does not inflate the work.
    let samples: Vec<_> = dataset.iter().collect();
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|&i| (samples[i].len(), i));
    let mut chunk = Vec::new();
    for (j, &i) in order.iter().enumerate() {
        chunk.push(samples[i]);
        let next = order.get(j + 1).map(|&n| samples[n].len());
        let full = next.is_none_or(|n| (chunk.len() + 1) * n > opts.batch_tokens);
        if full {
            let b = batch::gather(&chunk, aw, ht, rows)?;
            decoded += 4 * (b.aux.len() + b.final_hidden.len() + b.topk_logprobs.len() + b.topk_ids.len()) as u64;
            std::hint::black_box(&b);
            chunk.clear();
        }
    }
    let decode_seconds = start.elapsed().as_secs_f64();
    let rate = |x: f64, s: f64| x / s.max(1e-9);
    let read_tps = rate(tokens as f64, read_seconds);
    let decode_tps = rate(tokens as f64, decode_seconds);
    Ok(ShardBench {
        dtype: meta.dtype.to_string(),
        teacher: meta.teacher.to_string(),
        shards: files.len(),
        tokens,
        bytes,
        bytes_per_token: bytes as f64 / tokens as f64,
        cold_cache: cold,
        threads: rayon::current_num_threads(),
        read_seconds,
        read_gb_per_second: rate(bytes as f64 / 1e9, read_seconds),
        read_tokens_per_second: read_tps,
        decode_seconds,
        decode_gb_per_second: rate(bytes as f64 / 1e9, decode_seconds),
        decode_tokens_per_second: decode_tps,
        decoded_gb_per_second: rate(decoded as f64 / 1e9, decode_seconds),
        decode_over_read: decode_tps / read_tps,
    })
}

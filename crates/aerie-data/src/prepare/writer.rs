//! One split of a prepared dataset as a parquet file, written incrementally (a record batch per
//! [`BATCH_ROWS`] samples, row groups capped in rows and bytes, so memory stays flat) under a
//! temporary name and renamed into place only once complete.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, Int64Builder, ListBuilder, StringBuilder, UInt8Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use super::SplitStats;
use crate::atomic::{sync_dir, tmp_path};
use crate::paths::parent_dir;
use crate::{Error, Result};

/// Samples per record batch handed to the parquet writer.
pub(crate) const BATCH_ROWS: usize = 256;
const ROW_GROUP_ROWS: usize = 4096;
const ROW_GROUP_BYTES: usize = 64 << 20;

/// Column names of a prepared split.
pub mod columns {
    /// `list<int32>`: token ids.
    pub const INPUT_IDS: &str = "input_ids";
    /// `list<uint8>`: 1 on tokens to train on.
    pub const LOSS_MASK: &str = "loss_mask";
    /// string: the source conversation's id.
    pub const SOURCE_ID: &str = "source_id";
    /// int64: the record's position in the source (unique; the shard format's `sample_ids`).
    pub const SAMPLE_ID: &str = "sample_id";
}

/// The schema of a prepared split.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(columns::INPUT_IDS, DataType::List(Arc::new(Field::new("item", DataType::Int32, false))), false),
        Field::new(columns::LOSS_MASK, DataType::List(Arc::new(Field::new("item", DataType::UInt8, false))), false),
        Field::new(columns::SOURCE_ID, DataType::Utf8, false),
        Field::new(columns::SAMPLE_ID, DataType::Int64, false),
    ]))
}

fn perr(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Parquet { path: path.to_owned(), message: e.to_string() }
}

/// Writes one split.
pub(crate) struct SplitWriter {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<ArrowWriter<File>>,
    ids: ListBuilder<Int32Builder>,
    mask: ListBuilder<UInt8Builder>,
    source: StringBuilder,
    sample: Int64Builder,
    pending: usize,
    pub(crate) stats: SplitStats,
}

impl SplitWriter {
    /// Start `path` (written as `.tmp-<name>` until [`Self::finish`]), with `metadata` as the
    /// parquet file's key/value metadata.
    pub(crate) fn create(path: &Path, metadata: &[(String, String)]) -> Result<Self> {
        let tmp = tmp_path(path);
        let file = crate::atomic::create_tmp(&tmp)?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .set_key_value_metadata(Some(metadata.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect()))
            .build();
        let writer = ArrowWriter::try_new(file, schema(), Some(props)).map_err(|e| perr(&tmp, e))?;
        let item = |dt| Arc::new(Field::new("item", dt, false));
        Ok(Self {
            path: path.to_owned(),
            tmp,
            writer: Some(writer),
            ids: ListBuilder::new(Int32Builder::new()).with_field(item(DataType::Int32)),
            mask: ListBuilder::new(UInt8Builder::new()).with_field(item(DataType::UInt8)),
            source: StringBuilder::new(),
            sample: Int64Builder::new(),
            pending: 0,
            stats: SplitStats {
                file: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                ..SplitStats::default()
            },
        })
    }

    /// Append one sample. Ids must fit int32 (every real vocabulary does).
    pub(crate) fn push(&mut self, ids: &[u32], mask: &[u8], source_id: &str, sample_id: i64) -> Result<()> {
        for &id in ids {
            let id = i32::try_from(id).map_err(|_| perr(&self.path, format!("token id {id} exceeds int32")))?;
            self.ids.values().append_value(id);
        }
        self.ids.append(true);
        self.mask.values().append_slice(mask);
        self.mask.append(true);
        self.source.append_value(source_id);
        self.sample.append_value(sample_id);
        self.pending += 1;
        self.stats.samples += 1;
        self.stats.tokens += ids.len() as u64;
        self.stats.masked_tokens += mask.iter().filter(|&&m| m != 0).count() as u64;
        if self.pending >= BATCH_ROWS {
            self.flush_batch()?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.ids.finish()),
            Arc::new(self.mask.finish()),
            Arc::new(self.source.finish()),
            Arc::new(self.sample.finish()),
        ];
        let batch = RecordBatch::try_new(schema(), cols).map_err(|e| perr(&self.tmp, e))?;
        self.pending = 0;
        self.writer.as_mut().expect("writer open until finish").write(&batch).map_err(|e| perr(&self.tmp, e))
    }

    /// Write the footer, fsync, and rename into place.
    pub(crate) fn finish(mut self) -> Result<SplitStats> {
        self.flush_batch()?;
        let mut writer = self.writer.take().expect("writer open until finish");
        let result = writer
            .finish()
            .map_err(|e| perr(&self.tmp, e))
            .and_then(|_| writer.inner().sync_all().map_err(|e| Error::io(&self.tmp, e)));
        drop(writer);
        let result = result.and_then(|()| std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io(&self.path, e)));
        if result.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        result?;
        sync_dir(parent_dir(&self.path))?;
        Ok(std::mem::take(&mut self.stats))
    }
}

impl Drop for SplitWriter {
    /// An unfinished split leaves nothing behind.
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

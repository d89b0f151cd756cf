//! Reading a prepared dataset back: [`PreparedDataset::open`] checks `report.json` and the split
//! files, and [`PreparedDataset::samples`] streams a split one record batch at a time (what
//! capture engines and the vocabulary builder iterate).

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt8Type};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use super::writer::{BATCH_ROWS, columns, schema};
use super::{PREPARED_FORMAT, PrepareReport, REPORT_FILE};
use crate::{Error, Result};

/// One tokenised sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedSample {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// 1 on tokens to train on.
    pub loss_mask: Vec<u8>,
    /// The source conversation's id.
    pub source_id: String,
    /// The record's position in the source; unique within the dataset.
    pub sample_id: i64,
}

/// A prepared dataset directory: `report.json` plus one parquet file per split.
#[derive(Debug, Clone)]
pub struct PreparedDataset {
    dir: PathBuf,
    report: PrepareReport,
}

fn perr(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::Parquet { path: path.to_owned(), message: message.to_string() }
}

impl PreparedDataset {
    /// Open `dir`, checking its format and that every split file the report lists exists.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(REPORT_FILE);
        if !dir.is_dir() || !path.is_file() {
            let what = if !dir.exists() {
                "does not exist"
            } else if !dir.is_dir() {
                "is a file, not a directory"
            } else {
                "holds no report.json"
            };
            return Err(Error::Manifest {
                path: dir.to_owned(),
                message: format!("not a prepared dataset: it {what} (`aerie data prepare --out DIR` writes one)"),
            });
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let report: PrepareReport = serde_json::from_slice(&bytes).map_err(|e| Error::Manifest {
            path: path.clone(),
            message: format!("not a prepared-dataset report: {e}"),
        })?;
        if report.format != PREPARED_FORMAT {
            return Err(Error::UnsupportedFormat { path, found: report.format, expected: PREPARED_FORMAT });
        }
        for stats in report.splits.values() {
            let f = dir.join(&stats.file);
            if !f.is_file() {
                return Err(Error::Manifest {
                    path: path.clone(),
                    message: format!("lists split file {} which is missing", f.display()),
                });
            }
        }
        Ok(Self { dir: dir.to_owned(), report })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `prepare` recorded.
    pub fn report(&self) -> &PrepareReport {
        &self.report
    }

    /// Split names (`train`, `eval`).
    pub fn splits(&self) -> Vec<&str> {
        self.report.splits.keys().map(String::as_str).collect()
    }

    /// Samples in `split` (0 for an unknown split).
    pub fn len(&self, split: &str) -> u64 {
        self.report.splits.get(split).map_or(0, |s| s.samples)
    }

    /// Whether the dataset holds no sample at all.
    pub fn is_empty(&self) -> bool {
        self.report.splits.values().all(|s| s.samples == 0)
    }

    /// The target vocabulary size the data was tokenised for.
    pub fn vocab_size(&self) -> usize {
        self.report.vocab_size
    }

    /// The parquet file of `split`.
    pub fn split_path(&self, split: &str) -> Result<PathBuf> {
        let stats = self.report.splits.get(split).ok_or_else(|| {
            Error::InvalidOption(format!(
                "{}: no split `{split}` (splits: {})",
                self.dir.display(),
                self.splits().join(", ")
            ))
        })?;
        Ok(self.dir.join(&stats.file))
    }

    /// Stream the samples of `split`.
    pub fn samples(&self, split: &str) -> Result<PreparedSamples> {
        let path = self.split_path(split)?;
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| perr(&path, e))?;
        let want = schema();
        for field in want.fields() {
            match builder.schema().field_with_name(field.name()) {
                Ok(f) if f.data_type() == field.data_type() => {}
                Ok(f) => {
                    return Err(perr(
                        &path,
                        format!("column `{}` is {}, expected {}", f.name(), f.data_type(), field.data_type()),
                    ));
                }
                Err(_) => return Err(perr(&path, format!("no column `{}`", field.name()))),
            }
        }
        let reader = builder.with_batch_size(BATCH_ROWS).build().map_err(|e| perr(&path, e))?;
        Ok(PreparedSamples { path, reader, batch: None, row: 0, done: 0, failed: false })
    }
}

/// Iterator over the samples of one split.
pub struct PreparedSamples {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    row: usize,
    done: u64,
    failed: bool,
}

impl std::fmt::Debug for PreparedSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSamples").field("path", &self.path).field("done", &self.done).finish_non_exhaustive()
    }
}

impl PreparedSamples {
    fn sample(&self, batch: &RecordBatch, row: usize) -> Result<PreparedSample> {
        let col =
            |name: &str| batch.column_by_name(name).ok_or_else(|| perr(&self.path, format!("no column `{name}`")));
        let ids = col(columns::INPUT_IDS)?.as_list::<i32>();
        let mask = col(columns::LOSS_MASK)?.as_list::<i32>();
        let source = col(columns::SOURCE_ID)?.as_string::<i32>();
        let sample = col(columns::SAMPLE_ID)?.as_primitive::<Int64Type>();
        let ids = ids.value(row);
        let mask = mask.value(row);
        let ids = ids.as_primitive::<Int32Type>();
        let mask = mask.as_primitive::<UInt8Type>();
        if ids.len() != mask.len() {
            return Err(perr(
                &self.path,
                format!("sample #{}: {} input_ids but {} loss_mask values", self.done, ids.len(), mask.len()),
            ));
        }
        let input_ids = ids
            .values()
            .iter()
            .map(|&v| {
                u32::try_from(v).map_err(|_| perr(&self.path, format!("sample #{}: negative token id {v}", self.done)))
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(PreparedSample {
            input_ids,
            loss_mask: mask.values().to_vec(),
            source_id: source.value(row).to_owned(),
            sample_id: sample.value(row),
        })
    }

    fn step(&mut self) -> Result<Option<PreparedSample>> {
        loop {
            if let Some(batch) = &self.batch
                && self.row < batch.num_rows()
            {
                let s = self.sample(batch, self.row)?;
                self.row += 1;
                self.done += 1;
                return Ok(Some(s));
            }
            match self.reader.next() {
                Some(Ok(b)) => {
                    self.batch = Some(b);
                    self.row = 0;
                }
                Some(Err(e)) => return Err(perr(&self.path, format!("after {} samples: {e}", self.done))),
                None => return Ok(None),
            }
        }
    }
}

impl Iterator for PreparedSamples {
    type Item = Result<PreparedSample>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(s) => s.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

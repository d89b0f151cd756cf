//! Parquet datasets in the Hugging Face `datasets` layout: a file, or a directory of
//! `*.parquet` files (read in sorted path order, recursively), with a column `conversations` or
//! `messages` of `list<struct<from, value>>` or `list<struct<role, content>>`, and optionally an
//! `id` column (string or integer) and a `tools` column. Only those columns are decoded, one
//! record batch at a time.
//!
//! The turn structs may also hold string fields `reasoning_content` (or `reasoning`),
//! `tool_call_id` and `name`, and a `tool_calls` field; `tool_calls` and `tools` come in the two
//! shapes datasets store JSON in: nested lists and structs (`list<struct<id, type,
//! function: struct<name, arguments>>>`, with `arguments` a JSON string or a struct), or a
//! string holding the JSON. Either way they become the same message fields the JSON readers
//! fill (see `arrowutil::json_at` for how structs map to objects: null fields are absent keys).
//! A row whose JSON string does not parse, or whose values cannot be read as JSON, is a
//! malformed record.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use super::record::tool_calls_from_json;
use super::{Event, Source};
use crate::arrowutil::{ListColumn, StrColumn, id_at, json_at};
use crate::conversation::{RawConversation, RawTurn};
use crate::{Error, Result};

const BATCH_ROWS: usize = 256;

/// Streams the rows of one or more parquet files.
pub(crate) struct ParquetSource {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<Open>,
    rows_total: u64,
    rows_done: u64,
}

struct Open {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    batch: Option<RecordBatch>,
    row: usize,
    layout: Layout,
}

/// Column positions inside the projected batches.
#[derive(Clone, Copy)]
struct Layout {
    turns: usize,
    id: Option<usize>,
    tools: Option<usize>,
}

fn perr(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::Parquet { path: path.to_owned(), message: message.to_string() }
}

/// The parquet files of a dataset: `path` itself, or every `*.parquet` below it, sorted.
pub(crate) fn dataset_files(path: &Path) -> Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let p = entry.map_err(|e| Error::io(&dir, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "parquet") {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::Input {
            path: path.to_owned(),
            at: "directory".into(),
            message: "no *.parquet files in it".into(),
        });
    }
    Ok(files)
}

fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| perr(path, e))
}

impl ParquetSource {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let files = dataset_files(path)?;
        let mut rows_total = 0u64;
        for f in &files {
            rows_total += builder(f)?.metadata().file_metadata().num_rows().max(0) as u64;
        }
        Ok(Self { files, next_file: 0, current: None, rows_total, rows_done: 0 })
    }

    fn open_file(path: &Path) -> Result<Open> {
        let b = builder(path)?;
        let schema = b.schema().clone();
        let turns =
            ["conversations", "messages"].iter().find_map(|name| schema.index_of(name).ok()).ok_or_else(|| {
                let names: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                perr(path, format!("no `conversations` or `messages` column (columns: {})", names.join(", ")))
            })?;
        check_turns_type(path, schema.field(turns).name(), schema.field(turns).data_type())?;
        let id = schema.index_of("id").ok();
        let tools = schema.index_of("tools").ok();
        if let Some(t) = tools {
            check_json_type(path, "column `tools`", schema.field(t).data_type())?;
        }
        let mut roots = vec![turns];
        roots.extend(id);
        roots.extend(tools);
        roots.sort_unstable();
        let mask = ProjectionMask::roots(b.parquet_schema(), roots.iter().copied());
        let at = |c: usize| roots.iter().position(|&r| r == c).expect("projected");
        let layout = Layout { turns: at(turns), id: id.map(at), tools: tools.map(at) };
        let reader = b.with_projection(mask).with_batch_size(BATCH_ROWS).build().map_err(|e| perr(path, e))?;
        Ok(Open { path: path.to_owned(), reader, batch: None, row: 0, layout })
    }
}

fn check_turns_type(path: &Path, name: &str, dt: &DataType) -> Result<()> {
    let item = match dt {
        DataType::List(f) | DataType::LargeList(f) => f.data_type(),
        other => return Err(perr(path, format!("column `{name}` is {other}, expected a list of structs"))),
    };
    let DataType::Struct(fields) = item else {
        return Err(perr(
            path,
            format!("column `{name}` holds {item}, expected structs of {{from, value}} or {{role, content}}"),
        ));
    };
    let has = |n: &str| fields.iter().any(|f| f.name() == n && is_string(f.data_type()));
    if let Some(calls) = fields.iter().find(|f| f.name() == "tool_calls") {
        check_json_type(path, &format!("column `{name}`: field `tool_calls`"), calls.data_type())?;
    }
    if (has("from") || has("role")) && (has("value") || has("content")) {
        Ok(())
    } else {
        Err(perr(
            path,
            format!("column `{name}`: structs need string fields {{from, value}} or {{role, content}}, found {item}"),
        ))
    }
}

/// `tools` and `tool_calls`: a JSON string, nested lists/structs, or all null.
fn check_json_type(path: &Path, what: &str, dt: &DataType) -> Result<()> {
    match dt {
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) | DataType::Struct(_) => Ok(()),
        DataType::Null => Ok(()),
        dt if is_string(dt) => Ok(()),
        other => Err(perr(path, format!("{what} is {other}, expected a JSON string or lists and structs"))),
    }
}

/// A `tools`/`tool_calls` value: parsed when a string (empty: none), converted otherwise.
fn json_cell(array: &dyn Array, i: usize, what: &str) -> std::result::Result<serde_json::Value, String> {
    match StrColumn::new(array) {
        Some(s) => match s.get(i).map(str::trim) {
            None | Some("") => Ok(serde_json::Value::Null),
            Some(text) => serde_json::from_str(text).map_err(|e| format!("`{what}` is not JSON: {e}")),
        },
        None => json_at(array, i).map_err(|e| format!("`{what}` holds {e}")),
    }
}

fn is_string(dt: &DataType) -> bool {
    matches!(dt, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Row `row` of `batch` as a raw conversation; `Err` for a malformed row.
fn row_to_raw(
    batch: &RecordBatch,
    layout: Layout,
    row: usize,
    index: u64,
) -> std::result::Result<RawConversation, String> {
    let lists = ListColumn::new(batch.column(layout.turns).as_ref()).expect("type checked at open");
    let structs = lists.values().as_struct();
    let field = |a: &str, b: &str| structs.column_by_name(a).or_else(|| structs.column_by_name(b)).cloned();
    let roles = field("from", "role");
    let contents = field("value", "content");
    // Optional fields of the turn structs (OpenAI messages with reasoning and tool calls).
    let reasoning = field("reasoning_content", "reasoning");
    let call_ids = field("tool_call_id", "tool_call_id");
    let names = field("name", "name");
    let calls = field("tool_calls", "tool_calls");
    let roles = roles.as_deref().and_then(StrColumn::new);
    let contents = contents.as_deref().and_then(StrColumn::new);
    let reasoning = reasoning.as_deref().and_then(StrColumn::new);
    let call_ids = call_ids.as_deref().and_then(StrColumn::new);
    let names = names.as_deref().and_then(StrColumn::new);
    let mut turns = Vec::new();
    for j in lists.range(row).filter(|&j| structs.is_valid(j)) {
        let tool_calls = match &calls {
            Some(c) => {
                let value = json_cell(c.as_ref(), j, "tool_calls")?;
                tool_calls_from_json(value).map_err(|e| format!("`tool_calls` of turn {j}: {e}"))?
            }
            None => Vec::new(),
        };
        turns.push(RawTurn {
            role: roles.as_ref().and_then(|c| c.get(j)).unwrap_or_default().to_owned(),
            content: contents.as_ref().and_then(|c| c.get(j)).unwrap_or_default().to_owned(),
            reasoning_content: reasoning.as_ref().and_then(|c| c.get(j)).map(str::to_owned),
            tool_calls,
            tool_call_id: call_ids.as_ref().and_then(|c| c.get(j)).map(str::to_owned),
            name: names.as_ref().and_then(|c| c.get(j)).map(str::to_owned),
            ..RawTurn::default()
        });
    }
    let tools = match layout.tools {
        Some(c) => Some(json_cell(batch.column(c).as_ref(), row, "tools")?).filter(|t| !t.is_null()),
        None => None,
    };
    Ok(RawConversation { id: layout.id.and_then(|c| id_at(batch.column(c).as_ref(), row)), index, turns, tools })
}

impl Source for ParquetSource {
    fn next_event(&mut self) -> Result<Option<Event>> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.get(self.next_file) else {
                    return Ok(None);
                };
                self.next_file += 1;
                self.current = Some(Self::open_file(path)?);
            }
            let open = self.current.as_mut().expect("just opened");
            if let Some(batch) = &open.batch
                && open.row < batch.num_rows()
            {
                let raw = row_to_raw(batch, open.layout, open.row, self.rows_done);
                let at = format!("{} row {} (record #{})", open.path.display(), open.row, self.rows_done);
                open.row += 1;
                self.rows_done += 1;
                return Ok(Some(match raw {
                    Ok(raw) => Event::Record(raw),
                    Err(message) => Event::Malformed { at, message },
                }));
            }
            match open.reader.next() {
                Some(Ok(batch)) => {
                    open.batch = Some(batch);
                    open.row = 0;
                }
                Some(Err(e)) => {
                    return Err(Error::Input {
                        path: open.path.clone(),
                        at: format!("record #{}", self.rows_done),
                        message: e.to_string(),
                    });
                }
                None => self.current = None,
            }
        }
    }

    fn progress(&self) -> (u64, u64) {
        (self.rows_done, self.rows_total)
    }
}

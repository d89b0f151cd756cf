//! Readers: ShareGPT arrays (truncated, malformed, tricky strings), JSONL in both dialects,
//! parquet in the HF datasets layout.

use std::sync::Arc;

use aerie_data::Error;
use aerie_data::conversation::RawConversation;
use aerie_data::readers::{ConversationReader, InputFormat, ReadOptions, detect_format};
use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema};
use parquet::arrow::ArrowWriter;

use super::common::{sharegpt_record, tempdir};

fn read_all(path: &std::path::Path, strict: bool) -> (Vec<RawConversation>, ConversationReader) {
    let mut r = ConversationReader::open(path, &ReadOptions { format: InputFormat::Auto, strict }).unwrap();
    let mut out = Vec::new();
    for rec in r.by_ref() {
        out.push(rec.unwrap());
    }
    (out, r)
}

#[test]
fn truncated_sharegpt_yields_complete_records_and_names_the_cut() {
    let dir = tempdir();
    let path = dir.path().join("sharegpt.json");
    let recs = [
        sharegpt_record("a", &[("human", "brackets ] } [ { in a string"), ("gpt", "escaped \" quote and \\")]),
        sharegpt_record("b", &[("human", "x"), ("gpt", "y")]),
        sharegpt_record("c", &[("human", "\"]},{\""), ("gpt", "日本語")]),
        sharegpt_record("d", &[("human", "cut"), ("gpt", "here")]),
    ];
    let mut text = String::from("[\n  ");
    let mut cut_at = 0;
    for (i, r) in recs.iter().enumerate() {
        if i == 3 {
            cut_at = text.len();
        }
        text.push_str(r);
        text.push_str(",\n  ");
    }
    // Cut the file in the middle of record "d".
    let cut = &text[..cut_at + recs[3].len() / 2];
    std::fs::write(&path, cut).unwrap();
    assert_eq!(detect_format(&path).unwrap(), InputFormat::JsonArray);

    let (records, reader) = read_all(&path, false);
    let ids: Vec<_> = records.iter().map(|r| r.id.clone().unwrap()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(records[0].turns[0].content, "brackets ] } [ { in a string");
    assert_eq!(records[0].turns[1].content, "escaped \" quote and \\");
    assert_eq!(records[2].turns[0].content, "\"]},{\"");
    let report = reader.report();
    let t = report.truncated.as_ref().expect("truncation reported");
    assert_eq!(t.byte_offset, cut_at as u64);
    assert_eq!(t.complete_records, 3);
    assert_eq!(report.records, 3);
    assert_eq!(report.warnings.len(), 1);
    assert!(report.warnings[0].contains(&format!("byte {cut_at}")), "{:?}", report.warnings);
    assert!(report.warnings[0].contains("3 complete records"), "{:?}", report.warnings);

    // Strict: the same file is an error naming the file and the offset, after the good records.
    let mut r = ConversationReader::open(&path, &ReadOptions { format: InputFormat::JsonArray, strict: true }).unwrap();
    assert_eq!(r.by_ref().take(3).filter(|x| x.is_ok()).count(), 3);
    match r.next() {
        Some(Err(Error::Input { path: p, at, message })) => {
            assert_eq!(p, path);
            assert_eq!(at, format!("byte {cut_at}"));
            assert!(message.contains("truncated"), "{message}");
        }
        other => panic!("expected an input error, got {other:?}"),
    }
    assert!(r.next().is_none());
}

#[test]
fn sharegpt_array_edge_cases() {
    let dir = tempdir();
    let path = dir.path().join("d.json");
    // BOM, a malformed element (not an object of the right shape), a trailing comma.
    let text = format!(
        "\u{feff} [ {}, {{\"id\": \"bad\", \"conversations\": 5}}, 17, {} , ]  ",
        sharegpt_record("a", &[("human", "x"), ("gpt", "y")]),
        sharegpt_record("b", &[("human", "x"), ("gpt", "y")])
    );
    std::fs::write(&path, text).unwrap();
    let (records, reader) = read_all(&path, false);
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].index, 3, "indices count malformed records too");
    assert_eq!(reader.report().malformed, 2);
    assert!(reader.report().truncated.is_none());
    assert!(reader.report().warnings[0].contains("record #1"), "{:?}", reader.report().warnings);

    let mut strict =
        ConversationReader::open(&path, &ReadOptions { format: InputFormat::JsonArray, strict: true }).unwrap();
    assert!(strict.next().unwrap().is_ok());
    let err = strict.next().unwrap().unwrap_err().to_string();
    assert!(err.contains("record #1") && err.contains("malformed"), "{err}");

    // Empty array; not an array at all.
    std::fs::write(&path, "[]").unwrap();
    assert_eq!(read_all(&path, true).0.len(), 0);
    std::fs::write(&path, "\"x\"").unwrap();
    let err =
        ConversationReader::open(&path, &ReadOptions { format: InputFormat::JsonArray, strict: false }).unwrap_err();
    assert!(err.to_string().contains("expected a JSON array"), "{err}");
    // Garbage between records stops reading, like a cut.
    std::fs::write(&path, format!("[{} x {}]", sharegpt_record("a", &[]), sharegpt_record("b", &[]))).unwrap();
    let (records, reader) = read_all(&path, false);
    assert_eq!(records.len(), 1);
    assert!(reader.report().truncated.as_ref().unwrap().message.contains("`x`"));
}

#[test]
fn jsonl_both_dialects_blank_lines_and_a_cut_last_line() {
    let dir = tempdir();
    let path = dir.path().join("d.jsonl");
    let lines = [
        r#"{"id": "s", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}"#,
        "",
        r#"{"id": 12, "messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": [{"type": "text", "text": "d"}]}]}"#,
        r#"{"messages": "#,
        r#"not json"#,
        r#"{"messages": [{"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}]}"#,
        r#"{"id": "cut", "messages": [{"role": "user", "con"#,
    ];
    std::fs::write(&path, lines.join("\n")).unwrap();
    assert_eq!(detect_format(&path).unwrap(), InputFormat::Jsonl);
    let (records, reader) = read_all(&path, false);
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].turns[1].role, "gpt");
    assert_eq!(records[1].id.as_deref(), Some("12"));
    assert_eq!(records[1].turns[1].content, "d");
    assert_eq!(records[2].id, None);
    assert_eq!(records[2].index, 4);
    let report = reader.report();
    assert_eq!(report.malformed, 2, "{:?}", report.warnings);
    assert!(report.warnings[0].contains("line 4"), "{:?}", report.warnings);
    let t = report.truncated.as_ref().unwrap();
    let cut = lines[..6].iter().map(|l| l.len() + 1).sum::<usize>();
    assert_eq!(t.byte_offset, cut as u64);

    // A .json file holding JSONL is detected by its first byte.
    let p2 = dir.path().join("lines.json");
    std::fs::write(&p2, format!("{}\n", lines[0])).unwrap();
    assert_eq!(detect_format(&p2).unwrap(), InputFormat::Jsonl);
}

/// Write an HF-datasets-style parquet file: `id` int64 and a `list<struct<a, b>>` column.
fn write_hf_parquet(path: &std::path::Path, column: &str, keys: (&str, &str), rows: &[(i64, Vec<(&str, &str)>)]) {
    let fields = Fields::from(vec![Field::new(keys.0, DataType::Utf8, true), Field::new(keys.1, DataType::Utf8, true)]);
    let mut list = ListBuilder::new(StructBuilder::new(
        fields.clone(),
        vec![Box::new(StringBuilder::new()), Box::new(StringBuilder::new())],
    ));
    for (_, turns) in rows {
        for (a, b) in turns {
            let s = list.values();
            s.field_builder::<StringBuilder>(0).unwrap().append_value(a);
            s.field_builder::<StringBuilder>(1).unwrap().append_value(b);
            s.append(true);
        }
        list.append(true);
    }
    let turns: ArrayRef = Arc::new(list.finish());
    let ids: ArrayRef = Arc::new(Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>()));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("extra", DataType::Int64, false),
        Field::new(column, turns.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![ids.clone(), ids, turns]).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn parquet_hf_layout_file_and_directory() {
    let dir = tempdir();
    let data = dir.path().join("ds/data");
    std::fs::create_dir_all(&data).unwrap();
    write_hf_parquet(
        &data.join("train-00000-of-00002.parquet"),
        "conversations",
        ("from", "value"),
        &[(1, vec![("human", "a"), ("gpt", "b")]), (2, vec![("human", "c")])],
    );
    write_hf_parquet(
        &data.join("train-00001-of-00002.parquet"),
        "conversations",
        ("from", "value"),
        &[(3, vec![("system", "s"), ("human", "d"), ("gpt", "e")])],
    );
    let (records, reader) = read_all(&dir.path().join("ds"), true);
    assert_eq!(reader.report().format, InputFormat::Parquet);
    let ids: Vec<_> = records.iter().map(|r| r.id.clone().unwrap()).collect();
    assert_eq!(ids, ["1", "2", "3"]);
    assert_eq!(records[2].turns[2].content, "e");
    assert_eq!(records[2].index, 2);
    assert_eq!(reader.progress().0, 3);

    let single = dir.path().join("messages.parquet");
    write_hf_parquet(&single, "messages", ("role", "content"), &[(9, vec![("user", "q"), ("assistant", "r")])]);
    let (records, _) = read_all(&single, true);
    assert_eq!(records[0].turns[1].role, "assistant");

    let wrong = dir.path().join("wrong.parquet");
    write_hf_parquet(&wrong, "text", ("role", "content"), &[(1, vec![])]);
    let err = ConversationReader::open(&wrong, &ReadOptions::default()).unwrap().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("no `conversations` or `messages` column"), "{err}");
}

/// OpenAI messages with reasoning, tool calls (arguments as a JSON string and as an object),
/// tool results, names and `tools` lists of different schemas: the records of the parquet
/// tool-field check.
fn tool_records() -> Vec<serde_json::Value> {
    use serde_json::json;
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "Name"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}});
    let search = json!({"type": "function", "function": {"name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 50},
            "limit": {"type": "integer", "default": 5}}}}});
    vec![
        json!({"id": "t1", "tools": [weather], "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "21", "tool_call_id": "functions.get_weather:0", "name": "get_weather"},
            {"role": "assistant", "content": "21 °C."}]}),
        json!({"id": "t2", "tools": [weather, search], "messages": [
            {"role": "user", "content": "Find x"},
            {"role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "functions.search:0", "type": "function",
                 "function": {"name": "search", "arguments": {"q": "x", "limit": 2}}},
                {"id": "functions.get_weather:1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}]},
            {"role": "tool", "content": "X", "tool_call_id": "functions.search:0"},
            {"role": "assistant", "content": "Found."}]}),
        json!({"id": "t3", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}),
    ]
}

#[test]
fn parquet_tool_calls_and_tools_equal_the_jsonl_reader_nested_or_as_json_strings() {
    let Some(py) = super::common::python("the parquet tool-field check (pyarrow writes the files)") else { return };
    let dir = tempdir();
    let records = tool_records();
    let jsonl = dir.path().join("tools.jsonl");
    let lines: Vec<String> = records.iter().map(|r| r.to_string()).collect();
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let (want, _) = read_all(&jsonl, true);
    assert_eq!(want[0].turns[1].tool_calls[0].arguments, serde_json::json!({"city": "Paris"}));
    assert!(want[1].tools.is_some() && want[2].tools.is_none());

    // As HF `datasets` writes them: nested lists and structs (pyarrow infers the union of every
    // row's keys, null where a row lacks one), and as JSON strings (arguments as a string too).
    let script = r#"
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
records = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
pq.write_table(pa.Table.from_pylist(records), sys.argv[2])
flat = []
for r in records:
    msgs = []
    for m in r["messages"]:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = json.dumps(m["tool_calls"], ensure_ascii=False)
        msgs.append(m)
    flat.append({"id": r["id"], "messages": msgs, "tools": json.dumps(r["tools"]) if "tools" in r else None})
flat.append({"id": "bad", "messages": [{"role": "user", "content": "q"}], "tools": "[not json"})
pq.write_table(pa.Table.from_pylist(flat), sys.argv[3])
print(pa.Table.from_pylist(records).schema.field("tools").type)
"#;
    let (nested, strings) = (dir.path().join("nested.parquet"), dir.path().join("strings.parquet"));
    let out =
        std::process::Command::new(&py).arg("-c").arg(script).arg(&jsonl).arg(&nested).arg(&strings).output().unwrap();
    assert!(out.status.success(), "pyarrow failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("list<item: struct<"), "tools written as structs");

    let (got, _) = read_all(&nested, true);
    assert_eq!(got, want, "nested lists and structs read as the JSONL reader reads the JSON");

    let (got, reader) = read_all(&strings, false);
    assert_eq!(got, want, "JSON strings read as the JSONL reader reads the JSON");
    assert_eq!(reader.report().malformed, 1);
    assert!(
        reader.report().warnings[0].contains("row 3") && reader.report().warnings[0].contains("`tools` is not JSON")
    );
}

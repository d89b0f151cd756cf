//! The second domain of `aerie bench shift`: HumanEval's Python stubs as chat requests, split by
//! task into training, held-out and selection prompts, and the selection prompts of both domains.

use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// HumanEval tasks by split: every 8th task (0, 8, ...) is held out for evaluation, every 8th
/// from 4 (4, 12, ...) is a selection prompt, the rest are trained on.
pub(super) fn split_of(index: usize) -> &'static str {
    match index % 8 {
        0 => "heldout",
        4 => "select",
        _ => "train",
    }
}

/// The user turn a HumanEval task becomes.
pub(super) fn code_request(stub: &str) -> String {
    format!("Complete the following Python function.\n\n```python\n{stub}```")
}

/// Read HumanEval's gzipped JSONL: (task_id, prompt) per line.
pub(super) fn read_humaneval(path: &Path) -> Result<Vec<(String, String)>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(flate2::read::GzDecoder::new(file)).lines().enumerate() {
        let line = line.with_context(|| format!("{}: not gzipped text at line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}: line {} is not JSON", path.display(), i + 1))?;
        let field = |k: &str| {
            v.get(k).and_then(|x| x.as_str()).map(str::to_owned).with_context(|| {
                format!("{}: line {} has no string `{k}` (not HumanEval's format)", path.display(), i + 1)
            })
        };
        out.push((field("task_id")?, field("prompt")?));
    }
    if out.is_empty() {
        bail!("{}: no HumanEval task in the file", path.display());
    }
    Ok(out)
}

/// Write `lines` (JSON values, one per line) to `path` atomically.
pub(super) fn write_jsonl(path: &Path, lines: &[serde_json::Value]) -> Result<()> {
    let mut text = String::new();
    for v in lines {
        text += &format!("{v}\n");
    }
    aerie_data::atomic::write_bytes(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// The code prompts of each split as regenerate's input (ShareGPT records) and the selection
/// prompts of both domains as decode prompts.
pub(super) fn write_inputs(code: &Path, humaneval: &Path, mtbench: &Path, select: &Path) -> Result<usize> {
    let tasks = read_humaneval(humaneval)?;
    let mut train = 0;
    for split in ["train", "heldout"] {
        let records: Vec<serde_json::Value> = tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| split_of(*i) == split)
            .map(|(_, (id, stub))| {
                serde_json::json!({"id": id, "conversations": [{"from": "human", "value": code_request(stub)}]})
            })
            .collect();
        if split == "train" {
            train = records.len();
        }
        write_jsonl(&code.join(format!("{split}.jsonl")), &records)?;
    }
    // Selection prompts alternate the domains, so that `select.max_prompts` would keep both:
    // HumanEval's selection tasks and MT-Bench's first turns (neither trained on nor held out).
    let code_sel: Vec<String> =
        tasks.iter().enumerate().filter(|(i, _)| split_of(*i) == "select").map(|(_, (_, s))| code_request(s)).collect();
    let chat_sel = aerie_eval::prompts::read_prompts(mtbench)?;
    let mut lines = Vec::new();
    for (i, (code, chat)) in code_sel.iter().zip(&chat_sel).take(2).enumerate() {
        let first = chat.context.last().map(|m| m.content.clone()).unwrap_or_default();
        lines.push(serde_json::json!({"id": format!("mtbench-{}", chat.id), "prompt": first}));
        lines.push(serde_json::json!({"id": format!("humaneval-select-{i}"), "prompt": code}));
    }
    write_jsonl(select, &lines)?;
    Ok(train)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn humaneval_splits_hold_out_every_eighth_task() {
        let split: Vec<&str> = (0..16).map(split_of).collect();
        assert_eq!(split.iter().filter(|s| **s == "heldout").count(), 2);
        assert_eq!(split.iter().filter(|s| **s == "select").count(), 2);
        assert_eq!(split[0], "heldout");
        assert_eq!(split[4], "select");
        // HumanEval's 164 tasks: 21 held out, 20 for selection, 123 trained on.
        let n = |w: &str| (0..164).filter(|&i| split_of(i) == w).count();
        assert_eq!((n("heldout"), n("select"), n("train")), (21, 20, 123));
    }

    #[test]
    fn a_bad_humaneval_file_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.jsonl.gz");
        let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&p).unwrap(), flate2::Compression::fast());
        writeln!(gz, "{{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f():\\n\"}}").unwrap();
        writeln!(gz, "{{\"task_id\": \"HumanEval/1\"}}").unwrap();
        gz.finish().unwrap();
        let err = format!("{:#}", read_humaneval(&p).unwrap_err());
        assert!(err.contains("line 2") && err.contains("`prompt`"), "{err}");
    }
}

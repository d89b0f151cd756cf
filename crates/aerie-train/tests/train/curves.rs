//! Training curves: the TensorBoard event file beside `metrics.jsonl` holds the same numbers (read
//! by aerie's reader, and by TensorBoard's own `EventAccumulator` from `$AERIE_PYTHON`), also
//! after a resume, and `metrics::curves` draws several runs on one chart.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use aerie_train::metrics::{Record, curves, events, read};

use crate::common::*;

/// Every scalar of `metrics.jsonl` as `tag → [(step, f32 value)]`, in file order.
fn jsonl_scalars(run: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
    let m = read(run).unwrap();
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    let mut lines: Vec<(u64, Vec<(String, f64)>)> = m.train.iter().map(|r| (r.step(), r.scalars())).collect();
    lines.extend(m.eval.iter().map(|r| (r.step(), r.scalars())));
    // Event order is file order: train and eval lines interleave by step, train first at a step.
    lines.sort_by_key(|(step, _)| *step);
    for (step, scalars) in lines {
        for (tag, v) in scalars {
            out.entry(tag).or_default().push((step as i64, v as f32));
        }
    }
    out
}

/// The same from the run's event file, read with aerie's reader.
fn event_scalars(run: &Path) -> BTreeMap<String, Vec<(i64, f32)>> {
    let files = events::files(run).unwrap();
    assert_eq!(files.len(), 1, "one event file per run: {files:?}");
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for e in events::read(&files[0]).unwrap() {
        for (tag, v) in e.scalars {
            out.entry(tag).or_default().push((e.step, v));
        }
    }
    out
}

/// A run of 6 steps with an eval every 2 steps, killed after step 3 and resumed from its
/// checkpoint of step 2: a log that did not drop what the resume re-does would hold step 3 twice.
fn resumed_run(w: &World, name: &str) -> std::path::PathBuf {
    let cfg = config(w, name, "eval_every = 2\nsave_every = 2", "max_steps = 6");
    run_until(&cfg, 3);
    let dir = cfg.output_dir.clone();
    run(&cfg, 1, Some(&dir)).unwrap();
    dir
}

#[test]
fn event_file_holds_metrics_jsonl_also_after_a_resume() {
    let w = world();
    let dir = resumed_run(&w, "run");
    let jsonl = jsonl_scalars(&dir);
    for tag in
        ["train/loss", "train/acc_k/0", "train/accept_length", "train/lr", "train/grad_norm", "train/tokens_per_s"]
    {
        let steps: Vec<i64> = jsonl[tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, (1..=6).collect::<Vec<_>>(), "{tag}");
    }
    assert!(jsonl.contains_key("eval/eval/simulated_accept_length") && jsonl.contains_key("eval/eval/loss"));
    assert_eq!(event_scalars(&dir), jsonl);
}

/// `$AERIE_PYTHON` with the `tensorboard` package, or `None` with a note (a failure under CI).
fn tensorboard_python() -> Option<std::path::PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let Some(python) = std::env::var_os("AERIE_PYTHON") else {
        assert!(!ci, "AERIE_PYTHON is unset but CI=true: CI must run the TensorBoard check (.ci/run sets it)");
        println!("note: skipped: set AERIE_PYTHON to a Python with tensorboard (python/requirements-test.txt)");
        return None;
    };
    let ok = Command::new(&python)
        .args(["-c", "import tensorboard.backend.event_processing.event_accumulator"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(!ci, "CI=true but $AERIE_PYTHON has no tensorboard: install python/requirements-test.txt");
        println!("note: skipped: $AERIE_PYTHON has no tensorboard (python/requirements-test.txt)");
        return None;
    }
    Some(python.into())
}

/// TensorBoard's own reader (`EventAccumulator`, what `tensorboard --logdir` loads runs with)
/// reads every scalar of a resumed run with the step and value of `metrics.jsonl` (f32, as
/// TensorBoard stores scalars).
#[test]
fn tensorboard_reads_the_values_of_metrics_jsonl() {
    let Some(python) = tensorboard_python() else { return };
    let w = world();
    let dir = resumed_run(&w, "run");
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let out = Command::new(&python).args(["-c", script]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tb: BTreeMap<String, Vec<(i64, f64)>> = serde_json::from_slice(&out.stdout).unwrap();
    let jsonl = jsonl_scalars(&dir);
    assert_eq!(tb.keys().collect::<Vec<_>>(), jsonl.keys().collect::<Vec<_>>());
    for (tag, points) in &jsonl {
        let read: Vec<(i64, f32)> = tb[tag].iter().map(|&(s, v)| (s, v as f32)).collect();
        assert_eq!(&read, points, "{tag}");
    }
}

#[test]
fn curves_of_several_runs_are_drawn_to_png_and_svg() {
    let w = world();
    let a = config(&w, "run-a", "eval_every = 2", "max_steps = 4");
    let mut b = config(&w, "run-b", "eval_every = 2", "max_steps = 4");
    b.optim.lr = 3e-3;
    run(&a, 1, None).unwrap();
    run(&b, 1, None).unwrap();
    let runs = vec![a.output_dir.clone(), b.output_dir.clone()];
    let png = w.path("curves.png");
    curves::plot_runs(&runs, &png).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // IHDR: 1500 × 900.
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 1500);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 900);
    let svg = w.path("curves.svg");
    curves::plot_runs(&runs, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in ["run-a", "run-b", "run-a (eval: eval)", "learning rate", "tokens/s"] {
        assert!(text.contains(label), "{label} missing from the SVG");
    }
    // What cannot be drawn is refused with the file named.
    let err = curves::plot_runs(&runs, &w.path("curves.jpg")).unwrap_err().to_string();
    assert!(err.contains("curves.jpg") && err.contains(".png or .svg"), "{err}");
    let empty = w.path("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("metrics.jsonl"), "").unwrap();
    let err = curves::plot_runs(&[empty], &png).unwrap_err().to_string();
    assert!(err.contains("no train lines yet"), "{err}");
    std::fs::write(w.path("bad.jsonl"), "{\"kind\":\"train\",\"step\":1}\n").unwrap();
    let err = curves::plot_runs(&[w.path("bad.jsonl")], &png).unwrap_err().to_string();
    assert!(err.contains("bad.jsonl: line 1: missing field"), "{err}");
}

//! `[select]`: the loop decodes every `select.every_steps` steps and after the last, logs the τ,
//! keeps the best drafter as `RUN/best/` and carries it across a resume. The decoder here is a
//! stand-in that scores a drafter by a fixed τ per call (the real one is aerie-eval's, tested
//! through `aerie train` in aerie-cli's tests).

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Mutex};

use aerie_model::Drafter;
use aerie_train::select::{Decoded, Selector};
use aerie_train::{RunOptions, Summary, TrainConfig, train};
use burn::backend::Flex;

use crate::common::*;

/// Answers τ from `taus` in call order, and remembers each drafter's fc checksum.
#[derive(Debug)]
struct Scripted {
    taus: Mutex<Vec<f64>>,
    seen: Mutex<Vec<u64>>,
}

impl Selector<Flex> for Scripted {
    fn decoded_tau(&self, drafter: Drafter<Flex>) -> Result<Decoded, String> {
        self.seen.lock().unwrap().push(aerie_train::grads::weights_checksum(&drafter));
        let mut taus = self.taus.lock().unwrap();
        if taus.is_empty() {
            return Err("no τ left".into());
        }
        Ok(Decoded { tau: taus.remove(0), answers: 2, cycles: 7, seconds: 0.01 })
    }
}

fn scripted(taus: &[f64]) -> Arc<Scripted> {
    Arc::new(Scripted { taus: Mutex::new(taus.to_vec()), seen: Mutex::new(Vec::new()) })
}

fn with_select(w: &World, out: &str, top: &str, every: u64) -> TrainConfig {
    let text = config_text(w, out, top, "max_steps = 5");
    // [select] needs the target's model directory; the world has one.
    let text = text
        .replace(&format!("path = \"{}\"", w.target_file.display()), &format!("path = \"{}\"", w.target_dir.display()));
    let text = format!("{text}\n[select]\nevery_steps = {every}\nprompts = \"held-out.jsonl\"\nmax_new_tokens = 8\n");
    TrainConfig::from_toml_str(&text, Path::new("select.toml"), &[]).unwrap()
}

fn run_with(cfg: &TrainConfig, sel: Arc<Scripted>, resume: Option<&Path>, stop_after: Option<u64>) -> Summary {
    let opts = RunOptions::<B> {
        devices: vec![cpu()],
        resume: resume.map(Path::to_path_buf),
        all_reduce: None,
        selector: Some(sel),
    };
    train(cfg, &opts, &mut |e| match e {
        aerie_train::Event::Step(p) if stop_after.is_some_and(|s| p.step >= s) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .unwrap()
}

#[test]
fn the_best_decoded_tau_is_kept_and_survives_a_resume() {
    let w = world();
    // Every 2 steps and after the last (5): steps 2, 4, 5.
    let cfg = with_select(&w, "sel", "save_every = 2\nkeep_last = 0", 2);
    let sel = scripted(&[1.5, 1.9, 1.7]);
    let s = run_with(&cfg, sel.clone(), None, None);
    let best = s.best.as_ref().expect("a best drafter");
    assert_eq!((best.step, best.decoded.tau), (4, 1.9));
    let lines: Vec<_> = metrics_lines(&cfg.output_dir).into_iter().filter(|l| l["kind"] == "select").collect();
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![2, 4, 5]);
    assert_eq!(lines[2]["tau"].as_f64(), Some(1.7));
    assert_eq!((lines[2]["best_tau"].as_f64(), lines[2]["best_step"].as_u64()), (Some(1.9), Some(4)));
    // best/ holds step 4's weights (the checkpoint of step 4, bit for bit) and its record.
    let best_dir = cfg.output_dir.join("best");
    assert_eq!(tensors(&best_dir), tensors(&cfg.output_dir.join("checkpoint-4")));
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(best_dir.join("selection.json")).unwrap()).unwrap();
    assert_eq!((rec["step"].as_u64(), rec["tau"].as_f64()), (Some(4), Some(1.9)));
    assert!(aerie_train::metrics::read(&cfg.output_dir).unwrap().select.len() == 3);

    // Stopped after step 3 (checkpoint at 2, best at 2 with τ 1.5), resumed: the resumed run
    // chooses against 1.5, and a lower τ at step 4 leaves best/ at step 2.
    let cut = with_select(&w, "cut", "save_every = 2\nkeep_last = 0", 2);
    let first = scripted(&[1.5]);
    assert_eq!(run_with(&cut, first, None, Some(3)).steps, 3);
    let rest = scripted(&[1.2, 1.6]);
    let s = run_with(&cut, rest, Some(&cut.output_dir), None);
    let best = s.best.unwrap();
    assert_eq!((best.step, best.decoded.tau), (5, 1.6));
    let steps: Vec<u64> = metrics_lines(&cut.output_dir)
        .iter()
        .filter(|l| l["kind"] == "select")
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![2, 4, 5]);

    // Other decode settings than best/'s are refused on resume.
    let mut other = cut.clone();
    other.select.as_mut().unwrap().k = 3;
    let opts = RunOptions::<B> {
        devices: vec![cpu()],
        resume: Some(cut.output_dir.clone()),
        all_reduce: None,
        selector: Some(scripted(&[])),
    };
    let e = train(&other, &opts, &mut |_| ControlFlow::Continue(())).unwrap_err().to_string();
    assert!(e.contains("selection.json") && e.contains("[select] settings"), "{e}");
}

#[test]
fn select_needs_a_decoder_and_a_target_directory() {
    let w = world();
    let cfg = with_select(&w, "nodec", "", 1);
    let e = run(&cfg, 1, None).unwrap_err().to_string();
    assert!(e.contains("[select]") && e.contains("selector"), "{e}");
    // target.path a safetensors file and no select.target: nothing to decode with.
    let text = config_text(&w, "file", "", "max_steps = 1");
    let text = format!("{text}\n[select]\nprompts = \"p.jsonl\"\n");
    let e = TrainConfig::from_toml_str(&text, Path::new("file.toml"), &[]).unwrap_err().to_string();
    assert!(e.contains("file.toml") && e.contains("select.target"), "{e}");
}

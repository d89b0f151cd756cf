//! Kill (simulated: the observer stops the run, leaving a partial checkpoint directory behind),
//! resume, and the final weights equal an uninterrupted run's bit for bit.

use crate::common::*;

#[test]
fn resume_after_interruption_is_bit_identical() {
    let w = world();
    let top = "save_every = 3\nkeep_last = 2\neval_every = 4";
    let straight = config(&w, "straight", top, "max_steps = 8\ngrad_accumulation = 2");
    let a = run(&straight, 1, None).unwrap();
    assert_eq!(a.steps, 8);

    let broken = config(&w, "broken", top, "max_steps = 8\ngrad_accumulation = 2");
    let b = run_until(&broken, 5);
    assert_eq!((b.status, b.steps), (aerie_train::Status::Interrupted, 5));
    // What a kill -9 in the middle of the next save leaves.
    std::fs::create_dir_all(broken.output_dir.join("ckpt-6.tmp/training_state")).unwrap();
    std::fs::write(broken.output_dir.join("ckpt-6.tmp/config.json"), "{").unwrap();

    // Bookkeeping keys may change on resume; result-affecting keys may not.
    let mut changed = broken.clone();
    changed.optim.lr = 2e-3;
    changed.data.batch_tokens = 65;
    let e = run(&changed, 1, Some(&broken.output_dir)).unwrap_err().to_string();
    assert!(e.contains("optim.lr") && e.contains("data.batch_tokens") && e.contains("0.002"), "{e}");
    let e = run(&broken, 2, Some(&broken.output_dir)).unwrap_err().to_string();
    assert!(e.contains("micro-batches per step"), "{e}");

    let mut resumed = broken.clone();
    resumed.log_every = 2;
    let c = run(&resumed, 1, Some(&broken.output_dir)).unwrap();
    assert_eq!(c.steps, 8);
    assert!(c.resumed_from.as_ref().unwrap().ends_with("checkpoint-3"));
    assert!(!broken.output_dir.join("ckpt-6.tmp").exists());

    let fa = tensors(a.final_checkpoint.as_ref().unwrap());
    let fc = tensors(c.final_checkpoint.as_ref().unwrap());
    assert_eq!(fa.len(), fc.len());
    for ((na, ba), (nc, bc)) in fa.iter().zip(&fc) {
        assert_eq!(na, nc);
        assert!(ba == bc, "tensor `{na}` differs after resume");
    }
    // The intermediate checkpoint's weights agree too (same step, same bytes).
    assert_eq!(tensors(&straight.output_dir.join("checkpoint-6")), tensors(&broken.output_dir.join("checkpoint-6")));
    // metrics.jsonl: steps 4 and 5 of the killed segment were dropped and re-logged once.
    let steps: Vec<u64> = metrics_lines(&broken.output_dir)
        .iter()
        .filter(|l| l["kind"] == "train")
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 6, 8]);
}

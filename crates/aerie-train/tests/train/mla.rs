//! The MLA drafter chosen by `[init.shape.mla]` trains through the same loop as the Llama one:
//! the held-out loss falls, the checkpoint is an `Eagle3DeepseekV2ForCausalLM` drafter, and a
//! resumed run ends bit-identical (the optimizer state follows the MLA tensors' canonical names).

use aerie_model::checkpoint::load_drafter;

use crate::common::*;

const MLA: &str = "\n[init.shape.mla]\nq_lora_rank = 16\nkv_lora_rank = 12\nqk_nope_head_dim = 8\n\
                   qk_rope_head_dim = 4\nv_head_dim = 6\n";

#[test]
fn mla_drafter_learns_resumes_and_saves_its_layout() {
    let w = world();
    let top = "eval_every = 12\nsave_every = 6\nkeep_last = 2";
    let mut cfg = config(&w, "mla", top, &format!("max_steps = 12{MLA}"));
    cfg.optim.lr = 5e-3;
    let a = run(&cfg, 1, None).unwrap();
    assert_eq!((a.status, a.steps), (aerie_train::Status::Completed, 12));
    let evals: Vec<serde_json::Value> =
        metrics_lines(&cfg.output_dir).into_iter().filter(|l| l["kind"] == "eval").collect();
    let last = evals.last().unwrap()["metrics"]["loss"].as_f64().unwrap();
    // The held-out loss of the same initial drafter before any step (a first *train* loss is on
    // other samples and not comparable).
    let before = initial_held_out(&w, &cfg).loss;
    assert!(last < before, "held-out loss {last} after 12 steps, {before} before");

    let final_dir = a.final_checkpoint.clone().unwrap();
    let saved = load_drafter(&final_dir, None).unwrap();
    let m = saved.config.mla.expect("an MLA drafter");
    assert_eq!(
        (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        (16, 12, 8, 4, 6)
    );
    assert!(saved.tensors.contains_key("midlayer.self_attn.kv_a_proj_with_mqa.weight"));
    assert!(!saved.tensors.contains_key("midlayer.self_attn.q_proj.weight"));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(final_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(c["architectures"], serde_json::json!(["Eagle3DeepseekV2ForCausalLM"]));

    let mut broken = config(&w, "mla-broken", top, &format!("max_steps = 12{MLA}"));
    broken.optim.lr = 5e-3;
    let b = run_until(&broken, 7);
    assert_eq!(b.steps, 7);
    let c = run(&broken, 1, Some(&broken.output_dir)).unwrap();
    assert_eq!(c.steps, 12);
    assert_eq!(
        tensors(&final_dir),
        tensors(c.final_checkpoint.as_ref().unwrap()),
        "resume differs from a straight run"
    );
}

//! A NaN in the data stops training at the step that meets it, names the samples, and leaves the
//! last good checkpoint as the newest one.

use aerie_data::shard::ShardWriterOptions;
use aerie_train::data::{Catalog, plan_epoch};

use crate::common::*;

/// Overwrite the `aux_hidden` tensor of one shard file with NaN (checksums are off).
fn poison(shard: &std::path::Path) {
    let mut bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = header["aux_hidden"]["data_offsets"].as_array().unwrap();
    let (a, b) = (off[0].as_u64().unwrap() as usize, off[1].as_u64().unwrap() as usize);
    for c in bytes[8 + n + a..8 + n + b].chunks_exact_mut(4) {
        c.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(shard, bytes).unwrap();
}

#[test]
fn nan_stops_training_and_keeps_the_last_good_checkpoint() {
    // One sample per shard, so poisoning a shard poisons exactly one sample.
    let w = world_with(ShardWriterOptions { shard_tokens: 1, checksums: false });
    let cfg = config(&w, "nan", "save_every = 1\nkeep_last = 0", "max_steps = 6");
    let catalog = Catalog::open(&cfg.data).unwrap();
    let plan = plan_epoch(&catalog.train, cfg.seed, 0, cfg.data.batch_tokens, cfg.data.bucket_window);
    let victim = catalog.train[plan[3][0]];
    let label = catalog.describe(victim);
    let shard = catalog.view(victim).shard_path().to_path_buf();
    drop(catalog);
    poison(&shard);

    let e = run(&cfg, 1, None).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, aerie_train::Error::NonFinite { step: 4, .. }), "{msg}");
    assert!(msg.contains(&label) && msg.contains("checkpoint-3"), "{msg}");
    let ckpts = aerie_train::checkpoint::list_checkpoints(&cfg.output_dir).unwrap();
    assert_eq!(ckpts.last().unwrap().0, 3);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.output_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "non_finite");
}

//! Offline evaluation on captured shards, as `aerie eval loss`, `aerie eval accept` and `aerie
//! compare` run it: the shards and, when they carry final hidden states, the target head are
//! opened once; then each drafter is loaded and evaluated against them.

use std::path::{Path, PathBuf};

use aerie_data::shard::ShardDataset;
use aerie_model::checkpoint::{load_drafter, load_target_head};
use aerie_model::ttt::eval::{EvalLossOptions, eval_loss};
use aerie_model::{Drafter, TargetHead, TttMetrics};
use burn::tensor::{Tensor, TensorData, backend::Backend};

use crate::accept::AcceptReport;
use crate::verify::{AcceptOptions, eval_accept};
use crate::{Error, Result};

/// The target head `[V, Ht]` at `path` (a safetensors file with `lm_head.weight`, or the target
/// directory) as a tensor: the teacher of shards that carry final hidden states.
fn head_tensor<B: Backend>(path: &Path, device: &B::Device) -> Result<Tensor<B, 2>> {
    let head = load_target_head(path)?;
    let [v, h] = match head.shape[..] {
        [v, h] => [v, h],
        _ => {
            return Err(Error::Input {
                path: path.to_path_buf(),
                message: format!("the target head must be 2-D [V, Ht], found {:?}", head.shape),
            });
        }
    };
    Ok(Tensor::from_data(TensorData::new(head.to_f32("lm_head.weight")?, [v, h]), device))
}

/// Captured shards and the target head they need, opened once for any number of drafters.
pub struct ShardEval<B: Backend> {
    /// The shards.
    pub data: ShardDataset,
    /// The target head, when the shards carry final hidden states and one was given.
    pub head: Option<Tensor<B, 2>>,
    dir: PathBuf,
}

impl<B: Backend> ShardEval<B> {
    /// Open the shards in `dir` and, when they need it, the target head at `target_head`.
    pub fn open(dir: &Path, target_head: Option<&Path>, device: &B::Device) -> Result<Self> {
        let data = ShardDataset::open(dir).map_err(|e| Error::step(format!("opening {}", dir.display()), e))?;
        let teacher = data.metadata().teacher;
        let head = match (target_head, teacher.has_final_hidden()) {
            (Some(path), true) => {
                let head = head_tensor::<B>(path, device)?;
                let meta = data.metadata();
                let want = [meta.target_vocab_size, meta.hidden_size];
                if head.dims() != want {
                    // Named here: found later, the mismatch would be blamed on the drafter.
                    return Err(Error::Input {
                        path: path.to_path_buf(),
                        message: format!(
                            "--target-head is [{}, {}] ([V, Ht]); the shards in {} were captured from a target of \
                             vocabulary {} and hidden size {}",
                            head.dims()[0],
                            head.dims()[1],
                            dir.display(),
                            want[0],
                            want[1]
                        ),
                    });
                }
                Some(head)
            }
            (None, true) if teacher.topk().is_none() => {
                return Err(Error::Input {
                    path: dir.to_path_buf(),
                    message: "the shards carry final hidden states only; pass --target-head (lm_head safetensors or target directory)".into(),
                });
            }
            _ => None,
        };
        Ok(Self { data, head, dir: dir.to_path_buf() })
    }

    /// Samples an evaluation reads, with at most `max_samples`.
    pub fn samples(&self, max_samples: Option<usize>) -> usize {
        max_samples.map_or(self.data.len(), |m| m.min(self.data.len()))
    }

    /// Load the drafter at `drafter_dir` (its embedding from `target` when it ships none) and
    /// measure the training objective on these shards: teacher-forced loss, accuracy and
    /// simulated τ per step; the target head's logits are taken `head_chunk_rows` rows at a time.
    /// `progress(done)` after every batch (samples).
    pub fn loss(
        &self,
        drafter_dir: &Path,
        target: Option<&Path>,
        opts: &EvalLossOptions,
        head_chunk_rows: usize,
        progress: &dyn Fn(usize),
        device: &B::Device,
    ) -> Result<TttMetrics> {
        let drafter = self.drafter(drafter_dir, target, device)?;
        let head = self.head.clone().map(|h| TargetHead::new(h, drafter.vocab(), head_chunk_rows));
        eval_loss(&drafter, &self.data, head.as_ref(), opts, &mut |done, _| progress(done))
            .map_err(|e| Error::step(format!("evaluating {} on {}", drafter_dir.display(), self.dir.display()), e))
    }

    fn drafter(&self, drafter_dir: &Path, target: Option<&Path>, device: &B::Device) -> Result<Drafter<B>> {
        let ckpt = load_drafter(drafter_dir, target)
            .map_err(|e| Error::step(format!("loading drafter {}", drafter_dir.display()), e))?;
        Drafter::<B>::from_tensors(&ckpt.config, &ckpt.tensors, device)
            .map_err(|e| Error::step(format!("building drafter {}", drafter_dir.display()), e))
    }

    /// Load the drafter at `drafter_dir` (its embedding from `target` when it ships none) and
    /// measure its serving-mode acceptance; `progress(done)` after every batch (samples).
    pub fn accept(
        &self,
        drafter_dir: &Path,
        target: Option<&Path>,
        opts: &AcceptOptions,
        progress: &dyn Fn(usize),
        device: &B::Device,
    ) -> Result<AcceptReport> {
        let drafter = self.drafter(drafter_dir, target, device)?;
        eval_accept(&drafter, &self.data, self.head.as_ref(), opts, &mut |done, _| progress(done))
            .map_err(|e| Error::step(format!("evaluating {} on {}", drafter_dir.display(), self.dir.display()), e))
    }
}

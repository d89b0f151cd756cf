//! Content checks shared by the writer (on every pushed sample) and by
//! [`ShardDataset::verify`](super::ShardDataset::verify) (on every stored one), so a dataset
//! that one side accepts the other accepts too. Each returns a message that names the tensor
//! and the first offending position.

use super::names;

/// Log-probs may exceed 0 by this much (rounding in the engine's log-softmax).
const LOGPROB_SLACK: f32 = 1e-3;

/// Ids in `0..vocab`.
pub(crate) fn token_ids(tensor: &str, ids: &[i32], vocab: usize) -> Result<(), String> {
    match ids.iter().position(|&id| id < 0 || id as usize >= vocab) {
        Some(i) => Err(format!("{tensor}[{i}] = {} is outside the target vocabulary 0..{vocab}", ids[i])),
        None => Ok(()),
    }
}

/// Mask values 0 or 1; returns the count of ones.
pub(crate) fn loss_mask(mask: &[u8]) -> Result<u64, String> {
    match mask.iter().position(|&m| m > 1) {
        Some(i) => Err(format!("loss_mask[{i}] = {} is neither 0 nor 1", mask[i])),
        None => Ok(mask.iter().map(|&m| u64::from(m)).sum()),
    }
}

/// Top-k rows: ids in the vocabulary, log-probs neither NaN nor above 0, descending per row.
/// `-inf` is allowed (K larger than the distribution's support). The error names the tensor.
pub(crate) fn topk(ids: &[i32], logprobs: &[f32], k: usize, vocab: usize) -> Result<(), (&'static str, String)> {
    token_ids(names::TOPK_IDS, ids, vocab).map_err(|m| (names::TOPK_IDS, m))?;
    topk_logprobs(logprobs, k).map_err(|m| (names::TOPK_LOGPROBS, m))
}

fn topk_logprobs(logprobs: &[f32], k: usize) -> Result<(), String> {
    if k == 0 {
        return Ok(());
    }
    for (t, row) in logprobs.chunks_exact(k).enumerate() {
        if let Some(j) = row.iter().position(|&v| v.is_nan() || v > LOGPROB_SLACK) {
            return Err(format!("teacher_topk_logprobs[{t}, {j}] = {} is not a log-probability", row[j]));
        }
        if let Some(j) = row.windows(2).position(|w| w[1] > w[0]) {
            return Err(format!(
                "teacher_topk_logprobs row {t} is not descending ({} then {} at {j})",
                row[j],
                row[j + 1]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_point_at_the_first_problem() {
        assert!(token_ids("input_ids", &[0, 9], 10).is_ok());
        assert!(token_ids("input_ids", &[0, 10], 10).unwrap_err().contains("input_ids[1] = 10"));
        assert!(token_ids("input_ids", &[-1], 10).is_err());
        assert_eq!(loss_mask(&[0, 1, 1]), Ok(2));
        assert!(loss_mask(&[0, 2]).unwrap_err().contains("loss_mask[1] = 2"));
        let ninf = f32::NEG_INFINITY;
        assert!(topk(&[1, 2], &[-0.1, ninf], 2, 10).is_ok());
        let (tensor, message) = topk(&[1, 2], &[-1.0, -0.1], 2, 10).unwrap_err();
        assert_eq!(tensor, names::TOPK_LOGPROBS);
        assert!(message.contains("not descending"), "{message}");
        assert!(topk(&[1, 2], &[0.5, -0.1], 2, 10).unwrap_err().1.contains("[0, 0]"));
        assert!(topk(&[1, 2], &[-0.1, f32::NAN], 2, 10).is_err());
        assert_eq!(topk(&[1, 12], &[-0.1, -0.2], 2, 10).unwrap_err().0, names::TOPK_IDS);
    }
}

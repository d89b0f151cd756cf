//! A regenerated turn in the server's dialect: the job handed to aerie-engine's [`turn`] (which
//! owns every engine's request body and answer) and its answer read back into the driver's
//! [`TurnDone`]; and `--api auto` resolved by aerie-engine's one detection rule.

use std::collections::BTreeMap;

use aerie_engine::turn::{self, TurnRequest, TurnStop};
use serde_json::Value;

use super::{Resolved, ServerOptions};
use crate::regenerate::engine::{Finish, TurnDone, TurnJob};
use crate::regenerate::sampling::turn_seed;
use crate::{Error, Result};

/// Resolve `--api auto` and the model by aerie-engine's one detection rule.
pub(in crate::regenerate) fn detect(opts: &ServerOptions) -> Result<(Resolved, &'static str)> {
    let d = aerie_engine::detect::detect(&opts.url, opts.api, opts.model.as_deref())
        .map_err(|e| Error::Invalid(format!("--server {e}")))?;
    Ok((Resolved { api: d.engine, model: d.model }, d.source))
}

/// The request body of one turn.
pub(in crate::regenerate) fn request_body(
    resolved: &Resolved,
    job: &TurnJob,
    eos: &[u32],
    kwargs: &BTreeMap<String, Value>,
) -> Value {
    let s = job.sampling;
    let request = TurnRequest {
        prompt_ids: &job.prompt_ids,
        messages: &job.messages,
        tools: job.tools.as_ref(),
        max_new_tokens: job.max_new_tokens,
        temperature: s.temperature,
        top_p: s.top_p,
        seed: turn_seed(s.seed, job.source_index, job.turn),
        stop_ids: eos,
        model: resolved.model.as_deref(),
        template_kwargs: kwargs,
    };
    turn::body(resolved.api, &request)
}

/// Read one successful response into the driver's answer.
pub(in crate::regenerate) fn parse_response(
    resolved: &Resolved,
    job: &TurnJob,
    eos: &[u32],
    v: &Value,
) -> std::result::Result<TurnDone, String> {
    let a = turn::read(resolved.api, eos, v)?;
    let tokens = a.completion_tokens.unwrap_or(0);
    Ok(TurnDone {
        key: job.key,
        ids: a.ids,
        text: a.text,
        reasoning: a.reasoning,
        finish: match a.stop {
            TurnStop::Eos => Finish::Eos,
            TurnStop::Length => Finish::Budget,
        },
        prompt_tokens: a.prompt_tokens.unwrap_or(job.prompt_ids.len() as u64),
        tokens,
        prefill_seconds: 0.0,
        decode_seconds: 0.0,
        decode_tokens: tokens.saturating_sub(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::sampling::Sampling;
    use aerie_data::conversation::{Message, Role};
    use aerie_engine::Engine;
    use serde_json::json;

    fn job(temperature: f32) -> TurnJob {
        TurnJob {
            key: 2,
            conv_id: "c".into(),
            source_index: 5,
            turn: 1,
            prompt_ids: vec![1, 2, 3],
            messages: vec![Message::new(Role::User, "hi")],
            tools: None,
            max_new_tokens: 16,
            sampling: Sampling { temperature, top_p: 0.9, seed: 7 },
        }
    }

    /// The job's seed is the turn's (seed, record, turn), the answer's counts the driver's.
    #[test]
    fn a_job_goes_out_with_its_turn_seed_and_comes_back_as_the_drivers_answer() {
        let sg = Resolved { api: Engine::Sglang, model: None };
        let b = request_body(&sg, &job(0.7), &[9], &BTreeMap::new());
        assert_eq!(b["sampling_params"]["sampling_seed"], json!(turn_seed(7, 5, 1)));
        let v = json!({"output_ids": [5, 6, 9], "meta_info": {"completion_tokens": 3,
            "finish_reason": {"type": "stop", "matched": 9}}});
        let d = parse_response(&sg, &job(0.0), &[9], &v).unwrap();
        assert_eq!((d.key, d.ids.as_deref(), d.finish), (2, Some(&[5, 6][..]), Finish::Eos));
        assert_eq!((d.prompt_tokens, d.tokens, d.decode_tokens), (3, 3, 2));
    }
}

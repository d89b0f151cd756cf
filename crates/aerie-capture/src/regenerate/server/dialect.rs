//! The wire dialects of a regenerated turn: the request body of a turn, and reading the answer (SGLang's `/generate`, vLLM's ids-in/ids-out `/v1/completions`, the
//! OpenAI-compatible `/v1/chat/completions`).

use std::collections::BTreeMap;

use aerie_engine::Engine;
use serde_json::{Value, json};

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
    let sampled = !s.is_greedy();
    let seed = turn_seed(s.seed, job.source_index, job.turn);
    match resolved.api {
        Engine::Sglang => {
            let mut params = json!({
                "max_new_tokens": job.max_new_tokens,
                "temperature": s.temperature,
                "stop_token_ids": eos,
                // The text is not used (aerie decodes output_ids); keep it complete for logs.
                "skip_special_tokens": false,
            });
            if sampled {
                params["top_p"] = json!(s.top_p);
                params["sampling_seed"] = json!(seed);
            }
            json!({"input_ids": job.prompt_ids, "sampling_params": params, "stream": false})
        }
        Engine::Vllm => {
            let mut body = json!({
                "model": resolved.model.as_deref().unwrap_or("default"),
                "prompt": job.prompt_ids,
                "max_tokens": job.max_new_tokens,
                "temperature": s.temperature,
                "stop_token_ids": eos,
                "return_token_ids": true,
                // aerie decodes token_ids itself; the text is only kept complete for logs.
                "skip_special_tokens": false,
                "stream": false,
            });
            if sampled {
                body["top_p"] = json!(s.top_p);
                body["seed"] = json!(seed);
            }
            body
        }
        _ => {
            let messages: Vec<Value> =
                job.messages.iter().map(|m| json!({"role": m.role.as_str(), "content": m.content})).collect();
            let mut body = json!({
                "model": resolved.model.as_deref().unwrap_or("default"),
                "messages": messages,
                "max_tokens": job.max_new_tokens,
                "temperature": s.temperature,
                "stream": false,
            });
            if sampled {
                body["top_p"] = json!(s.top_p);
                body["seed"] = json!(seed);
            }
            if !kwargs.is_empty() {
                body["chat_template_kwargs"] = json!(kwargs);
            }
            if let Some(tools) = &job.tools {
                body["tools"] = tools.clone();
            }
            body
        }
    }
}

/// Read one successful response.
pub(in crate::regenerate) fn parse_response(
    api: Engine,
    job: &TurnJob,
    eos: &[u32],
    v: &Value,
) -> std::result::Result<TurnDone, String> {
    let mut done = TurnDone {
        key: job.key,
        ids: None,
        text: None,
        reasoning: None,
        finish: Finish::Eos,
        prompt_tokens: job.prompt_ids.len() as u64,
        tokens: 0,
        prefill_seconds: 0.0,
        decode_seconds: 0.0,
        decode_tokens: 0,
    };
    let u = |x: Option<&Value>| x.and_then(Value::as_u64);
    match api {
        Engine::Sglang => {
            let meta = v.get("meta_info").ok_or("no `meta_info` in the /generate response")?;
            let mut ids: Vec<u32> = v
                .get("output_ids")
                .and_then(Value::as_array)
                .ok_or("no `output_ids` list in the /generate response (is this SGLang?)")?
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("`output_ids` holds {x}, not a token id"))
                })
                .collect::<std::result::Result<_, _>>()?;
            let reason = meta.get("finish_reason");
            let kind = reason.and_then(|r| r.get("type")).and_then(Value::as_str).unwrap_or("");
            done.finish = match kind {
                "stop" => Finish::Eos,
                "length" => Finish::Budget,
                "abort" => {
                    let m = reason.and_then(|r| r.get("message")).map(Value::to_string).unwrap_or_default();
                    return Err(format!("the server aborted the request: {m}"));
                }
                other => return Err(format!("unknown meta_info.finish_reason.type `{other}`")),
            };
            let completion = u(meta.get("completion_tokens")).unwrap_or(ids.len() as u64);
            // SGLang keeps the matched stop token in output_ids; it is not part of the answer.
            let matched = reason.and_then(|r| r.get("matched")).and_then(Value::as_u64).map(|n| n as u32);
            if done.finish == Finish::Eos && ids.last().is_some_and(|t| Some(*t) == matched || eos.contains(t)) {
                ids.pop();
            }
            done.prompt_tokens = u(meta.get("prompt_tokens")).unwrap_or(done.prompt_tokens);
            done.tokens = completion;
            done.ids = Some(ids);
        }
        Engine::Vllm => {
            let choice = v.get("choices").and_then(|c| c.get(0)).ok_or("no `choices[0]` in the completion response")?;
            let mut ids: Vec<u32> = choice
                .get("token_ids")
                .and_then(Value::as_array)
                .ok_or("no `choices[0].token_ids` in the completion response (a vLLM with `return_token_ids`?)")?
                .iter()
                .map(|x| x.as_u64().map(|n| n as u32).ok_or("`token_ids` holds a non-integer"))
                .collect::<std::result::Result<_, _>>()?;
            done.finish = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("stop") => Finish::Eos,
                Some("length") => Finish::Budget,
                Some("abort") => return Err("the server aborted the request (finish_reason `abort`)".into()),
                other => return Err(format!("unknown choices[0].finish_reason {other:?}")),
            };
            // vLLM keeps the stop token in token_ids (`stop_reason` names it when it was one of
            // stop_token_ids, null for the model's own eos); it is not part of the answer.
            let matched = choice.get("stop_reason").and_then(Value::as_u64).map(|n| n as u32);
            if done.finish == Finish::Eos && ids.last().is_some_and(|t| Some(*t) == matched || eos.contains(t)) {
                ids.pop();
            }
            let usage = v.get("usage");
            done.prompt_tokens = u(usage.and_then(|x| x.get("prompt_tokens"))).unwrap_or(done.prompt_tokens);
            done.tokens = u(usage.and_then(|x| x.get("completion_tokens"))).unwrap_or(ids.len() as u64);
            done.ids = Some(ids);
        }
        _ => {
            let choice = v.get("choices").and_then(|c| c.get(0)).ok_or("no `choices[0]` in the chat response")?;
            let msg = choice.get("message").ok_or("no `choices[0].message` in the chat response")?;
            let text = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
            done.text = Some(text("content").unwrap_or_default());
            done.reasoning = text("reasoning_content").or_else(|| text("reasoning")).filter(|r| !r.is_empty());
            done.finish = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("length") => Finish::Budget,
                _ => Finish::Eos,
            };
            let usage = v.get("usage");
            done.prompt_tokens = u(usage.and_then(|x| x.get("prompt_tokens"))).unwrap_or(done.prompt_tokens);
            done.tokens = u(usage.and_then(|x| x.get("completion_tokens"))).unwrap_or(0);
        }
    }
    done.decode_tokens = done.tokens.saturating_sub(1);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::sampling::Sampling;
    use aerie_data::conversation::{Message, Role};

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

    #[test]
    fn bodies_carry_the_ids_or_the_messages_and_seed_only_when_sampling() {
        let sg = Resolved { api: Engine::Sglang, model: None };
        let b = request_body(&sg, &job(0.0), &[9], &BTreeMap::new());
        assert_eq!(b["input_ids"], json!([1, 2, 3]));
        assert_eq!(b["sampling_params"]["stop_token_ids"], json!([9]));
        assert!(b["sampling_params"].get("sampling_seed").is_none());
        let b = request_body(&sg, &job(0.7), &[9], &BTreeMap::new());
        assert_eq!(b["sampling_params"]["sampling_seed"], json!(turn_seed(7, 5, 1)));
        let oa = Resolved { api: Engine::Openai, model: Some("m".into()) };
        let kw = BTreeMap::from([("thinking".to_owned(), json!(false))]);
        let b = request_body(&oa, &job(0.7), &[9], &kw);
        assert_eq!(b["messages"][0], json!({"role": "user", "content": "hi"}));
        assert_eq!((b["model"].as_str(), b["max_tokens"].as_u64()), (Some("m"), Some(16)));
        assert_eq!(b["chat_template_kwargs"]["thinking"], false);
        assert_eq!(b["seed"], json!(turn_seed(7, 5, 1)));
        assert!(b.get("tools").is_none(), "no tools key without tools");
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let b = request_body(&oa, &TurnJob { tools: Some(tools.clone()), ..job(0.0) }, &[9], &kw);
        assert_eq!(b["tools"], tools, "the conversation's tools go to the server");
    }

    #[test]
    fn responses_of_both_dialects() {
        let j = job(0.0);
        let sg = json!({"text": "ab", "output_ids": [5, 6, 9], "meta_info": {"id": "x", "prompt_tokens": 3,
            "completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 9}}});
        let d = parse_response(Engine::Sglang, &j, &[9], &sg).unwrap();
        assert_eq!((d.ids.as_deref(), d.finish, d.tokens), (Some(&[5, 6][..]), Finish::Eos, 3));
        let len = json!({"output_ids": [5, 6], "meta_info": {"completion_tokens": 2,
            "finish_reason": {"type": "length", "length": 2}}});
        assert_eq!(parse_response(Engine::Sglang, &j, &[9], &len).unwrap().finish, Finish::Budget);
        let abort = json!({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}});
        assert!(parse_response(Engine::Sglang, &j, &[9], &abort).unwrap_err().contains("oom"));
        let chat = json!({"choices": [{"message": {"role": "assistant", "content": "hey", "reasoning_content": "r"},
            "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 16}});
        let d = parse_response(Engine::Openai, &j, &[9], &chat).unwrap();
        assert_eq!((d.text.as_deref(), d.reasoning.as_deref()), (Some("hey"), Some("r")));
        assert_eq!((d.finish, d.prompt_tokens, d.tokens), (Finish::Budget, 4, 16));
    }

    #[test]
    fn vllm_completions_carry_ids_both_ways() {
        let vl = Resolved { api: Engine::Vllm, model: Some("smol".into()) };
        let b = request_body(&vl, &job(0.0), &[9, 4], &BTreeMap::new());
        assert_eq!(b["prompt"], json!([1, 2, 3]), "aerie's ids are the prompt");
        assert_eq!((b["model"].as_str(), b["max_tokens"].as_u64()), (Some("smol"), Some(16)));
        assert_eq!(b["stop_token_ids"], json!([9, 4]));
        assert_eq!(b["return_token_ids"], true);
        assert!(b.get("messages").is_none() && b.get("seed").is_none() && b.get("top_p").is_none());
        let b = request_body(&vl, &job(0.7), &[9], &BTreeMap::new());
        assert_eq!(b["seed"], json!(turn_seed(7, 5, 1)));
        assert!((b["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);

        let j = job(0.0);
        // Stopped on a stop_token_ids entry: vLLM names it in stop_reason and keeps it.
        let stop = json!({"choices": [{"index": 0, "text": "ab", "token_ids": [5, 6, 9], "finish_reason": "stop",
            "stop_reason": 9, "prompt_token_ids": null}], "usage": {"prompt_tokens": 3, "completion_tokens": 3}});
        let d = parse_response(Engine::Vllm, &j, &[9], &stop).unwrap();
        assert_eq!((d.ids.as_deref(), d.finish, d.tokens, d.prompt_tokens), (Some(&[5, 6][..]), Finish::Eos, 3, 3));
        // The model's own eos: stop_reason null, the token still last.
        let eos = json!({"choices": [{"token_ids": [5, 9], "finish_reason": "stop", "stop_reason": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        assert_eq!(parse_response(Engine::Vllm, &j, &[9], &eos).unwrap().ids.as_deref(), Some(&[5][..]));
        // The budget: every token is the answer's, an eos-looking last one included.
        let len = json!({"choices": [{"token_ids": [5, 6, 9], "finish_reason": "length", "stop_reason": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3}});
        let d = parse_response(Engine::Vllm, &j, &[9], &len).unwrap();
        assert_eq!((d.ids.as_deref(), d.finish), (Some(&[5, 6, 9][..]), Finish::Budget));
        let no_ids = json!({"choices": [{"text": "x", "finish_reason": "stop"}]});
        assert!(parse_response(Engine::Vllm, &j, &[9], &no_ids).unwrap_err().contains("return_token_ids"));
        let abort = json!({"choices": [{"token_ids": [], "finish_reason": "abort"}]});
        assert!(parse_response(Engine::Vllm, &j, &[9], &abort).unwrap_err().contains("abort"));
    }
}

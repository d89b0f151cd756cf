//! One chat turn answered by a serving engine, in each engine's dialect (`aerie regenerate
//! --server`): the request body of a turn and the reading of its answer. Three dialects:
//!
//! - **SGLang** `POST /generate` with `input_ids` (the caller's own render, so the prompt is
//!   exactly the tokens it would feed a native target) and `output_ids` back (the tokens the model
//!   produced). Shapes from SGLang's source: `GenerateReqInput`
//!   (`python/sglang/srt/managers/io_struct.py`), `SamplingParams`
//!   (`python/sglang/srt/sampling/sampling_params.py`: `max_new_tokens`, `stop_token_ids`,
//!   `temperature`, `top_p`, `skip_special_tokens`, `sampling_seed`), the response
//!   `{"text", "output_ids", "meta_info": {"finish_reason": {"type": "stop", "matched": id} |
//!   {"type": "length", "length": n} | {"type": "abort", "message"}, "prompt_tokens",
//!   "completion_tokens", ...}}` (`tokenizer_manager.py`, `schedule_batch.py` `FINISH_*`).
//! - **vLLM** `POST /v1/completions` with `prompt` as the token ids and `return_token_ids`, the
//!   generated `choices[0].token_ids` back: exact tokens in and out, as with SGLang, through
//!   vLLM's OpenAI server (0.32: `CompletionRequest.prompt: list[int]`, `return_token_ids`,
//!   `stop_token_ids`, `skip_special_tokens`, `seed` in
//!   `vllm/entrypoints/openai/completion/protocol.py`; `CompletionResponseChoice.token_ids`,
//!   `finish_reason` `stop`/`length`, `stop_reason` the matched stop id or null for the model's
//!   own eos; the stop token is kept in `token_ids`).
//! - **OpenAI-compatible** `POST /v1/chat/completions` with `messages` (the server renders its
//!   own chat template), `choices[0].message.content` and `reasoning_content` back.
//!
//! The stop token an engine keeps at the end of its ids is dropped here: it is not part of the
//! answer.

use std::collections::BTreeMap;

use aerie_data::conversation::Message;
use serde_json::{Value, json};

use crate::Engine;

/// What one turn asks of the engine.
#[derive(Debug, Clone, Copy)]
pub struct TurnRequest<'a> {
    /// The rendered prompt's token ids (SGLang, vLLM).
    pub prompt_ids: &'a [u32],
    /// The same history as messages (OpenAI-compatible servers render their own template).
    pub messages: &'a [Message],
    /// Tool declarations (OpenAI function schemas), for servers that render their own template.
    pub tools: Option<&'a Value>,
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass, sent only when sampling.
    pub top_p: f32,
    /// The turn's seed, sent only when sampling.
    pub seed: u64,
    /// Token ids that end the answer.
    pub stop_ids: &'a [u32],
    /// `model` of completion and chat requests (`default` when unknown).
    pub model: Option<&'a str>,
    /// Template variables, sent as `chat_template_kwargs` to servers that render the template.
    pub template_kwargs: &'a BTreeMap<String, Value>,
}

/// Why the engine stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnStop {
    /// A stop or eos token (dropped from the ids).
    Eos,
    /// `max_new_tokens` ran out.
    Length,
}

/// One turn's answer as the engine gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnAnswer {
    /// The generated ids without the stopping token (SGLang, vLLM).
    pub ids: Option<Vec<u32>>,
    /// The answer's text (OpenAI-compatible servers).
    pub text: Option<String>,
    /// The server's `reasoning_content`, when it split one off.
    pub reasoning: Option<String>,
    /// Why it stopped.
    pub stop: TurnStop,
    /// Prompt tokens, when the engine said.
    pub prompt_tokens: Option<u64>,
    /// Generated tokens (the stopping token included), when the engine said.
    pub completion_tokens: Option<u64>,
}

/// The URL path a turn is posted to.
pub fn path(engine: Engine) -> &'static str {
    match engine {
        Engine::Sglang => "/generate",
        Engine::Vllm => "/v1/completions",
        Engine::Openai => "/v1/chat/completions",
    }
}

/// The request body of one turn.
pub fn body(engine: Engine, r: &TurnRequest<'_>) -> Value {
    let sampled = r.temperature != 0.0;
    let model = r.model.unwrap_or("default");
    match engine {
        Engine::Sglang => {
            let mut params = json!({
                "max_new_tokens": r.max_new_tokens,
                "temperature": r.temperature,
                "stop_token_ids": r.stop_ids,
                // The text is not used (the ids are); keep it complete for logs.
                "skip_special_tokens": false,
            });
            if sampled {
                params["top_p"] = json!(r.top_p);
                params["sampling_seed"] = json!(r.seed);
            }
            json!({"input_ids": r.prompt_ids, "sampling_params": params, "stream": false})
        }
        // vLLM's completions and OpenAI chat share the OpenAI request keys.
        Engine::Vllm | Engine::Openai => {
            let mut body = json!({
                "model": model,
                "max_tokens": r.max_new_tokens,
                "temperature": r.temperature,
                "stream": false,
            });
            if engine == Engine::Vllm {
                body["prompt"] = json!(r.prompt_ids);
                body["stop_token_ids"] = json!(r.stop_ids);
                body["return_token_ids"] = json!(true);
                // The ids are the answer; the text is only kept complete for logs.
                body["skip_special_tokens"] = json!(false);
            } else {
                let messages: Vec<Value> =
                    r.messages.iter().map(|m| json!({"role": m.role.as_str(), "content": m.content})).collect();
                body["messages"] = json!(messages);
                if !r.template_kwargs.is_empty() {
                    body["chat_template_kwargs"] = json!(r.template_kwargs);
                }
                if let Some(tools) = r.tools {
                    body["tools"] = tools.clone();
                }
            }
            if sampled {
                body["top_p"] = json!(r.top_p);
                body["seed"] = json!(r.seed);
            }
            body
        }
    }
}

/// Token ids of a JSON list.
fn ids_of(list: Option<&Value>, what: &str) -> Result<Vec<u32>, String> {
    list.and_then(Value::as_array)
        .ok_or_else(|| format!("no `{what}` list in the response"))?
        .iter()
        .map(|x| {
            x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("`{what}` holds {x}, not a token id"))
        })
        .collect()
}

/// Drop the stopping token the engine kept at the end of `ids` (`matched`, or any stop id).
fn drop_stop(ids: &mut Vec<u32>, stop: TurnStop, matched: Option<u32>, stop_ids: &[u32]) {
    if stop == TurnStop::Eos && ids.last().is_some_and(|t| Some(*t) == matched || stop_ids.contains(t)) {
        ids.pop();
    }
}

/// The stop token id an engine names (`meta_info.finish_reason.matched`, `stop_reason`): absent
/// or not a number (vLLM names a matched stop string) is `None`; a number beyond `u32` is an error,
/// never a wrapped id that could drop the wrong token.
fn matched_id(x: Option<&Value>, what: &str) -> Result<Option<u32>, String> {
    match x.and_then(Value::as_u64) {
        None => Ok(None),
        Some(n) => u32::try_from(n).map(Some).map_err(|_| format!("`{what}` is {n}, beyond any token id (u32)")),
    }
}

/// Read one successful answer of `engine` to a turn that stops at `stop_ids`.
pub fn read(engine: Engine, stop_ids: &[u32], v: &Value) -> Result<TurnAnswer, String> {
    let u = |x: Option<&Value>| x.and_then(Value::as_u64);
    let mut a = TurnAnswer {
        ids: None,
        text: None,
        reasoning: None,
        stop: TurnStop::Eos,
        prompt_tokens: None,
        completion_tokens: None,
    };
    match engine {
        Engine::Sglang => {
            let meta = v.get("meta_info").ok_or("no `meta_info` in the /generate response")?;
            let mut ids = ids_of(v.get("output_ids"), "output_ids").map_err(|e| format!("{e} (is this SGLang?)"))?;
            let reason = meta.get("finish_reason");
            a.stop = match reason.and_then(|r| r.get("type")).and_then(Value::as_str).unwrap_or("") {
                "stop" => TurnStop::Eos,
                "length" => TurnStop::Length,
                "abort" => {
                    let m = reason.and_then(|r| r.get("message")).map(Value::to_string).unwrap_or_default();
                    return Err(format!("the server aborted the request: {m}"));
                }
                other => return Err(format!("unknown meta_info.finish_reason.type `{other}`")),
            };
            // SGLang keeps the matched stop token in output_ids.
            let matched = matched_id(reason.and_then(|r| r.get("matched")), "meta_info.finish_reason.matched")?;
            a.completion_tokens = Some(u(meta.get("completion_tokens")).unwrap_or(ids.len() as u64));
            drop_stop(&mut ids, a.stop, matched, stop_ids);
            a.prompt_tokens = u(meta.get("prompt_tokens"));
            a.ids = Some(ids);
        }
        Engine::Vllm => {
            let choice = v.get("choices").and_then(|c| c.get(0)).ok_or("no `choices[0]` in the completion response")?;
            let mut ids = ids_of(choice.get("token_ids"), "choices[0].token_ids")
                .map_err(|e| format!("{e} (a vLLM with `return_token_ids`?)"))?;
            a.stop = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("stop") => TurnStop::Eos,
                Some("length") => TurnStop::Length,
                Some("abort") => return Err("the server aborted the request (finish_reason `abort`)".into()),
                other => return Err(format!("unknown choices[0].finish_reason {other:?}")),
            };
            // vLLM keeps the stop token in token_ids (`stop_reason` names it when it was one of
            // stop_token_ids, null for the model's own eos).
            let matched = matched_id(choice.get("stop_reason"), "choices[0].stop_reason")?;
            let usage = v.get("usage");
            a.completion_tokens = Some(u(usage.and_then(|x| x.get("completion_tokens"))).unwrap_or(ids.len() as u64));
            drop_stop(&mut ids, a.stop, matched, stop_ids);
            a.prompt_tokens = u(usage.and_then(|x| x.get("prompt_tokens")));
            a.ids = Some(ids);
        }
        Engine::Openai => {
            let choice = v.get("choices").and_then(|c| c.get(0)).ok_or("no `choices[0]` in the chat response")?;
            let msg = choice.get("message").ok_or("no `choices[0].message` in the chat response")?;
            let text = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
            a.text = Some(text("content").unwrap_or_default());
            a.reasoning = text("reasoning_content").or_else(|| text("reasoning")).filter(|r| !r.is_empty());
            a.stop = match choice.get("finish_reason").and_then(Value::as_str) {
                Some("length") => TurnStop::Length,
                _ => TurnStop::Eos,
            };
            let usage = v.get("usage");
            a.prompt_tokens = u(usage.and_then(|x| x.get("prompt_tokens")));
            a.completion_tokens = Some(u(usage.and_then(|x| x.get("completion_tokens"))).unwrap_or(0));
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aerie_data::conversation::Role;

    fn request<'a>(temperature: f32, messages: &'a [Message], kwargs: &'a BTreeMap<String, Value>) -> TurnRequest<'a> {
        TurnRequest {
            prompt_ids: &[1, 2, 3],
            messages,
            tools: None,
            max_new_tokens: 16,
            temperature,
            top_p: 0.9,
            seed: 77,
            stop_ids: &[9],
            model: Some("m"),
            template_kwargs: kwargs,
        }
    }

    #[test]
    fn bodies_carry_the_ids_or_the_messages_and_seed_only_when_sampling() {
        let msgs = [Message::new(Role::User, "hi")];
        let none = BTreeMap::new();
        let b = body(Engine::Sglang, &request(0.0, &msgs, &none));
        assert_eq!(b["input_ids"], json!([1, 2, 3]));
        assert_eq!(b["sampling_params"]["stop_token_ids"], json!([9]));
        assert!(b["sampling_params"].get("sampling_seed").is_none());
        let b = body(Engine::Sglang, &request(0.7, &msgs, &none));
        assert_eq!(b["sampling_params"]["sampling_seed"], json!(77));
        let kw = BTreeMap::from([("thinking".to_owned(), json!(false))]);
        let b = body(Engine::Openai, &request(0.7, &msgs, &kw));
        assert_eq!(b["messages"][0], json!({"role": "user", "content": "hi"}));
        assert_eq!((b["model"].as_str(), b["max_tokens"].as_u64()), (Some("m"), Some(16)));
        assert_eq!(b["chat_template_kwargs"]["thinking"], false);
        assert_eq!(b["seed"], json!(77));
        assert!(b.get("tools").is_none(), "no tools key without tools");
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let b = body(Engine::Openai, &TurnRequest { tools: Some(&tools), ..request(0.0, &msgs, &kw) });
        assert_eq!(b["tools"], tools, "the conversation's tools go to the server");
        let b = body(Engine::Vllm, &TurnRequest { stop_ids: &[9, 4], ..request(0.0, &msgs, &none) });
        assert_eq!(b["prompt"], json!([1, 2, 3]), "the ids are the prompt");
        assert_eq!((b["model"].as_str(), b["max_tokens"].as_u64()), (Some("m"), Some(16)));
        assert_eq!((&b["stop_token_ids"], &b["return_token_ids"]), (&json!([9, 4]), &json!(true)));
        assert!(b.get("messages").is_none() && b.get("seed").is_none() && b.get("top_p").is_none());
        let b = body(Engine::Vllm, &request(0.7, &msgs, &none));
        assert_eq!(b["seed"], json!(77));
        assert!((b["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
        assert_eq!((path(Engine::Sglang), path(Engine::Vllm)), ("/generate", "/v1/completions"));
    }

    #[test]
    fn answers_of_every_dialect_without_their_stop_token() {
        let sg = json!({"text": "ab", "output_ids": [5, 6, 9], "meta_info": {"id": "x", "prompt_tokens": 3,
            "completion_tokens": 3, "finish_reason": {"type": "stop", "matched": 9}}});
        let a = read(Engine::Sglang, &[9], &sg).unwrap();
        assert_eq!((a.ids.as_deref(), a.stop, a.completion_tokens), (Some(&[5, 6][..]), TurnStop::Eos, Some(3)));
        let len = json!({"output_ids": [5, 6], "meta_info": {"completion_tokens": 2,
            "finish_reason": {"type": "length", "length": 2}}});
        assert_eq!(read(Engine::Sglang, &[9], &len).unwrap().stop, TurnStop::Length);
        let abort = json!({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}});
        assert!(read(Engine::Sglang, &[9], &abort).unwrap_err().contains("oom"));
        let chat = json!({"choices": [{"message": {"role": "assistant", "content": "hey", "reasoning_content": "r"},
            "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 16}});
        let a = read(Engine::Openai, &[9], &chat).unwrap();
        assert_eq!((a.text.as_deref(), a.reasoning.as_deref()), (Some("hey"), Some("r")));
        assert_eq!((a.stop, a.prompt_tokens, a.completion_tokens), (TurnStop::Length, Some(4), Some(16)));

        // vLLM stopped on a stop_token_ids entry: it names it in stop_reason and keeps it.
        let stop = json!({"choices": [{"index": 0, "text": "ab", "token_ids": [5, 6, 9], "finish_reason": "stop",
            "stop_reason": 9, "prompt_token_ids": null}], "usage": {"prompt_tokens": 3, "completion_tokens": 3}});
        let a = read(Engine::Vllm, &[9], &stop).unwrap();
        assert_eq!((a.ids.as_deref(), a.stop, a.completion_tokens), (Some(&[5, 6][..]), TurnStop::Eos, Some(3)));
        assert_eq!(a.prompt_tokens, Some(3));
        // The model's own eos: stop_reason null, the token still last.
        let eos = json!({"choices": [{"token_ids": [5, 9], "finish_reason": "stop", "stop_reason": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        assert_eq!(read(Engine::Vllm, &[9], &eos).unwrap().ids.as_deref(), Some(&[5][..]));
        // The budget: every token is the answer's, an eos-looking last one included.
        let len = json!({"choices": [{"token_ids": [5, 6, 9], "finish_reason": "length", "stop_reason": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3}});
        let a = read(Engine::Vllm, &[9], &len).unwrap();
        assert_eq!((a.ids.as_deref(), a.stop), (Some(&[5, 6, 9][..]), TurnStop::Length));
        let no_ids = json!({"choices": [{"text": "x", "finish_reason": "stop"}]});
        assert!(read(Engine::Vllm, &[9], &no_ids).unwrap_err().contains("return_token_ids"));
        let abort = json!({"choices": [{"token_ids": [], "finish_reason": "abort"}]});
        assert!(read(Engine::Vllm, &[9], &abort).unwrap_err().contains("abort"));
    }

    #[test]
    fn a_matched_id_beyond_u32_is_an_error_not_a_wrapped_token() {
        // 2^32 + 9 wrapped to 9 would drop the answer's last token 9 as if it were the stop.
        let huge = (1u64 << 32) + 9;
        let sg = json!({"output_ids": [5, 9], "meta_info": {"finish_reason": {"type": "stop", "matched": huge}}});
        let e = read(Engine::Sglang, &[], &sg).unwrap_err();
        assert!(e.contains("matched") && e.contains(&huge.to_string()), "{e}");
        let vl = json!({"choices": [{"token_ids": [5, 9], "finish_reason": "stop", "stop_reason": huge}]});
        let e = read(Engine::Vllm, &[], &vl).unwrap_err();
        assert!(e.contains("stop_reason") && e.contains(&huge.to_string()), "{e}");
        // A stop string in stop_reason is no id: nothing matched by id, the ids stay.
        let s = json!({"choices": [{"token_ids": [5, 9], "finish_reason": "stop", "stop_reason": "END"}]});
        assert_eq!(read(Engine::Vllm, &[], &s).unwrap().ids.as_deref(), Some(&[5, 9][..]));
    }
}

//! `aerie_capture::regenerate` on a tiny random target: the output is what greedy
//! `TargetModel::generate` answers to the chat-templated prompt, turn after turn with the
//! model's own earlier answers in the prompt; an interrupted run (a crash at a token, a torn last
//! line) resumes into a byte-identical file, greedy or sampled; eos stops; bad input is refused
//! with the file named.

mod fixture;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use aerie_capture::regenerate::{meta_path, partial_path, report_path};
use aerie_capture::{RegenerateOptions, regenerate};
use aerie_data::conversation::{Message, Role};
use aerie_data::template::{ChatTemplate, TemplateChoice};
use aerie_data::tokenizer::TokenizerFiles;
use aerie_model::TargetModel;
use burn::backend::Flex;
use serde_json::{Value, json};

type B = Flex;

struct Setup {
    dir: tempfile::TempDir,
    target: PathBuf,
    data: PathBuf,
    model: TargetModel<B>,
    records: Vec<Value>,
}

fn setup(n: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    fixture::write_target(&target, 32, 2, 5);
    let records = fixture::conversations(n);
    let data = dir.path().join("chat.jsonl");
    fixture::write_jsonl(&data, &records);
    let model = TargetModel::<B>::load(&target, &Default::default()).unwrap();
    Setup { dir, target, data, model, records }
}

fn opts(s: &Setup, out: &str, max_new: usize) -> RegenerateOptions {
    let mut o = RegenerateOptions::new(&s.data, s.dir.path().join(out));
    o.max_new_tokens = max_new;
    o.target_name = "tiny".into();
    o
}

fn role(from: &str) -> Role {
    match from {
        "system" => Role::System,
        "human" => Role::User,
        "gpt" => Role::Assistant,
        other => panic!("fixture role {other}"),
    }
}

/// The reference: every assistant turn answered by `generate` on the rendered prefix (own
/// answers included), the eos dropped, decoded without special tokens, its ids and why it ended
/// kept beside the text. With `original_answers`
/// the prompts keep the dataset's answers instead (to show they differ).
fn reference(s: &Setup, max_new: usize, eos: &[u32], original_answers: bool) -> Vec<Value> {
    let tok = TokenizerFiles::load(&s.target).unwrap();
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    s.records
        .iter()
        .enumerate()
        .map(|(index, rec)| {
            let mut prompt_msgs: Vec<Message> = Vec::new();
            let mut out_turns = Vec::new();
            for t in rec["conversations"].as_array().unwrap() {
                let (from, value) = (t["from"].as_str().unwrap(), t["value"].as_str().unwrap());
                if from != "gpt" {
                    prompt_msgs.push(Message::new(role(from), value));
                    out_turns.push(json!({"from": from, "value": value}));
                    continue;
                }
                let prompt = template.render(&prompt_msgs, true).unwrap();
                let ids = tok.tokenizer.encode(prompt.as_str(), false).unwrap().get_ids().to_vec();
                let mut answer = s.model.generate(&ids, max_new, eos).unwrap();
                let stopped = answer.last().is_some_and(|t| eos.contains(t));
                if stopped {
                    answer.pop();
                }
                let text = tok.tokenizer.decode(&answer, true).unwrap();
                assert!(!text.trim().is_empty(), "the fixture answers with whitespace; pick another seed");
                prompt_msgs.push(Message::new(Role::Assistant, if original_answers { value } else { &text }));
                // The ids themselves too, so `data prepare` trains on exactly what was generated.
                let finish = if stopped { "stop" } else { "length" };
                out_turns.push(json!({"from": "gpt", "value": text, "token_ids": answer, "finish_reason": finish}));
            }
            json!({"id": rec["id"], "source_index": index, "conversations": out_turns})
        })
        .collect()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn greedy_output_is_generate_on_the_rendered_prefix_with_own_answers() {
    let s = setup(6);
    let o = opts(&s, "regen.jsonl", 12);
    let report = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
    assert_eq!(report.eos_token_ids, vec![fixture::IM_END]);
    let want = reference(&s, 12, &report.eos_token_ids, false);
    let got = lines(&o.out);
    assert_eq!(got, want);
    // Byte layout: one compact JSON object per line, keys in id, source_index, conversations order.
    let text = std::fs::read_to_string(&o.out).unwrap();
    let want_text: String = want.iter().map(|v| format!("{v}\n")).collect();
    assert_eq!(text, want_text);
    // Multi-turn prompts hold the model's own earlier answers: with the dataset's answers in the
    // prompt, some later turn would be answered differently.
    let with_original = reference(&s, 12, &report.eos_token_ids, true);
    assert_ne!(with_original, want);
    assert_eq!(report.records, 6);
    assert_eq!(report.written_records, 6);
    assert_eq!(report.turns_regenerated, 1 + 2 + 3 + 1 + 2 + 3);
    assert_eq!(report.stopped_by_eos + report.stopped_by_max_new_tokens + report.stopped_by_max_length, 12);
    assert!(report.tokens_generated > 0 && report.tokens_per_second > 0.0);
    assert!(!partial_path(&o.out).exists() && !meta_path(&o.out).exists());
    let saved: Value = serde_json::from_slice(&std::fs::read(report_path(&o.out)).unwrap()).unwrap();
    assert_eq!(saved["records"], 6);
    // A finished output is not replaced without overwrite.
    let err = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("already exists") && err.contains("--overwrite"), "{err}");
}

/// Run `o`, crashing (a panic out of the progress callback) after `after_tokens` tokens.
fn crash_after(s: &Setup, o: &RegenerateOptions, after_tokens: u64) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        regenerate(&s.model, &s.target, o, &mut |p| {
            if p.tokens >= after_tokens {
                panic!("simulated crash");
            }
        })
    }));
    assert!(r.is_err(), "the run finished before the simulated crash");
}

fn interrupted_run_is_byte_identical(temperature: f32) {
    let s = setup(7);
    let mut full = opts(&s, "full.jsonl", 10);
    full.sampling.temperature = temperature;
    full.sampling.top_p = 0.9;
    full.sampling.seed = 11;
    let report = regenerate(&s.model, &s.target, &full, &mut |_| {}).unwrap();
    let want = std::fs::read(&full.out).unwrap();

    let mut o = full.clone();
    o.out = s.dir.path().join("resumed.jsonl");
    // Crash once mid-way, then again later: each time some records are complete on disk.
    crash_after(&s, &o, report.tokens_generated / 3);
    let partial = partial_path(&o.out);
    let first = std::fs::read(&partial).unwrap();
    assert!(first.ends_with(b"\n") && !first.is_empty() && first.len() < want.len());
    assert_eq!(&want[..first.len()], &first[..]);
    crash_after(&s, &o, report.tokens_generated / 3);
    // A torn write: half of the next line.
    let done = std::fs::read(&partial).unwrap();
    let next_end = want[done.len()..].iter().position(|&b| b == b'\n').unwrap() + done.len();
    let mut torn = done.clone();
    torn.extend_from_slice(&want[done.len()..(done.len() + next_end) / 2]);
    std::fs::write(&partial, &torn).unwrap();
    let resumed = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(&o.out).unwrap(), want, "resumed output differs");
    assert_eq!(resumed.records, report.records);
    assert!(resumed.resumed_records > 0 && resumed.written_records < report.records);
    assert_eq!(resumed.resumed_records + resumed.written_records, report.records);
}

#[test]
fn greedy_interrupted_run_resumes_byte_identical() {
    interrupted_run_is_byte_identical(0.0);
}

#[test]
fn sampled_interrupted_run_resumes_byte_identical() {
    interrupted_run_is_byte_identical(0.9);
}

#[test]
fn sampling_depends_on_the_seed_only() {
    let s = setup(3);
    let run = |seed: u64, name: &str| {
        let mut o = opts(&s, name, 8);
        o.sampling.temperature = 1.0;
        o.sampling.seed = seed;
        regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
        std::fs::read_to_string(&o.out).unwrap()
    };
    let a = run(1, "a.jsonl");
    assert_eq!(a, run(1, "b.jsonl"));
    assert_ne!(a, run(2, "c.jsonl"));
    assert_ne!(
        a,
        std::fs::read_to_string({
            let o = opts(&s, "greedy.jsonl", 8);
            regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
            o.out
        })
        .unwrap()
    );
}

#[test]
fn decoding_stops_at_the_targets_eos() {
    let s = setup(1);
    let tok = TokenizerFiles::load(&s.target).unwrap();
    let template = ChatTemplate::resolve(&TemplateChoice::Auto, &tok).unwrap();
    let conv = &s.records[0]["conversations"];
    let msgs = vec![
        Message::new(Role::System, conv[0]["value"].as_str().unwrap()),
        Message::new(Role::User, conv[1]["value"].as_str().unwrap()),
    ];
    let ids = tok.tokenizer.encode(template.render(&msgs, true).unwrap().as_str(), false).unwrap().get_ids().to_vec();
    let free = s.model.generate(&ids, 8, &[]).unwrap();
    // The first token not seen before, from position 2 on: the answer before it is non-empty.
    let k = (2..free.len()).find(|&k| !free[..k].contains(&free[k])).expect("a fresh token");
    let eos = free[k];
    // Make it the target's eos (config.json), keeping the weights.
    let cfg_path = s.target.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["eos_token_id"] = json!(eos);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let model = TargetModel::<B>::load(&s.target, &Default::default()).unwrap();
    let o = opts(&s, "eos.jsonl", 8);
    let report = regenerate(&model, &s.target, &o, &mut |_| {}).unwrap();
    assert_eq!(report.eos_token_ids, {
        let mut v = vec![eos, fixture::IM_END];
        v.sort();
        v
    });
    assert_eq!(report.stopped_by_eos, 1);
    assert_eq!(report.tokens_generated, k as u64 + 1);
    let got = lines(&o.out);
    assert_eq!(got[0]["conversations"][2]["value"], tok.tokenizer.decode(&free[..k], true).unwrap());
}

#[test]
fn bad_input_is_refused_naming_the_file() {
    let s = setup(2);
    // Missing data.
    let mut o = opts(&s, "x.jsonl", 4);
    o.data = s.dir.path().join("missing.jsonl");
    let err = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("missing.jsonl"), "{err}");
    // No conversation with a turn to answer (a lone user turn is a prompt-only record, which
    // is answered: see `prompt_only_records_are_answered_turn_by_turn`).
    let empty = s.dir.path().join("empty.jsonl");
    fixture::write_jsonl(
        &empty,
        &[
            json!({"id": "a", "conversations": []}),
            json!({"id": "b", "conversations": [{"from": "system", "value": "hi"}]}),
        ],
    );
    let mut o = opts(&s, "y.jsonl", 4);
    o.data = empty.clone();
    let err = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("empty.jsonl") && err.contains("no_assistant_turn"), "{err}");
    assert!(!o.out.exists() && !partial_path(&o.out).exists());
    // A tokenizer with more tokens than the target's vocabulary.
    let small = s.dir.path().join("small");
    fixture::write_model(
        &small,
        &fixture::target_reference::RefConfig { vocab: 200, ..fixture::tiny_config(32, 2) },
        1,
        &[1],
    );
    fixture::write_tokenizer(&small, Some(fixture::CHATML));
    let small_model = TargetModel::<B>::load(&small, &Default::default()).unwrap();
    let o = opts(&s, "z.jsonl", 4);
    let err = regenerate(&small_model, &small, &o, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json") && err.contains("258") && err.contains("200"), "{err}");
    // Resuming with other options.
    let o = opts(&s, "w.jsonl", 4);
    crash_after(&s, &o, 2);
    let mut other = o.clone();
    other.sampling.temperature = 0.5;
    let err = regenerate(&s.model, &s.target, &other, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("w.jsonl.partial") && err.contains("temperature"), "{err}");
    other.overwrite = true;
    regenerate(&s.model, &s.target, &other, &mut |_| {}).unwrap();
}

#[test]
fn long_prompts_are_cut_or_dropped() {
    let s = setup(3);
    let mut o = opts(&s, "short.jsonl", 4);
    // Conversation 0 (with a system prompt) cannot start; the others fit one exchange only.
    o.max_length = Some(80);
    let report = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
    assert_eq!(report.dropped.get("prompt_too_long"), Some(&1), "{report:?}");
    assert_eq!(report.cut.get("prompt_too_long"), Some(&2), "{report:?}");
    for rec in lines(&o.out) {
        assert_eq!(rec["conversations"].as_array().unwrap().len(), 2);
    }
}

/// Continuous batching (`batch_size` > 1, conversations of several turns sharing the batch)
/// writes the bytes batch 1 writes, greedy and sampled: every turn is its own sequence with its
/// own sampling stream, whatever rows its neighbours occupy.
#[test]
fn batched_regeneration_writes_the_batch_one_bytes() {
    let s = setup(9);
    for temperature in [0.0, 0.9] {
        let run = |batch: usize| {
            let mut o = opts(&s, &format!("b{batch}-t{temperature}.jsonl"), 10);
            o.sampling.temperature = temperature;
            o.sampling.top_p = 0.9;
            o.sampling.seed = 5;
            o.batch_size = batch;
            let report = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
            assert_eq!(report.batch_size, batch);
            (std::fs::read(&o.out).unwrap(), report.tokens_generated, report.turns_regenerated)
        };
        let one = run(1);
        assert!(one.2 > 9, "several turns per conversation ({} turns)", one.2);
        for batch in [3, 8] {
            assert_eq!(run(batch), one, "batch {batch}, temperature {temperature}");
        }
    }
}

#[test]
fn prompt_only_records_are_answered_turn_by_turn() {
    // MT-Bench's shape and a ShareGPT record with user turns only: every prompt is answered, the
    // second one holding the target's first answer; a record with answers is unchanged.
    let s = setup(2);
    let data = s.dir.path().join("mt.jsonl");
    fixture::write_jsonl(
        &data,
        &[
            json!({"question_id": 81, "category": "writing", "turns": ["Say a.", "Now say b."]}),
            json!({"id": "u", "conversations": [{"from": "human", "value": "Only a question."}]}),
        ],
    );
    let mut o = opts(&s, "mt-out.jsonl", 4);
    o.data = data;
    let report = regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
    assert_eq!((report.records, report.turns_regenerated), (2, 3));
    let text = std::fs::read_to_string(&o.out).unwrap();
    let got: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got[0]["id"], "81");
    let roles: Vec<&str> =
        got[0]["conversations"].as_array().unwrap().iter().map(|t| t["from"].as_str().unwrap()).collect();
    assert_eq!(roles, ["human", "gpt", "human", "gpt"]);
    assert_eq!(got[0]["conversations"][2]["value"], "Now say b.");
    assert!(!text.contains("(to be regenerated)"));
    assert_eq!(got[1]["conversations"].as_array().unwrap().len(), 2);
}

#[test]
fn a_records_tools_are_in_every_prompt_and_in_the_output() {
    // A template that declares the tools before the turns (as Kimi's and Qwen's do): the target
    // answers the prompt with the declarations, as it would when serving the conversation, and
    // the output record keeps them for `aerie data prepare`.
    let s = setup(1);
    let jinja = s.dir.path().join("tools.jinja");
    std::fs::write(
        &jinja,
        "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}\
         {%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let data = s.dir.path().join("tools.jsonl");
    let record = json!({"id": "t", "tools": tools, "conversations": [
        {"from": "human", "value": "Find the answer."}, {"from": "gpt", "value": "original"}]});
    fixture::write_jsonl(&data, &[record]);
    let mut o = opts(&s, "tools-out.jsonl", 6);
    o.data = data;
    o.template = TemplateChoice::File(jinja.clone());
    regenerate(&s.model, &s.target, &o, &mut |_| {}).unwrap();
    let got = lines(&o.out);
    assert_eq!(got[0]["tools"], tools, "the output keeps the record's tools");

    let tok = TokenizerFiles::load(&s.target).unwrap();
    let template = ChatTemplate::resolve(&TemplateChoice::File(jinja), &tok).unwrap();
    let msgs = [Message::new(Role::User, "Find the answer.")];
    let render = |tools: Option<&Value>| template.render_conversation(&msgs, tools, true, &Default::default()).unwrap();
    let (with, without) = (render(Some(&tools)), render(None));
    assert!(with.contains("\"lookup\"") && !without.contains("lookup"), "{with}");
    let ids = tok.tokenizer.encode(with.as_str(), false).unwrap().get_ids().to_vec();
    let mut answer = s.model.generate(&ids, 6, &[fixture::IM_END]).unwrap();
    if answer.last() == Some(&fixture::IM_END) {
        answer.pop();
    }
    assert_eq!(got[0]["conversations"][1]["value"], tok.tokenizer.decode(&answer, true).unwrap());
}

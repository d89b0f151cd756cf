//! Where a run's first weights come from: a fresh drafter shaped after the target (HF Llama init,
//! seeded) with a draft vocab from `aerie vocab build`, or a warm start from an existing drafter
//! that KEEPS its d2t/t2d (eagle3.md §4: its lm_head rows are tied to that map; the reference
//! trainer regenerates the map and silently breaks the drafter). Also the target head (teacher)
//! and embedding sources.

use std::path::{Path, PathBuf};

use aerie_data::hf_config::{config_json_path, text_model};
use aerie_data::vocab::DraftVocab;
use aerie_model::DrafterConfig;
use aerie_model::checkpoint::config::{MLA_ARCHITECTURE, SGLANG_ARCHITECTURE, parse_config, read_config};
use aerie_model::checkpoint::io::WeightFiles;
use aerie_model::checkpoint::{
    Dialect, DrafterCheckpoint, Dtype, HostTensor, TensorMap, load_drafter_with_notes, load_target_embedding,
    load_target_head,
};
use serde_json::{Map, Value, json};

use crate::config::{InitKind, ShapeOverrides, TrainConfig};
use crate::{Error, Result};
use aerie_model::rng::SplitMix;

/// The initial drafter: its checkpoint (with `embed_tokens.weight`) and what was done to get it.
#[derive(Debug, Clone)]
pub struct Initial {
    /// Config and canonical tensors, embedding included.
    pub checkpoint: DrafterCheckpoint,
    /// Facts for the user (defaults applied, the vocab kept or switched, ...).
    pub notes: Vec<String>,
}

fn init_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Init { path: path.to_path_buf(), message: message.into() }
}

/// Read a draft vocab file (safetensors with `d2t`, optionally `t2d`). The target vocab size is
/// `t2d`'s length, else `vocab_size`.
pub fn read_vocab_file(path: &Path, vocab_size: Option<usize>) -> Result<DraftVocab> {
    let files = WeightFiles::open_file(path);
    if !files.contains("d2t")? {
        return Err(init_err(path, "no `d2t` tensor: expected the file `aerie vocab build` writes"));
    }
    let t2d = if files.contains("t2d")? { files.load(&["t2d"])?.remove("t2d") } else { None };
    let d2t = files.load(&["d2t"])?.remove("d2t").expect("loaded above").to_i64("d2t")?;
    let t2d: Option<Vec<bool>> =
        t2d.map(|t| t.to_i64("t2d").map(|v| v.iter().map(|&x| x != 0).collect())).transpose()?;
    let v = match (&t2d, vocab_size) {
        (Some(t), Some(v)) if t.len() != v => {
            return Err(init_err(path, format!("t2d has {} entries, the target vocab is {v}", t.len())));
        }
        (Some(t), _) => t.len(),
        (None, Some(v)) => v,
        (None, None) => return Err(init_err(path, "no `t2d`, and the target vocab size is unknown")),
    };
    let map = DraftVocab::from_d2t(&d2t, v).map_err(|m| init_err(path, format!("d2t: {m}")))?;
    if let Some(t) = t2d {
        map.check_t2d(&t).map_err(|m| init_err(path, m))?;
    }
    Ok(map)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| init_err(path, format!("not valid JSON: {e}")))
}

/// A fresh drafter's config: the target's Llama shape (from `text_config` for multimodal
/// wrappers), overridden by `[init.shape]`, with `target_hidden_size` = the target's hidden size,
/// `draft_vocab_size` from the vocab and aux ids defaulting to `[1, N/2-1, N-4]`. Parsed through
/// the drafter config reader, so RoPE keys are understood exactly as for a loaded drafter.
pub fn fresh_config(target_config: &Path, vocab: &DraftVocab, shape: &ShapeOverrides) -> Result<DrafterConfig> {
    let path = config_json_path(target_config);
    let top = read_json(&path)?;
    let text = text_model(&top);
    let mut m = Map::new();
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "vocab_size",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
    ] {
        if let Some(v) = text.get(key).filter(|v| !v.is_null()) {
            m.insert(key.into(), v.clone());
        }
    }
    let n_layers = text
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .ok_or_else(|| init_err(&path, "no num_hidden_layers: is this the target's config.json?"))?
        as usize;
    let target_hidden = text.get("hidden_size").cloned().ok_or_else(|| init_err(&path, "no hidden_size"))?;
    let o = shape;
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.into(), v);
        }
    };
    put("hidden_size", o.hidden_size.map(|v| json!(v)));
    put("intermediate_size", o.intermediate_size.map(|v| json!(v)));
    put("num_attention_heads", o.num_attention_heads.map(|v| json!(v)));
    put("num_key_value_heads", o.num_key_value_heads.map(|v| json!(v)));
    put("head_dim", o.head_dim.map(|v| json!(v)));
    put("rms_norm_eps", o.rms_norm_eps.map(|v| json!(v)));
    put("rope_theta", o.rope_theta.map(|v| json!(v)));
    put("max_position_embeddings", o.max_position_embeddings.map(|v| json!(v)));
    put("fc_norm", o.fc_norm.map(|v| json!(v)));
    put("norm_output", o.norm_output.map(|v| json!(v)));
    if o.rope_theta.is_some() {
        // An explicit theta replaces the target's transformers-5 rope_parameters (which win
        // over the legacy key when both are present).
        m.remove("rope_parameters");
    }
    m.insert("target_hidden_size".into(), target_hidden);
    m.insert("draft_vocab_size".into(), json!(vocab.draft_vocab_size()));
    m.insert("num_hidden_layers".into(), json!(1));
    m.insert("architectures".into(), json!([SGLANG_ARCHITECTURE]));
    if let Some(mla) = &o.mla {
        m.insert("architectures".into(), json!([MLA_ARCHITECTURE]));
        for (k, v) in [
            ("q_lora_rank", mla.q_lora_rank),
            ("kv_lora_rank", mla.kv_lora_rank),
            ("qk_nope_head_dim", mla.qk_nope_head_dim),
            ("qk_rope_head_dim", mla.qk_rope_head_dim),
            ("v_head_dim", mla.v_head_dim),
        ] {
            m.insert(k.into(), json!(v));
        }
    }
    if let Some(ids) = &o.aux_layer_ids {
        m.insert("eagle_config".into(), json!({"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": true}));
    }
    if let Some(name) = top.get("_name_or_path").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        m.insert("target_name_or_path".into(), json!(name));
    }
    let cfg = parse_config(&Value::Object(m), &path, Some(n_layers))?.resolved(&path)?;
    if cfg.vocab_size != vocab.vocab_size() {
        return Err(init_err(
            &path,
            format!("the target vocab is {} but the draft vocab maps into {} ids", cfg.vocab_size, vocab.vocab_size()),
        ));
    }
    if let Some(&bad) = cfg.aux_layers.ids.iter().find(|&&i| i >= n_layers) {
        return Err(init_err(&path, format!("aux layer {bad} does not exist in a {n_layers}-layer target")));
    }
    let problems = cfg.problems();
    if !problems.is_empty() {
        return Err(init_err(&path, problems.join("; ")));
    }
    Ok(cfg)
}

fn embedding_source(cfg: &TrainConfig) -> Result<&Path> {
    cfg.target.embedding_source().ok_or_else(|| {
        Error::config(
            &cfg.output_dir,
            "the target's input embedding is needed: set `target.path` (model directory or safetensors file) or `target.embedding`",
        )
    })
}

/// The target's embedding `[V, H]`, checked against the drafter config.
pub fn load_embedding(cfg: &TrainConfig, dc: &DrafterConfig) -> Result<HostTensor> {
    let src = embedding_source(cfg)?;
    let want = ([dc.vocab_size, dc.hidden_size], "vocab_size, hidden_size");
    checked(src, load_target_embedding(src)?, "the target embedding", want)
}

/// The target head `[V, Ht]` (the teacher), checked against the drafter config.
pub fn load_head(source: &Path, dc: &DrafterConfig) -> Result<HostTensor> {
    let want = ([dc.vocab_size, dc.target_hidden_size], "vocab_size, target_hidden_size");
    checked(source, load_target_head(source)?, "the target head", want)
}

/// `t` when its shape is `want.0`; else an error naming `src`, `what` and the drafter's fields
/// (`want.1`) that ask for that shape.
fn checked(src: &Path, t: HostTensor, what: &str, want: ([usize; 2], &str)) -> Result<HostTensor> {
    let ([rows, cols], fields) = want;
    if t.shape != [rows, cols] {
        return Err(init_err(src, format!("{what} is {:?}, the drafter needs [{rows}, {cols}] ({fields})", t.shape)));
    }
    Ok(t)
}

/// The drafter a run starts from, per `[init]`.
pub fn initial_drafter(cfg: &TrainConfig) -> Result<Initial> {
    match cfg.init.kind {
        InitKind::Fresh => fresh(cfg),
        InitKind::WarmStart => warm_start(cfg),
    }
}

/// The shape of the drafter a run starts from, read from config files only (no weights): for a
/// fresh drafter the target's `config.json` and the vocab file, exactly as [`initial_drafter`]
/// reads them; for a warm start the drafter's own `config.json` (its shape is kept). What
/// `aerie bench train` measures.
pub fn drafter_config(cfg: &TrainConfig) -> Result<DrafterConfig> {
    match cfg.init.kind {
        InitKind::Fresh => Ok(fresh_shape(cfg)?.1),
        InitKind::WarmStart => {
            let dir = cfg.init.drafter.as_deref().expect("validated: warm_start has init.drafter");
            let path = config_json_path(dir);
            Ok(read_config(&path, None)?.resolved(&path)?)
        }
    }
}

/// A fresh drafter's draft vocab and config: `init.vocab` (its target vocab size from the
/// target's `config.json`) and [`fresh_config`] of the target config.
fn fresh_shape(cfg: &TrainConfig) -> Result<(DraftVocab, DrafterConfig)> {
    let vocab_path = cfg.init.vocab.as_deref().expect("validated: fresh has init.vocab");
    let target_config: PathBuf = match (&cfg.init.target_config, &cfg.target.path) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => p.clone(),
        (None, None) => unreachable!("validated: fresh has a target config"),
    };
    let t2d_hint = {
        let top = read_json(&config_json_path(&target_config))?;
        text_model(&top).get("vocab_size").and_then(Value::as_u64).map(|v| v as usize)
    };
    let vocab = read_vocab_file(vocab_path, t2d_hint)?;
    let dc = fresh_config(&target_config, &vocab, &cfg.init.shape)?;
    Ok((vocab, dc))
}

fn fresh(cfg: &TrainConfig) -> Result<Initial> {
    let (vocab, dc) = fresh_shape(cfg)?;
    let embed = load_embedding(cfg, &dc)?;
    let mut tensors = aerie_model::init::init_tensors(&dc, &vocab, Some(embed), cfg.seed);
    let mut notes = Vec::new();
    if cfg.init.from_target {
        notes.push(target_init(cfg, &dc, &vocab, &mut tensors)?);
    }
    notes.insert(
        0,
        format!(
            "fresh drafter: H {}, I {}, {} heads ({} KV) of {}, aux layers {:?} (output of layer), Vd {} of V {}",
            dc.hidden_size,
            dc.intermediate_size,
            dc.num_attention_heads,
            dc.num_key_value_heads,
            dc.head_dim,
            dc.aux_layers.output_of_layer(),
            dc.draft_vocab_size,
            dc.vocab_size
        ),
    );
    Ok(Initial {
        checkpoint: DrafterCheckpoint {
            config: dc,
            dialect: Dialect::Sglang,
            weight_dtype: Dtype::F32,
            tensors,
            dir: PathBuf::new(),
            source: None,
        },
        notes,
    })
}

/// Where a target keeps its final RMSNorm weight.
const TARGET_NORM_KEYS: &[&str] =
    &["model.norm.weight", "language_model.model.norm.weight", "model.language_model.norm.weight", "norm.weight"];

/// `init.from_target`: make the fresh drafter start where the target ends. lm_head = the target
/// head's rows of the draft ids (ascending target id, the d2t order), norm = the target's final
/// norm, fc = identity on the LAST aux feature (the deepest captured layer) and zero on the
/// others, o_proj and down_proj zero (both residual branches closed). At step 0 the drafter is
/// then a "logit lens" of that layer, restricted to the draft vocab; every other weight keeps the
/// reference init, and the closed branches open from the first step (their gradients are not
/// zero). Needs H = Ht (the default shape).
fn target_init(cfg: &TrainConfig, dc: &DrafterConfig, vocab: &DraftVocab, tensors: &mut TensorMap) -> Result<String> {
    let (h, ht, a) = (dc.hidden_size, dc.target_hidden_size, dc.num_aux());
    let src = cfg.target.head_source().ok_or_else(|| {
        Error::config(&cfg.output_dir, "`init.from_target` needs the target: set `target.path` (or `target.head`)")
    })?;
    if h != ht {
        return Err(init_err(
            src,
            format!("`init.from_target` needs hidden_size = the target's ({ht}); init.shape.hidden_size is {h}"),
        ));
    }
    let head = load_head(src, dc)?.to_f32("lm_head.weight")?;
    let mut rows = Vec::with_capacity(vocab.draft_vocab_size() * h);
    for &t in vocab.target_ids() {
        rows.extend_from_slice(&head[t * h..(t + 1) * h]);
    }
    tensors.insert("lm_head.weight".into(), HostTensor::from_f32(vec![vocab.draft_vocab_size(), h], &rows, Dtype::F32));

    let norm_src = cfg.target.path.as_deref().unwrap_or(src);
    let files = if norm_src.is_dir() { WeightFiles::open_dir(norm_src)? } else { WeightFiles::open_file(norm_src) };
    let mut norm = None;
    for key in TARGET_NORM_KEYS {
        if files.contains(key)? {
            norm = files.load(&[key])?.remove(*key);
            break;
        }
    }
    let norm = norm.ok_or_else(|| {
        init_err(norm_src, format!("`init.from_target`: no final norm weight under any of {TARGET_NORM_KEYS:?}"))
    })?;
    if norm.shape != [h] {
        return Err(init_err(norm_src, format!("the target's final norm is {:?}, expected [{h}]", norm.shape)));
    }
    tensors.insert("norm.weight".into(), HostTensor::from_f32(vec![h], &norm.to_f32("norm.weight")?, Dtype::F32));

    let mut fc = vec![0.0f32; h * a * ht];
    for i in 0..h {
        fc[i * a * ht + (a - 1) * ht + i] = 1.0;
    }
    tensors.insert("fc.weight".into(), HostTensor::from_f32(vec![h, a * ht], &fc, Dtype::F32));
    for key in ["midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"] {
        let shape = tensors.get(key).map(|t| t.shape.clone()).ok_or_else(|| init_err(src, format!("no {key}")))?;
        let n = shape.iter().product();
        tensors.insert(key.into(), HostTensor::from_f32(shape, &vec![0.0; n], Dtype::F32));
    }
    Ok(format!(
        "target-initialised (init.from_target): lm_head = target head rows of the {} draft ids, norm = target final norm, \
         fc passes aux layer {} through, o_proj and down_proj zero",
        vocab.draft_vocab_size(),
        dc.aux_layers.output_of_layer().last().copied().unwrap_or_default(),
    ))
}

fn vocab_of(ckpt: &DrafterCheckpoint) -> Result<DraftVocab> {
    let c = &ckpt.config;
    match ckpt.tensors.get("d2t") {
        Some(t) => {
            DraftVocab::from_d2t(&t.to_i64("d2t")?, c.vocab_size).map_err(|m| init_err(&ckpt.dir, format!("d2t: {m}")))
        }
        None => Ok(DraftVocab::identity(c.vocab_size)),
    }
}

fn warm_start(cfg: &TrainConfig) -> Result<Initial> {
    let dir = cfg.init.drafter.as_deref().expect("validated: warm_start has init.drafter");
    let loaded = load_drafter_with_notes(dir, cfg.target.embedding_source())?;
    let mut notes = loaded.notes;
    let mut ckpt = loaded.checkpoint;
    if !ckpt.tensors.contains_key("embed_tokens.weight") {
        return Err(init_err(dir, "the drafter ships no embed_tokens.weight: set `target.path` or `target.embedding`"));
    }
    let own = vocab_of(&ckpt)?;
    notes.push(format!("warm start from {}: keeping its d2t/t2d (Vd {})", dir.display(), own.draft_vocab_size()));
    if let Some(vpath) = &cfg.init.vocab {
        let given = read_vocab_file(vpath, Some(ckpt.config.vocab_size))?;
        if given != own {
            let shared = given.target_ids().iter().filter(|&&t| own.contains(t)).count();
            let what = format!(
                "the drafter's vocab map (Vd {}) differs from {} (Vd {}); {shared} target ids are in both",
                own.draft_vocab_size(),
                vpath.display(),
                given.draft_vocab_size()
            );
            if !cfg.init.allow_vocab_override {
                return Err(init_err(
                    dir,
                    format!(
                        "{what}. The drafter's lm_head rows belong to its own map; drop `init.vocab` to keep it, or set \
                         `init.allow_vocab_override = true` to switch (rows of shared ids are kept, the others start fresh)"
                    ),
                ));
            }
            remap_vocab(&mut ckpt, &own, &given, cfg.seed)?;
            notes.pop();
            notes.push(format!("{what}: switched to the given map, {shared} lm_head rows kept"));
        }
    }
    ckpt.weight_dtype = Dtype::F32;
    Ok(Initial { checkpoint: ckpt, notes })
}

/// Switch a drafter to another vocab map: lm_head row of target id t is copied where the old
/// map has t, N(0, 0.02) (seeded) elsewhere.
fn remap_vocab(ckpt: &mut DrafterCheckpoint, old: &DraftVocab, new: &DraftVocab, seed: u64) -> Result<()> {
    let head = ckpt.tensors.get("lm_head.weight").ok_or_else(|| init_err(&ckpt.dir, "no lm_head.weight"))?;
    let h = ckpt.config.hidden_size;
    let rows = head.to_f32("lm_head.weight")?;
    let mut old_row = vec![usize::MAX; old.vocab_size()];
    for (i, &t) in old.target_ids().iter().enumerate() {
        old_row[t] = i;
    }
    let mut rng = SplitMix(seed ^ 0x0072_656D_6170);
    let mut normal = || {
        let u = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let v = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos() * 0.02) as f32
    };
    let mut out = Vec::with_capacity(new.draft_vocab_size() * h);
    for &t in new.target_ids() {
        match old_row[t] {
            usize::MAX => out.extend((0..h).map(|_| normal())),
            i => out.extend_from_slice(&rows[i * h..(i + 1) * h]),
        }
    }
    let vd = new.draft_vocab_size();
    ckpt.tensors.insert("lm_head.weight".into(), HostTensor::from_f32(vec![vd, h], &out, Dtype::F32));
    ckpt.tensors.insert("d2t".into(), HostTensor::from_i64(vec![vd], new.d2t()));
    ckpt.tensors.insert("t2d".into(), HostTensor::from_bool(vec![new.vocab_size()], new.t2d()));
    ckpt.config.draft_vocab_size = vd;
    Ok(())
}

#[cfg(test)]
mod tests {
    use aerie_model::checkpoint::io::write_safetensors;
    use aerie_model::checkpoint::synthetic;

    use super::*;

    const V: usize = 40;
    const VD: usize = 12;
    const H: usize = 16;

    /// A tiny target directory (config, embedding, head, final norm) and a draft vocab file.
    fn target(root: &Path) -> (PathBuf, PathBuf) {
        let dir = root.join("target");
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": 24,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "num_hidden_layers": 8,
            "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64
        });
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let f = |n: usize, k: f32| (0..n).map(|i| ((i as f32) * k).sin()).collect::<Vec<f32>>();
        let embed = HostTensor::from_f32(vec![V, H], &f(V * H, 0.37), Dtype::F32);
        let head = HostTensor::from_f32(vec![V, H], &f(V * H, 0.11), Dtype::F32);
        let norm = HostTensor::from_f32(vec![H], &f(H, 1.3), Dtype::F32);
        write_safetensors(
            &dir.join("model.safetensors"),
            [("model.embed_tokens.weight", &embed), ("lm_head.weight", &head), ("model.norm.weight", &norm)],
        )
        .unwrap();
        let (d2t, t2d) = synthetic::vocab_map(V, VD, 5);
        let vocab = root.join("vocab.safetensors");
        write_safetensors(
            &vocab,
            [("d2t", &HostTensor::from_i64(vec![VD], &d2t)), ("t2d", &HostTensor::from_bool(vec![V], &t2d))],
        )
        .unwrap();
        (dir, vocab)
    }

    fn config(root: &Path, init: &str) -> Result<TrainConfig> {
        let text = format!(
            "output_dir = \"{out}\"\n[data]\ntrain = [\"{out}/none\"]\n[init]\n{init}\n[target]\npath = \"{t}\"\n",
            out = root.join("run").display(),
            t = root.join("target").display(),
        );
        TrainConfig::from_toml_str(&text, Path::new("test.toml"), &[])
    }

    #[test]
    fn from_target_starts_where_the_target_ends() {
        let root = tempfile::tempdir().unwrap();
        let (dir, vocab) = target(root.path());
        let init = format!("kind = \"fresh\"\nvocab = \"{}\"", vocab.display());
        let plain = initial_drafter(&config(root.path(), &init).unwrap()).unwrap().checkpoint;
        let cfg = config(root.path(), &format!("{init}\nfrom_target = true")).unwrap();
        let got = initial_drafter(&cfg).unwrap();
        let t = &got.checkpoint.tensors;
        let f32s = |k: &str| t[k].to_f32(k).unwrap();

        let map = read_vocab_file(&vocab, Some(V)).unwrap();
        let head = load_target_head(&dir).unwrap().to_f32("head").unwrap();
        let rows = f32s("lm_head.weight");
        for (j, &id) in map.target_ids().iter().enumerate() {
            assert_eq!(&rows[j * H..(j + 1) * H], &head[id * H..(id + 1) * H], "lm_head row {j} (target id {id})");
        }
        let norm = WeightFiles::open_dir(&dir).unwrap().load(&["model.norm.weight"]).unwrap();
        assert_eq!(f32s("norm.weight"), norm["model.norm.weight"].to_f32("norm").unwrap());
        let fc = f32s("fc.weight");
        let a = got.checkpoint.config.num_aux();
        assert_eq!(fc.len(), H * a * H);
        for i in 0..H {
            for j in 0..a * H {
                let want = if j == (a - 1) * H + i { 1.0 } else { 0.0 };
                assert_eq!(fc[i * a * H + j], want, "fc[{i}, {j}]");
            }
        }
        for k in ["midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"] {
            assert!(f32s(k).iter().all(|&x| x == 0.0), "{k} is not zero");
        }
        // Everything else is the reference init, the vocab map included.
        for k in
            ["midlayer.self_attn.q_proj.weight", "midlayer.mlp.gate_proj.weight", "d2t", "t2d", "embed_tokens.weight"]
        {
            assert_eq!(t[k], plain.tensors[k], "{k}");
        }
        assert!(got.notes.iter().any(|n| n.contains("from_target")), "{:?}", got.notes);
    }

    #[test]
    fn from_target_is_refused_for_a_warm_start() {
        let root = tempfile::tempdir().unwrap();
        target(root.path());
        let e = config(root.path(), "kind = \"warm_start\"\ndrafter = \"d\"\nfrom_target = true").unwrap_err();
        assert!(e.to_string().contains("init.from_target"), "{e}");
    }
}

//! safetensors on disk: reading a model directory (`model.safetensors`, or shards listed in
//! `model.safetensors.index.json`) through memory maps, reading headers alone (a Kimi drafter is
//! gigabytes; `inspect` needs only shapes), and writing files and directories atomically so that
//! an interrupted export never leaves a half-written drafter that an engine would load.
//!
//! Keys here are FILE keys, as stored; renaming to canonical names is [`super::keys`]' job.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype as StDtype, View};

use super::tensors::{Dtype, HostTensor, TensorMap};
use crate::{Error, Result};

/// File name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Dtype and shape of one stored tensor, read from a header without touching its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// The file that holds it.
    pub file: PathBuf,
}

impl TensorHeader {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The safetensors files of one checkpoint: a single file or an index of shards. Opening reads
/// only the index; files are mapped when their tensors are asked for.
#[derive(Debug, Clone)]
pub struct WeightFiles {
    layout: Layout,
}

#[derive(Debug, Clone)]
enum Layout {
    Single(PathBuf),
    /// File key → shard path, from the index's `weight_map`.
    Indexed {
        index: PathBuf,
        weight_map: BTreeMap<String, PathBuf>,
    },
}

fn st_err(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::Safetensors { path: path.to_path_buf(), message: message.to_string() }
}

fn from_st(dtype: StDtype, path: &Path, key: &str) -> Result<Dtype> {
    Ok(match dtype {
        StDtype::F32 => Dtype::F32,
        StDtype::F16 => Dtype::F16,
        StDtype::BF16 => Dtype::BF16,
        StDtype::I64 => Dtype::I64,
        StDtype::I32 => Dtype::I32,
        StDtype::U8 => Dtype::U8,
        StDtype::BOOL => Dtype::Bool,
        other => {
            return Err(st_err(
                path,
                format!(
                    "tensor `{key}` has dtype {other:?}, which aerie does not read \
                     (F32, BF16, F16, I64, I32, U8, BOOL)"
                ),
            ));
        }
    })
}

fn to_st(dtype: Dtype) -> StDtype {
    match dtype {
        Dtype::F32 => StDtype::F32,
        Dtype::F16 => StDtype::F16,
        Dtype::BF16 => StDtype::BF16,
        Dtype::I64 => StDtype::I64,
        Dtype::I32 => StDtype::I32,
        Dtype::U8 => StDtype::U8,
        Dtype::Bool => StDtype::BOOL,
    }
}

/// Map a file read-only.
fn map(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and every tensor is copied out before it is dropped. A file
    // truncated by another process while mapped would fault; checkpoints are not written in
    // place by aerie (it writes a temporary file and renames it).
    unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}

impl WeightFiles {
    /// The weights of the model directory `dir`, or `None` when it holds neither
    /// `model.safetensors` nor `model.safetensors.index.json`.
    pub fn find(dir: &Path) -> Result<Option<Self>> {
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Ok(Some(Self { layout: Layout::Single(single) }));
        }
        let index = dir.join(INDEX_FILE);
        if !index.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let bad = |m: String| Error::Config { path: index.clone(), message: m };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map =
            value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
        let mut weight_map = BTreeMap::new();
        for (key, file) in map {
            let name = file.as_str().ok_or_else(|| bad(format!("weight_map[`{key}`] is not a file name")))?;
            let rel = Path::new(name);
            if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(bad(format!("weight_map[`{key}`] = `{name}` leaves the checkpoint directory")));
            }
            weight_map.insert(key.clone(), dir.join(rel));
        }
        Ok(Some(Self { layout: Layout::Indexed { index, weight_map } }))
    }

    /// Like [`WeightFiles::find`], but a directory without weights is an error.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        Self::find(dir)?.ok_or_else(|| Error::Config {
            path: dir.to_path_buf(),
            message: format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
        })
    }

    /// A single safetensors file.
    pub fn open_file(path: &Path) -> Self {
        Self { layout: Layout::Single(path.to_path_buf()) }
    }

    /// The file that names the weights: the single file or the index.
    pub fn source(&self) -> &Path {
        match &self.layout {
            Layout::Single(p) => p,
            Layout::Indexed { index, .. } => index,
        }
    }

    /// The distinct data files, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        match &self.layout {
            Layout::Single(p) => vec![p.clone()],
            Layout::Indexed { weight_map, .. } => {
                let mut v: Vec<PathBuf> = weight_map.values().cloned().collect();
                v.sort();
                v.dedup();
                v
            }
        }
    }

    /// Whether the checkpoint holds `key`. Reads only the index, or the single file's header.
    pub fn contains(&self, key: &str) -> Result<bool> {
        match &self.layout {
            Layout::Indexed { weight_map, .. } => Ok(weight_map.contains_key(key)),
            Layout::Single(_) => Ok(self.headers()?.contains_key(key)),
        }
    }

    /// Dtype and shape of every tensor, from the headers alone (no tensor data is read).
    /// For an index, every key it lists must be in the shard it names.
    pub fn headers(&self) -> Result<BTreeMap<String, TensorHeader>> {
        let mut out = BTreeMap::new();
        for file in self.files() {
            let mmap = map(&file)?;
            let (_, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| st_err(&file, e))?;
            for (key, info) in meta.tensors() {
                if let Layout::Indexed { weight_map, .. } = &self.layout
                    && weight_map.get(&key) != Some(&file)
                {
                    continue; // listed elsewhere (or not at all): the index decides
                }
                let dtype = from_st(info.dtype, &file, &key)?;
                out.insert(key, TensorHeader { dtype, shape: info.shape.clone(), file: file.clone() });
            }
        }
        if let Layout::Indexed { index, weight_map } = &self.layout {
            let lost: Vec<&String> = weight_map.keys().filter(|k| !out.contains_key(*k)).collect();
            if !lost.is_empty() {
                return Err(st_err(
                    index,
                    format!("{} indexed tensor(s) missing from their shards, e.g. `{}`", lost.len(), lost[0]),
                ));
            }
        }
        Ok(out)
    }

    /// Dtype and shape of one tensor from the header of the file that holds it (for an index,
    /// only that shard is opened); `None` when the checkpoint lacks it.
    pub fn header(&self, key: &str) -> Result<Option<TensorHeader>> {
        let file = match &self.layout {
            Layout::Single(p) => p.clone(),
            Layout::Indexed { weight_map, .. } => match weight_map.get(key) {
                Some(f) => f.clone(),
                None => return Ok(None),
            },
        };
        let mmap = map(&file)?;
        let (_, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| st_err(&file, e))?;
        match meta.info(key) {
            None if matches!(self.layout, Layout::Single(_)) => Ok(None),
            None => Err(st_err(&file, format!("indexed tensor `{key}` is not in this shard"))),
            Some(info) => {
                Ok(Some(TensorHeader { dtype: from_st(info.dtype, &file, key)?, shape: info.shape.clone(), file }))
            }
        }
    }

    /// Load the tensors named by `keys` (file keys), mapping each file once.
    pub fn load(&self, keys: &[&str]) -> Result<TensorMap> {
        let mut by_file: HashMap<PathBuf, Vec<&str>> = HashMap::new();
        for &key in keys {
            let file = match &self.layout {
                Layout::Single(p) => p.clone(),
                Layout::Indexed { index, weight_map } => weight_map
                    .get(key)
                    .cloned()
                    .ok_or_else(|| st_err(index, format!("no tensor `{key}` in the index")))?,
            };
            by_file.entry(file).or_default().push(key);
        }
        let mut out = TensorMap::new();
        for (file, keys) in by_file {
            let mmap = map(&file)?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| st_err(&file, e))?;
            for key in keys {
                let view = st.tensor(key).map_err(|_| st_err(&file, format!("no tensor `{key}` in this file")))?;
                let dtype = from_st(view.dtype(), &file, key)?;
                out.insert(
                    key.to_string(),
                    HostTensor { dtype, shape: view.shape().to_vec(), data: view.data().to_vec() },
                );
            }
        }
        Ok(out)
    }

    /// Load every tensor.
    pub fn load_all(&self) -> Result<TensorMap> {
        let keys: Vec<String> = match &self.layout {
            Layout::Indexed { weight_map, .. } => weight_map.keys().cloned().collect(),
            Layout::Single(_) => self.headers()?.into_keys().collect(),
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.load(&refs)
    }
}

/// A [`HostTensor`] as a safetensors view.
struct StView<'a>(&'a HostTensor);

impl View for StView<'_> {
    fn dtype(&self) -> StDtype {
        to_st(self.0.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.0.data)
    }
    fn data_len(&self) -> usize {
        self.0.data.len()
    }
}

/// Write `tensors` (file keys) as one safetensors file with `__metadata__ {"format": "pt"}`,
/// atomically: the data goes to a temporary file in the same directory, which is synced and then
/// renamed over `path`.
pub fn write_safetensors<'a, K: AsRef<str>>(
    path: &Path,
    tensors: impl IntoIterator<Item = (K, &'a HostTensor)>,
) -> Result<()> {
    let tensors: Vec<(K, &HostTensor)> = tensors.into_iter().collect();
    for (key, t) in &tensors {
        let key = key.as_ref();
        if t.data.len() != t.numel() * t.dtype.size() {
            return Err(Error::Shape(format!(
                "tensor `{key}` for {}: {} bytes for shape {:?} of {}",
                path.display(),
                t.data.len(),
                t.shape,
                t.dtype
            )));
        }
    }
    let dir = parent_dir(path);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("model.safetensors");
    let tmp =
        tempfile::Builder::new().prefix(&format!(".{name}.tmp-")).tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors.iter().map(|(k, t)| (k.as_ref(), StView(t))), Some(meta), tmp.path())
        .map_err(|e| st_err(tmp.path(), format!("cannot write: {e}")))?;
    File::open(tmp.path()).and_then(|f| f.sync_all()).map_err(|e| Error::io(tmp.path(), e))?;
    set_public_mode(tmp.path(), false)?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Temporary files and directories are created private (0600/0700); a published checkpoint must
/// be readable by the serving engine's user, like any file written with the default umask.
fn set_public_mode(path: &Path, dir: bool) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if dir { 0o755 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io(path, e))?;
    }
    #[cfg(not(unix))]
    let _ = (path, dir);
    Ok(())
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The mark aerie leaves in every drafter directory it writes ([`write_dir_atomic`]): what
/// `export --force` recognises as its own, where a directory that merely holds `config.json`
/// and `model.safetensors` (a small target model) is someone else's.
pub const EXPORT_MARKER: &str = ".aerie-export.json";
/// What [`EXPORT_MARKER`] holds.
pub const EXPORT_MARKER_FORMAT: &str = "aerie-export/1";

/// Build the directory `out` atomically: `fill` writes into a fresh temporary directory beside
/// `out`, [`EXPORT_MARKER`] is added, and the directory is then renamed to `out`. An existing
/// empty directory is replaced; a non-empty one only with `overwrite`, and only when it holds
/// exactly what this writer writes (`config.json`, `model.safetensors` and the marker, nothing
/// else): a Hugging Face model directory, a model of just those two files, a training
/// checkpoint with its optimizer state or a directory of notes is never replaced.
pub fn write_dir_atomic(out: &Path, overwrite: bool, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let exists_err = |m: &str| Error::OutputExists { path: out.to_path_buf(), message: m.into() };
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| exists_err("the output path must end in a directory name"))?;
    if out.exists() {
        if !out.is_dir() {
            return Err(exists_err("exists and is not a directory"));
        }
        let non_empty = std::fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_some();
        if non_empty {
            if !overwrite {
                return Err(exists_err(
                    "exists and is not empty: choose another --out, or pass --force to replace a drafter aerie exported there",
                ));
            }
            let files = ["config.json", SINGLE_FILE, EXPORT_MARKER];
            aerie_data::owned::check_dir_is_ours(out, "a drafter checkpoint", &files, &files)?;
            check_marker(out)?;
        }
    }
    let parent = parent_dir(out);
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-"))
        .tempdir_in(parent)
        .map_err(|e| Error::io(parent, e))?;
    fill(tmp.path())?;
    let marker = tmp.path().join(EXPORT_MARKER);
    let text =
        format!("{{\"format\": \"{EXPORT_MARKER_FORMAT}\", \"writer\": \"aerie {}\"}}\n", env!("CARGO_PKG_VERSION"));
    std::fs::write(&marker, text).map_err(|e| Error::io(&marker, e))?;
    set_public_mode(tmp.path(), true)?;
    aerie_data::atomic::replace_dir(tmp.path(), out).map_err(|e| Error::io(out, e))?;
    // The temporary directory now lives at `out`; make sure its guard does not delete it.
    let _ = tmp.keep();
    Ok(())
}

/// Refuse `dir` unless its [`EXPORT_MARKER`] is aerie's (`format` [`EXPORT_MARKER_FORMAT`]).
fn check_marker(dir: &Path) -> Result<()> {
    let path = dir.join(EXPORT_MARKER);
    let ok = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v["format"] == EXPORT_MARKER_FORMAT);
    if ok {
        return Ok(());
    }
    Err(aerie_data::Error::NotOurs {
        path: dir.to_path_buf(),
        message: format!(
            "is not a drafter checkpoint that aerie wrote ({EXPORT_MARKER} is not aerie's); refusing to replace it: \
             move it away or choose another output"
        ),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TensorMap {
        TensorMap::from([
            ("a.weight".into(), HostTensor::from_f32(vec![2, 3], &[1., 2., 3., 4., 5., 6.], Dtype::BF16)),
            ("d2t".into(), HostTensor::from_i64(vec![2], &[0, 7])),
            ("t2d".into(), HostTensor::from_bool(vec![3], &[true, false, true])),
        ])
    }

    #[test]
    fn single_file_round_trip_and_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE_FILE);
        write_safetensors(&path, &sample()).unwrap();
        let w = WeightFiles::open_dir(dir.path()).unwrap();
        assert_eq!(w.load_all().unwrap(), sample());
        let h = w.headers().unwrap();
        assert_eq!(h["a.weight"].shape, vec![2, 3]);
        assert_eq!(h["t2d"].dtype, Dtype::Bool);
        // Metadata and no stray temporary files.
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes[8..200]);
        assert!(text.contains(r#""__metadata__":{"format":"pt"}"#), "{text}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
        }
    }

    #[test]
    fn sharded_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sample();
        let first = TensorMap::from([("a.weight".to_string(), s.remove("a.weight").unwrap())]);
        write_safetensors(&dir.path().join("model-00001-of-00002.safetensors"), &first).unwrap();
        write_safetensors(&dir.path().join("model-00002-of-00002.safetensors"), &s).unwrap();
        let index = serde_json::json!({"metadata": {}, "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "d2t": "model-00002-of-00002.safetensors",
            "t2d": "model-00002-of-00002.safetensors"}});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let w = WeightFiles::open_dir(dir.path()).unwrap();
        assert_eq!(w.files().len(), 2);
        assert_eq!(w.load_all().unwrap(), sample());
        assert_eq!(w.headers().unwrap().len(), 3);
        assert!(w.contains("d2t").unwrap());
        let e = w.load(&["nope"]).unwrap_err().to_string();
        assert!(e.contains(INDEX_FILE) && e.contains("nope"), "{e}");
    }

    #[test]
    fn missing_and_broken_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = WeightFiles::open_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("no model.safetensors"), "{e}");
        std::fs::write(dir.path().join(SINGLE_FILE), b"garbage").unwrap();
        let e = WeightFiles::open_dir(dir.path()).unwrap().load_all().unwrap_err().to_string();
        assert!(e.contains(SINGLE_FILE) && e.contains("not a readable safetensors"), "{e}");
    }

    #[test]
    fn atomic_dir_refuses_and_replaces() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("out");
        // What the writer writes: exactly config.json and model.safetensors.
        let write = |ow| {
            write_dir_atomic(&out, ow, |d| {
                std::fs::write(d.join("config.json"), "{}").map_err(|e| Error::io(d, e))?;
                std::fs::write(d.join(SINGLE_FILE), "").map_err(|e| Error::io(d, e))
            })
        };
        write(false).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o755);
        }
        let e = write(false).unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
        write(true).unwrap();
        // A failing fill leaves the old output alone and no temporary directory behind.
        let e = write_dir_atomic(&out, true, |_| Err(Error::Shape("boom".into())));
        assert!(e.is_err() && out.join("config.json").is_file());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
        // Unrelated directories are never replaced.
        let other = root.path().join("home");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("notes.txt"), "x").unwrap();
        let e = write_dir_atomic(&other, true, |_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("refusing to replace") && e.contains("notes.txt"), "{e}");
        // Nor a model directory holding more than the writer's two files.
        std::fs::write(out.join("tokenizer.json"), "{}").unwrap();
        let e = write(true).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
        assert!(out.join("tokenizer.json").is_file());
    }

    #[test]
    fn force_replaces_only_a_directory_bearing_aeries_mark() {
        let root = tempfile::tempdir().unwrap();
        let fill = |d: &Path| {
            std::fs::write(d.join("config.json"), "{}").map_err(|e| Error::io(d, e))?;
            std::fs::write(d.join(SINGLE_FILE), "new").map_err(|e| Error::io(d, e))
        };
        // A model of exactly the two files an export holds (a 538 MB target was lost this way).
        let model = root.path().join("model");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
        std::fs::write(model.join(SINGLE_FILE), "weights").unwrap();
        let e = write_dir_atomic(&model, true, fill).unwrap_err().to_string();
        assert!(e.contains("refusing to replace") && e.contains(EXPORT_MARKER), "{e}");
        assert_eq!(std::fs::read(model.join(SINGLE_FILE)).unwrap(), b"weights");
        // A marker that is not aerie's is no mark.
        std::fs::write(model.join(EXPORT_MARKER), "{}").unwrap();
        assert!(write_dir_atomic(&model, true, fill).is_err());
        assert_eq!(std::fs::read(model.join(SINGLE_FILE)).unwrap(), b"weights");
        // aerie's own export bears it, and is replaced.
        let out = root.path().join("export");
        write_dir_atomic(&out, false, fill).unwrap();
        let mark: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join(EXPORT_MARKER)).unwrap()).unwrap();
        assert_eq!(mark["format"], EXPORT_MARKER_FORMAT);
        write_dir_atomic(&out, true, fill).unwrap();
    }
}

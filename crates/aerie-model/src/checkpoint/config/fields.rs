//! Typed access to `config.json` objects: every accessor names the file and the full key path in
//! its error, treats JSON `null` as absent, and never panics on a value of the wrong type.

use std::path::Path;

use serde_json::{Map, Value};

use super::config_err;
use crate::{Error, Result};

/// Typed access to one JSON object, with errors naming the file and the key.
pub(super) struct Obj<'a> {
    pub(super) path: &'a Path,
    pub(super) map: &'a Map<String, Value>,
    /// Key path prefix for messages, e.g. `transformer_layer_config.`.
    pub(super) ctx: &'a str,
}

impl<'a> Obj<'a> {
    pub(super) fn new(path: &'a Path, value: &'a Value, ctx: &'a str) -> Result<Self> {
        let map = value.as_object().ok_or_else(|| config_err(path, format!("`{ctx}` is not a JSON object")))?;
        Ok(Self { path, map, ctx })
    }

    /// The value, with JSON null treated as absent.
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn bad(&self, key: &str, want: &str, got: &Value) -> Error {
        config_err(self.path, format!("`{}{key}` must be {want}, found {got}", self.ctx))
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "a non-negative integer", v)),
        }
    }

    pub(super) fn req_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| config_err(self.path, format!("required key `{}{key}` is missing", self.ctx)))
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.bad(key, "a number", v)),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.bad(key, "true or false", v)),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.bad(key, "a string", v)),
        }
    }

    pub(super) fn ids(&self, key: &str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.bad(key, "a list of layer ids", v))?;
        arr.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.bad(key, "a list of non-negative layer ids", v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub(super) fn child(&self, key: &str, ctx: &'a str) -> Result<Option<Obj<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => Obj::new(self.path, v, ctx).map(Some),
        }
    }
}

//! Python's semantics on the JSON values `json.loads` makes: truthiness, iteration, type names,
//! `str`, `repr` and `json.dumps`, as far as the port needs them.

use serde_json::Value;

use super::super::python::{float_repr, json_string};
use super::{R, raised, unsupported};

/// Python's truthiness of a JSON value.
pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Python's type name of what `json.loads` makes of a JSON value.
pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Iterating a value in Python: a list's items, a string's characters, a dict's keys.
pub(super) fn iterate(v: &Value) -> R<Vec<std::borrow::Cow<'_, Value>>> {
    use std::borrow::Cow;
    Ok(match v {
        Value::Array(items) => items.iter().map(Cow::Borrowed).collect(),
        Value::String(s) => s.chars().map(|c| Cow::Owned(Value::String(c.to_string()))).collect(),
        Value::Object(o) => o.keys().map(|k| Cow::Owned(Value::String(k.clone()))).collect(),
        other => return raised(format!("TypeError: '{}' object is not iterable", type_name(other))),
    })
}

/// A JSON number as Python's `json.loads` makes it.
pub(super) enum PyNumber {
    Int(String),
    Float(f64),
}

pub(super) fn py_number(n: &serde_json::Number) -> R<PyNumber> {
    if let Some(i) = n.as_i64() {
        return Ok(PyNumber::Int(i.to_string()));
    }
    if let Some(u) = n.as_u64() {
        return Ok(PyNumber::Int(u.to_string()));
    }
    let x = n.as_f64().unwrap_or(f64::NAN);
    // serde_json reads integers beyond 64 bits, and `-0`, as floats; Python keeps them ints.
    if x.fract() == 0.0 && x.abs() >= 9.2e18 {
        return unsupported(format!("the number {x:e}, an integer beyond 64 bits or a float (ambiguous once parsed)"));
    }
    if x == 0.0 && x.is_sign_negative() {
        return unsupported("the number -0 (an int or a float: ambiguous once parsed)");
    }
    Ok(PyNumber::Float(x))
}

/// Python's `str()` of a JSON value (`repr` inside lists and dicts).
pub(super) fn py_str(v: &Value) -> R<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => {
            let mut out = String::new();
            py_repr(other, &mut out)?;
            Ok(out)
        }
    }
}

/// A value for an exception's message (its exact text does not matter: only that Python raised).
pub(super) fn show(v: &Value) -> String {
    py_str(v).unwrap_or_else(|_| v.to_string())
}

/// How [`literal`] spells a value: Python's `repr()` or `json.dumps`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spelling {
    Repr,
    Json,
}

/// Python's `repr()` of a JSON value; strings only when printable ASCII (Python's escaping of
/// other characters is not reproduced).
fn py_repr(v: &Value, out: &mut String) -> R<()> {
    literal(v, Spelling::Repr, out)
}

/// `json.dumps(v, ensure_ascii=False)`: `", "` and `": "` separators, Python's float repr.
pub(super) fn json_dumps(v: &Value) -> R<String> {
    let mut out = String::new();
    literal(v, Spelling::Json, &mut out)?;
    Ok(out)
}

/// `repr` and `json.dumps` share the layout (`", "` between items, `": "` after keys, Python's
/// int and float spellings) and differ in the words for null and the booleans and in strings.
fn literal(v: &Value, spelling: Spelling, out: &mut String) -> R<()> {
    let json = spelling == Spelling::Json;
    match v {
        Value::Null => out.push_str(if json { "null" } else { "None" }),
        Value::Bool(b) => out.push_str(match (json, *b) {
            (true, true) => "true",
            (true, false) => "false",
            (false, true) => "True",
            (false, false) => "False",
        }),
        Value::Number(n) => match py_number(n)? {
            PyNumber::Int(s) => out.push_str(&s),
            PyNumber::Float(x) => out.push_str(&float_repr(x)),
        },
        Value::String(s) => string_literal(s, spelling, out)?,
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                literal(item, spelling, out)?;
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, item)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                string_literal(k, spelling, out)?;
                out.push_str(": ");
                literal(item, spelling, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn string_literal(s: &str, spelling: Spelling, out: &mut String) -> R<()> {
    if spelling == Spelling::Json {
        json_string(s, false, out);
        return Ok(());
    }
    if !s.chars().all(|c| (' '..='~').contains(&c)) {
        return unsupported(format!("Python's repr of the string {s:?} inside a list or dict"));
    }
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        if c == '\\' || c == quote {
            out.push('\\');
        }
        out.push(c);
    }
    out.push(quote);
    Ok(())
}

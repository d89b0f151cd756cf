//! Python behaviour that Hugging Face chat templates rely on, for minijinja: how Jinja2 prints
//! values (`None`, `True`, float repr), transformers' `tojson` (plain `json.dumps`, not Jinja's
//! HTML-safe variant: `", "`/`": "` separators, non-ASCII kept), `raise_exception` and
//! `strftime_now`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

use super::clock::{civil_from_days, days_from_civil, unix_now};

/// Prefix of the message of errors raised by a template's own `raise_exception`.
pub(crate) const RAISED: &str = "template raised: ";

/// `raise_exception(message)`: abort rendering with the template's message.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// `strftime_now(format)`: the current time formatted like Python's `strftime`. The clock is
/// UTC (transformers uses the local time zone; build machines usually run in UTC).
pub(crate) fn strftime_now(format: String) -> Result<Value, Error> {
    Ok(Value::from(strftime(&format, unix_now())))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Format `unix_secs` (UTC) with the common `strftime` directives; unknown ones are kept.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:>2}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", (hh + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('B') => write!(out, "{}", MONTHS[m as usize - 1]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('F') => write!(out, "{y}-{m:02}-{d:02}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// A JSON value as a template value (objects keep their key order).
pub(crate) fn json_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (_, _, f) => Value::from(f.unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_to_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_to_value(v)))),
    }
}

/// Python's `repr(float)` (shortest round-trip digits; exponent form outside [1e-4, 1e16)).
pub(crate) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{:e}", x);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    if x == 0.0 || (-4..16).contains(&exp) {
        let mut s = format!("{x}");
        if !s.contains('.') {
            s.push_str(".0");
        }
        s
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// Python's `repr(str)`.
fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str(value)` for what templates print; nested strings use `repr`.
pub(crate) fn py_str(value: &Value, out: &mut String, nested: bool) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if !value.is_integer() => {
            out.push_str(&float_repr(f64::try_from(value.clone()).unwrap_or(f64::NAN)));
        }
        ValueKind::String if nested => str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(&item, out, true);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(&key, out, true);
                out.push_str(": ");
                py_str(&value.get_item(&key).unwrap_or_default(), out, true);
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// The formatter for `{{ ... }}`: Python's `str()` (no auto-escaping, as transformers).
pub(crate) fn format_value(out: &mut Output, _: &mut State, value: &Value) -> Result<(), Error> {
    if let Some(s) = value.as_str() {
        return out.write_str(s).map_err(Error::from);
    }
    let mut s = String::new();
    py_str(value, &mut s, false);
    out.write_str(&s).map_err(Error::from)
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, keyword arguments as in Python.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(usize::try_from(v)?),
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let item = v.get_item_by_index(0)?;
            let key = v.get_item_by_index(1)?;
            (item.to_string(), key.to_string())
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonStyle {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, value: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => {
                let _ = write!(out, "{value}");
            }
            ValueKind::Number => {
                let x = f64::try_from(value.clone())?;
                out.push_str(&match float_repr(x).as_str() {
                    "nan" => "NaN".to_owned(),
                    "inf" => "Infinity".to_owned(),
                    "-inf" => "-Infinity".to_owned(),
                    s => s.to_owned(),
                });
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(('[', ']'), &items, level, out, |item, out| self.write(item, level + 1, out))?;
            }
            ValueKind::Map | ValueKind::Plain => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|a| a.to_string());
                }
                self.container(('{', '}'), &keys, level, out, |key, out| {
                    match key.as_str() {
                        Some(k) => self.string(k, out),
                        None => {
                            let mut k = String::new();
                            py_str(key, &mut k, false);
                            self.string(&k, out);
                        }
                    }
                    out.push_str(&self.key_sep);
                    self.write(&value.get_item(key)?, level + 1, out)
                })?;
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: cannot serialise a {other} value"),
                ));
            }
        }
        Ok(())
    }

    /// A list or an object: `open`, the entries separated by `item_sep`, each on its own line
    /// when indenting, then `close`; an empty one is written `[]` or `{}` on one line.
    fn container(
        &self,
        (open, close): (char, char),
        entries: &[Value],
        level: usize,
        out: &mut String,
        mut entry: impl FnMut(&Value, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if entries.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(level + 1, out);
            entry(e, out)?;
        }
        self.newline(level, out);
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        json_string(s, self.ensure_ascii, out);
    }
}

/// A JSON string as Python's `json.dumps` writes it: the short escapes, `\u00XX` below 0x20,
/// and with `ensure_ascii` every other non-ASCII character as UTF-16 `\uXXXX` units.
pub(crate) fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (0.0, "0.0"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(strftime("%d %b %Y %H:%M:%S %A %j %%", t), "26 Jul 2024 13:05:09 Friday 208 %");
        assert_eq!(strftime("%B %e, %y %I%p", 0), "January  1, 70 12AM");
    }
}

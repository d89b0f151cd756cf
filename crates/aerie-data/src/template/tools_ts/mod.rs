//! Kimi-K2.5's tool declarations in TypeScript (`tools_ts_str`), as its tokenizer computes them.
//!
//! K2.5's `apply_chat_template` (Python, in the checkpoint, outside the Jinja file) sorts the
//! `tools` keys recursively, calls `encode_tools_to_typescript_style(tools)` of its module
//! `tool_declaration_ts.py`, and passes the result to the template as `tools_ts_str`; when that
//! raises, it passes nothing and the template declares the tools as compact JSON instead
//! (`../shared/reference/kimi-tokenizer.md` §2). This is a port of that module, written from
//! reading it: the same text for every schema it renders, and the same exceptions (here
//! [`Outcome::Raised`]) wherever the Python raises, following Python's semantics on JSON values
//! (truthiness, `in` on strings and lists, iteration over a string's characters or a dict's
//! keys, `str()` of numbers, `json.dumps` of defaults) and its order of evaluation, so that the
//! first failure is the one Python meets.
//!
//! Where Python would print something this port does not reproduce byte for byte (`repr` of a
//! string with non-ASCII or unprintable characters inside a list, a non-string `type`, an
//! integer JSON number beyond 64 bits, `-0`), the port answers [`Unsupported`] and the caller
//! drops the sample with its own reason, rather than render it differently from the
//! checkpoint's own code. Tested against the reference module itself
//! (`scripts/kimi_tools_ts_reference.py`, tests `chat_data::kimi_tools_ts`).

use serde_json::Value;

mod py;
mod schema;

pub(crate) use py::truthy;
use py::{iterate, py_str, type_name};
use schema::{Registry, description_text, format_description, parse, parse_object};

const INDENT: &str = "  ";
const FIELD_DELIMITER: &str = ",\n";

/// What `encode_tools_to_typescript_style` does with a tools list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It returns this text.
    Text(String),
    /// It raises (the Python exception, in words): K2.5's tokenizer then passes no
    /// `tools_ts_str` and the template falls back to JSON.
    Raised(String),
}

/// The tools list uses something this port does not reproduce exactly (what, in words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why an evaluation stopped.
enum Stop {
    Raised(String),
    Unsupported(String),
}

type R<T> = std::result::Result<T, Stop>;

fn raised<T>(message: impl Into<String>) -> R<T> {
    Err(Stop::Raised(message.into()))
}

fn unsupported<T>(message: impl Into<String>) -> R<T> {
    Err(Stop::Unsupported(message.into()))
}

/// What K2.5's `apply_chat_template` passes as `tools_ts_str` for `tools`: `None` when `tools`
/// is falsy or the encoder raises (the template then declares the tools as JSON, or not at
/// all), else the TypeScript text (possibly empty: no function tools, so the JSON fallback too).
/// Keys are sorted recursively first (`deep_sort_dict`), as the tokenizer does.
///
/// A conversation is rendered several times (prefixes for its spans and chains) with the same
/// tools, and the encoding cost as much as the rest of preparing a sample, so the last result
/// is kept per thread and reused for an equal `tools` value (the function is pure).
pub fn kimi_tools_ts_str(tools: &Value) -> std::result::Result<Option<String>, Unsupported> {
    type Memo = Option<(Value, std::result::Result<Option<String>, Unsupported>)>;
    thread_local! {
        static LAST: std::cell::RefCell<Memo> = const { std::cell::RefCell::new(None) };
    }
    if let Some(hit) = LAST.with_borrow(|m| m.as_ref().filter(|(t, _)| t == tools).map(|(_, r)| r.clone())) {
        return hit;
    }
    let result = compute_tools_ts_str(tools);
    LAST.with_borrow_mut(|m| *m = Some((tools.clone(), result.clone())));
    result
}

fn compute_tools_ts_str(tools: &Value) -> std::result::Result<Option<String>, Unsupported> {
    let tools = super::deep_sorted(tools);
    if !truthy(&tools) {
        return Ok(None);
    }
    match encode_tools_to_typescript_style(&tools)? {
        Outcome::Text(s) => Ok(Some(s)),
        Outcome::Raised(_) => Ok(None),
    }
}

/// `encode_tools_to_typescript_style(tools)` on `tools` as given (not key-sorted).
pub fn encode_tools_to_typescript_style(tools: &Value) -> std::result::Result<Outcome, Unsupported> {
    match encode(tools) {
        Ok(s) => Ok(Outcome::Text(s)),
        Err(Stop::Raised(m)) => Ok(Outcome::Raised(m)),
        Err(Stop::Unsupported(m)) => Err(Unsupported(m)),
    }
}

fn encode(tools: &Value) -> R<String> {
    if !truthy(tools) {
        return Ok(String::new());
    }
    let mut functions = Vec::new();
    for tool in iterate(tools)? {
        let Value::Object(tool) = tool.as_ref() else {
            return raised(format!("AttributeError: '{}' object has no attribute 'get'", type_name(&tool)));
        };
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            continue; // other tool types are skipped
        }
        if let Some(function) = tool.get("function").filter(|f| truthy(f)) {
            functions.push(function_to_typescript(function)?);
        }
    }
    if functions.is_empty() {
        return Ok(String::new());
    }
    Ok(format!("# Tools\n\n## functions\nnamespace functions {{\n{}\n}}\n", functions.join("\n")))
}

/// `_openai_function_to_typescript_style`.
fn function_to_typescript(function: &Value) -> R<String> {
    let Value::Object(f) = function else {
        return raised(format!("AttributeError: '{}' object has no attribute 'get'", type_name(function)));
    };
    let empty = Value::Object(serde_json::Map::new());
    let mut registry = Registry::default();
    let parameters = f.get("parameters").filter(|p| truthy(p)).unwrap_or(&empty);
    let (_, parsed) = parse_object(parameters, &mut registry)?;

    let mut interfaces = Vec::new();
    let root_interface = registry.has_self_ref;
    if root_interface {
        // The root's properties in their own order, not sorted as an object renders them.
        let params = parsed.properties.iter().map(|p| p.to_typescript(INDENT)).collect::<R<Vec<_>>>()?;
        let params = params.join(FIELD_DELIMITER);
        let params = if params.is_empty() { params } else { format!("\n{params}\n") };
        interfaces.push(format!("interface parameters {{{params}}}"));
    }
    // Definitions registered while these are parsed are resolvable but not declared.
    let definitions = registry.definitions.clone();
    for (name, schema) in definitions {
        let ty = parse(schema, &mut registry)?;
        let params = ty.to_typescript("")?;
        let Value::Object(schema) = schema else {
            return raised(format!("AttributeError: '{}' object has no attribute 'get'", type_name(schema)));
        };
        let description = match description_text(schema.get("description"))? {
            Some(d) => format_description(d, "") + "\n",
            None => String::new(),
        };
        interfaces.push(format!("{description}interface {name} {params}"));
    }
    let interfaces = interfaces.join("\n");
    let name = match f.get("name") {
        None => "function".to_owned(),
        Some(v) => py_str(v)?,
    };
    let type_def = if root_interface {
        format!("type {name} = (_: parameters) => any;")
    } else {
        format!("type {name} = (_: {}) => any;", parsed.to_typescript("")?)
    };
    let description = description_text(f.get("description"))?.map(|d| format_description(d, "")).unwrap_or_default();
    Ok([interfaces, description, type_def].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// serde_json parses floats exactly (its `float_roundtrip` feature, set in the workspace):
    /// without it, 5,764 of the 199,999 shortest spellings of i/7 parsed one ulp off and then
    /// printed differently from Python in the TypeScript declarations and every `tojson`.
    #[test]
    fn json_floats_parse_to_the_nearest_double() {
        for i in 1..20_000u32 {
            let text = format!("{}", f64::from(i) / 7.0);
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v.as_f64(), Some(text.parse::<f64>().unwrap()), "{text}");
            assert_eq!(v.to_string(), text);
        }
    }

    fn ts(tools: Value) -> Option<String> {
        kimi_tools_ts_str(&tools).unwrap()
    }

    /// Worked by hand from the reference: required before optional, each sorted by name;
    /// descriptions and constraints as `//` comments; integer as number; enums quoted.
    #[test]
    fn one_function_by_hand() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "required": ["city"], "properties": {
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                "city": {"type": "string", "description": "Name, e.g. 巴黎\nor Paris"}}}}}]);
        let want = "# Tools\n\n## functions\nnamespace functions {\n// Weather now\ntype get_weather = (_: {\n\
                    \x20 // Name, e.g. 巴黎\n  // or Paris\n  city: string,\n  // maximum: 7.5, minimum: 1\n  days?: number,\n\
                    \x20 // Default: \"c\"\n  unit?: \"c\" | \"f\"\n}) => any;\n}\n";
        assert_eq!(ts(tools).unwrap(), want);
    }

    #[test]
    fn refs_arrays_and_fallbacks() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "$defs": {"P": {"type": "object", "description": "A point", "properties": {"x": {"type": "number"}}}},
            "properties": {"ps": {"type": "array", "items": {"$ref": "#/$defs/P", "description": "one"}}}}}}]);
        let want = "# Tools\n\n## functions\nnamespace functions {\n// A point\ninterface P {\n  x?: number\n}\n\
                    type f = (_: {\n  ps?: Array<\n    // one\n    P\n  >\n}) => any;\n}\n";
        assert_eq!(ts(tools).unwrap(), want);
        // A property with no type raises in Python: no tools_ts_str, the template's JSON fallback.
        let bad = json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"description": "?"}}}}}]);
        assert_eq!(ts(bad), None);
        // No function tools: the empty string (falsy, so the JSON fallback too); falsy tools: nothing.
        assert_eq!(ts(json!([{"type": "_plugin"}])).as_deref(), Some(""));
        assert_eq!(ts(json!([])), None);
        // Python's repr of a non-ASCII string inside a list is not reproduced: unsupported.
        let odd = json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"enum": [["é"]]}}}}}]);
        assert!(kimi_tools_ts_str(&odd).is_err());
    }

    #[test]
    fn serde_json_reads_minus_zero_as_a_float() {
        // Why `-0` is unsupported: Python's json reads it as the int 0, serde_json as -0.0.
        let v: Value = serde_json::from_str("-0").unwrap();
        assert!(v.is_f64());
    }
}

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

use super::python::{float_repr, json_string};

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

/// `_SchemaRegistry`: `$defs` seen so far, in first-insertion order (a later `$defs` entry of
/// the same name replaces the schema in place, as a Python dict does).
#[derive(Default)]
struct Registry<'a> {
    definitions: Vec<(&'a str, &'a Value)>,
    has_self_ref: bool,
}

enum Resolved<'a> {
    SelfRef,
    Definition(&'a Value),
}

impl<'a> Registry<'a> {
    fn register(&mut self, defs: &'a Value) -> R<()> {
        if !truthy(defs) {
            return Ok(());
        }
        let Value::Object(defs) = defs else {
            return raised(format!("AttributeError: '{}' object has no attribute 'items'", type_name(defs)));
        };
        for (name, schema) in defs {
            match self.definitions.iter_mut().find(|(n, _)| *n == name.as_str()) {
                Some(slot) => slot.1 = schema,
                None => self.definitions.push((name, schema)),
            }
        }
        Ok(())
    }

    fn resolve(&mut self, reference: &'a Value) -> R<Resolved<'a>> {
        let Value::String(r) = reference else {
            return raised(format!("AttributeError: '{}' object has no attribute 'startswith'", type_name(reference)));
        };
        if r == "#" {
            self.has_self_ref = true;
            return Ok(Resolved::SelfRef);
        }
        if !r.starts_with("#/$defs/") {
            return raised(format!("ValueError: Unsupported reference format: {r}"));
        }
        let name = r.rsplit('/').next().unwrap_or_default();
        match self.definitions.iter().find(|(n, _)| *n == name) {
            Some((_, schema)) => Ok(Resolved::Definition(schema)),
            None => raised(format!("ValueError: Reference not found: {r}")),
        }
    }
}

/// `_BaseType`: the description (evaluated only when printed, as in Python) and the
/// constraints a type prints.
#[derive(Default)]
struct Base<'a> {
    description: Option<&'a Value>,
    constraints: Vec<(&'a str, &'a Value)>,
}

impl<'a> Base<'a> {
    fn of(schema: &'a Value, allowed: &[&str]) -> R<Self> {
        let Value::Object(m) = schema else {
            return raised(format!("AttributeError: '{}' object has no attribute 'get'", type_name(schema)));
        };
        let constraints = m.iter().filter(|(k, _)| allowed.contains(&k.as_str())).map(|(k, v)| (k.as_str(), v));
        Ok(Self { description: m.get("description"), constraints: constraints.collect() })
    }

    /// `format_docstring`.
    fn docstring(&self, indent: &str) -> R<String> {
        let mut lines = Vec::new();
        if let Some(d) = description_text(self.description)? {
            lines.push(format_description(d, indent));
        }
        if !self.constraints.is_empty() {
            let mut constraints = self.constraints.clone();
            constraints.sort_by(|a, b| a.0.cmp(b.0));
            let parts = constraints.iter().map(|(k, v)| Ok(format!("{k}: {}", py_str(v)?))).collect::<R<Vec<_>>>()?;
            lines.push(format!("{indent}// {}", parts.join(", ")));
        }
        Ok(lines.into_iter().map(|l| l + "\n").collect())
    }
}

/// `_ParameterType`: one of the module's type classes.
struct Type<'a> {
    base: Base<'a>,
    kind: Kind<'a>,
}

enum Kind<'a> {
    /// `_ParameterTypeScalar` made by the module itself (`any`, `null`).
    Builtin(&'static str),
    /// `_ParameterTypeScalar` of a schema's `type`.
    Scalar(&'a Value),
    Object(Object<'a>),
    Array(Box<Type<'a>>),
    Enum(&'a Value),
    AnyOf(Vec<Type<'a>>),
    Union(Vec<&'static str>),
    Ref(String),
}

/// `_ParameterTypeObject`.
#[derive(Default)]
struct Object<'a> {
    properties: Vec<Parameter<'a>>,
    additional: Additional<'a>,
}

#[derive(Default)]
enum Additional<'a> {
    #[default]
    Absent,
    Parsed(Box<Type<'a>>),
    Raw(&'a Value),
}

/// `_Parameter`.
struct Parameter<'a> {
    name: &'a str,
    ty: Type<'a>,
    optional: bool,
    default: Option<&'a Value>,
}

/// `_parse_parameter_type`.
fn parse<'a>(schema: &'a Value, registry: &mut Registry<'a>) -> R<Type<'a>> {
    let m = match schema {
        Value::Bool(true) => return Ok(Type { base: Base::default(), kind: Kind::Builtin("any") }),
        Value::Bool(false) => return Ok(Type { base: Base::default(), kind: Kind::Builtin("null") }),
        Value::Object(m) => m,
        // `in` on a string or list, then `.get` or indexing by a string: always an error.
        Value::String(_) | Value::Array(_) => {
            return raised(format!("Invalid JSON Schema object: {} (not a dict)", type_name(schema)));
        }
        Value::Null | Value::Number(_) => {
            return raised(format!("TypeError: argument of type '{}' is not iterable", type_name(schema)));
        }
    };
    if m.contains_key("$ref") {
        let base = Base::of(schema, &[])?;
        let reference = &m["$ref"];
        let self_ref = match registry.resolve(reference)? {
            Resolved::SelfRef => true,
            Resolved::Definition(Value::Object(d)) => d.get("$self_ref").is_some_and(truthy),
            Resolved::Definition(other) => {
                return raised(format!("AttributeError: '{}' object has no attribute 'get'", type_name(other)));
            }
        };
        let name = if self_ref {
            "parameters".to_owned()
        } else {
            reference.as_str().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_owned()
        };
        return Ok(Type { base, kind: Kind::Ref(name) });
    }
    if m.contains_key("anyOf") {
        let base = Base::of(schema, &[])?;
        let types = match &m["anyOf"] {
            Value::Array(items) => items.iter().map(|t| parse(t, registry)).collect::<R<Vec<_>>>()?,
            // A string's characters or a dict's keys: strings, which never parse.
            Value::String(s) if s.is_empty() => Vec::new(),
            Value::Object(o) if o.is_empty() => Vec::new(),
            Value::String(_) | Value::Object(_) => return raised("Invalid JSON Schema object: str"),
            other => return raised(format!("TypeError: '{}' object is not iterable", type_name(other))),
        };
        return Ok(Type { base, kind: Kind::AnyOf(types) });
    }
    if m.contains_key("enum") {
        let base = Base::of(schema, &[])?;
        let values = &m["enum"];
        if let Some(ty) = m.get("type") {
            validate_enum(values, ty)?;
        }
        return Ok(Type { base, kind: Kind::Enum(values) });
    }
    if let Some(ty) = m.get("type") {
        if let Value::Array(types) = ty {
            let base = Base::of(schema, &[])?;
            let types = types.iter().map(union_member).collect::<R<Vec<_>>>()?;
            return Ok(Type { base, kind: Kind::Union(types) });
        }
        return match ty.as_str() {
            Some("object") => {
                let (base, object) = parse_object(schema, registry)?;
                Ok(Type { base, kind: Kind::Object(object) })
            }
            Some("array") => {
                let base = Base::of(schema, &["minItems", "maxItems"])?;
                let item = match m.get("items") {
                    Some(items) if truthy(items) => parse(items, registry)?,
                    _ => Type { base: Base::default(), kind: Kind::Builtin("any") },
                };
                Ok(Type { base, kind: Kind::Array(Box::new(item)) })
            }
            name => {
                let allowed: &[&str] = match name {
                    Some("string") => &["maxLength", "minLength", "pattern"],
                    Some("number" | "integer") => &["maximum", "minimum"],
                    _ => &[],
                };
                Ok(Type { base: Base::of(schema, allowed)?, kind: Kind::Scalar(ty) })
            }
        };
    }
    if m.is_empty() {
        return Ok(Type { base: Base::default(), kind: Kind::Builtin("any") });
    }
    raised("ValueError: Invalid JSON Schema object")
}

/// `_ParameterTypeObject.__init__` (also the root `parameters`).
fn parse_object<'a>(schema: &'a Value, registry: &mut Registry<'a>) -> R<(Base<'a>, Object<'a>)> {
    let base = Base::of(schema, &[])?;
    let m = schema.as_object().expect("Base::of checked it is a dict");
    let mut object = Object::default();
    if m.is_empty() {
        return Ok((base, object));
    }
    if let Some(defs) = m.get("$defs") {
        registry.register(defs)?;
    }
    object.additional = match m.get("additionalProperties") {
        None | Some(Value::Null) => Additional::Absent,
        Some(ap @ Value::Object(_)) => Additional::Parsed(Box::new(parse(ap, registry)?)),
        Some(other) => Additional::Raw(other),
    };
    let Some(properties) = m.get("properties") else { return Ok((base, object)) };
    let Value::Object(properties) = properties else {
        return raised(format!("AttributeError: '{}' object has no attribute 'keys'", type_name(properties)));
    };
    let required = Required::of(m.get("required"))?;
    for (name, prop) in properties {
        let ty = parse(prop, registry)?;
        let default = prop.as_object().and_then(|p| p.get("default")).filter(|d| !d.is_null());
        object.properties.push(Parameter { name, ty, optional: !required.contains(name), default });
    }
    Ok((base, object))
}

/// `set(required)`: a list's elements, a string's characters, a dict's keys.
enum Required<'a> {
    Names(Vec<&'a str>),
    Chars(&'a str),
}

impl<'a> Required<'a> {
    fn of(required: Option<&'a Value>) -> R<Self> {
        Ok(match required {
            None => Required::Names(Vec::new()),
            Some(Value::Array(items)) => {
                let mut names = Vec::new();
                for item in items {
                    match item {
                        Value::String(s) => names.push(s.as_str()),
                        Value::Array(_) | Value::Object(_) => {
                            return raised(format!("TypeError: unhashable type: '{}'", type_name(item)));
                        }
                        _ => {} // hashable, never equal to a property name
                    }
                }
                Required::Names(names)
            }
            Some(Value::String(s)) => Required::Chars(s),
            Some(Value::Object(o)) => Required::Names(o.keys().map(String::as_str).collect()),
            Some(other) => return raised(format!("TypeError: '{}' object is not iterable", type_name(other))),
        })
    }

    fn contains(&self, name: &str) -> bool {
        match self {
            Required::Names(names) => names.contains(&name),
            Required::Chars(s) => {
                let mut chars = name.chars();
                matches!((chars.next(), chars.next()), (Some(c), None) if s.contains(c))
            }
        }
    }
}

/// `_ParameterTypeUnion`'s mapping of one listed type.
fn union_member(t: &Value) -> R<&'static str> {
    Ok(match t.as_str() {
        Some("string") => "string",
        Some("number" | "integer") => "number",
        Some("boolean") => "boolean",
        Some("null") => "null",
        Some("object") => "{}",
        Some("array") => "Array<any>",
        _ if matches!(t, Value::Array(_) | Value::Object(_)) => {
            return raised(format!("TypeError: unhashable type: '{}'", type_name(t)));
        }
        _ => return raised(format!("KeyError: {}", show(t))),
    })
}

/// `_ParameterTypeEnum.__init__`'s check of the values against a declared `type`.
fn validate_enum(values: &Value, ty: &Value) -> R<()> {
    let ty = match ty {
        Value::Array(types) => match types.as_slice() {
            [t] => t,
            [a, b] => {
                if !types.iter().any(|t| t.as_str() == Some("null")) {
                    return raised(format!("ValueError: Enum type {} is not supported", show(ty)));
                }
                if a.as_str() != Some("null") { a } else { b }
            }
            _ => return raised(format!("ValueError: Enum type {} is not supported", show(ty))),
        },
        other => other,
    };
    for val in iterate(values)? {
        let val = val.as_ref();
        let ok = match (ty.as_str(), val) {
            (_, Value::Null) => true,
            (Some("string"), v) => v.is_string(),
            (Some("number"), v) => matches!(v, Value::Number(_) | Value::Bool(_)),
            (Some("integer"), Value::Number(n)) => matches!(py_number(n)?, PyNumber::Int(_)),
            (Some("integer"), v) => v.is_boolean(),
            (Some("boolean"), v) => v.is_boolean(),
            _ => true,
        };
        if !ok {
            return raised(format!("ValueError: Enum value {} does not match type {}", show(val), show(ty)));
        }
    }
    Ok(())
}

impl Type<'_> {
    /// `to_typescript_style(indent)`.
    fn to_typescript(&self, indent: &str) -> R<String> {
        Ok(match &self.kind {
            Kind::Builtin(name) => (*name).to_owned(),
            Kind::Scalar(Value::String(name)) => if name == "integer" { "number" } else { name.as_str() }.to_owned(),
            // Python returns the value itself, which prints or raises depending on the caller.
            Kind::Scalar(other) => return unsupported(format!("a schema `type` that is a {}", type_name(other))),
            Kind::Object(object) => object.to_typescript(indent)?,
            Kind::Array(item) => {
                let inner = format!("{indent}{INDENT}");
                let doc = item.base.docstring(&inner)?;
                if doc.is_empty() {
                    format!("Array<{}>", item.to_typescript(indent)?)
                } else {
                    format!("Array<\n{doc}{inner}{}\n{indent}>", item.to_typescript(&inner)?)
                }
            }
            Kind::Enum(values) => {
                let parts = iterate(values)?
                    .into_iter()
                    .map(|e| match e.as_ref() {
                        Value::String(s) => Ok(format!("\"{s}\"")),
                        other => py_str(other),
                    })
                    .collect::<R<Vec<_>>>()?;
                parts.join(" | ")
            }
            Kind::AnyOf(types) => types.iter().map(|t| t.to_typescript(indent)).collect::<R<Vec<_>>>()?.join(" | "),
            Kind::Union(types) => types.join(" | "),
            Kind::Ref(name) => name.clone(),
        })
    }
}

impl Object<'_> {
    fn to_typescript(&self, indent: &str) -> R<String> {
        let mut required: Vec<&Parameter> = self.properties.iter().filter(|p| !p.optional).collect();
        let mut optional: Vec<&Parameter> = self.properties.iter().filter(|p| p.optional).collect();
        required.sort_by(|a, b| a.name.cmp(b.name));
        optional.sort_by(|a, b| a.name.cmp(b.name));
        let inner = format!("{indent}{INDENT}");
        let mut params =
            required.into_iter().chain(optional).map(|p| p.to_typescript(&inner)).collect::<R<Vec<_>>>()?;
        let additional = match &self.additional {
            Additional::Absent => None,
            Additional::Raw(Value::Bool(true)) => Some("any".to_owned()),
            Additional::Raw(Value::Bool(false)) => Some("never".to_owned()),
            Additional::Parsed(t) => Some(t.to_typescript(&inner)?),
            Additional::Raw(other) => {
                return raised(format!("ValueError: Unknown additionalProperties: {}", show(other)));
            }
        };
        if let Some(ap) = additional {
            params.push(format!("{inner}[k: string]: {ap}"));
        }
        if params.is_empty() {
            return Ok("{}".into());
        }
        Ok(format!("{{\n{}\n{indent}}}", params.join(FIELD_DELIMITER)))
    }
}

impl Parameter<'_> {
    fn to_typescript(&self, indent: &str) -> R<String> {
        let mut comments = self.ty.base.docstring(indent)?;
        if let Some(default) = self.default {
            let shown = match default {
                Value::Bool(_) | Value::Number(_) => py_str(default)?,
                other => json_dumps(other)?,
            };
            comments.push_str(&format!("{indent}// Default: {shown}\n"));
        }
        let mark = if self.optional { "?" } else { "" };
        Ok(format!("{comments}{indent}{}{mark}: {}", self.name, self.ty.to_typescript(indent)?))
    }
}

/// `_format_description`.
fn format_description(description: &str, indent: &str) -> String {
    description
        .split('\n')
        .map(|l| if l.is_empty() { String::new() } else { format!("{indent}// {l}") })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A description as printed: `None` when falsy; `.split` of anything but a string raises.
fn description_text(description: Option<&Value>) -> R<Option<&str>> {
    match description {
        Some(d) if truthy(d) => match d {
            Value::String(s) => Ok(Some(s)),
            other => raised(format!("AttributeError: '{}' object has no attribute 'split'", type_name(other))),
        },
        _ => Ok(None),
    }
}

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
fn type_name(v: &Value) -> &'static str {
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
fn iterate(v: &Value) -> R<Vec<std::borrow::Cow<'_, Value>>> {
    use std::borrow::Cow;
    Ok(match v {
        Value::Array(items) => items.iter().map(Cow::Borrowed).collect(),
        Value::String(s) => s.chars().map(|c| Cow::Owned(Value::String(c.to_string()))).collect(),
        Value::Object(o) => o.keys().map(|k| Cow::Owned(Value::String(k.clone()))).collect(),
        other => return raised(format!("TypeError: '{}' object is not iterable", type_name(other))),
    })
}

/// A JSON number as Python's `json.loads` makes it.
enum PyNumber {
    Int(String),
    Float(f64),
}

fn py_number(n: &serde_json::Number) -> R<PyNumber> {
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
fn py_str(v: &Value) -> R<String> {
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
fn show(v: &Value) -> String {
    py_str(v).unwrap_or_else(|_| v.to_string())
}

/// Python's `repr()` of a JSON value; strings only when printable ASCII (Python's escaping of
/// other characters is not reproduced).
fn py_repr(v: &Value, out: &mut String) -> R<()> {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Value::Number(n) => match py_number(n)? {
            PyNumber::Int(s) => out.push_str(&s),
            PyNumber::Float(x) => out.push_str(&float_repr(x)),
        },
        Value::String(s) => {
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
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(item, out)?;
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, item)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&Value::String(k.clone()), out)?;
                out.push_str(": ");
                py_repr(item, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// `json.dumps(v, ensure_ascii=False)`: `", "` and `": "` separators, Python's float repr.
fn json_dumps(v: &Value) -> R<String> {
    fn write(v: &Value, out: &mut String) -> R<()> {
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => match py_number(n)? {
                PyNumber::Int(s) => out.push_str(&s),
                PyNumber::Float(x) => out.push_str(&float_repr(x)),
            },
            Value::String(s) => json_string(s, false, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write(item, out)?;
                }
                out.push(']');
            }
            Value::Object(o) => {
                out.push('{');
                for (i, (k, item)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    json_string(k, false, out);
                    out.push_str(": ");
                    write(item, out)?;
                }
                out.push('}');
            }
        }
        Ok(())
    }
    let mut out = String::new();
    write(v, &mut out)?;
    Ok(out)
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

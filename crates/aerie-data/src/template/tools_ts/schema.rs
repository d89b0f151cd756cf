//! The JSON-schema side of the port: `_SchemaRegistry` (`$defs` and `$ref`), the parameter type
//! classes (`_ParameterType*`, `_Parameter`) and their TypeScript rendering, each as the Python
//! module evaluates it.

use serde_json::Value;

use super::py::{PyNumber, iterate, json_dumps, py_number, py_str, show, truthy, type_name};
use super::{FIELD_DELIMITER, INDENT, R, raised, unsupported};

/// `_SchemaRegistry`: `$defs` seen so far, in first-insertion order (a later `$defs` entry of
/// the same name replaces the schema in place, as a Python dict does).
#[derive(Default)]
pub(super) struct Registry<'a> {
    pub(super) definitions: Vec<(&'a str, &'a Value)>,
    pub(super) has_self_ref: bool,
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
pub(super) struct Base<'a> {
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
pub(super) struct Type<'a> {
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
pub(super) struct Object<'a> {
    pub(super) properties: Vec<Parameter<'a>>,
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
pub(super) struct Parameter<'a> {
    name: &'a str,
    ty: Type<'a>,
    optional: bool,
    default: Option<&'a Value>,
}

/// `_parse_parameter_type`.
pub(super) fn parse<'a>(schema: &'a Value, registry: &mut Registry<'a>) -> R<Type<'a>> {
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
pub(super) fn parse_object<'a>(schema: &'a Value, registry: &mut Registry<'a>) -> R<(Base<'a>, Object<'a>)> {
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
    pub(super) fn to_typescript(&self, indent: &str) -> R<String> {
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
    pub(super) fn to_typescript(&self, indent: &str) -> R<String> {
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
    pub(super) fn to_typescript(&self, indent: &str) -> R<String> {
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
pub(super) fn format_description(description: &str, indent: &str) -> String {
    description
        .split('\n')
        .map(|l| if l.is_empty() { String::new() } else { format!("{indent}// {l}") })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A description as printed: `None` when falsy; `.split` of anything but a string raises.
pub(super) fn description_text(description: Option<&Value>) -> R<Option<&str>> {
    match description {
        Some(d) if truthy(d) => match d {
            Value::String(s) => Ok(Some(s)),
            other => raised(format!("AttributeError: '{}' object has no attribute 'split'", type_name(other))),
        },
        _ => Ok(None),
    }
}

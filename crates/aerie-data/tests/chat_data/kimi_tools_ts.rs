//! Kimi-K2.5's TypeScript tool declarations (`tools_ts_str`): aerie's port
//! (`template::tools_ts`) against the reference module itself, `tool_declaration_ts.py` as
//! PyPI's `tinker-cookbook==0.6.1` ships it, run through `scripts/kimi_tools_ts_reference.py`:
//! byte-equal text wherever the reference renders, no `tools_ts_str` wherever it raises (the
//! template's JSON fallback), and aerie's own refusal only where marked.

use aerie_data::template::tools_ts::kimi_tools_ts_str;
use serde_json::{Value, json};

use crate::common::*;

fn function(name: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": parameters}})
}

fn props(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

/// (what, tools, whether aerie refuses it as unsupported).
fn cases() -> Vec<(&'static str, Value, bool)> {
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            "city": {"type": "string", "description": "Name, e.g. 巴黎\nor Paris"}}}}});
    // A pydantic-style schema: titles, $defs, anyOf with null, `default: null`.
    let pydantic = function(
        "book",
        json!({"title": "BookArgs", "type": "object", "required": ["guest", "when"],
            "$defs": {
                "Guest": {"title": "Guest", "type": "object", "description": "Who stays.\n\nOne person.",
                    "required": ["name"], "properties": {"name": {"type": "string", "title": "Name"},
                    "age": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": null}}},
                "Room": {"enum": ["single", "double"], "type": "string", "description": "Room kind"}},
            "properties": {
                "guest": {"$ref": "#/$defs/Guest"},
                "room": {"$ref": "#/$defs/Room", "description": "Which room", "default": "single"},
                "when": {"type": "string", "format": "date-time", "pattern": "^\\d{4}-\\d{2}$"},
                "nights": {"type": "integer", "default": 1, "maximum": 30},
                "extras": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}}}),
    );
    vec![
        ("weather: required first, descriptions, constraints, enum default", json!([weather]), false),
        (
            "several functions, a non-function tool skipped, no parameters, no name",
            json!([weather, {"type": "_plugin", "_plugin": {"name": "x"}},
                {"type": "function", "function": {"name": "ping", "description": "Ping it"}},
                {"type": "function", "function": {"parameters": {}}},
                {"type": "function", "function": {"name": "nul", "parameters": null}}]),
            false,
        ),
        ("pydantic-style: $defs, $ref, anyOf with null, titles", json!([pydantic]), false),
        (
            "nested objects with their own required lists and descriptions",
            json!([function(
                "nest",
                json!({"type": "object", "required": ["outer"], "properties": {
                "outer": {"type": "object", "description": "Outer thing", "required": ["b"], "properties": {
                    "b": {"type": "boolean"}, "a": {"type": "object", "properties": {"deep": {"type": "number",
                    "description": "Deepest", "minimum": -1.5}}}}}}})
            )]),
            false,
        ),
        (
            "arrays: item docstrings, no items, empty items, arrays of arrays, item constraints",
            json!([function(
                "arr",
                props(json!({
                "plain": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "none": {"type": "array"},
                "empty": {"type": "array", "items": {}},
                "described": {"type": "array", "items": {"type": "string", "description": "A tag\nlowercase"}},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number", "maximum": 9}}},
                "objects": {"type": "array", "description": "Points", "items": {"type": "object",
                    "description": "A point", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x"]}}}))
            )]),
            false,
        ),
        (
            "anyOf of scalars, objects and arrays (members share the indent)",
            json!([function(
                "any",
                props(json!({"v": {"description": "Either", "anyOf": [
                {"type": "string"}, {"type": "object", "properties": {"k": {"type": "string"}}},
                {"type": "array", "items": {"type": "boolean"}}, {"type": "null"}]}}))
            )]),
            false,
        ),
        (
            "enums: numbers, floats, bools, null, with a nullable type, without a type, a string's characters",
            json!([function(
                "en",
                props(json!({
                "n": {"enum": [1, 2.5, -3, 1e-5], "type": "number"},
                "b": {"enum": [true, false], "type": "boolean"},
                "s": {"enum": ["a", null], "type": ["string", "null"]},
                "u": {"enum": ["x", 1, null, true]},
                "chars": {"enum": "xyz"},
                "one": {"enum": ["only"], "type": ["string"]},
                "listed": {"enum": [[1, "a'b"], {"k": "v"}]}}))
            )]),
            false,
        ),
        (
            "type lists as unions, unknown scalar types kept",
            json!([function(
                "un",
                props(json!({
                "u": {"type": ["string", "integer", "null", "object", "array", "boolean", "number"]},
                "f": {"type": "file", "description": "Upload"},
                "i": {"type": "integer", "minimum": 0, "maximum": 10, "default": 3}}))
            )]),
            false,
        ),
        (
            "additionalProperties: true, false, a schema, alone",
            json!([function(
                "ap",
                json!({"type": "object", "additionalProperties": false, "properties": {
                "meta": {"type": "object", "additionalProperties": true},
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "nested": {"type": "object", "additionalProperties": {"type": "object",
                    "properties": {"z": {"type": "string"}}}, "properties": {"id": {"type": "string"}}},
                "empty": {"type": "object"}}})
            )]),
            false,
        ),
        (
            "defaults: strings with quotes and non-ASCII, floats, bools, lists, dicts",
            json!([function(
                "def",
                props(json!({
                "s": {"type": "string", "default": "say \"hi\"\n to 世界"},
                "f": {"type": "number", "default": 0.5},
                "e": {"type": "number", "default": 1e-7},
                "big": {"type": "number", "default": 12_345_678_901_234_567_u64},
                "t": {"type": "boolean", "default": false},
                "l": {"type": "array", "default": [1, "two", null, 2.0]},
                "d": {"type": "object", "default": {"k": ["v", {"é": true}]}},
                "z": {"type": "integer", "default": 0}}))
            )]),
            false,
        ),
        (
            "descriptions: blank lines, carriage returns, falsy non-strings ignored",
            json!([{"type": "function", "function": {"name": "desc", "description": "Line one\n\nLine three\r\nend\n",
                "parameters": props(json!({"a": {"type": "string", "description": "x\n\ny"},
                    "b": {"type": "string", "description": 0}, "c": {"type": "string", "description": null}}))}}]),
            false,
        ),
        (
            "required as a string: its characters",
            json!([function(
                "req",
                json!({"type": "object", "required": "ab",
                "properties": {"a": {"type": "string"}, "ab": {"type": "string"}, "c": {"type": "string"}}})
            )]),
            false,
        ),
        (
            "schemas {}, true and false",
            json!([function("bools", props(json!({"anything": {}, "yes": true, "no": false})))]),
            false,
        ),
        (
            "a self reference (#): the root becomes `interface parameters`, in its own key order",
            json!([function(
                "tree",
                json!({"type": "object", "required": ["value"], "additionalProperties": false,
                "properties": {"value": {"type": "string", "description": "Node value"},
                    "children": {"type": "array", "items": {"$ref": "#"}}, "a_first": {"type": "integer"}}})
            )]),
            false,
        ),
        (
            "$defs: non-object definitions, nested $defs, a definition with its own description",
            json!([function(
                "defs",
                json!({"type": "object", "$defs": {
                    "Color": {"enum": ["red", "green"]},
                    "Box": {"type": "object", "$defs": {"Inner": {"type": "string"}},
                        "properties": {"inner": {"$ref": "#/$defs/Inner"}, "color": {"$ref": "#/$defs/Color"}}},
                    "Any": {}},
                "properties": {"box": {"$ref": "#/$defs/Box"}, "c": {"$ref": "#/$defs/Color"}}})
            )]),
            false,
        ),
        (
            "keys in reverse order (deep_sort_dict first)",
            json!([{"function": {"parameters": {"properties": {"z": {"type": "string"}, "m": {"type": "number"},
                "a": {"type": "boolean"}}, "type": "object", "required": ["z", "a"]}, "name": "rev"},
                "type": "function"}]),
            false,
        ),
        (
            "a function with an empty definition is skipped; only those: no text",
            json!([{"type": "function", "function": {}}, {"type": "retrieval"}]),
            false,
        ),
        (
            "a property with a description but no type raises",
            json!([function("bad", props(json!({"x": {"description": "?"}})))]),
            false,
        ),
        (
            "a reference to a definition not yet registered raises",
            json!([function(
                "late",
                json!({"type": "object", "properties": {
                "a": {"$ref": "#/$defs/Later"},
                "b": {"type": "object", "$defs": {"Later": {"type": "string"}}}}})
            )]),
            false,
        ),
        (
            "`#/definitions/` references raise",
            json!([function(
                "draft7",
                json!({"type": "object", "definitions": {"X": {"type": "string"}},
                "properties": {"x": {"$ref": "#/definitions/X"}}})
            )]),
            false,
        ),
        (
            "an enum value that contradicts its type raises",
            json!([function("badenum", props(json!({"e": {"type": "integer", "enum": [1, 2.5]}})))]),
            false,
        ),
        (
            "an enum over three types raises",
            json!([function("tri", props(json!({"e": {"type": ["string", "number", "null"], "enum": ["a"]}})))]),
            false,
        ),
        (
            "an unknown type in a union raises",
            json!([function("u", props(json!({"x": {"type": ["string", "date"]}})))]),
            false,
        ),
        (
            "a numeric additionalProperties raises",
            json!([function("apn", json!({"type": "object", "additionalProperties": 1, "properties": {}}))]),
            false,
        ),
        (
            "a non-string truthy description raises",
            json!([function("dn", props(json!({"x": {"type": "string", "description": 5}})))]),
            false,
        ),
        ("tools as a dict raise", json!({"type": "function", "function": {"name": "f"}}), false),
        ("an empty tools list: nothing computed", json!([]), false),
        ("a tool that is not a dict raises", json!(["get_weather"]), false),
        // Where Python's output is not reproduced: refused, never rendered differently.
        (
            "a non-ASCII string in a listed enum value",
            json!([function("r", props(json!({"x": {"enum": [["é"]]}})))]),
            true,
        ),
        (
            "a float beyond 2^63 (a Python int or float?)",
            json!([function("b", props(json!({"x": {"type": "number", "maximum": 1e20}})))]),
            true,
        ),
        ("a non-string scalar type", json!([function("t", props(json!({"x": {"type": 5}})))]), true),
    ]
}

/// A small deterministic generator (64-bit LCG) of tool lists mixing every feature the
/// reference reads, valid and not, for the differential check below.
struct Gen(u64);

impl Gen {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.next(items.len())]
    }

    fn scalar(&mut self) -> Value {
        match self.next(8) {
            0 => json!(null),
            1 => json!(self.next(2) == 1),
            2 => json!(self.next(100) as i64 - 50),
            3 => json!([0.5, 1e-6, 2.0, -3.25, 1e15][self.next(5)]),
            4 => json!(["a", "Ünï", "q\"t", "x'y", "", "line\nbreak"][self.next(6)]),
            5 => json!([1, "b"]),
            6 => json!({"k": [true, null]}),
            _ => json!("s"),
        }
    }

    fn description(&mut self) -> Option<Value> {
        match self.next(10) {
            0..=4 => None,
            5 => Some(json!("One line")),
            6 => Some(json!("Two\nlines\n\nand a gap")),
            7 => Some(json!("")),
            8 => Some(json!(0)),
            _ => Some(json!(if self.next(6) == 0 { json!(7) } else { json!("Described 说明") })),
        }
    }

    fn schema(&mut self, depth: usize, defs: &[String]) -> Value {
        let kind = if depth == 0 { self.next(6) } else { self.next(12) };
        let mut s = match kind {
            0 => json!({"type": self.pick(&["string", "integer", "number", "boolean", "null", "file"])}),
            1 => json!({"type": "string", "maxLength": self.next(50), "pattern": "^[a-z]+$"}),
            2 => json!({"type": self.pick(&["integer", "number"]), "minimum": self.next(5), "maximum": 9.5}),
            3 => {
                let values: Vec<Value> = (0..1 + self.next(3)).map(|_| self.scalar()).collect();
                match self.next(4) {
                    0 => json!({"enum": values}),
                    1 => json!({"enum": values, "type": self.pick(&["string", "integer", "number", "boolean"])}),
                    2 => json!({"enum": values, "type": [self.pick(&["string", "number"]), "null"]}),
                    _ => json!({"enum": ["x", "y"], "type": "string"}),
                }
            }
            4 => json!({"type": (0..1 + self.next(3)).map(|_| self.pick(&["string", "integer", "null", "object",
                "array", "boolean", "number", "date"])).collect::<Vec<_>>()}),
            5 => match self.next(4) {
                0 => json!({}),
                1 => json!(true),
                2 => json!(false),
                _ => json!({"description": "no type"}),
            },
            6 | 7 => self.object(depth - 1, defs),
            8 | 9 => {
                let mut a = json!({"type": "array"});
                if self.next(4) > 0 {
                    a["items"] = self.schema(depth - 1, defs);
                }
                if self.next(3) == 0 {
                    a["minItems"] = json!(1);
                }
                a
            }
            10 => json!({"anyOf": (0..1 + self.next(3)).map(|_| self.schema(depth - 1, defs)).collect::<Vec<_>>()}),
            _ => match self.next(4) {
                0 => json!({"$ref": "#"}),
                1 => json!({"$ref": "#/$defs/Missing"}),
                _ if !defs.is_empty() => json!({"$ref": format!("#/$defs/{}", defs[self.next(defs.len())])}),
                _ => json!({"$ref": "#/definitions/X"}),
            },
        };
        if let Value::Object(m) = &mut s {
            if let Some(d) = self.description() {
                m.insert("description".into(), d);
            }
            if self.next(5) == 0 {
                m.insert("default".into(), self.scalar());
            }
        }
        s
    }

    fn object(&mut self, depth: usize, defs: &[String]) -> Value {
        let names = ["id", "name", "a", "b", "Zeta", "count", "über", "x_y"];
        let n = self.next(5);
        let mut props = serde_json::Map::new();
        for _ in 0..n {
            let name = self.pick(&names).to_owned();
            props.insert(name, self.schema(depth, defs));
        }
        let mut o = json!({"type": "object", "properties": props});
        let keys: Vec<String> = o["properties"].as_object().unwrap().keys().cloned().collect();
        match self.next(4) {
            0 => {}
            1 => o["required"] = json!(keys.iter().filter(|_| self.next(2) == 0).collect::<Vec<_>>()),
            2 => o["required"] = json!(keys),
            _ => o["required"] = json!(["missing"]),
        }
        match self.next(6) {
            0 => o["additionalProperties"] = json!(false),
            1 => o["additionalProperties"] = json!(true),
            2 if depth > 0 => o["additionalProperties"] = self.schema(depth - 1, defs),
            _ => {}
        }
        o
    }

    fn tools(&mut self) -> Value {
        let mut tools = Vec::new();
        for i in 0..1 + self.next(3) {
            let defs: Vec<String> = (0..self.next(3)).map(|j| format!("D{j}")).collect();
            let mut params = self.object(2, &defs);
            if !defs.is_empty() {
                let bodies: serde_json::Map<String, Value> =
                    defs.iter().map(|d| (d.clone(), self.schema(1, &defs[..0]))).collect();
                params["$defs"] = Value::Object(bodies);
            }
            let mut f = json!({"name": format!("fn_{i}"), "parameters": params});
            if let Some(d) = self.description() {
                f["description"] = d;
            }
            tools.push(match self.next(12) {
                0 => json!({"type": "_plugin", "_plugin": f}),
                _ => json!({"type": "function", "function": f}),
            });
        }
        Value::Array(tools)
    }
}

/// Run the reference on `tools`: one answer per list.
fn reference(py: &std::path::Path, tools: &[&Value]) -> Vec<Value> {
    let want = json_script(py, "kimi_tools_ts_reference.py", tools, Some("tinker-cookbook==0.6.1, --no-deps"));
    assert_eq!(want.len(), tools.len());
    want
}

#[test]
fn kimi_tools_ts_equals_the_reference_on_generated_tool_lists() {
    let what = "the Kimi-K2.5 TypeScript tool declaration check on generated lists";
    let Some(py) = python(what) else { return };
    let mut g = Gen(14);
    let lists: Vec<Value> = (0..1000).map(|_| g.tools()).collect();
    let want = reference(&py, &lists.iter().collect::<Vec<_>>());
    let (mut rendered, mut raised, mut refused) = (0, 0, 0);
    for (i, (tools, want)) in lists.iter().zip(&want).enumerate() {
        let got = match kimi_tools_ts_str(tools) {
            Ok(got) => got,
            Err(e) => {
                // Only what the port is documented to refuse: Python's repr of non-ASCII text.
                assert!(e.0.contains("repr of the string"), "list {i}: refused ({e}); reference: {want}\n{tools}");
                refused += 1;
                continue;
            }
        };
        match want.get("ts") {
            Some(Value::String(ts)) => {
                assert_eq!(got.as_deref(), Some(ts.as_str()), "list {i}: {tools}");
                rendered += 1;
            }
            _ => {
                assert_eq!(got, None, "list {i}: the reference gives {want}; {tools}");
                raised += 1;
            }
        }
    }
    eprintln!("generated: {rendered} rendered, {raised} raised, {refused} refused; all equal to the reference");
    assert!(rendered >= 250 && raised >= 100, "the generator must exercise both paths");
}

#[test]
fn kimi_tools_ts_equals_the_reference_module() {
    let what = "the Kimi-K2.5 TypeScript tool declaration check";
    let Some(py) = python(what) else { return };
    let cases = cases();
    let want = reference(&py, &cases.iter().map(|c| &c.1).collect::<Vec<_>>());
    let (mut rendered, mut raised, mut refused) = (0, 0, 0);
    for ((what, tools, refuse), want) in cases.iter().zip(&want) {
        let got = kimi_tools_ts_str(tools);
        if *refuse {
            assert!(got.is_err(), "{what}: aerie should refuse it, got {got:?} (reference: {want})");
            refused += 1;
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{what}: unsupported ({e}); reference: {want}"));
        match (want.get("ts"), want.get("raised")) {
            (Some(Value::String(ts)), _) => {
                assert_eq!(got.as_deref(), Some(ts.as_str()), "{what}");
                rendered += usize::from(!ts.is_empty());
            }
            (Some(Value::Null), _) => assert_eq!(got, None, "{what}: the reference computes nothing"),
            (_, Some(message)) => {
                assert_eq!(got, None, "{what}: the reference raised {message}, so no tools_ts_str");
                raised += 1;
            }
            _ => panic!("{what}: unexpected reference answer {want}"),
        }
    }
    eprintln!("{rendered} rendered, {raised} raised (JSON fallback), {refused} refused: equal to the reference");
    assert!(rendered >= 15 && raised >= 8, "the cases must exercise both paths");
}

//! Small adapters over arrow arrays: the string and list encodings a column may come in
//! (`Utf8`/`LargeUtf8`/`Utf8View`, `List`/`LargeList`), read uniformly.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, GenericListArray, OffsetSizeTrait};
use arrow_schema::DataType;

/// A string column in any of arrow's encodings.
pub(crate) enum StrColumn<'a> {
    Utf8(&'a arrow_array::StringArray),
    Large(&'a arrow_array::LargeStringArray),
    View(&'a arrow_array::StringViewArray),
}

impl<'a> StrColumn<'a> {
    /// `None` when `array` is not a string column.
    pub(crate) fn new(array: &'a dyn Array) -> Option<Self> {
        Some(match array.data_type() {
            DataType::Utf8 => StrColumn::Utf8(array.as_string::<i32>()),
            DataType::LargeUtf8 => StrColumn::Large(array.as_string::<i64>()),
            DataType::Utf8View => StrColumn::View(array.as_string_view()),
            _ => return None,
        })
    }

    /// Row `i`, `None` when null.
    pub(crate) fn get(&self, i: usize) -> Option<&'a str> {
        match self {
            StrColumn::Utf8(a) => a.is_valid(i).then(|| a.value(i)),
            StrColumn::Large(a) => a.is_valid(i).then(|| a.value(i)),
            StrColumn::View(a) => a.is_valid(i).then(|| a.value(i)),
        }
    }
}

/// An id column: strings or integers, read as text.
pub(crate) fn id_at(array: &dyn Array, i: usize) -> Option<String> {
    if !array.is_valid(i) {
        return None;
    }
    if let Some(s) = StrColumn::new(array) {
        return s.get(i).map(str::to_owned);
    }
    Some(match array.data_type() {
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(i).to_string(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(i).to_string(),
        _ => return None,
    })
}

/// A list column in either offset width: the child values and each row's range in them.
pub(crate) enum ListColumn<'a> {
    Small(&'a GenericListArray<i32>),
    Large(&'a GenericListArray<i64>),
}

impl<'a> ListColumn<'a> {
    /// `None` when `array` is not a list column.
    pub(crate) fn new(array: &'a dyn Array) -> Option<Self> {
        Some(match array.data_type() {
            DataType::List(_) => ListColumn::Small(array.as_list::<i32>()),
            DataType::LargeList(_) => ListColumn::Large(array.as_list::<i64>()),
            _ => return None,
        })
    }

    /// The concatenated child values.
    pub(crate) fn values(&self) -> &'a ArrayRef {
        match self {
            ListColumn::Small(a) => a.values(),
            ListColumn::Large(a) => a.values(),
        }
    }

    /// The child range of row `i` (empty when null).
    pub(crate) fn range(&self, i: usize) -> std::ops::Range<usize> {
        fn r<O: OffsetSizeTrait>(a: &GenericListArray<O>, i: usize) -> std::ops::Range<usize> {
            if a.is_null(i) {
                return 0..0;
            }
            let o = a.value_offsets();
            o[i].as_usize()..o[i + 1].as_usize()
        }
        match self {
            ListColumn::Small(a) => r(a, i),
            ListColumn::Large(a) => r(a, i),
        }
    }
}

/// Row `i` of `array` as JSON, for nested columns holding JSON-like data (tool calls, tool
/// schemas): lists as arrays, structs as objects, strings, numbers, booleans and nulls.
///
/// A struct's null fields are left out: an Arrow struct column has every field of its schema in
/// every row (writers such as pyarrow and HF `datasets` take the union of the keys of all rows),
/// so a null there almost always stands for a key the row's original object did not have. Keys
/// come in the column's field order. `Float32`/`Float16` values are read as their shortest
/// decimal form (0.1f32 is 0.1, not 0.10000000149011612). Other types (binary, dates,
/// decimals, maps, dictionaries) are an error naming the type.
pub(crate) fn json_at(array: &dyn Array, i: usize) -> Result<serde_json::Value, String> {
    use arrow_array::types::{Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, UInt8Type, UInt16Type};
    use serde_json::Value;
    if matches!(array.data_type(), DataType::Null) || array.is_null(i) {
        return Ok(Value::Null);
    }
    let float =
        |x: f64| serde_json::Number::from_f64(x).map(Value::Number).ok_or_else(|| format!("the float {x} is not JSON"));
    Ok(match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(i)),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(i).into(),
        DataType::Float16 => {
            float(array.as_primitive::<Float16Type>().value(i).to_f32().to_string().parse().expect("a float"))?
        }
        DataType::Float32 => float(array.as_primitive::<Float32Type>().value(i).to_string().parse().expect("a float"))?,
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(i))?,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Value::String(StrColumn::new(array).and_then(|s| s.get(i)).unwrap_or_default().to_owned())
        }
        DataType::List(_) | DataType::LargeList(_) => {
            let list = ListColumn::new(array).expect("a list type");
            let values = list.values();
            list.range(i).map(|j| json_at(values.as_ref(), j)).collect::<Result<Vec<_>, _>>()?.into()
        }
        DataType::FixedSizeList(_, _) => {
            let item = array.as_fixed_size_list().value(i);
            (0..item.len()).map(|j| json_at(item.as_ref(), j)).collect::<Result<Vec<_>, _>>()?.into()
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut object = serde_json::Map::new();
            for (field, column) in fields.iter().zip(s.columns()) {
                let v = json_at(column.as_ref(), i)?;
                if !v.is_null() {
                    object.insert(field.name().clone(), v);
                }
            }
            Value::Object(object)
        }
        other => return Err(format!("a value of arrow type {other}, which aerie does not read as JSON")),
    })
}

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

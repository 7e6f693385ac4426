//! JSON objects on one line, as the tools' `--json` rows print them: field order kept,
//! strings escaped, numbers that JSON cannot hold (NaN, infinities) written as `null`.

use std::fmt::Write;

/// A JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i128),
    /// A number with this many decimals.
    Fixed(f64, usize),
    /// A number with 6 significant digits (rates that may be tiny).
    Sig(f64),
    Bool(bool),
    Null,
    /// Already JSON (an array or object built with this module).
    Raw(String),
}

impl Value {
    /// The value as JSON text.
    pub fn to_json(&self) -> String {
        let mut o = String::new();
        self.write(&mut o);
        o
    }
    fn write(&self, o: &mut String) {
        let finite = |x: f64| x.is_finite();
        match self {
            Value::Str(s) => {
                o.push('"');
                escape(s, o);
                o.push('"');
            }
            Value::Int(i) => {
                let _ = write!(o, "{i}");
            }
            Value::Fixed(x, d) if finite(*x) => {
                let _ = write!(o, "{x:.d$}");
            }
            Value::Sig(x) if finite(*x) => {
                let v: f64 = format!("{x:.5e}").parse().unwrap_or(*x);
                let _ = write!(o, "{v}");
            }
            Value::Bool(b) => {
                let _ = write!(o, "{b}");
            }
            Value::Raw(r) => o.push_str(r),
            Value::Fixed(..) | Value::Sig(_) | Value::Null => o.push_str("null"),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
macro_rules! from_int {
    ($($t:ty),*) => {$(impl From<$t> for Value {
        fn from(i: $t) -> Self {
            Value::Int(i as i128)
        }
    })*};
}
from_int!(u8, u16, u32, u64, usize, i32, i64);
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// An object under construction.
#[derive(Clone, Debug, Default)]
pub struct Object(Vec<(String, Value)>);

impl Object {
    pub fn new() -> Object {
        Object::default()
    }
    /// Adds a field.
    pub fn set(mut self, key: &str, v: impl Into<Value>) -> Object {
        self.0.push((key.to_string(), v.into()));
        self
    }
    /// Adds every field of `other`.
    pub fn extend(mut self, other: &Object) -> Object {
        self.0.extend(other.0.iter().cloned());
        self
    }
    /// The fields, in order.
    pub fn fields(&self) -> &[(String, Value)] {
        &self.0
    }
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut o = String::from("{");
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            o.push('"');
            escape(k, &mut o);
            o.push_str("\":");
            v.write(&mut o);
        }
        o.push('}');
        f.write_str(&o)
    }
}

impl From<Object> for Value {
    fn from(o: Object) -> Self {
        Value::Raw(o.to_string())
    }
}

/// A JSON array of `items`.
pub fn array(items: impl IntoIterator<Item = impl Into<Value>>) -> Value {
    let mut o = String::from("[");
    for (i, v) in items.into_iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        v.into().write(&mut o);
    }
    o.push(']');
    Value::Raw(o)
}

fn escape(s: &str, o: &mut String) {
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_escape_strings_and_null_what_json_cannot_hold() {
        let o = Object::new()
            .set("name", "a \"b\"\n")
            .set("n", 3u32)
            .set("x", Value::Fixed(1.23456, 3))
            .set("bad", Value::Fixed(f64::NAN, 3))
            .set("tiny", Value::Sig(1.234567e-9))
            .set("none", None::<u32>)
            .set("list", array(["a", "b"]));
        assert_eq!(
            o.to_string(),
            r#"{"name":"a \"b\"\n","n":3,"x":1.235,"bad":null,"tiny":0.00000000123457,"none":null,"list":["a","b"]}"#
        );
    }
}

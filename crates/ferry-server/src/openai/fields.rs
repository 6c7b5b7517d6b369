//! [`Fields`]: reads a JSON object field by field, so every type error names its field (`param`)
//! and every field left over is reported as unsupported or unknown instead of being ignored.
//!
//! A field whose value is `null` counts as absent everywhere (OpenAI's SDKs send `null` for
//! "not given"). Where an integer is expected, an integral float (`2.0`, as JavaScript clients
//! and some SDKs write numbers) is that integer; `2.5` stays a type error.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object being consumed field by field.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
    prefix: String,
}

impl Fields {
    /// Wraps an object; `prefix` is prepended to field names in `param` (e.g. `"messages[0]."`).
    pub fn new(map: Map<String, Value>, prefix: impl Into<String>) -> Self {
        Self {
            map,
            prefix: prefix.into(),
        }
    }

    /// Wraps a value that must be an object (`param` names it when it is not).
    pub fn from_value(value: Value, param: &str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self::new(map, format!("{param}."))),
            other => Err(ApiError::invalid_type(param, "an object", &other)),
        }
    }

    /// The full `param` name of a field.
    pub fn param(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    /// Rejects any field not in `known` before anything is read: `unsupported` names OpenAI
    /// fields this server does not implement (reported as such), anything else is unknown.
    /// Fields set to `null` pass.
    pub fn reject_others(&self, known: &[&str], unsupported: &[&str]) -> Result<(), ApiError> {
        for (key, value) in &self.map {
            if known.contains(&key.as_str()) || value.is_null() {
                continue;
            }
            let param = self.param(key);
            return Err(if unsupported.contains(&key.as_str()) {
                ApiError::unsupported_parameter(&param)
            } else {
                ApiError::unknown_parameter(&param)
            });
        }
        Ok(())
    }

    /// Removes a field and returns its raw value; `None` when absent or null.
    pub fn take_raw(&mut self, name: &str) -> Option<Value> {
        self.map.remove(name).filter(|v| !v.is_null())
    }

    /// Removes a field and converts it; absent or null is `None`, a wrong type a 400 naming the
    /// field (`expected` describes the type in the message, e.g. "a number").
    pub fn optional<T: DeserializeOwned>(
        &mut self,
        name: &str,
        expected: &str,
    ) -> Result<Option<T>, ApiError> {
        match self.take_raw(name) {
            None => Ok(None),
            Some(value) => convert(value, &self.param(name), expected).map(Some),
        }
    }

    /// Like [`Fields::optional`], but absent or null is a 400 `missing_required_parameter`.
    pub fn required<T: DeserializeOwned>(
        &mut self,
        name: &str,
        expected: &str,
    ) -> Result<T, ApiError> {
        let param = self.param(name);
        self.optional(name, expected)?
            .ok_or_else(|| ApiError::missing(&param))
    }

    /// A field that is accepted only with one value (e.g. `n` must be 1): any other value is a
    /// 400 `unsupported_value` naming the field.
    pub fn only<T>(&mut self, name: &str, expected: &str, allowed: T) -> Result<(), ApiError>
    where
        T: DeserializeOwned + PartialEq + std::fmt::Display,
    {
        match self.optional::<T>(name, expected)? {
            Some(v) if v != allowed => Err(ApiError::unsupported_value(
                &self.param(name),
                format!(
                    "`{}` = {v} is not supported by this server; only {allowed} is.",
                    self.param(name)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Converts a JSON value, naming `param` on a type error. A value that only fails because it
/// holds integral floats where integers are expected is converted with them as integers.
pub fn convert<T: DeserializeOwned>(
    value: Value,
    param: &str,
    expected: &str,
) -> Result<T, ApiError> {
    match serde_json::from_value::<T>(value.clone()) {
        Ok(v) => Ok(v),
        Err(_) => integral(&value)
            .and_then(|ints| serde_json::from_value::<T>(ints).ok())
            .ok_or_else(|| ApiError::invalid_type(param, expected, &value)),
    }
}

/// `value` with every integral float (in arrays and objects too) written as an integer; `None`
/// when it holds none.
pub fn integral(value: &Value) -> Option<Value> {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64()?;
            // Every integral f64 of magnitude below 2^63 fits an i64.
            let fits = f.fract() == 0.0 && f.abs() < 2f64.powi(63);
            fits.then(|| Value::from(f as i64))
        }
        Value::Array(items) => {
            let converted: Vec<Option<Value>> = items.iter().map(integral).collect();
            converted.iter().any(Option::is_some).then(|| {
                Value::Array(
                    converted
                        .into_iter()
                        .zip(items)
                        .map(|(c, v)| c.unwrap_or_else(|| v.clone()))
                        .collect(),
                )
            })
        }
        Value::Object(map) => {
            let mut changed = false;
            let out = map
                .iter()
                .map(|(k, v)| {
                    let c = integral(v);
                    changed |= c.is_some();
                    (k.clone(), c.unwrap_or_else(|| v.clone()))
                })
                .collect();
            changed.then_some(Value::Object(out))
        }
        _ => None,
    }
}

/// An integer JSON value, or an integral float, as `i64`.
pub fn as_integer(value: &Value) -> Option<i64> {
    value
        .as_i64()
        .or_else(|| integral(value).and_then(|v| v.as_i64()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Fields {
        Fields::from_value(v, "x")
            .map(|f| Fields::new(f.map, ""))
            .unwrap()
    }

    #[test]
    fn reads_and_rejects() {
        let mut f = fields(json!({"a": 1, "b": null, "c": "s", "tools": []}));
        assert_eq!(f.optional::<i64>("a", "an integer").unwrap(), Some(1));
        assert_eq!(f.optional::<i64>("b", "an integer").unwrap(), None);
        let err = f.optional::<i64>("c", "an integer").unwrap_err();
        assert_eq!((err.param(), err.code()), (Some("c"), Some("invalid_type")));
        let err = f.required::<i64>("d", "an integer").unwrap_err();
        assert_eq!(err.code(), Some("missing_required_parameter"));
        let err = f.reject_others(&[], &["tools"]).unwrap_err();
        assert_eq!(err.code(), Some("unsupported_parameter"));
    }

    #[test]
    fn integral_floats_are_integers() {
        let mut f = fields(json!({"a": 2.0, "b": 2.5, "c": [1.0, 2], "d": -3.0, "e": 1e300}));
        assert_eq!(f.optional::<i64>("a", "an integer").unwrap(), Some(2));
        let err = f.optional::<i64>("b", "an integer").unwrap_err();
        assert_eq!(err.code(), Some("invalid_type"));
        assert_eq!(
            f.optional::<Vec<u32>>("c", "ids").unwrap(),
            Some(vec![1, 2])
        );
        assert_eq!(f.optional::<i64>("d", "an integer").unwrap(), Some(-3));
        assert!(f.optional::<i64>("e", "an integer").is_err());
        assert_eq!(as_integer(&json!(7.0)), Some(7));
        assert_eq!(as_integer(&json!(7.5)), None);
        // Floats stay floats where floats are expected.
        let mut f = fields(json!({"t": 1.0}));
        assert_eq!(f.optional::<f64>("t", "a number").unwrap(), Some(1.0));
    }

    #[test]
    fn only_one_value() {
        let mut f = fields(json!({"n": 1, "m": 2}));
        assert!(f.only("n", "an integer", 1i64).is_ok());
        let err = f.only("m", "an integer", 1i64).unwrap_err();
        assert_eq!(
            (err.param(), err.code()),
            (Some("m"), Some("unsupported_value"))
        );
        let f = fields(json!({"zzz": 1}));
        assert_eq!(
            f.reject_others(&["a"], &[]).unwrap_err().code(),
            Some("unknown_parameter")
        );
    }
}

//! Per-model sampling defaults: what a request that names no `temperature`, `top_p`, `top_k`,
//! `min_p` or `repetition_penalty` samples with, and `ferry generate` too.
//!
//! Each value comes from the first of: the setting (`--temperature`, `FERRY_TEMPERATURE`,
//! `models[].sampling.temperature`), the model's own recommendation (its
//! `generation_config.json`, or a GGUF's `general.sampling.*` keys, read by the model layer into
//! a [`SamplingSettings`] too), and [`FALLBACK`], llama.cpp's server defaults. [`resolve`] does
//! the merge and says where each value came from, for the load log. A request's own fields
//! override all three.

use std::fmt;
use std::marker::PhantomData;

use super::values::{Codec, Shown};

/// Sampling values that may each be unset: the settings of one model, or what its files
/// recommend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingSettings {
    /// Softmax temperature in [0, 2]; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1]; 1 is off.
    pub top_p: Option<f32>,
    /// The k most likely tokens; 0 is off.
    pub top_k: Option<usize>,
    /// Minimum probability relative to the top token, in [0, 1]; 0 is off.
    pub min_p: Option<f32>,
    /// Repetition penalty over prompt and output (> 0); 1 is off.
    pub repetition_penalty: Option<f32>,
}

/// Sampling values, every one set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingValues {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass; 1 is off.
    pub top_p: f32,
    /// The k most likely tokens; 0 is off.
    pub top_k: usize,
    /// Minimum relative probability; 0 is off.
    pub min_p: f32,
    /// Repetition penalty; 1 is off.
    pub repetition_penalty: f32,
}

/// What a value falls back to when neither the setting nor the model gives it: llama.cpp's
/// server defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no repetition penalty).
pub const FALLBACK: SamplingValues = SamplingValues {
    temperature: 0.8,
    top_p: 0.95,
    top_k: 40,
    min_p: 0.05,
    repetition_penalty: 1.0,
};

/// Where one resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplingOrigin {
    /// The model's setting (flag, variable or config file).
    Setting,
    /// The model's own files.
    Model,
    /// [`FALLBACK`].
    Fallback,
}

impl fmt::Display for SamplingOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SamplingOrigin::Setting => "setting",
            SamplingOrigin::Model => "model",
            SamplingOrigin::Fallback => "llama.cpp default",
        })
    }
}

/// The values a model samples with, and the origin of each (in field order: temperature, top_p,
/// top_k, min_p, repetition_penalty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResolvedSampling {
    /// The values.
    pub values: SamplingValues,
    /// Where each came from.
    pub origins: [SamplingOrigin; 5],
}

impl ResolvedSampling {
    /// One line for the load log: `temperature=0.8 (llama.cpp default), top_p=0.9 (model), ...`.
    pub fn describe(&self) -> String {
        let v = &self.values;
        let o = &self.origins;
        format!(
            "temperature={} ({}), top_p={} ({}), top_k={} ({}), min_p={} ({}), \
             repetition_penalty={} ({})",
            v.temperature,
            o[0],
            v.top_p,
            o[1],
            v.top_k,
            o[2],
            v.min_p,
            o[3],
            v.repetition_penalty,
            o[4]
        )
    }
}

/// Merges a model's settings over what its files recommend over [`FALLBACK`].
pub fn resolve(setting: &SamplingSettings, model: &SamplingSettings) -> ResolvedSampling {
    fn pick<T: Copy>(setting: Option<T>, model: Option<T>, fallback: T) -> (T, SamplingOrigin) {
        match (setting, model) {
            (Some(v), _) => (v, SamplingOrigin::Setting),
            (None, Some(v)) => (v, SamplingOrigin::Model),
            (None, None) => (fallback, SamplingOrigin::Fallback),
        }
    }
    let f = FALLBACK;
    let temperature = pick(setting.temperature, model.temperature, f.temperature);
    let top_p = pick(setting.top_p, model.top_p, f.top_p);
    let top_k = pick(setting.top_k, model.top_k, f.top_k);
    let min_p = pick(setting.min_p, model.min_p, f.min_p);
    let repetition_penalty = pick(
        setting.repetition_penalty,
        model.repetition_penalty,
        f.repetition_penalty,
    );
    ResolvedSampling {
        values: SamplingValues {
            temperature: temperature.0,
            top_p: top_p.0,
            top_k: top_k.0,
            min_p: min_p.0,
            repetition_penalty: repetition_penalty.0,
        },
        origins: [
            temperature.1,
            top_p.1,
            top_k.1,
            min_p.1,
            repetition_penalty.1,
        ],
    }
}

impl SamplingSettings {
    /// `self` with the values a model's files recommend dropped where they are out of range
    /// (a file's stray value falls back instead of failing every request); returns the names
    /// of the dropped ones.
    pub fn keep_valid(&mut self) -> Vec<&'static str> {
        let mut dropped = Vec::new();
        let mut check = |value: &mut Option<f32>, ok: fn(f64) -> bool, name| {
            if value.is_some_and(|v| !(v.is_finite() && ok(f64::from(v)))) {
                *value = None;
                dropped.push(name);
            }
        };
        check(&mut self.temperature, Temperature::ok, "temperature");
        check(&mut self.top_p, Nucleus::ok, "top_p");
        check(&mut self.min_p, Fraction::ok, "min_p");
        check(
            &mut self.repetition_penalty,
            Penalty::ok,
            "repetition_penalty",
        );
        dropped
    }
}

/// The range one sampling value must lie in.
pub trait Range {
    /// The rule, for the error message ("between 0 and 2").
    const RULE: &'static str;
    /// Whether `value` (finite) is in range (the request's and the setting's rule alike).
    fn ok(value: f64) -> bool;
}

/// `temperature`: [0, 2], as the OpenAI API takes it.
pub struct Temperature;
impl Range for Temperature {
    const RULE: &'static str = "between 0 and 2";
    fn ok(value: f64) -> bool {
        (0.0..=2.0).contains(&value)
    }
}

/// `top_p`: (0, 1].
pub struct Nucleus;
impl Range for Nucleus {
    const RULE: &'static str = "greater than 0 and at most 1";
    fn ok(value: f64) -> bool {
        value > 0.0 && value <= 1.0
    }
}

/// `min_p`: [0, 1].
pub struct Fraction;
impl Range for Fraction {
    const RULE: &'static str = "between 0 and 1";
    fn ok(value: f64) -> bool {
        (0.0..=1.0).contains(&value)
    }
}

/// `repetition_penalty`: greater than 0.
pub struct Penalty;
impl Range for Penalty {
    const RULE: &'static str = "greater than 0";
    fn ok(value: f64) -> bool {
        value > 0.0
    }
}

/// An optional sampling value in the range `R`; unset (the empty string) by default.
pub struct OptionalSampling<R>(PhantomData<R>);
impl<R: Range> Codec for OptionalSampling<R> {
    type Value = Option<f32>;
    fn parse(text: &str) -> Result<Option<f32>, String> {
        if text.trim().is_empty() {
            return Ok(None);
        }
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a number"))?;
        if !(value.is_finite() && R::ok(value)) {
            return Err(format!("`{text}` must be {}", R::RULE));
        }
        Ok(Some(value as f32))
    }
    fn show(value: &Option<f32>) -> Shown {
        value.map_or(Shown::Unset, |v| Shown::Text(v.to_string()))
    }
}

/// An optional count, 0 allowed (`top_k`: 0 is off); unset (the empty string) by default.
pub struct OptionalCount;
impl Codec for OptionalCount {
    type Value = Option<usize>;
    fn parse(text: &str) -> Result<Option<usize>, String> {
        if text.trim().is_empty() {
            return Ok(None);
        }
        text.trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("`{text}` is not a whole number (0 is off)"))
    }
    fn show(value: &Option<usize>) -> Shown {
        value.map_or(Shown::Unset, |v| Shown::Number(v as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_beats_the_model_which_beats_the_fallback() {
        let setting = SamplingSettings {
            temperature: Some(0.3),
            ..Default::default()
        };
        let model = SamplingSettings {
            temperature: Some(0.6),
            top_p: Some(0.9),
            ..Default::default()
        };
        let resolved = resolve(&setting, &model);
        assert_eq!(resolved.values.temperature, 0.3);
        assert_eq!(resolved.values.top_p, 0.9);
        assert_eq!(resolved.values.top_k, FALLBACK.top_k);
        assert_eq!(
            resolved.origins,
            [
                SamplingOrigin::Setting,
                SamplingOrigin::Model,
                SamplingOrigin::Fallback,
                SamplingOrigin::Fallback,
                SamplingOrigin::Fallback
            ]
        );
        assert!(resolved
            .describe()
            .starts_with("temperature=0.3 (setting), top_p=0.9 (model), top_k=40 (llama.cpp"));
    }

    #[test]
    fn values_out_of_range_are_refused_or_dropped() {
        type T = OptionalSampling<Temperature>;
        assert_eq!(T::parse("0.7"), Ok(Some(0.7)));
        assert_eq!(T::parse(""), Ok(None));
        assert!(T::parse("2.5").unwrap_err().contains("between 0 and 2"));
        assert!(OptionalSampling::<Nucleus>::parse("0").is_err());
        assert!(OptionalSampling::<Penalty>::parse("NaN").is_err());
        assert_eq!(OptionalCount::parse("0"), Ok(Some(0)));
        assert!(OptionalCount::parse("-1").is_err());
        let mut stray = SamplingSettings {
            temperature: Some(7.0),
            top_p: Some(0.9),
            min_p: Some(f32::NAN),
            ..Default::default()
        };
        assert_eq!(stray.keep_valid(), vec!["temperature", "min_p"]);
        assert_eq!(stray.top_p, Some(0.9));
        assert_eq!(stray.temperature, None);
    }
}

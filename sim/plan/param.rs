//! Plan parameters that are either fixed or drawn from the seed, and the typed reader for the free
//! `params` tables of faults.
//!
//! Owns: turning a TOML value (`5000`, `[1000, 8000]`, `"XREADGROUP"`) into one drawn value. Every
//! draw goes through the single plan RNG, in a fixed order, so one plan + one seed gives the same
//! run on every machine. Never draws from anything but the RNG it is handed.

use std::collections::BTreeSet;

use rand::distributions::uniform::SampleUniform;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::Deserialize;

use super::PlanError;

/// A number that is either fixed (`5`) or drawn uniformly from an inclusive range (`[2, 8]`).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Param<T> {
    Fixed(T),
    Range([T; 2]),
}

impl<T: SampleUniform + PartialOrd + Copy + std::fmt::Debug> Param<T> {
    /// The value for this run. A range with `lo > hi` is a plan error.
    pub fn draw(&self, rng: &mut SmallRng, name: &str) -> Result<T, PlanError> {
        match *self {
            Param::Fixed(value) => Ok(value),
            Param::Range([lo, hi]) if lo <= hi => Ok(rng.gen_range(lo..=hi)),
            Param::Range([lo, hi]) => Err(PlanError::Invalid(format!("{name}: range [{lo:?}, {hi:?}] is empty"))),
        }
    }
}

/// Reads the `params` table of one fault: every key must be consumed (unknown keys are errors, so a
/// typo never silently becomes a default).
pub struct Params<'a> {
    what: String,
    table: &'a toml::Table,
    used: BTreeSet<String>,
}

impl<'a> Params<'a> {
    pub fn new(what: impl Into<String>, table: &'a toml::Table) -> Self {
        Self { what: what.into(), table, used: BTreeSet::new() }
    }

    fn error(&self, name: &str, message: &str) -> PlanError {
        PlanError::Invalid(format!("{}: param `{name}` {message}", self.what))
    }

    fn value(&mut self, name: &str) -> Option<&'a toml::Value> {
        self.used.insert(name.to_string());
        self.table.get(name)
    }

    /// An integer parameter (`n` or `[lo, hi]`), or `default` when absent (`None`: required).
    pub fn u64(&mut self, name: &str, default: Option<Param<u64>>, rng: &mut SmallRng) -> Result<u64, PlanError> {
        let param = match self.value(name) {
            None => default.ok_or_else(|| self.error(name, "is required"))?,
            Some(value) => parse_u64(value).ok_or_else(|| self.error(name, "must be an integer or [lo, hi]"))?,
        };
        param.draw(rng, &format!("{}.{name}", self.what))
    }

    /// A float parameter (`x` or `[lo, hi]`), or `default` when absent.
    pub fn f64(&mut self, name: &str, default: Option<Param<f64>>, rng: &mut SmallRng) -> Result<f64, PlanError> {
        let param = match self.value(name) {
            None => default.ok_or_else(|| self.error(name, "is required"))?,
            Some(value) => parse_f64(value).ok_or_else(|| self.error(name, "must be a number or [lo, hi]"))?,
        };
        param.draw(rng, &format!("{}.{name}", self.what))
    }

    /// A string parameter; a list of strings means "draw one of them".
    pub fn string(&mut self, name: &str, default: Option<&str>, rng: &mut SmallRng) -> Result<String, PlanError> {
        match self.value(name) {
            None => default.map(str::to_string).ok_or_else(|| self.error(name, "is required")),
            Some(toml::Value::String(s)) => Ok(s.clone()),
            Some(toml::Value::Array(items)) if !items.is_empty() => {
                let i = rng.gen_range(0..items.len());
                items[i].as_str().map(str::to_string).ok_or_else(|| self.error(name, "must be a string or strings"))
            }
            Some(_) => Err(self.error(name, "must be a string or a list of strings")),
        }
    }

    /// Fails on keys no reader asked for.
    pub fn finish(self) -> Result<(), PlanError> {
        match self.table.keys().find(|k| !self.used.contains(k.as_str())) {
            Some(key) => Err(PlanError::Invalid(format!("{}: unknown param `{key}`", self.what))),
            None => Ok(()),
        }
    }
}

fn parse_u64(value: &toml::Value) -> Option<Param<u64>> {
    let int = |v: &toml::Value| v.as_integer().and_then(|i| u64::try_from(i).ok());
    match value {
        toml::Value::Array(items) if items.len() == 2 => Some(Param::Range([int(&items[0])?, int(&items[1])?])),
        other => int(other).map(Param::Fixed),
    }
}

fn parse_f64(value: &toml::Value) -> Option<Param<f64>> {
    let num = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    match value {
        toml::Value::Array(items) if items.len() == 2 => Some(Param::Range([num(&items[0])?, num(&items[1])?])),
        other => num(other).map(Param::Fixed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fixed_and_ranged_values_are_drawn_and_unknown_keys_rejected() {
        let table: toml::Table = toml::from_str("a = 5\nb = [10, 20]\nc = 0.5\nd = \"XACK\"\ntypo = 1").unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut params = Params::new("fault[0] kill", &table);
        assert_eq!(params.u64("a", None, &mut rng).unwrap(), 5);
        let b = params.u64("b", None, &mut rng).unwrap();
        assert!((10..=20).contains(&b), "{b}");
        assert_eq!(params.f64("c", None, &mut rng).unwrap(), 0.5);
        assert_eq!(params.string("d", None, &mut rng).unwrap(), "XACK");
        assert_eq!(params.u64("absent", Some(Param::Fixed(7)), &mut rng).unwrap(), 7);
        assert!(params.u64("required", None, &mut rng).is_err());
        let err = params.finish().unwrap_err().to_string();
        assert!(err.contains("unknown param `typo`"), "{err}");
    }

    #[test]
    fn empty_range_is_an_error() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert!(Param::Range([5u64, 1]).draw(&mut rng, "x").is_err());
    }
}

//! Typed, path-addressed reading of a `.nemo`'s `model_config.yaml` (written by OmegaConf), with
//! errors that name the file and the dotted key. The Parakeet and Sortformer parsers both read
//! through it.
//!
//! Scalars resolve by the YAML 1.2 core schema: `null`, `~` and an empty value are null, and a
//! null reads as absent. One integer rule for every setting: the value must be a YAML integer
//! (`4.0` is not one). A number setting takes an integer or a float (`1.0e-05`, `.inf`).

use std::fmt::Display;
use std::path::Path;

use saphyr::{LoadableYamlNode, Scalar, Yaml, YamlEmitter};

use crate::error::ModelError;

/// Largest integer setting accepted (sizes, counts, rates). Far above any real model, and it
/// keeps every product of two settings (shape checks) well inside `usize`.
pub(crate) const MAX_SETTING: u64 = 1 << 24;

/// A parsed config whose top level is a mapping, and the name errors use for it.
pub(crate) struct ConfigYaml<'a> {
    root: Yaml<'static>,
    file: &'a Path,
}

impl<'a> ConfigYaml<'a> {
    /// Parses `text`, a single YAML document with a mapping at the top. `file` is the name used
    /// in errors.
    pub(crate) fn parse(text: &str, file: &'a Path) -> Result<Self, ModelError> {
        let document = |problem: String| ModelError::InvalidConfig {
            file: file.to_path_buf(),
            key: "<document>".to_string(),
            problem,
        };
        let mut documents: Vec<Yaml<'static>> =
            Yaml::load_from_str(text).map_err(|e| document(format!("not valid YAML: {e}")))?;
        if documents.len() > 1 {
            return Err(document("not valid YAML: more than one document".into()));
        }
        // An empty text holds no document: a null, as in YAML.
        let root = documents.pop().unwrap_or(Yaml::Value(Scalar::Null));
        if !untag(&root).is_mapping() {
            return Err(document("the top level is not a mapping".into()));
        }
        Ok(Self { root, file })
    }

    /// The node at dotted `path`, null included.
    fn lookup(&self, path: &str) -> Option<&Yaml<'static>> {
        let mut node = untag(&self.root);
        for part in path.split('.') {
            node = untag(node.as_mapping_get(part)?);
        }
        Some(node)
    }

    /// The value at dotted `path`; absent or null is `None`.
    pub(crate) fn get(&self, path: &str) -> Option<&Yaml<'static>> {
        self.lookup(path).filter(|v| !v.is_null())
    }

    /// Whether `path` is present with an explicit `null` (which [`Self::get`] reports as absent).
    pub(crate) fn is_null(&self, path: &str) -> bool {
        self.lookup(path).is_some_and(Yaml::is_null)
    }

    pub(crate) fn invalid(&self, key: &str, problem: impl Into<String>) -> ModelError {
        ModelError::InvalidConfig {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    pub(crate) fn unsupported(&self, key: &str, value: impl Display) -> ModelError {
        ModelError::UnsupportedConfig {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            value: value.to_string(),
        }
    }

    /// The value at `key` through `convert`; `expected` names what `convert` accepts.
    fn read<'s, T>(
        &'s self,
        key: &str,
        expected: &str,
        convert: impl Fn(&'s Yaml<'static>) -> Option<T>,
    ) -> Result<Option<T>, ModelError> {
        self.get(key)
            .map(|v| {
                convert(v).ok_or_else(|| {
                    self.invalid(key, format!("expected {expected}, found {}", show(v)))
                })
            })
            .transpose()
    }

    /// A size or count: an integer from 0 to [`MAX_SETTING`].
    pub(crate) fn usize_opt(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.read(key, &format!("an integer from 0 to {MAX_SETTING}"), |v| {
            as_u64(v)
                .filter(|&n| n <= MAX_SETTING)
                .and_then(|n| usize::try_from(n).ok())
        })
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        Ok(self.usize_opt(key)?.unwrap_or(default))
    }

    /// A required size or count.
    pub(crate) fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_opt(key)?
            .ok_or_else(|| self.invalid(key, "missing"))
    }

    /// A required size or count above zero.
    pub(crate) fn positive(&self, key: &str) -> Result<usize, ModelError> {
        self.nonzero(key, self.usize(key)?)
    }

    /// A size or count above zero, `default` when absent.
    pub(crate) fn positive_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        self.nonzero(key, self.usize_or(key, default)?)
    }

    fn nonzero(&self, key: &str, n: usize) -> Result<usize, ModelError> {
        match n {
            0 => Err(self.invalid(key, "must be positive")),
            n => Ok(n),
        }
    }

    /// A non-negative integer for a cross-check that only compares: `None` when absent or when
    /// the value is anything else (the setting it mirrors is the one validated).
    pub(crate) fn u64_if_integer(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(as_u64)
    }

    pub(crate) fn i64_opt(&self, key: &str) -> Result<Option<i64>, ModelError> {
        self.read(key, "an integer", Yaml::as_integer)
    }

    /// A number (integer or float, infinities and NaN included).
    pub(crate) fn f64_opt(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.read(key, "a number", as_f64)
    }

    /// A finite number, `default` when absent.
    pub(crate) fn finite_f64_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        let finite = |v| as_f64(v).filter(|f| f.is_finite());
        Ok(self
            .read(key, "a finite number", finite)?
            .unwrap_or(default))
    }

    /// A finite number as `f32`, `default` when absent.
    pub(crate) fn finite_f32_or(&self, key: &str, default: f32) -> Result<f32, ModelError> {
        self.finite_f64_or(key, f64::from(default))
            .map(|f| f as f32)
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        Ok(self
            .read(key, "true or false", Yaml::as_bool)?
            .unwrap_or(default))
    }

    pub(crate) fn str_opt(&self, key: &str) -> Result<Option<&str>, ModelError> {
        self.read(key, "a string", Yaml::as_str)
    }

    /// A string option that must be one of `allowed` (or absent, meaning `default`).
    pub(crate) fn choice<'s>(
        &'s self,
        key: &str,
        default: &'s str,
        allowed: &[&str],
    ) -> Result<&'s str, ModelError> {
        let value = self.str_opt(key)?.unwrap_or(default);
        if allowed.contains(&value) {
            Ok(value)
        } else {
            Err(self.unsupported(key, value))
        }
    }

    /// A list whose every item passes `convert`; `expected` names what it accepts.
    fn list<T>(
        &self,
        key: &str,
        expected: &str,
        convert: impl Fn(&Yaml<'static>) -> Option<T>,
    ) -> Result<Option<Vec<T>>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_sequence()
            .ok_or_else(|| self.invalid(key, format!("expected a list, found {}", show(v))))?;
        items
            .iter()
            .map(|item| {
                convert(untag(item)).ok_or_else(|| {
                    self.invalid(key, format!("expected {expected}, found {}", show(item)))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    pub(crate) fn int_list(&self, key: &str) -> Result<Option<Vec<i64>>, ModelError> {
        self.list(key, "integers", Yaml::as_integer)
    }

    /// A list of strings. YAML turns pieces such as `1` or `true` into other scalars when
    /// unquoted; NeMo always quotes them, but plain scalars are accepted as their text.
    pub(crate) fn string_list(&self, key: &str) -> Result<Option<Vec<String>>, ModelError> {
        self.list(key, "strings", |item| match item {
            Yaml::Value(Scalar::String(s)) => Some(s.to_string()),
            Yaml::Value(Scalar::Integer(_) | Scalar::FloatingPoint(_) | Scalar::Boolean(_)) => {
                Some(show(item))
            }
            _ => None,
        })
    }

    /// `<section>._target_` must name `class` (any module path) when present.
    pub(crate) fn target(&self, section: &str, class: &str) -> Result<(), ModelError> {
        let key = format!("{section}._target_");
        match self.str_opt(&key)? {
            Some(t) if t.rsplit('.').next() != Some(class) => Err(self.unsupported(&key, t)),
            _ => Ok(()),
        }
    }
}

/// The node under any tags (`!tag value` reads as `value`).
fn untag<'v>(v: &'v Yaml<'static>) -> &'v Yaml<'static> {
    match v {
        Yaml::Tagged(_, inner) => untag(inner),
        other => other,
    }
}

/// The integer rule: a YAML integer, not negative.
fn as_u64(v: &Yaml<'_>) -> Option<u64> {
    v.as_integer().and_then(|n| u64::try_from(n).ok())
}

/// A YAML integer or float as `f64`.
pub(crate) fn as_f64(v: &Yaml<'_>) -> Option<f64> {
    match v {
        Yaml::Value(Scalar::Integer(n)) => Some(*n as f64),
        Yaml::Value(Scalar::FloatingPoint(f)) => Some(f.0),
        _ => None,
    }
}

/// A value as YAML text, for messages (a list or mapping in block style).
pub(crate) fn show(v: &Yaml<'_>) -> String {
    let mut text = String::new();
    match YamlEmitter::new(&mut text).dump(v) {
        Ok(()) => text.trim_start_matches("---").trim().to_string(),
        Err(_) => format!("{v:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "model_config.yaml";

    fn parse(text: &str) -> ConfigYaml<'static> {
        ConfigYaml::parse(text, Path::new(FILE)).expect("valid YAML")
    }

    /// `(key, problem)` of the `InvalidConfig` that `result` must be.
    fn problem<T: std::fmt::Debug>(result: Result<T, ModelError>) -> (String, String) {
        match result {
            Err(ModelError::InvalidConfig { key, problem, .. }) => (key, problem),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    const DOC: &str = "
a:
  int: 4
  neg: -1
  big: 16777217
  whole_float: 4.0
  float: 1.0e-05
  inf: .inf
  nul: null
  tilde: ~
  empty:
  text: rel_pos
  quoted: '12'
  flag: true
  list: [70, 1]
  nested: [[1, 2]]
  pieces: ['a', 1, true, 'b']
  tagged: !custom 7
";

    #[test]
    fn scalars_resolve_as_in_the_core_schema() {
        let y = parse(DOC);
        assert_eq!(y.usize_opt("a.int").ok(), Some(Some(4)));
        assert_eq!(y.i64_opt("a.neg").ok(), Some(Some(-1)));
        assert_eq!(y.f64_opt("a.float").ok(), Some(Some(1e-5)));
        assert_eq!(y.f64_opt("a.int").ok(), Some(Some(4.0)));
        assert_eq!(y.f64_opt("a.inf").ok(), Some(Some(f64::INFINITY)));
        assert_eq!(y.str_opt("a.text").ok(), Some(Some("rel_pos")));
        assert_eq!(y.str_opt("a.quoted").ok(), Some(Some("12")));
        assert_eq!(y.bool_or("a.flag", false).ok(), Some(true));
        assert_eq!(y.usize_opt("a.tagged").ok(), Some(Some(7)));
        for null in ["a.nul", "a.tilde", "a.empty"] {
            assert!(y.get(null).is_none() && y.is_null(null), "{null}");
        }
        assert!(!y.is_null("a.missing") && y.get("a.missing").is_none());
        assert_eq!(y.int_list("a.list").ok(), Some(Some(vec![70, 1])));
        assert_eq!(
            y.string_list("a.pieces").ok(),
            Some(Some(vec![
                "a".into(),
                "1".into(),
                "true".into(),
                "b".into()
            ]))
        );
    }

    #[test]
    fn integers_must_be_yaml_integers_in_range() {
        let y = parse(DOC);
        let (key, msg) = problem(y.usize_opt("a.whole_float"));
        assert_eq!(key, "a.whole_float");
        assert_eq!(
            msg,
            format!("expected an integer from 0 to {MAX_SETTING}, found 4.0")
        );
        for key in ["a.neg", "a.big", "a.text"] {
            assert!(y.usize_opt(key).is_err(), "{key}");
        }
        assert!(y.i64_opt("a.whole_float").is_err());
        for (key, n) in [("a.int", Some(4)), ("a.big", Some(16_777_217))] {
            assert_eq!(y.u64_if_integer(key), n, "{key}");
        }
        for key in ["a.neg", "a.whole_float", "a.text", "a.missing"] {
            assert_eq!(y.u64_if_integer(key), None, "{key}");
        }
        let (_, msg) = problem(y.finite_f64_or("a.inf", 0.0));
        assert_eq!(msg, "expected a finite number, found .inf");
        let (_, msg) = problem(y.positive_or("a.missing", 0));
        assert_eq!(msg, "must be positive");
        let (_, msg) = problem(y.usize("a.missing"));
        assert_eq!(msg, "missing");
        let (_, msg) = problem(y.int_list("a.nested"));
        assert_eq!(msg, "expected integers, found - 1\n- 2");
    }

    #[test]
    fn documents_must_be_one_mapping() {
        for text in ["", "- 1\n", "a: [\n", "a: 1\na: 2\n", "a: 1\n---\nb: 2\n"] {
            let err = ConfigYaml::parse(text, Path::new(FILE)).err();
            let Some(ModelError::InvalidConfig { key, .. }) = err else {
                panic!("{text:?}: {err:?}");
            };
            assert_eq!(key, "<document>", "{text:?}");
        }
    }
}

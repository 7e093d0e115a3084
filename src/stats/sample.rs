//! The builder of the `riffle stats` JSON tree: values put against declarations, nested by
//! their dotted paths.
//!
//! `put(&defs::CACHE_HITS, 9)` walks `cache` (making it an object if it is not one yet, a
//! section written `null` included) and sets `hits`; a later put to the same path replaces
//! the value. Keys are kept sorted (serde_json's map), so the order of the puts does not show.

use serde_json::{Map, Value};

use super::{Section, Stat};

/// A `riffle stats` tree being built; see the module documentation.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    root: Map<String, Value>,
}

impl Sample {
    pub fn new() -> Sample {
        Sample::default()
    }

    /// Sets `stat`'s value (a number, a boolean, a string, or `null` for `None`).
    pub fn put(&mut self, stat: &Stat, value: impl Into<Value>) {
        self.set(stat.path, value.into());
    }

    /// Writes `section` as `null`: this mount has none.
    pub fn absent(&mut self, section: &Section) {
        self.set(section.path, Value::Null);
    }

    /// The tree built.
    pub fn into_json(self) -> Value {
        Value::Object(self.root)
    }

    fn set(&mut self, path: &str, value: Value) {
        let (parents, leaf) = match path.rsplit_once('.') {
            Some((parents, leaf)) => (Some(parents), leaf),
            None => (None, path),
        };
        let mut map = &mut self.root;
        for part in parents.into_iter().flat_map(|p| p.split('.')) {
            let child = map.entry(part).or_insert_with(|| Value::Object(Map::new()));
            if !child.is_object() {
                *child = Value::Object(Map::new());
            }
            let Value::Object(next) = child else {
                unreachable!("made an object above");
            };
            map = next;
        }
        map.insert(leaf.to_string(), value);
    }
}

impl From<Value> for Sample {
    /// A sample that adds to `tree` (its fields are kept); a tree that is not an object
    /// starts empty.
    fn from(tree: Value) -> Sample {
        match tree {
            Value::Object(root) => Sample { root },
            _ => Sample::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::stats::{counter, section, text, NUMBER};

    const A: Stat = counter("a", NUMBER, "a");
    const B_C: Stat = counter("b.c", NUMBER, "b.c");
    const B_D_E: Stat = text("b.d.e", "b.d.e");
    const B: Section = section("b");

    #[test]
    fn values_nest_by_path() {
        let mut s = Sample::new();
        s.put(&B_D_E, "x");
        s.put(&A, 1u64);
        s.put(&B_C, 2u64);
        s.put(&A, 3u64);
        assert_eq!(
            s.into_json(),
            json!({"a": 3, "b": {"c": 2, "d": {"e": "x"}}})
        );
    }

    #[test]
    fn absent_sections_and_none_are_null() {
        let mut s = Sample::new();
        s.absent(&B);
        s.put(&A, None::<u64>);
        assert_eq!(s.clone().into_json(), json!({"a": null, "b": null}));
        s.put(&B_C, 1u64);
        assert_eq!(s.into_json(), json!({"a": null, "b": {"c": 1}}));
    }

    #[test]
    fn a_sample_adds_to_a_tree() {
        let mut s = Sample::from(json!({"x": 1, "b": {"y": 2}}));
        s.put(&B_C, 3u64);
        assert_eq!(s.into_json(), json!({"x": 1, "b": {"c": 3, "y": 2}}));
    }
}

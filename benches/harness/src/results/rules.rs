//! The thresholds of the report's goals, read from `benches/goals.toml` (the policy; the
//! harness only measures and renders). Each goal the harness measures names its line there
//! by id ([`rule`]); a measure without a line, or a line without a measure, fails the
//! harness's tests.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Deserialize;

/// The goals file, compiled in so that every build judges by the file it was built with.
const GOALS_TOML: &str = include_str!("../../../goals.toml");

/// How a measured value is judged against its goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum Cmp {
    #[serde(rename = ">=")]
    AtLeast,
    #[serde(rename = "<=")]
    AtMost,
    #[serde(rename = "<")]
    Below,
}

impl Cmp {
    pub(super) fn symbol(self) -> &'static str {
        match self {
            Cmp::AtLeast => "≥",
            Cmp::AtMost => "≤",
            Cmp::Below => "<",
        }
    }

    pub(super) fn met(self, value: f64, goal: f64) -> bool {
        match self {
            Cmp::AtLeast => value >= goal,
            Cmp::AtMost => value <= goal,
            Cmp::Below => value < goal,
        }
    }
}

/// One goal's line of `goals.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Rule {
    pub(super) id: String,
    pub(super) cmp: Cmp,
    pub(super) goal: f64,
    /// Where the goal was set (an issue, a commit).
    #[allow(dead_code)]
    pub(super) from: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    goal: Vec<Rule>,
}

/// Every rule of `goals.toml`, by id.
pub(super) fn rules() -> &'static HashMap<String, Rule> {
    static RULES: OnceLock<HashMap<String, Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let file: File = toml::from_str(GOALS_TOML)
            .unwrap_or_else(|e| panic!("benches/goals.toml does not parse: {e}"));
        let mut by_id = HashMap::new();
        for rule in file.goal {
            let id = rule.id.clone();
            assert!(
                by_id.insert(id.clone(), rule).is_none(),
                "benches/goals.toml: goal {id} is there twice"
            );
        }
        by_id
    })
}

/// The rule of goal `id`; a measure whose id `goals.toml` lacks is a bug of the harness.
pub(super) fn rule(id: &str) -> Rule {
    rules()
        .get(id)
        .cloned()
        .unwrap_or_else(|| panic!("benches/goals.toml has no goal {id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of goals.toml is measured somewhere: its id appears as a literal in the
    /// harness's goal code.
    #[test]
    fn every_goal_has_a_measure() {
        let code = [
            include_str!("goals.rs"),
            include_str!("cpu_goals.rs"),
            include_str!("w4.rs"),
        ]
        .concat();
        for id in rules().keys() {
            assert!(
                code.contains(&format!("\"{id}\"")),
                "benches/goals.toml's goal {id} is measured nowhere"
            );
        }
    }

    #[test]
    fn comparisons_judge_as_written() {
        assert!(Cmp::AtLeast.met(0.9, 0.9) && !Cmp::AtLeast.met(0.89, 0.9));
        assert!(Cmp::AtMost.met(1.0, 1.0) && !Cmp::AtMost.met(1.01, 1.0));
        assert!(!Cmp::Below.met(1.0, 1.0) && Cmp::Below.met(0.99, 1.0));
        assert_eq!(rule("w1.plan_first_256").cmp, Cmp::Below);
    }
}

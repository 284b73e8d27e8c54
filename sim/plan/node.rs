//! Names of the simulated nodes and the target syntax of fault plans.
//!
//! Node names are `redis`, `operator`, `coordinator-N`, `consumer-N`, `producer-N` (N from 1).
//! A target is one node, `<role>-?` (one initial node of that role, drawn from the seed when the
//! plan is drawn) or `<role>-*` (every node of that role alive when the fault fires).

use std::fmt;
use std::str::FromStr;

use rand::rngs::SmallRng;
use rand::Rng;

use super::PlanError;

/// The kind of a simulated node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Redis,
    Operator,
    Coordinator,
    Consumer,
    Producer,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Redis => "redis",
            Role::Operator => "operator",
            Role::Coordinator => "coordinator",
            Role::Consumer => "consumer",
            Role::Producer => "producer",
        }
    }

    fn indexed(self) -> bool {
        matches!(self, Role::Coordinator | Role::Consumer | Role::Producer)
    }

    fn parse(s: &str) -> Option<Role> {
        [Role::Redis, Role::Operator, Role::Coordinator, Role::Consumer, Role::Producer]
            .into_iter()
            .find(|r| r.name() == s)
    }
}

/// One simulated node, written by its name (`consumer-2`) in capsules. `index` is 0 for `redis` and `operator`, 1.. otherwise; a Redis node with
/// an index is the old primary of the index-th `redis-split-brain` fault (`redis-old-N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeRef {
    pub role: Role,
    pub index: u32,
}

impl NodeRef {
    pub const REDIS: NodeRef = NodeRef { role: Role::Redis, index: 0 };
    pub const OPERATOR: NodeRef = NodeRef { role: Role::Operator, index: 0 };

    pub fn new(role: Role, index: u32) -> Self {
        Self { role, index }
    }

    /// The old primary of the `n`-th split brain of a run (n from 1).
    pub fn old_primary(n: u32) -> Self {
        Self { role: Role::Redis, index: n }
    }
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.role.indexed() {
            write!(f, "{}-{}", self.role.name(), self.index)
        } else if self.role == Role::Redis && self.index > 0 {
            write!(f, "redis-old-{}", self.index)
        } else {
            f.write_str(self.role.name())
        }
    }
}

impl FromStr for NodeRef {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PlanError::Invalid(format!("`{s}` is not a node name (redis, operator, coordinator-N, ...)"));
        if let Some(role) = Role::parse(s).filter(|r| !r.indexed()) {
            return Ok(NodeRef::new(role, 0));
        }
        let (role, index) = s.rsplit_once('-').ok_or_else(bad)?;
        let role = Role::parse(role).filter(|r| r.indexed()).ok_or_else(bad)?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        if index == 0 {
            return Err(bad());
        }
        Ok(NodeRef::new(role, index))
    }
}

/// A resolved fault target, written as `consumer-2` or `consumer-*` in capsules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Node(NodeRef),
    /// Every node of the role alive when the fault fires.
    All(Role),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Node(node) => node.fmt(f),
            Target::All(role) => write!(f, "{}-*", role.name()),
        }
    }
}

impl FromStr for Target {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_suffix("-*").and_then(Role::parse) {
            Some(role) => Ok(Target::All(role)),
            None => s.parse().map(Target::Node),
        }
    }
}

/// Serde through `Display` / `FromStr`: capsules write nodes and targets by name.
macro_rules! serde_by_name {
    ($type:ty) => {
        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let name = <String as serde::Deserialize>::deserialize(deserializer)?;
                name.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_by_name!(NodeRef);
serde_by_name!(Target);

/// How many nodes of each role exist at the start (for `-?` draws and range checks).
#[derive(Clone, Copy, Debug)]
pub struct InitialCounts {
    pub coordinators: u32,
    pub consumers: u32,
    pub producers: u32,
}

impl InitialCounts {
    fn of(&self, role: Role) -> u32 {
        match role {
            Role::Coordinator => self.coordinators,
            Role::Consumer => self.consumers,
            Role::Producer => self.producers,
            Role::Redis | Role::Operator => 1,
        }
    }
}

/// Parses a target; `-?` is drawn now. A spec may list alternatives separated by `|`
/// (`"consumer-?|coordinator-?"`): one is drawn first.
pub fn resolve_target(spec: &str, counts: &InitialCounts, rng: &mut SmallRng) -> Result<Target, PlanError> {
    // Alternatives naming a role the plan has none of (`producer-?` with 0 producers) drop out.
    let drawable = |s: &&str| s.strip_suffix("-?").and_then(Role::parse).is_none_or(|r| counts.of(r) > 0);
    let mut options: Vec<&str> = spec.split('|').map(str::trim).filter(drawable).collect();
    if options.is_empty() {
        options.push(spec.split('|').next().unwrap_or(spec).trim());
    }
    let spec = options[rng.gen_range(0..options.len())];
    if let Some(role) = spec.strip_suffix("-*").and_then(Role::parse) {
        return Ok(Target::All(role));
    }
    if let Some(role) = spec.strip_suffix("-?").and_then(Role::parse) {
        let count = counts.of(role);
        if count == 0 {
            return Err(PlanError::Invalid(format!("target `{spec}`: the plan has no {} nodes", role.name())));
        }
        let index = if role.indexed() { rng.gen_range(1..=count) } else { 0 };
        return Ok(Target::Node(NodeRef::new(role, index)));
    }
    spec.parse().map(Target::Node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn names_round_trip_and_bad_names_fail() {
        for name in ["redis", "operator", "coordinator-2", "consumer-10", "producer-1"] {
            assert_eq!(name.parse::<NodeRef>().unwrap().to_string(), name);
        }
        for bad in ["consumer-0", "consumer", "redis-1", "kafka-1", ""] {
            assert!(bad.parse::<NodeRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn drawn_targets_stay_within_the_initial_nodes() {
        let counts = InitialCounts { coordinators: 2, consumers: 3, producers: 0 };
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..50 {
            match resolve_target("consumer-?", &counts, &mut rng).unwrap() {
                Target::Node(NodeRef { role: Role::Consumer, index }) => assert!((1..=3).contains(&index)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(resolve_target("coordinator-*", &counts, &mut rng).unwrap(), Target::All(Role::Coordinator));
        assert!(resolve_target("producer-?", &counts, &mut rng).is_err());
    }
}

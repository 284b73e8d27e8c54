//! The coordinator's decision core: the recorded model, the protocol types, and the pure decision
//! functions. Nothing in this module performs I/O, reads a clock, or draws randomness; the
//! simulation and the property tests rely on that.

pub mod admin;
pub mod assignor;
pub mod engine;
pub mod fence;
pub mod index;
pub mod input;
pub mod model;
pub mod observe;
pub mod planted;
pub mod proof;
pub mod protocol;
pub mod transition;
pub mod validate;

pub use admin::{first_metadata_version, Creation};
pub use engine::{
    check_session, decide_admin, decide_evidence, decide_heartbeat, decide_heartbeat_indexed, decide_routing,
    decide_tick, deferral_renewable_without_read, tick_deferral_ms, Context, Decision,
};
pub use index::GroupIndex;
pub use model::{GroupConfig, GroupId, GroupMetadata, MemberId, ShardId};
pub use observe::{LocalView, Observations};
pub use planted::{PlantedBug, PlantedBugs};

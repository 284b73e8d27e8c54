//! The coordinator service: the Redis-recorded workflow around the pure core, the shutdown gate,
//! and the stored-record codec. Generic over the [`crate::store::MetadataStore`], so production
//! (Redis) and the simulation (the in-memory fake on a simulated node) run the same code.

mod cache;
pub mod codec;
mod coordinator;
mod counters;
mod critical;
mod marks;
mod monitors;
mod pruning;
mod relay;
mod roster;
pub mod shutdown;

pub use coordinator::{
    Coordinator, CoordinatorOptions, GroupDescription, MAX_ASSIGNMENT_LEASE_MS_DEFAULT, TICKER_REFRESH_MS_DEFAULT,
    TICKER_SILENCE_MS_DEFAULT,
};
#[doc(hidden)]
pub use critical::UNSEEN_MISSING;
pub use pruning::LocalSizes;

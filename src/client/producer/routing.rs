//! [`RoutingCache`]: the producer's routing view under a lease, as a pure state machine (`now_ms`
//! is a parameter; no I/O, no clock).
//!
//! Rules (seed: "Producer Routing During Failures"):
//! - The cache lease is `routingCacheTtlMs` counted from the *send* time of the refresh that
//!   fetched it; a publish after the lease ended fails (fail closed). This is the invariant.
//! - A refresh is due `routingRefreshIntervalMs` after the last successful refresh's send time
//!   (before expiry), and at once when a publish finds no valid cache (none yet, or its lease
//!   ended). A publish has no other staleness signal: an XADD carries no version, so a view that
//!   is valid but out of date is replaced by the next periodic refresh, never by a publish.
//! - A refresh replaces the view when its metadataVersion is newer, or when it is equal but routes
//!   differently (the store lost writes and the version was issued again with other content; the
//!   store is the source of truth). An equal version that routes the same only extends the lease.
//!   A failed refresh keeps the cache while its lease holds.
//! - Decision filling a gap: an *older* version (the store lost writes) never replaces a valid
//!   cache and never extends it; once the cache expired it is adopted, because Redis is the source
//!   of truth and refusing it would stop every producer for good after a rollback.
//! - Every refresh reports the cached version. When the coordinator answers that this very
//!   version is lost (`lostVersion`), the older view replaces the valid cache at once: publishing
//!   on to shards of a lost AddShards would strand those entries where no consumer ever reads.
//! - The cache remembers the highest shard count any publish was routed with, and every refresh
//!   reports it (`knownShardCount`) once a coordinator said it reads it: entries published before
//!   the loss was detected sit on shards of a lost AddShards, and the coordinator adds those
//!   shards again so a consumer reads them (DESIGN §8). It is forgotten when a refresh is answered
//!   `GROUP_NOT_FOUND`. A producer that holds a view never gets that answer: it reports a version,
//!   and to a report naming a version a coordinator answers a group whose metadata key is gone
//!   with `METADATA_MISSING` (it cannot tell a delete from lost metadata). So a running producer
//!   keeps the count across a delete, and reports it to a group recreated under the same name.
//! - A coordinator that refuses a report's extra parameters (an older binary behind the same
//!   address answers 400 naming one) is asked again with the same report once, since behind a
//!   balancer the retry likely reaches another coordinator; refused twice in a row, the report
//!   loses what was refused (see [`Refused`]) until an answer says its coordinator reads it.

use crate::core::model::{GroupConfig, ShardId};
use crate::core::planted::{PlantedBug, PlantedBugs};
use crate::core::proof::ViewProof;
use crate::core::protocol::{RoutingReport, RoutingResponse};

use super::super::hash::shard_for_key;

/// Most routing requests one refresh sends: a report with a shard count and proofs, again after
/// a 400, once more without the proofs after the second, again, and with the version alone
/// ([`RoutingCache::refused`]; each pair of refusals leaves out more, and a report without extras
/// is never sent again).
pub const ROUTING_REQUESTS_MAX: usize = 5;

/// What a coordinator refused in a routing report, read from its 400 (a binary that does not know
/// a parameter refuses the whole request: `deny_unknown_fields`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Only a proof (`knownVersionProof`, `knownShardCountProof`) of a report that carries one:
    /// the previous release reads `knownShardCount`, which came before the proofs, so the count
    /// still goes, unproven (that release heals from it; a newer one counts it as unproven).
    Proofs,
    /// `knownShardCount`, or something the refusal does not name: only the version goes.
    ShardCount,
}

impl Refused {
    /// What the 400 `message` to `report` refused. serde names the first unknown parameter as
    /// "unknown field `knownVersionProof`, expected `knownVersion` or `knownShardCount`": only the
    /// name right after "unknown field" counts, since the list that follows names parameters the
    /// coordinator does read.
    pub fn of(report: &RoutingReport, message: &str) -> Self {
        let names = |parameter: &str| message.contains(&format!("unknown field `{parameter}`"));
        let proofs = report.known_version_proof.is_some() || report.known_shard_count_proof.is_some();
        if proofs && !names("knownShardCount") && (names("knownVersionProof") || names("knownShardCountProof")) {
            Refused::Proofs
        } else {
            Refused::ShardCount
        }
    }
}

/// True when `report` carries anything besides the version (the parameters a newer binary added).
pub fn carries_extras(report: &RoutingReport) -> bool {
    report.known_shard_count > 0 || report.known_version_proof.is_some() || report.known_shard_count_proof.is_some()
}

/// Where one publish goes, decided at `now_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub shard: ShardId,
    pub stream: String,
    pub metadata_version: u64,
    pub cache_expires_ms: u64,
}

/// Why no route could be given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No routing view was ever fetched.
    #[error("no routing view yet")]
    NoRouting,
    /// The routing view's lease ended at `expired_at_ms` (fail closed).
    #[error("routing cache expired at {expired_at_ms} ms (version {metadata_version})")]
    Expired { expired_at_ms: u64, metadata_version: u64 },
}

/// What applying a refresh did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefreshOutcome {
    /// The view was replaced (newer version, or an older one after the cache expired, or the same
    /// version with different content: the version was reused after the store lost writes, and
    /// the store is the source of truth).
    Replaced,
    /// Same version: the lease was extended.
    Extended,
    /// An older version while the cache is valid: kept as is.
    KeptNewer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Cached {
    routing: RoutingResponse,
    expires_ms: u64,
    refresh_due_ms: u64,
}

/// The producer's routing cache. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingCache {
    cached: Option<Cached>,
    /// A publish asked for a refresh before the periodic one.
    refresh_now: bool,
    /// The highest shard count a publish was routed with (0: none yet).
    published_shard_count: u32,
    /// The coordinator's proof of `published_shard_count`, from the view routed with.
    published_shard_count_proof: Option<ViewProof>,
    /// The last answer said its coordinator reads `knownShardCount`.
    peer_reads_shard_count: bool,
    /// The last answer carried proofs, so its coordinator reads them (older ones refuse them).
    peer_reads_proofs: bool,
    /// The last report was refused once (400) and sent again as it was ([`RoutingCache::refused`]);
    /// cleared by any answer, and by the second refusal, which leaves the refused part out.
    refused_once: bool,
    planted: PlantedBugs,
}

impl RoutingCache {
    pub fn new(planted: PlantedBugs) -> Self {
        Self {
            cached: None,
            refresh_now: true,
            published_shard_count: 0,
            published_shard_count_proof: None,
            peer_reads_shard_count: false,
            peer_reads_proofs: false,
            refused_once: false,
            planted,
        }
    }

    /// What the next refresh reports: the cached version and, to a coordinator that reads it,
    /// the highest shard count a publish was routed with, each with the proof the coordinator gave
    /// of it (to a coordinator that reads proofs: a number above the recorded one is evidence of
    /// lost writes only with its proof, DESIGN §8).
    pub fn report(&self) -> RoutingReport {
        let known_shard_count = if self.peer_reads_shard_count { self.published_shard_count } else { 0 };
        let proofs = self.peer_reads_proofs;
        RoutingReport {
            known_version: self.routing().map_or(0, |r| r.metadata_version),
            known_shard_count,
            known_version_proof: self.routing().and_then(|r| r.metadata_version_proof).filter(|_| proofs),
            known_shard_count_proof: self.published_shard_count_proof.filter(|_| proofs && known_shard_count > 0),
        }
    }

    /// A coordinator answered `report` (a report this cache made) with a 400 whose message is
    /// `message`: the report to send at once instead, or `None` when the refusal is not about
    /// anything a newer binary adds (a report without extras; the refresh then fails as it is).
    ///
    /// The first refusal sends the same report again: behind a balancer over an old and a new
    /// coordinator the retry likely reaches the other one. Dropping the extras at once, and taking
    /// them up again at the next answer that carries proofs, let a round robin of two hand every
    /// full report to the old coordinator and every reduced retry to the new one, so a proof never
    /// reached the coordinator that checks it (the trap DESIGN §10 describes for `fenced`). Two
    /// refusals in a row leave out what was refused (see [`Refused`]) until an answer says its
    /// coordinator reads it, so a refresh ends after at most [`ROUTING_REQUESTS_MAX`] requests.
    pub fn refused(&mut self, report: &RoutingReport, message: &str) -> Option<RoutingReport> {
        if !carries_extras(report) {
            return None;
        }
        if !std::mem::replace(&mut self.refused_once, true) {
            return Some(*report);
        }
        self.refused_once = false;
        self.peer_reads_proofs = false;
        if Refused::of(report, message) == Refused::ShardCount {
            self.peer_reads_shard_count = false;
        }
        Some(self.report())
    }

    /// The group was deleted: shards published to before belong to an incarnation that is gone.
    pub fn forget_published(&mut self) {
        self.published_shard_count = 0;
        self.published_shard_count_proof = None;
    }

    /// The cached view, valid or not.
    pub fn routing(&self) -> Option<&RoutingResponse> {
        self.cached.as_ref().map(|c| &c.routing)
    }

    pub fn expires_ms(&self) -> Option<u64> {
        self.cached.as_ref().map(|c| c.expires_ms)
    }

    /// True when the lease holds at `now_ms`.
    pub fn is_valid(&self, now_ms: u64) -> bool {
        self.cached.as_ref().is_some_and(|c| now_ms < c.expires_ms)
    }

    /// When the next refresh is due (`None`: now).
    pub fn refresh_due_ms(&self) -> Option<u64> {
        match &self.cached {
            Some(c) if !self.refresh_now => Some(c.refresh_due_ms.min(c.expires_ms)),
            _ => None,
        }
    }

    /// True when a refresh should be sent at `now_ms`.
    pub fn needs_refresh(&self, now_ms: u64) -> bool {
        self.refresh_due_ms().is_none_or(|due| now_ms >= due)
    }

    /// A publish found no valid cache (none yet, or its lease ended): refresh at once.
    pub fn mark_stale(&mut self) {
        self.refresh_now = true;
    }

    /// Applies a successful refresh sent at `sent_ms`.
    pub fn apply_refresh(&mut self, sent_ms: u64, now_ms: u64, routing: RoutingResponse) -> RefreshOutcome {
        // Bounded as a valid group config bounds them (at most 24 h, the refresh before the
        // cache ends): a coordinator's bug or lie must not keep a partitioned producer publishing
        // on one view for ever, nor stop its refreshes.
        let ttl_ms = routing.routing_cache_ttl_ms.min(GroupConfig::MS_MAX);
        let refresh_ms = routing.routing_refresh_interval_ms.min(ttl_ms.saturating_sub(1).max(1));
        let expires_ms = sent_ms.saturating_add(ttl_ms);
        let refresh_due_ms = sent_ms.saturating_add(refresh_ms);
        let valid = self.is_valid(now_ms);
        self.peer_reads_shard_count = routing.accepts_known_shard_count;
        self.peer_reads_proofs = routing.metadata_version_proof.is_some();
        self.refused_once = false;
        let outcome = match &mut self.cached {
            Some(c) if routing.metadata_version == c.routing.metadata_version && same_view(&c.routing, &routing) => {
                // Refreshes may be answered out of order: never shorten the lease.
                c.expires_ms = c.expires_ms.max(expires_ms);
                c.refresh_due_ms = c.refresh_due_ms.max(refresh_due_ms);
                // The same view, proven again: keep the proof a coordinator gave last (a group's
                // key changes only when an older release rewrote its record).
                if routing.metadata_version_proof.is_some() {
                    c.routing.metadata_version_proof = routing.metadata_version_proof;
                    c.routing.shard_count_proof = routing.shard_count_proof;
                }
                RefreshOutcome::Extended
            }
            // An older version is kept out while the cache is valid, unless the coordinator says
            // the cached version itself is the one the store lost (the producer reported it).
            Some(c)
                if routing.metadata_version < c.routing.metadata_version
                    && valid
                    && routing.lost_version != Some(c.routing.metadata_version) =>
            {
                RefreshOutcome::KeptNewer
            }
            _ => {
                self.cached = Some(Cached { routing, expires_ms, refresh_due_ms });
                RefreshOutcome::Replaced
            }
        };
        self.refresh_now = false;
        outcome
    }

    /// The route of `key` at `now_ms`, or why there is none. The caller must write at `now_ms`;
    /// the view's shard count is remembered as published with.
    pub fn route(&mut self, now_ms: u64, key: &[u8]) -> Result<Route, RouteError> {
        let cached = self.cached.as_ref().ok_or(RouteError::NoRouting)?;
        let routing = &cached.routing;
        if now_ms >= cached.expires_ms && !self.planted.has(PlantedBug::PublishOnExpiredCache) {
            return Err(RouteError::Expired {
                expired_at_ms: cached.expires_ms,
                metadata_version: routing.metadata_version,
            });
        }
        let buckets = if self.planted.has(PlantedBug::RouteOverOneShardTooMany) {
            routing.shard_count.saturating_add(1)
        } else {
            routing.shard_count
        };
        let shard = shard_for_key(key, buckets);
        if routing.shard_count > self.published_shard_count {
            self.published_shard_count = routing.shard_count;
            self.published_shard_count_proof = routing.shard_count_proof;
        } else if routing.shard_count == self.published_shard_count && routing.shard_count_proof.is_some() {
            // The latest proof of the same count (a group's key changes only across an update).
            self.published_shard_count_proof = routing.shard_count_proof;
        }
        let stream = match routing.stream_keys.get(shard as usize) {
            Some(stream) => stream.clone(),
            None => routing.group.stream_key(shard),
        };
        Ok(Route { shard, stream, metadata_version: routing.metadata_version, cache_expires_ms: cached.expires_ms })
    }
}

/// True when two routing views route identically (bookkeeping fields aside).
fn same_view(a: &RoutingResponse, b: &RoutingResponse) -> bool {
    a.group == b.group && a.shard_count == b.shard_count && a.stream_keys == b.stream_keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::GroupId;

    const TTL_MS: u64 = 1_000;
    const INTERVAL_MS: u64 = 300;

    fn routing(version: u64, shard_count: u32) -> RoutingResponse {
        let group = GroupId::new("orders", "billing");
        RoutingResponse {
            metadata_version_proof: None,
            shard_count_proof: None,
            stream_keys: (0..shard_count).map(|s| group.stream_key(s)).collect(),
            group,
            metadata_version: version,
            shard_count,
            routing_cache_ttl_ms: TTL_MS,
            routing_refresh_interval_ms: INTERVAL_MS,
            store_revision: 1,
            lost_version: None,
            accepts_known_shard_count: true,
        }
    }

    /// A routing answer's cache TTL and refresh interval are bounded as a valid group config bounds
    /// them: u64::MAX would let a partitioned producer publish on one view for ever and never
    /// refresh again (review finding).
    #[test]
    fn an_answers_cache_ttl_and_refresh_interval_are_bounded_as_a_valid_config_bounds_them() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        let absurd =
            RoutingResponse { routing_cache_ttl_ms: u64::MAX, routing_refresh_interval_ms: u64::MAX, ..routing(3, 4) };
        assert_eq!(cache.apply_refresh(0, 10, absurd), RefreshOutcome::Replaced);
        assert_eq!(cache.expires_ms(), Some(GroupConfig::MS_MAX));
        assert!(!cache.needs_refresh(GroupConfig::MS_MAX - 2));
        assert!(cache.needs_refresh(GroupConfig::MS_MAX - 1), "the refresh comes before the cache ends");
        assert!(matches!(cache.route(GroupConfig::MS_MAX, b"k"), Err(RouteError::Expired { .. })));
    }

    #[test]
    fn empty_cache_refreshes_at_once_and_refuses_to_route() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        assert!(cache.needs_refresh(0));
        assert_eq!(cache.route(0, b"k"), Err(RouteError::NoRouting));
    }

    #[test]
    fn lease_counts_from_the_refresh_send_time_and_fails_closed_at_expiry() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        assert_eq!(cache.apply_refresh(100, 600, routing(3, 4)), RefreshOutcome::Replaced);
        let route = cache.route(100 + TTL_MS - 1, b"order-1").expect("valid");
        assert_eq!((route.shard, route.stream.as_str(), route.metadata_version), (1, "orders:1", 3));
        assert_eq!(route.cache_expires_ms, 100 + TTL_MS);
        assert_eq!(
            cache.route(100 + TTL_MS, b"order-1"),
            Err(RouteError::Expired { expired_at_ms: 100 + TTL_MS, metadata_version: 3 })
        );
    }

    #[test]
    fn refresh_is_due_every_interval_before_expiry_and_at_once_when_stale() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 10, routing(1, 2));
        assert!(!cache.needs_refresh(INTERVAL_MS - 1));
        assert!(cache.needs_refresh(INTERVAL_MS));
        const { assert!(INTERVAL_MS < TTL_MS) };
        cache.mark_stale();
        assert!(cache.needs_refresh(20));
        cache.apply_refresh(20, 30, routing(1, 2));
        assert!(!cache.needs_refresh(30));
    }

    #[test]
    fn replaced_only_by_a_newer_version_and_extended_by_an_equal_one() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(5, 2));
        assert_eq!(cache.apply_refresh(200, 205, routing(5, 2)), RefreshOutcome::Extended);
        assert_eq!(cache.expires_ms(), Some(200 + TTL_MS));
        // A late answer to an earlier refresh never shortens the lease.
        assert_eq!(cache.apply_refresh(100, 210, routing(5, 2)), RefreshOutcome::Extended);
        assert_eq!(cache.expires_ms(), Some(200 + TTL_MS));
        // An older version does not replace or extend a valid cache.
        assert_eq!(cache.apply_refresh(400, 405, routing(4, 1)), RefreshOutcome::KeptNewer);
        assert_eq!((cache.routing().map(|r| r.metadata_version), cache.expires_ms()), (Some(5), Some(200 + TTL_MS)));
        // A newer version (more shards) replaces it.
        assert_eq!(cache.apply_refresh(500, 505, routing(6, 8)), RefreshOutcome::Replaced);
        assert_eq!(cache.routing().map(|r| r.shard_count), Some(8));
        assert_eq!(cache.expires_ms(), Some(500 + TTL_MS));
    }

    #[test]
    fn reports_carry_the_proofs_of_the_cached_version_and_of_the_widest_view_published_with() {
        let proof = |n: u8| -> ViewProof { format!("{:032x}", n).parse().expect("a proof") };
        let proven = |version, shards, v: u8, n: u8| RoutingResponse {
            metadata_version_proof: Some(proof(v)),
            shard_count_proof: Some(proof(n)),
            ..routing(version, shards)
        };
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, proven(5, 8, 1, 2));
        cache.route(10, b"k").expect("routed");
        let report = cache.report();
        assert_eq!((report.known_version, report.known_shard_count), (5, 8));
        assert_eq!((report.known_version_proof, report.known_shard_count_proof), (Some(proof(1)), Some(proof(2))));
        // The store lost the add-shards: a smaller view replaces the cache, but the count published
        // with, and its proof, stay (that is the evidence the heal needs).
        cache.mark_stale();
        cache.apply_refresh(2_000, 2_005, RoutingResponse { lost_version: Some(5), ..proven(4, 2, 3, 4) });
        cache.route(2_010, b"k").expect("routed");
        let report = cache.report();
        assert_eq!((report.known_version, report.known_shard_count), (4, 8));
        assert_eq!((report.known_version_proof, report.known_shard_count_proof), (Some(proof(3)), Some(proof(2))));
        // An older coordinator refused a proof: the same report goes once more; refused again,
        // the count goes without proofs (that coordinator reads the count) until an answer
        // carries proofs again.
        let full = cache.report();
        let old = "invalid query: unknown field `knownVersionProof`, expected `knownVersion` or `knownShardCount`";
        assert_eq!(cache.refused(&full, old), Some(full));
        let unproven = RoutingReport { known_version: 4, known_shard_count: 8, ..RoutingReport::NONE };
        assert_eq!(cache.refused(&full, old), Some(unproven));
        assert_eq!(cache.report(), unproven);
        cache.apply_refresh(2_100, 2_105, proven(4, 2, 3, 4));
        assert_eq!(cache.report().known_shard_count_proof, Some(proof(2)));
        // An answer without proofs (an older coordinator) turns them off.
        cache.apply_refresh(2_200, 2_205, routing(4, 2));
        assert_eq!(cache.report().known_version_proof, None);
        assert_eq!(cache.report().known_shard_count_proof, None);
    }

    /// A 400 to a report with extras sends the same report once more, and leaves out what was
    /// refused only at the second refusal in a row: behind a round robin of an old and a new
    /// coordinator the retry reaches the new one with everything (compat review F4). The name
    /// after "unknown field" decides what is refused, not the list of parameters that follows.
    #[test]
    fn a_refused_report_goes_once_more_and_loses_only_what_two_refusals_in_a_row_named() {
        let proof: ViewProof = "0123456789abcdef0123456789abcdef".parse().expect("a proof");
        let proven =
            RoutingResponse { metadata_version_proof: Some(proof), shard_count_proof: Some(proof), ..routing(5, 8) };
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, proven.clone());
        cache.route(10, b"k").expect("routed");
        let full = cache.report();
        assert_eq!((full.known_shard_count, full.known_version_proof), (8, Some(proof)));
        let count_refused = "unknown field `knownShardCount`, expected `knownVersion`";
        let proof_refused = "unknown field `knownShardCountProof`, expected one of `knownVersion`, `knownShardCount`";
        assert_eq!(Refused::of(&full, proof_refused), Refused::Proofs);
        assert_eq!(Refused::of(&full, count_refused), Refused::ShardCount);
        assert_eq!(Refused::of(&full, "a 400 about something else"), Refused::ShardCount);
        let unproven = RoutingReport { known_version_proof: None, known_shard_count_proof: None, ..full };
        assert_eq!(Refused::of(&unproven, proof_refused), Refused::ShardCount, "no proof to leave out");
        // An answer between two refusals makes the next one a first refusal again.
        assert_eq!(cache.refused(&full, count_refused), Some(full));
        cache.apply_refresh(100, 105, proven.clone());
        assert_eq!(cache.refused(&full, count_refused), Some(full), "not two in a row");
        // Two in a row naming the count: only the version goes, then nothing is retried.
        assert_eq!(cache.refused(&full, count_refused), Some(RoutingReport::version(5)));
        assert_eq!(cache.refused(&RoutingReport::version(5), count_refused), None);
        // Two refusals of the proof, then two of the unproven count: the most one refresh sends.
        cache.apply_refresh(200, 205, proven);
        let mut report = cache.report();
        let mut requests = 1;
        while let Some(retry) = cache.refused(&report, if report == full { proof_refused } else { count_refused }) {
            (report, requests) = (retry, requests + 1);
        }
        assert_eq!((report, requests), (RoutingReport::version(5), ROUTING_REQUESTS_MAX));
    }

    /// Found by the simulation (swarm seed 1106): a failover lost an AddShards write (v9, 23
    /// shards) and the coordinator later wrote a different v9 (20 shards). Extending the cached
    /// view kept publishes going to shards 20-22, which no consumer would ever own.
    #[test]
    fn the_same_version_with_different_content_replaces_the_cache() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(9, 23));
        assert_eq!(cache.apply_refresh(100, 105, routing(9, 20)), RefreshOutcome::Replaced);
        assert_eq!(cache.routing().map(|r| r.shard_count), Some(20));
        assert_eq!(cache.expires_ms(), Some(100 + TTL_MS));
    }

    /// The producer reports its cached version; the coordinator answers that the store lost it.
    /// The older, true view replaces the still-valid cache at once (only if the cache still holds
    /// exactly the version reported lost).
    #[test]
    fn an_older_version_replaces_a_valid_cache_whose_version_the_coordinator_says_is_lost() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(9, 23));
        let not_ours = RoutingResponse { lost_version: Some(8), ..routing(7, 20) };
        assert_eq!(cache.apply_refresh(100, 105, not_ours), RefreshOutcome::KeptNewer);
        let ours = RoutingResponse { lost_version: Some(9), ..routing(7, 20) };
        assert_eq!(cache.apply_refresh(200, 205, ours), RefreshOutcome::Replaced);
        assert_eq!(cache.routing().map(|r| (r.metadata_version, r.shard_count)), Some((7, 20)));
        assert_eq!(cache.route(205, b"k").map(|r| r.shard < 20), Ok(true));
    }

    #[test]
    fn an_older_version_is_adopted_only_after_the_cache_expired() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(5, 4));
        assert_eq!(cache.apply_refresh(TTL_MS, TTL_MS + 5, routing(4, 2)), RefreshOutcome::Replaced);
        assert_eq!(cache.routing().map(|r| r.metadata_version), Some(4));
    }

    #[test]
    fn a_failed_refresh_keeps_the_cache_until_its_lease_ends() {
        // A failure is "no apply": the cache is untouched and still routes until expiry.
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(2, 4));
        assert!(cache.needs_refresh(INTERVAL_MS));
        assert!(cache.route(TTL_MS - 1, b"k").is_ok());
        assert!(cache.route(TTL_MS, b"k").is_err());
    }

    #[test]
    fn planted_publish_on_expired_cache_is_observable() {
        let mut cache = RoutingCache::new(PlantedBugs::only(PlantedBug::PublishOnExpiredCache));
        cache.apply_refresh(0, 5, routing(2, 4));
        assert!(cache.route(TTL_MS + 1, b"k").is_ok());
    }

    #[test]
    fn planted_route_over_one_shard_too_many_is_observable() {
        let mut cache = RoutingCache::new(PlantedBugs::only(PlantedBug::RouteOverOneShardTooMany));
        cache.apply_refresh(0, 5, routing(1, 4));
        let outside = (0..100).filter_map(|k| cache.route(6, format!("k{k}").as_bytes()).ok()).filter(|r| r.shard >= 4);
        assert!(outside.count() > 0, "some keys land on shard 4, outside the view");
    }

    #[test]
    fn routes_follow_the_jump_hash_over_the_cached_shard_count() {
        let mut cache = RoutingCache::new(PlantedBugs::NONE);
        cache.apply_refresh(0, 5, routing(1, 10));
        assert_eq!(cache.route(6, "中国".as_bytes()).map(|r| r.shard), Ok(5));
    }
}

//! Turning stored records into [`GroupMetadata`] and back, with the schema and layout checks the
//! seed asks for: an unknown `schemaVersion`/`layoutVersion` or unparsable JSON fails closed with
//! `METADATA_INCOMPATIBLE`; it is never overwritten.

use crate::core::model::{GroupId, GroupMetadata, LAYOUT_VERSION, SCHEMA_VERSION};
use crate::core::protocol::{ApiError, ErrorCode};
use crate::store::StoredRecord;

/// Parses a stored record of `group`.
pub fn decode(group: &GroupId, record: &StoredRecord) -> Result<GroupMetadata, ApiError> {
    let incompatible = |why: String| ApiError::new(ErrorCode::MetadataIncompatible, format!("group {group}: {why}"));
    if record.schema_version != SCHEMA_VERSION {
        return Err(incompatible(format!(
            "schemaVersion {} is not supported (this build reads {SCHEMA_VERSION})",
            record.schema_version
        )));
    }
    if record.layout_version != LAYOUT_VERSION {
        return Err(incompatible(format!(
            "layoutVersion {} is not supported (this build reads {LAYOUT_VERSION})",
            record.layout_version
        )));
    }
    let metadata: GroupMetadata =
        serde_json::from_str(&record.aggregate).map_err(|e| incompatible(format!("aggregate is not valid: {e}")))?;
    if &metadata.group != group {
        return Err(incompatible("aggregate names another group".into()));
    }
    metadata.validate().map_err(|e| incompatible(e.to_string()))?;
    Ok(metadata)
}

/// Serializes metadata for a write. Fails only on a bug (the model always serializes).
pub fn encode(metadata: &GroupMetadata) -> Result<String, ApiError> {
    serde_json::to_string(metadata)
        .map_err(|e| ApiError::new(ErrorCode::MetadataIncompatible, format!("cannot encode metadata: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::GroupConfig;

    fn record(g: &GroupMetadata) -> StoredRecord {
        StoredRecord {
            aggregate: encode(g).expect("encodes"),
            revision: 1,
            schema_version: SCHEMA_VERSION,
            layout_version: LAYOUT_VERSION,
            updated_at_ms: 0,
            write_id: "w1".into(),
        }
    }

    #[test]
    fn round_trips_and_rejects_future_schema_corruption_and_foreign_groups() {
        let group = GroupId::new("orders", "billing");
        let g = GroupMetadata::new(group.clone(), 8, GroupConfig::default());
        assert_eq!(decode(&group, &record(&g)), Ok(g.clone()));

        let future = StoredRecord { schema_version: 2, ..record(&g) };
        assert_eq!(decode(&group, &future).unwrap_err().code, ErrorCode::MetadataIncompatible);
        let layout = StoredRecord { layout_version: 9, ..record(&g) };
        assert_eq!(decode(&group, &layout).unwrap_err().code, ErrorCode::MetadataIncompatible);
        let corrupt = StoredRecord { aggregate: "{not json".into(), ..record(&g) };
        assert_eq!(decode(&group, &corrupt).unwrap_err().code, ErrorCode::MetadataIncompatible);
        let other = GroupId::new("orders", "other");
        assert_eq!(decode(&other, &record(&g)).unwrap_err().code, ErrorCode::MetadataIncompatible);
        let mut broken = g;
        broken.shard_count = 0;
        assert_eq!(decode(&group, &record(&broken)).unwrap_err().code, ErrorCode::MetadataIncompatible);
    }
}

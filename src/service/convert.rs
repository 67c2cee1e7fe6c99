//! The mapping between domain types and their protobuf messages.

use std::time::Duration;

use crate::batch::{self, FlushReason, Group};
use crate::pb;
use crate::policy::Policy;
use crate::store::{AddOutcome, AddResult};

pub fn add_response(result: AddResult) -> pb::AddResponse {
    pb::AddResponse {
        outcome: match result.outcome {
            AddOutcome::Added => pb::AddOutcome::Added,
            AddOutcome::Duplicate => pb::AddOutcome::Duplicate,
        } as i32,
        group_size: result.group_size,
        flushed: result.flushed.map(|b| batch_to_pb(&b, String::new(), 0)),
    }
}

pub fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// Converts a batch for the wire.
pub fn batch_to_pb(batch: &batch::Batch, cursor: String, delivery_count: u32) -> pb::Batch {
    pb::Batch {
        id: batch.id(),
        key: batch.key.clone(),
        items: batch
            .items
            .iter()
            .map(|item| pb::Item {
                id: item.id.clone(),
                payload: item.payload.clone(),
            })
            .collect(),
        reason: match batch.reason {
            FlushReason::Size => pb::FlushReason::Size,
            FlushReason::Timeout => pb::FlushReason::Timeout,
            FlushReason::Bytes => pb::FlushReason::Bytes,
            FlushReason::Manual => pb::FlushReason::Manual,
        } as i32,
        opened_at: Some(timestamp(batch.opened_at_ms)),
        flushed_at: Some(timestamp(batch.flushed_at_ms)),
        cursor,
        delivery_count,
    }
}

/// Converts an open group for the wire, with the policy its key resolves to now.
pub fn group_to_pb(group: Group, policy: &Policy) -> pb::Group {
    pb::Group {
        size: group.size,
        bytes: group.bytes,
        opened_at: Some(timestamp(group.opened_at_ms)),
        due_at: Some(timestamp(group.due_at_ms)),
        max_items: policy.max_items,
        max_wait: Some(duration(group.max_wait())),
        max_bytes: policy.max_bytes.unwrap_or(0),
        items: group
            .items
            .into_iter()
            .map(|item| pb::Item {
                id: item.id,
                payload: item.payload,
            })
            .collect(),
        key: group.key,
    }
}

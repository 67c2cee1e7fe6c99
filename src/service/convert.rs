//! The mapping between domain types and their protobuf messages.

use std::time::Duration;

use crate::batch::{self, FlushReason, Group};
use crate::batch::{AddOutcome, AddResult};
use crate::pb;
use crate::policy::Policy;

pub fn add_response(result: AddResult) -> pb::AddResponse {
    let batches: Vec<pb::Batch> = result
        .flushed
        .into_iter()
        .map(|b| batch_into_pb(b, String::new(), 0))
        .collect();
    let (outcome, limit) = match result.outcome {
        AddOutcome::Added => (pb::AddOutcome::Added, String::new()),
        AddOutcome::Duplicate => (pb::AddOutcome::Duplicate, String::new()),
        AddOutcome::Refused(limit) => (pb::AddOutcome::Refused, limit.name()),
    };
    pb::AddResponse {
        outcome: outcome as i32,
        limit,
        group_size: result.group_size,
        flushed: batches.last().cloned(),
        batches,
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

/// A flush reason for the wire.
pub fn reason_to_pb(reason: FlushReason) -> pb::FlushReason {
    match reason {
        FlushReason::Size => pb::FlushReason::Size,
        FlushReason::Timeout => pb::FlushReason::Timeout,
        FlushReason::Bytes => pb::FlushReason::Bytes,
        FlushReason::Manual => pb::FlushReason::Manual,
        FlushReason::Capacity => pb::FlushReason::Capacity,
        FlushReason::Idle => pb::FlushReason::Idle,
        FlushReason::Cutoff => pb::FlushReason::Cutoff,
        FlushReason::Deadline => pb::FlushReason::Deadline,
        FlushReason::MaxAge => pb::FlushReason::MaxAge,
        FlushReason::Closed => pb::FlushReason::Closed,
        FlushReason::Overflow => pb::FlushReason::Overflow,
    }
}

/// An item for the wire.
pub fn item_to_pb(item: batch::Item) -> pb::Item {
    pb::Item {
        id: String::from_utf8(item.id)
            .unwrap_or_else(|bytes| String::from_utf8_lossy(bytes.as_bytes()).into_owned()),
        payload: item.payload,
        measures: item.measures.into_iter().collect(),
        deadline: item.deadline_ms.map(timestamp),
        requeue_count: item.requeue_count,
    }
}

/// Converts a batch for the wire.
pub fn batch_to_pb(batch: &batch::Batch, cursor: String, delivery_count: u32) -> pb::Batch {
    batch_into_pb(batch.clone(), cursor, delivery_count)
}

/// Converts a batch for the wire, moving its key and items.
pub fn batch_into_pb(batch: batch::Batch, cursor: String, delivery_count: u32) -> pb::Batch {
    pb::Batch {
        id: batch.id(),
        trace_context: crate::telemetry::traceparent(&batch),
        reason: reason_to_pb(batch.reason) as i32,
        opened_at: Some(timestamp(batch.opened_at_ms)),
        flushed_at: Some(timestamp(batch.flushed_at_ms)),
        cursor,
        delivery_count,
        key: batch.key,
        items: batch.items.into_iter().map(item_to_pb).collect(),
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
        max_wait: Some(duration(group.max_wait)),
        max_bytes: policy.max_bytes.unwrap_or(0),
        items: group.items.into_iter().map(item_to_pb).collect(),
        measures: group.measures.into_iter().collect(),
        capacity: policy
            .capacity
            .iter()
            .map(|(name, cap)| (name.clone(), *cap))
            .collect(),
        last_added_at: Some(timestamp(group.last_added_ms)),
        due_reason: reason_to_pb(group.due_reason) as i32,
        key: group.key,
    }
}

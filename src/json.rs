//! The protobuf JSON mapping of the API's messages (field names in
//! lowerCamelCase, enums by name, timestamps as RFC 3339, 64-bit integers as
//! strings), for the CLI's `--json` and the web view's JSON API, so both
//! speak exactly what gRPC-JSON clients such as grpcurl speak.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

use crate::pb;

/// The descriptors of `batcher.v1`, decoded once.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("the compiled-in descriptors decode")
});

/// `message` in the protobuf JSON mapping. Fields at their default value are
/// left out, as the mapping says.
pub fn to_json<M: prost::Name>(message: &M) -> serde_json::Value {
    let descriptor = POOL
        .get_message_by_name(&M::full_name())
        .expect("every batcher.v1 message has a descriptor");
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .expect("a message decodes as its own type");
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new())
        .expect("a message serializes to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field names, enums, maps and timestamps follow the JSON mapping.
    #[test]
    fn a_batch_in_the_json_mapping() {
        let batch = pb::Batch {
            id: "3-1700000000000-0".into(),
            key: "north".into(),
            items: vec![pb::Item {
                id: "parcel-1".into(),
                payload: b"{}".to_vec(),
                measures: [("weight_g".to_string(), 1200)].into(),
                ..Default::default()
            }],
            reason: pb::FlushReason::Capacity as i32,
            flushed_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            ..Default::default()
        };
        let json = to_json(&batch);
        assert_eq!(json["reason"], "FLUSH_REASON_CAPACITY");
        assert_eq!(json["flushedAt"], "2023-11-14T22:13:20Z");
        assert_eq!(json["items"][0]["id"], "parcel-1");
        assert_eq!(json["items"][0]["payload"], "e30=");
        assert_eq!(json["items"][0]["measures"]["weight_g"], "1200");
        assert!(json.get("cursor").is_none(), "defaults are left out");
    }
}

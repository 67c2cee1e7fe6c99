//! How Redis replies become our types. redis-rs decodes the nested parts
//! (tuples, `Vec`, `Option`, its stream reply types); the impls here only put
//! them together, so nothing in the store walks a reply by hand.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use redis::streams;
use redis::{FromRedisValue, ParsingError, Value, from_redis_value};

use super::ext;
use crate::batch::{Batch, DecodeError, FlushReason, Group, Item, StreamId, decode_items};

impl From<DecodeError> for ParsingError {
    fn from(err: DecodeError) -> ParsingError {
        err.0.into()
    }
}

impl From<ParsingError> for DecodeError {
    fn from(err: ParsingError) -> DecodeError {
        DecodeError(err.to_string())
    }
}

impl FromRedisValue for StreamId {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(from_redis_value::<String>(v)?.parse()?)
    }
}

impl FromRedisValue for FlushReason {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(from_redis_value::<String>(v)?.parse()?)
    }
}

/// A batch as the scripts return it: `{stream_id, reason, opened, flushed, n,
/// items, x, names}`. The caller knows its shard and key.
pub(super) struct ScriptBatch {
    stream_id: StreamId,
    reason: FlushReason,
    opened_at_ms: u64,
    flushed_at_ms: u64,
    items: Vec<Item>,
}

impl ScriptBatch {
    pub(super) fn into_batch(self, shard: u16, key: &str) -> Batch {
        Batch {
            shard,
            stream_id: self.stream_id,
            key: key.to_owned(),
            items: self.items,
            reason: self.reason,
            opened_at_ms: self.opened_at_ms,
            flushed_at_ms: self.flushed_at_ms,
            origin: None,
            for_group: None,
        }
    }
}

/// The parts of a script's batch, in reply order.
type ScriptBatchParts = (
    StreamId,
    FlushReason,
    u64,
    u64,
    usize,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
);

impl FromRedisValue for ScriptBatch {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (stream_id, reason, opened_at_ms, flushed_at_ms, count, blob, x, names): ScriptBatchParts =
            from_redis_value(v)?;
        let mut items = decode_items(&blob, count)?;
        ext::decode_all(&x, &ext::names_of(&names), &mut items)?;
        Ok(ScriptBatch {
            stream_id,
            reason,
            opened_at_ms,
            flushed_at_ms,
            items,
        })
    }
}

/// What the add function did with one item (see `src/lua/add_call.lua`).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ItemReply {
    Added,
    Duplicate,
    /// Refused by a limit on open groups: the shard's (false) or its
    /// policy's (true).
    Refused {
        by_policy: bool,
    },
    /// Waiting for room under a limit on open groups, the shard's or its
    /// policy's: for the call's group to flush number `room` (from 1; 0 for none).
    Waiting {
        by_policy: bool,
        room: usize,
    },
}

/// A group the add function names to flush to make room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Room {
    pub key: String,
}

/// The add function's reply, flat: `{earliest due set or 0, then per
/// item: outcome, size (or limit, or room number), batches or false; then
/// the keys of the groups to flush to make room}`, or, from a call that
/// wrote no batch and names no group, the same numbers packed: little-endian
/// doubles, the earliest due time, then per item its outcome and size.
/// Where the items end is the caller's to say ([`AddReply::split`]): the
/// call knows how many it sent.
pub(super) struct AddReply {
    /// The earliest due time among the groups whose due time the call set.
    pub earliest: Option<u64>,
    rest: Rest,
}

/// The part of an add function's reply after the earliest due time.
enum Rest {
    Flat(Vec<Value>),
    /// Outcome and size per item.
    Packed(Vec<f64>),
}

/// One item's reply: what it did, the group's size after, and the batches
/// it wrote.
pub(super) type ItemParts = (ItemReply, u32, Option<Vec<ScriptBatch>>);

impl AddReply {
    /// The replies of the call's `count` items, and the groups to flush to
    /// make room.
    pub fn split(self, count: usize) -> Result<(Vec<ItemParts>, Vec<Room>), ParsingError> {
        let mut items = Vec::with_capacity(count);
        let parts = match self.rest {
            Rest::Packed(numbers) => {
                if numbers.len() != 2 * count {
                    return Err("the add function's packed result count".into());
                }
                for pair in numbers.chunks_exact(2) {
                    let (outcome, size) = item_reply(pair[0] as i64, pair[1] as u32)?;
                    items.push((outcome, size, None));
                }
                return Ok((items, Vec::new()));
            }
            Rest::Flat(parts) if parts.len() >= 3 * count => parts,
            Rest::Flat(_) => return Err("the add function's result count".into()),
        };
        let mut parts = parts.into_iter();
        for _ in 0..count {
            let code: i64 = next_part(&mut parts, "an outcome")?;
            let n: u32 = next_part(&mut parts, "a group size")?;
            let (outcome, size) = item_reply(code, n)?;
            items.push((outcome, size, next_part(&mut parts, "its batches")?));
        }
        let rooms = parts
            .map(|key| from_redis_value(key).map(|key| Room { key }))
            .collect::<Result<_, _>>()?;
        Ok((items, rooms))
    }
}

/// An item's outcome and its group's size, from its code and number.
fn item_reply(code: i64, n: u32) -> Result<(ItemReply, u32), ParsingError> {
    let outcome = match code {
        1 => ItemReply::Added,
        2 => ItemReply::Duplicate,
        3 => ItemReply::Refused { by_policy: n == 2 },
        4 | 5 => ItemReply::Waiting {
            by_policy: code == 5,
            room: n as usize,
        },
        other => return Err(format!("add outcome {other}").into()),
    };
    Ok((outcome, if code <= 2 { n } else { 0 }))
}

impl FromRedisValue for AddReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        if let Value::BulkString(bytes) = v {
            if bytes.len() % 8 != 0 {
                return Err("a packed add reply of a partial number".into());
            }
            let numbers: Vec<f64> = bytes
                .chunks_exact(8)
                .map(|d| f64::from_le_bytes(d.try_into().expect("8 bytes")))
                .collect();
            let Some((&earliest, rest)) = numbers.split_first() else {
                return Err("an empty packed add reply".into());
            };
            return Ok(AddReply {
                earliest: (earliest > 0.0).then_some(earliest as u64),
                rest: Rest::Packed(rest.to_vec()),
            });
        }
        let mut parts = from_redis_value::<Vec<Value>>(v)?.into_iter();
        let earliest: u64 = next_part(&mut parts, "the earliest due time")?;
        Ok(AddReply {
            earliest: (earliest > 0).then_some(earliest),
            rest: Rest::Flat(parts.collect()),
        })
    }
}

/// Takes the next part of a flat reply.
fn next_part<T: FromRedisValue>(
    parts: &mut impl Iterator<Item = Value>,
    what: &str,
) -> Result<T, ParsingError> {
    from_redis_value(parts.next().ok_or_else(|| format!("reply lacks {what}"))?)
}

/// What one sweep step saw in a shard.
#[derive(Debug)]
pub struct DueScan {
    /// Redis's clock at the scan (ms).
    pub now_ms: u64,
    /// The earliest due time of a group not yet due.
    pub next_due_ms: Option<u64>,
    /// Keys of the groups that are due, soonest first.
    pub keys: Vec<String>,
    /// Keys of the groups due at `next_due_ms`.
    pub next_keys: Vec<String>,
}

impl FromRedisValue for DueScan {
    /// The due scan's reply: `{now, earliest due not yet due or -1, count,
    /// count due keys, keys due next...}`.
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let mut parts = from_redis_value::<Vec<Value>>(v)?.into_iter();
        let now_ms = next_part(&mut parts, "now")?;
        let next_due: i64 = next_part(&mut parts, "next due")?;
        let count: usize = next_part(&mut parts, "due count")?;
        let mut keys: Vec<String> = parts.map(from_redis_value).collect::<Result<_, _>>()?;
        let next_keys = keys.split_off(count.min(keys.len()));
        Ok(DueScan {
            now_ms,
            next_due_ms: u64::try_from(next_due).ok(),
            keys,
            next_keys,
        })
    }
}

/// The library's `group` reply: `{}` when the group is not open, else
/// `{opened, due, reason, size, bytes, last arrival, max_wait, names,
/// {sums}, {id, payload, ext, ...}}` (see `src/lua/groups.lua`). The key
/// is the caller's to fill in.
pub(super) struct GroupReply(pub Option<Group>);

/// The parts of a `group` reply, in order.
type GroupParts = (
    u64,
    u64,
    FlushReason,
    u32,
    u64,
    u64,
    u64,
    Vec<u8>,
    Vec<u64>,
    Vec<Vec<u8>>,
);

impl FromRedisValue for GroupReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let parts: Vec<Value> = from_redis_value(v)?;
        if parts.is_empty() {
            return Ok(GroupReply(None));
        }
        let (opened, due, reason, size, bytes, last, max_wait, names, sums, flat): GroupParts =
            from_redis_value(Value::Array(parts))?;
        let names = ext::names_of(&names);
        let mut measures: BTreeMap<String, u64> = names.iter().cloned().zip(sums).collect();
        let mut items = Vec::with_capacity(flat.len() / 3);
        for part in flat.chunks_exact(3) {
            let mut item = Item::new(&part[0][..], part[1].clone());
            ext::parse(&part[2], &names, &mut item)?;
            items.push(item);
        }
        if !items.is_empty() {
            // Every measure's sum, not only the capacity's that the group keeps.
            measures.clear();
            for item in &items {
                for (name, value) in &item.measures {
                    *measures.entry(name.clone()).or_default() += value;
                }
            }
        }
        Ok(GroupReply(Some(Group {
            key: String::new(),
            size,
            bytes,
            opened_at_ms: opened,
            due_at_ms: due,
            due_reason: reason,
            last_added_ms: last,
            max_wait: Duration::from_millis(max_wait),
            measures,
            items,
        })))
    }
}

/// A batch as a stream entry holds it: fields `key`, `reason`, `opened`,
/// `flushed`, `n`, `items`, when its items carry exts `x` and (if its group
/// had a capacity) `names`, and on a re-driven copy `origin` and `for_group`.
pub(super) fn batch_from_entry(
    shard: u16,
    entry: streams::StreamId,
) -> Result<Batch, ParsingError> {
    let streams::StreamId { id, mut map, .. } = entry;
    let mut field = |name: &str| {
        map.remove(name)
            .ok_or_else(|| ParsingError::from(format!("stream entry {id} lacks {name:?}")))
    };
    let count: usize = from_redis_value(field("n")?)?;
    let blob: Vec<u8> = from_redis_value(field("items")?)?;
    let mut items = decode_items(&blob, count)?;
    if let Ok(x) = field("x") {
        let names: Vec<u8> = field("names").map_or(Ok(Vec::new()), from_redis_value)?;
        let x: Vec<u8> = from_redis_value(x)?;
        ext::decode_all(&x, &ext::names_of(&names), &mut items)?;
    }
    Ok(Batch {
        shard,
        key: from_redis_value(field("key")?)?,
        reason: from_redis_value(field("reason")?)?,
        opened_at_ms: from_redis_value(field("opened")?)?,
        flushed_at_ms: from_redis_value(field("flushed")?)?,
        items,
        origin: field("origin").ok().map(from_redis_value).transpose()?,
        for_group: field("for_group").ok().map(from_redis_value).transpose()?,
        stream_id: id.parse()?,
    })
}

/// The batches of stream entries.
pub(super) fn batches_from_entries(
    shard: u16,
    entries: Vec<streams::StreamId>,
) -> Result<Vec<Batch>, DecodeError> {
    entries
        .into_iter()
        .map(|entry| Ok(batch_from_entry(shard, entry)?))
        .collect()
}

/// The batches of an XREAD or XREADGROUP reply for one stream (`None` when
/// a blocking read timed out).
pub(super) fn batches_from_read(
    shard: u16,
    reply: Option<streams::StreamReadReply>,
) -> Result<Vec<Batch>, DecodeError> {
    let entries = reply
        .into_iter()
        .flat_map(|reply| reply.keys)
        .flat_map(|key| key.ids)
        .collect();
    batches_from_entries(shard, entries)
}

/// One entry of the claim script's reply: `{entry id, fields, delivery count}`.
pub(super) struct Claimed {
    pub entry: streams::StreamId,
    pub deliveries: u32,
}

impl FromRedisValue for Claimed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (id, map, deliveries): (String, HashMap<String, Value>, u32) = from_redis_value(v)?;
        Ok(Claimed {
            entry: streams::StreamId {
                id,
                map,
                ..Default::default()
            },
            deliveries,
        })
    }
}

//! How Redis replies become our types. redis-rs decodes the nested parts
//! (tuples, `Vec`, `Option`, its stream reply types); the impls here only put
//! them together, so nothing in the store walks a reply by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value, from_redis_value};

use super::ext;
use crate::batch::{Batch, DecodeError, FlushReason, Group, Item, StreamId, take};
use crate::scripts::layout::Field;

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

/// A batch as the scripts return it: `{stream_id, fields}`, the fields
/// its stream entry holds. The caller knows its shard.
pub(super) struct ScriptBatch(Batch);

impl ScriptBatch {
    pub(super) fn into_batch(self, shard: u16) -> Batch {
        Batch { shard, ..self.0 }
    }
}

impl FromRedisValue for ScriptBatch {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        Ok(ScriptBatch(batch_from_entry(0, from_redis_value(v)?)?))
    }
}

/// Takes the next part of a flat reply.
pub(super) fn next_part<T: FromRedisValue>(
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

/// A stream entry as Redis gives it: its id and its fields, name and value
/// in turn (none for an entry trimmed away).
pub(super) struct Entry {
    id: String,
    fields: Vec<Vec<u8>>,
}

impl FromRedisValue for Entry {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (id, fields): (String, Option<Vec<Vec<u8>>>) = from_redis_value(v)?;
        Ok(Entry {
            id,
            fields: fields.unwrap_or_default(),
        })
    }
}

/// An XREAD or XREADGROUP reply for one stream: its entries (none when a
/// blocking read timed out).
pub(super) struct ReadReply(Vec<Entry>);

impl FromRedisValue for ReadReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let streams: Vec<Value> = match v {
            Value::Nil => Vec::new(),
            Value::Map(pairs) => pairs.into_iter().map(|(_, entries)| entries).collect(),
            other => from_redis_value::<Vec<(Value, Value)>>(other)?
                .into_iter()
                .map(|(_, entries)| entries)
                .collect(),
        };
        let mut entries = Vec::new();
        for stream in streams {
            entries.extend(from_redis_value::<Vec<Entry>>(stream)?);
        }
        Ok(ReadReply(entries))
    }
}

/// The last entry id a stream ever generated, from its `XINFO STREAM`
/// reply (whose first and last entries, batches, it does not read).
pub(super) struct LastGenerated(pub StreamId);

impl FromRedisValue for LastGenerated {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let pairs: Vec<(Value, Value)> = match v {
            Value::Map(pairs) => pairs,
            other => from_redis_value(other)?,
        };
        for (name, value) in pairs {
            if from_redis_value::<String>(name).is_ok_and(|n| n == "last-generated-id") {
                return Ok(LastGenerated(from_redis_value(value)?));
            }
        }
        Err("XINFO STREAM lacks last-generated-id".into())
    }
}

/// A batch as its stream entry holds it ([`crate::scripts::layout`]): its
/// own fields ([`Field`]) and its items, in any order, or packed in one
/// field. The items are put in arrival order by sequence number.
pub(super) fn batch_from_entry(shard: u16, entry: Entry) -> Result<Batch, ParsingError> {
    let Entry { id, fields } = entry;
    let bad = |what: &str| ParsingError::from(format!("stream entry {id}: {what}"));
    if fields.len() % 2 != 0 {
        return Err(bad("an odd number of fields"));
    }
    let mut own: [Option<Vec<u8>>; Field::ALL.len()] = Default::default();
    let mut raw: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(fields.len() / 2);
    let mut fields = fields.into_iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        match name[..] {
            [byte] if byte >= 128 => {
                if let Some(slot) = own.get_mut(usize::from(byte - 128)) {
                    *slot = Some(value);
                }
            }
            _ => raw.push((name, value)),
        }
    }
    let mut take_optional = |field: Field| own[usize::from(field.byte() - 128)].take();
    let mut take_own = |field: Field, what: &str| {
        take_optional(field).ok_or_else(|| bad(&format!("lacks its {what}")))
    };
    let text = |bytes: Vec<u8>, what: &str| {
        String::from_utf8(bytes).map_err(|_| bad(&format!("its {what} is not UTF-8")))
    };
    let number = |bytes: Vec<u8>, what: &str| -> Result<u64, ParsingError> {
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| bad(&format!("its {what} is not a number")))
    };
    let key = text(take_own(Field::Key, "key")?, "key")?;
    let reason: FlushReason = text(take_own(Field::Reason, "reason")?, "reason")?.parse()?;
    let opened_at_ms = number(take_own(Field::Opened, "opening time")?, "opening time")?;
    let flushed_at_ms = number(take_own(Field::Flushed, "flush time")?, "flush time")?;
    let names = ext::names_of(&take_optional(Field::Names).unwrap_or_default());
    let for_group = take_optional(Field::ForGroup)
        .map(|g| text(g, "consumer group"))
        .transpose()?;
    let origin = take_optional(Field::Origin)
        .map(|o| text(o, "origin")?.parse().map_err(ParsingError::from))
        .transpose()?;
    if let Some(packed) = take_optional(Field::Packed) {
        let mut blob = &packed[..];
        while !blob.is_empty() {
            let item_id = take(&mut blob, "packed items")?.to_vec();
            raw.push((item_id, take(&mut blob, "packed items")?.to_vec()));
        }
    }
    let mut items = Vec::with_capacity(raw.len());
    for (item_id, value) in raw {
        let (seq, item) = item_of(item_id, value, &names)?;
        items.push((seq, item));
    }
    items.sort_unstable_by_key(|(seq, _)| *seq);
    Ok(Batch {
        shard,
        key,
        reason,
        opened_at_ms,
        flushed_at_ms,
        items: items.into_iter().map(|(_, item)| item).collect(),
        origin,
        for_group,
        stream_id: id.parse()?,
    })
}

/// An item from its id and its value in a group's hash: an ext (`+`, a byte
/// 1 + k, 8 (1 + k) bytes, text and `|`, or none), its sequence number, `,`
/// and its payload.
fn item_of(id: Vec<u8>, mut value: Vec<u8>, names: &[String]) -> Result<(u64, Item), DecodeError> {
    let bad = || {
        DecodeError(format!(
            "item {:?}: a bad value",
            String::from_utf8_lossy(&id)
        ))
    };
    let ext_len = match value[..] {
        [b'+', k, ..] => {
            let from = 2 + 8 * usize::from(k);
            let bar = value
                .get(from..)
                .and_then(|rest| rest.iter().position(|b| *b == b'|'));
            from + bar.ok_or_else(bad)? + 1
        }
        _ => 0,
    };
    let (ext, rest) = value.split_at(ext_len);
    let comma = rest.iter().position(|b| *b == b',').ok_or_else(bad)?;
    let seq = std::str::from_utf8(&rest[..comma])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(bad)?;
    let mut item = Item::new(id, Vec::new());
    ext::parse(ext, names, &mut item)?;
    // The payload is what follows the comma, moved to the front in place.
    value.drain(..ext_len + comma + 1);
    item.payload = value;
    Ok((seq, item))
}

/// The batches of stream entries.
pub(super) fn batches_from_entries(
    shard: u16,
    entries: Vec<Entry>,
) -> Result<Vec<Batch>, DecodeError> {
    entries
        .into_iter()
        .map(|entry| Ok(batch_from_entry(shard, entry)?))
        .collect()
}

/// The batches of an XREAD or XREADGROUP reply for one stream.
pub(super) fn batches_from_read(shard: u16, reply: ReadReply) -> Result<Vec<Batch>, DecodeError> {
    batches_from_entries(shard, reply.0)
}

/// One entry of the claim script's reply: `{entry id, fields, delivery count}`.
pub(super) struct Claimed {
    pub entry: Entry,
    pub deliveries: u32,
}

impl FromRedisValue for Claimed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let (id, fields, deliveries): (String, Vec<Vec<u8>>, u32) = from_redis_value(v)?;
        Ok(Claimed {
            entry: Entry { id, fields },
            deliveries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[&[u8]]) -> Entry {
        Entry {
            id: "5-1".into(),
            fields: fields.iter().map(|f| f.to_vec()).collect(),
        }
    }

    /// A batch's entry gives its items in sequence order whatever their
    /// order in it, binary payloads with ',' and ':' whole, skips fields of
    /// its own it does not know, and names what it lacks.
    #[test]
    fn reads_items_by_sequence_number() {
        let fields: [&[u8]; 14] = [
            b"b",
            b"12,x,y:z",
            b"\x80",
            b"100",
            b"a",
            b"3,\x00\xff",
            b"\x86",
            b"TIMEOUT",
            b"\x8f",
            b"later",
            b"\x87",
            b"200",
            b"\x85",
            b"north",
        ];
        let batch = batch_from_entry(3, entry(&fields)).unwrap();
        assert_eq!((batch.shard, batch.key.as_str()), (3, "north"));
        assert_eq!((batch.opened_at_ms, batch.flushed_at_ms), (100, 200));
        assert_eq!(batch.reason, FlushReason::Timeout);
        let items: Vec<_> = batch
            .items
            .iter()
            .map(|i| (&i.id[..], &i.payload[..]))
            .collect();
        assert_eq!(items, [(&b"a"[..], &b"\x00\xff"[..]), (b"b", b"x,y:z")]);
        assert_eq!((batch.origin, batch.for_group), (None, None));

        let lacking = batch_from_entry(3, entry(&fields[..12])).err().unwrap();
        assert!(lacking.to_string().contains("lacks its key"), "{lacking}");
        let mut bad = fields;
        bad[1] = b"x,y";
        assert!(batch_from_entry(3, entry(&bad)).is_err());
    }

    /// Packed items, an item's ext with its measures, and a redriven
    /// copy's group and origin all come back.
    #[test]
    fn reads_packed_items_exts_and_copies() {
        let mut value = vec![b'+', 2];
        value.extend(0f64.to_le_bytes());
        value.extend(7f64.to_le_bytes());
        value.extend(b"r2|2,p:2");
        let mut packed = b"3:id12:9,".to_vec();
        packed.extend(format!("3:id2{}:", value.len()).as_bytes());
        packed.extend(&value);
        let batch = batch_from_entry(
            0,
            entry(&[
                b"\x8a", &packed, b"\x80", b"1", b"\x83", b"kg", b"\x86", b"SIZE", b"\x87", b"2",
                b"\x85", b"k", b"\x88", b"audit", b"\x89", b"4-0",
            ]),
        )
        .unwrap();
        let ids: Vec<_> = batch.items.iter().map(|i| &i.id[..]).collect();
        assert_eq!(ids, [&b"id2"[..], b"id1"]);
        assert_eq!(
            (&batch.items[0].payload[..], &batch.items[1].payload[..]),
            (&b"p:2"[..], &b""[..])
        );
        assert_eq!(batch.items[0].measures.get("kg"), Some(&7));
        assert_eq!(batch.items[0].requeue_count, 2);
        assert_eq!(batch.for_group.as_deref(), Some("audit"));
        assert_eq!(batch.origin.map(|o| o.to_string()).as_deref(), Some("4-0"));
    }
}

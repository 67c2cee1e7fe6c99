//! The add function's reply (see `src/lua/add_call.lua`): each item's
//! outcome and group size, packed, the batches written, by item, and the
//! groups to flush to make room.

use redis::{FromRedisValue, ParsingError, Value, from_redis_value};

use crate::scripts::codes::{Limit, Outcome};
use crate::store::decode::{ScriptBatch, next_part};

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

/// The add function's reply: little-endian doubles, packed, the earliest
/// due time and then per item its outcome and size; from a call that
/// wrote batches or names groups to flush, in a list with them: `{numbers,
/// W, then W pairs of an item's number (from 1) and the batches it wrote,
/// then the keys of the groups to flush to make room}`. Where the items
/// end is the caller's to say ([`AddReply::split`]): the call knows how
/// many it sent.
pub(super) struct AddReply {
    /// The earliest due time among the groups whose due time the call set.
    pub earliest: Option<u64>,
    /// Outcome and size per item.
    numbers: Vec<f64>,
    /// The batches written, by item (from 1).
    wrote: Vec<(usize, Vec<ScriptBatch>)>,
    rooms: Vec<Room>,
}

/// One item's reply: what it did, the group's size after, and the batches
/// it wrote.
pub(super) type ItemParts = (ItemReply, u32, Option<Vec<ScriptBatch>>);

impl AddReply {
    /// The replies of the call's `count` items, and the groups to flush to
    /// make room.
    pub fn split(self, count: usize) -> Result<(Vec<ItemParts>, Vec<Room>), ParsingError> {
        if self.numbers.len() != 2 * count {
            return Err("the add function's result count".into());
        }
        let mut items = Vec::with_capacity(count);
        for pair in self.numbers.chunks_exact(2) {
            let (outcome, size) = item_reply(pair[0], pair[1])?;
            items.push((outcome, size, None));
        }
        for (at, batches) in self.wrote {
            let Some(item) = at.checked_sub(1).and_then(|at| items.get_mut(at)) else {
                return Err(format!("batches of item {at} of {count}").into());
            };
            item.2 = Some(batches);
        }
        Ok((items, self.rooms))
    }
}

/// An item's outcome and its group's size, from its code and number (see
/// [`Outcome`]).
fn item_reply(code: f64, n: f64) -> Result<(ItemReply, u32), ParsingError> {
    let outcome = Outcome::from_code(code).ok_or_else(|| format!("add outcome {code}"))?;
    let reply = match outcome {
        Outcome::Added => ItemReply::Added,
        Outcome::Duplicate => ItemReply::Duplicate,
        Outcome::Refused => {
            let limit = Limit::from_code(n).ok_or_else(|| format!("open-group limit {n}"))?;
            ItemReply::Refused {
                by_policy: limit == Limit::Policy,
            }
        }
        Outcome::WaitingShard | Outcome::WaitingPolicy => ItemReply::Waiting {
            by_policy: outcome == Outcome::WaitingPolicy,
            room: n as usize,
        },
    };
    let size = match outcome {
        Outcome::Added | Outcome::Duplicate => n as u32,
        _ => 0,
    };
    Ok((reply, size))
}

/// The numbers of a packed add reply: the earliest due time, and the rest.
fn add_numbers(bytes: &[u8]) -> Result<(Option<u64>, Vec<f64>), ParsingError> {
    if !bytes.len().is_multiple_of(8) {
        return Err("a packed add reply of a partial number".into());
    }
    let mut numbers = bytes
        .chunks_exact(8)
        .map(|d| f64::from_le_bytes(d.try_into().expect("8 bytes")));
    let Some(earliest) = numbers.next() else {
        return Err("an empty packed add reply".into());
    };
    Ok((
        (earliest > 0.0).then_some(earliest as u64),
        numbers.collect(),
    ))
}

impl FromRedisValue for AddReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        if let Value::BulkString(bytes) = v {
            let (earliest, numbers) = add_numbers(&bytes)?;
            return Ok(AddReply {
                earliest,
                numbers,
                wrote: Vec::new(),
                rooms: Vec::new(),
            });
        }
        let mut parts = from_redis_value::<Vec<Value>>(v)?.into_iter();
        let bytes: Vec<u8> = next_part(&mut parts, "the numbers")?;
        let (earliest, numbers) = add_numbers(&bytes)?;
        let pairs: usize = next_part(&mut parts, "the count of items that wrote batches")?;
        let mut wrote = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            let at: usize = next_part(&mut parts, "an item's number")?;
            wrote.push((at, next_part(&mut parts, "its batches")?));
        }
        let rooms = parts
            .map(|key| from_redis_value(key).map(|key| Room { key }))
            .collect::<Result<_, _>>()?;
        Ok(AddReply {
            earliest,
            numbers,
            wrote,
            rooms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An add reply gives each item its outcome and size from the packed
    /// numbers, the batches to the item that wrote them, and the groups to
    /// flush after them; a bare string of numbers is a reply without either.
    #[test]
    fn reads_add_replies() {
        let numbers = |xs: &[f64]| -> Value {
            Value::BulkString(xs.iter().flat_map(|x| x.to_le_bytes()).collect())
        };
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let fields = [
            &b"a"[..],
            b"1,p",
            b"\x80",
            b"10",
            b"\x85",
            b"north",
            b"\x86",
            b"SIZE",
            b"\x87",
            b"20",
        ];
        let batch = Value::Array(vec![
            bulk(b"7-0"),
            Value::Array(fields.iter().map(|f| bulk(f)).collect()),
        ]);
        let reply = Value::Array(vec![
            numbers(&[42.0, 2.0, 3.0, 1.0, 0.0, 4.0, 1.0]),
            Value::Int(1),
            Value::Int(2),
            Value::Array(vec![batch]),
            bulk(b"south"),
        ]);
        let reply = AddReply::from_redis_value(reply).unwrap();
        assert_eq!(reply.earliest, Some(42));
        let (mut items, rooms) = reply.split(3).unwrap();
        assert_eq!(items[0].0, ItemReply::Duplicate);
        assert_eq!(items[0].1, 3);
        assert!(items[0].2.is_none() && items[2].2.is_none());
        let flushed = items[1].2.take().unwrap();
        assert_eq!(flushed.len(), 1);
        let batch = flushed.into_iter().next().unwrap().into_batch(0);
        assert_eq!(batch.key, "north");
        assert_eq!(
            items[2].0,
            ItemReply::Waiting {
                by_policy: false,
                room: 1
            }
        );
        assert_eq!(
            rooms,
            vec![Room {
                key: "south".into()
            }]
        );

        let bare = AddReply::from_redis_value(numbers(&[0.0, 1.0, 5.0])).unwrap();
        assert_eq!(bare.earliest, None);
        let (items, rooms) = bare.split(1).unwrap();
        assert_eq!(items[0].0, ItemReply::Added);
        assert_eq!(items[0].1, 5);
        assert!(rooms.is_empty());
        assert!(
            AddReply::from_redis_value(numbers(&[0.0, 1.0, 5.0]))
                .unwrap()
                .split(2)
                .is_err()
        );
    }
}

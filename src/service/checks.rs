//! Validation of request fields that no protobuf type expresses; every
//! refusal names the field.

use std::collections::BTreeMap;
use std::fmt::Display;

use bytesize::ByteSize;

use super::{BatcherService, DEFAULT_PAGE_SIZE, MAX_NAME_BYTES, MAX_PAGE_SIZE};
use crate::batch;
use crate::error::{Error, invalid};
use crate::policy::{MAX_MEASURE, Policy};
use crate::store::DeadLetterPosition;

impl BatcherService {
    pub(super) fn check_name(&self, field: &str, name: &str) -> Result<(), Error> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if ok {
            Ok(())
        } else {
            Err(invalid(
                field,
                format!("must be 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 _ - ."),
            ))
        }
    }

    /// Parses batch ids of this service's shards.
    pub(super) fn batch_ids(&self, ids: &[String]) -> Result<Vec<(u16, batch::StreamId)>, Error> {
        let shards = self.store.keyspace().shards();
        ids.iter()
            .enumerate()
            .map(|(i, id)| {
                batch::Batch::parse_id(id)
                    .filter(|(shard, _)| *shard < shards)
                    .ok_or_else(|| invalid(format!("batch_ids[{i}]"), "is not a batch id"))
            })
            .collect()
    }

    pub(super) fn check_key(&self, field: impl Display, key: &str) -> Result<(), Error> {
        check_required_size(field, key.len(), self.limits.max_key_bytes)
    }

    pub(super) fn check_id(&self, field: impl Display, id: &str) -> Result<(), Error> {
        check_required_size(field, id.len(), self.limits.max_item_id_bytes)
    }

    /// Checks the consumer group an Ack or Redrive names, and parses its batch ids.
    pub(super) fn group_batch_ids(
        &self,
        group: &str,
        ids: &[String],
    ) -> Result<Vec<(u16, batch::StreamId)>, Error> {
        self.check_name("consumer_group", group)?;
        self.batch_ids(ids)
    }
}

/// Refuses a value of `len` bytes when that is more than `limit`. The
/// field's name is written only for an error (an add's names are
/// `format_args!` of its place in the request).
pub(super) fn check_size(field: impl Display, len: usize, limit: ByteSize) -> Result<(), Error> {
    if len as u64 > limit.as_u64() {
        return Err(invalid(
            field.to_string(),
            format!("is {len} bytes, more than the limit of {}", limit.as_u64()),
        ));
    }
    Ok(())
}

/// Refuses an empty value, or one of more than `limit` bytes.
pub(super) fn check_required_size(
    field: impl Display,
    len: usize,
    limit: ByteSize,
) -> Result<(), Error> {
    if len == 0 {
        return Err(invalid(field.to_string(), "must not be empty"));
    }
    check_size(field, len, limit)
}

/// Checks an item's measures (`field` is `...item.measures`): names as
/// config names them, values that the scripts sum exactly, and none that
/// alone exceeds the key's capacity.
pub(super) fn measures(
    field: impl Display,
    measures: std::collections::HashMap<String, u64>,
    policy: &Policy,
) -> Result<BTreeMap<String, u64>, Error> {
    let mut checked = BTreeMap::new();
    for (name, value) in measures {
        let at = || format!("{field}[{name:?}]");
        if !crate::policy::measure_name_ok(&name) {
            return Err(invalid(
                at(),
                "must be named by 1 to 64 of A-Z a-z 0-9 _ - .",
            ));
        }
        if value > MAX_MEASURE {
            return Err(invalid(
                at(),
                format!("must be at most {MAX_MEASURE}, got {value}"),
            ));
        }
        if let Some(&cap) = policy.capacity.get(&name)
            && value > cap
        {
            return Err(invalid(
                at(),
                format!("is {value}, more than the key's capacity of {cap}: it can never fit"),
            ));
        }
        checked.insert(name, value);
    }
    Ok(checked)
}

/// A timestamp as ms since the Unix epoch; refuses one before the epoch or
/// with nanos out of range.
pub(super) fn timestamp_ms(field: impl Display, at: prost_types::Timestamp) -> Result<u64, Error> {
    if at.seconds < 0 || !(0..1_000_000_000).contains(&at.nanos) {
        return Err(invalid(
            field.to_string(),
            "must be a valid time after 1970-01-01T00:00:00Z",
        ));
    }
    Ok(at.seconds as u64 * 1000 + at.nanos as u64 / 1_000_000)
}

/// A listing's `page_size` (AIP-158): 0 means the default, more than the
/// maximum means the maximum, and a negative size is refused.
pub(super) fn page_size(size: i32) -> Result<usize, Error> {
    match size {
        0 => Ok(DEFAULT_PAGE_SIZE as usize),
        n if n < 0 => Err(invalid("page_size", "must not be negative")),
        n => Ok(n.min(MAX_PAGE_SIZE) as usize),
    }
}

/// The position a listing's `page_token` names: none for the first page; a
/// token `parse` cannot read is refused, naming the listing it must come from.
pub(super) fn page_after<T>(
    token: &str,
    parse: fn(&str) -> Option<T>,
    listing: &str,
) -> Result<Option<T>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    let unknown = || invalid("page_token", format!("is not a token from {listing}"));
    parse(token).map(Some).ok_or_else(unknown)
}

/// Encodes a ListGroups position as a page token.
pub(super) fn page_token(due: u64, key: &str) -> String {
    format!("{due}:{key}")
}

pub(super) fn parse_page_token(token: &str) -> Option<(u64, String)> {
    let (due, key) = token.split_once(':')?;
    Some((due.parse().ok()?, key.to_owned()))
}

/// Encodes a ListDeadLetters position as a page token: `<shard>/<entry id>`.
pub(super) fn dead_letter_token((shard, id): DeadLetterPosition) -> String {
    format!("{shard}/{id}")
}

pub(super) fn parse_dead_letter_token(token: &str) -> Option<DeadLetterPosition> {
    let (shard, id) = token.split_once('/')?;
    Some((shard.parse().ok()?, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listing reads a page size of 0 as the default and one over
    /// the maximum as the maximum, and refuses a negative one.
    #[test]
    fn page_sizes_are_defaulted_and_clamped() {
        assert_eq!(page_size(0).unwrap(), DEFAULT_PAGE_SIZE as usize);
        assert_eq!(page_size(7).unwrap(), 7);
        assert_eq!(page_size(5000).unwrap(), MAX_PAGE_SIZE as usize);
        assert_eq!(page_size(i32::MAX).unwrap(), MAX_PAGE_SIZE as usize);
        let err = page_size(-1).unwrap_err().to_string();
        assert_eq!(err, "page_size: must not be negative");
    }
}

//! The data layout, format 4 ([`super::FORMAT`]): the one description of
//! it. The bytes that name fields are defined here, in [`Field`], and the
//! library gets them as the Lua tables `FIELD` and `BATCH` ([`lua`]), so
//! neither side spells a byte of its own. The library's functions are the
//! only code that reads or writes a group's hash; the service reads
//! batches (`store::decode`) and writes items' exts (`store::ext`).
//!
//! # A group
//!
//! One hash per open group (`<tag>:g:<key>`), under its shard's hash tag.
//! Its own fields are single bytes from 128 ([`Field`], Lua `FIELD`), which
//! no item id can be (an id is UTF-8, so a one-byte id is ASCII); every
//! other field is an item:
//!
//! - `OPENED`: opened at (ms, Redis clock), as text.
//! - `STATE`: the counters, struct `'<dddd' .. 'd' * k`: the last
//!   arrival's sequence number, the item count, the payload bytes, the last
//!   arrival (ms), then the sums of the k capacity measures that `NAMES`
//!   names, in its order (no sums: they are summed again from the items
//!   when a capacity needs them).
//! - `RULES`: the due rules besides `max_wait` (absent for a group whose
//!   due time is opened + `max_wait`, which only the due set holds), struct
//!   `'<dddddddd'`: `max_wait`, `max_idle`, the cutoff, `deadline_lead`,
//!   `max_age`, the earliest item deadline, opened and the due time the
//!   rules gave last (all ms, 0 = none).
//! - `NAMES`: the capacity measures that the items' packed values and the
//!   sums follow, joined by `;` (absent: none).
//! - `LIMITS`: when it opened under a limit on open groups: its policy's
//!   scope, NUL, its last arrival as the open-group index has it (absent:
//!   not indexed; `src/lua/limits.lua` describes the index).
//! - an item, the field being its id: its ext, its sequence number, `,`
//!   and its payload.
//!
//! # An item's ext
//!
//! `''`, or, packed by the service (`store::ext`): `+`, a byte
//! 1 + k, then 1 + k little-endian doubles (its deadline in ms or 0, then
//! its value of each measure `NAMES` names, -0 for none; k is 0 or that
//! count), then as text its other measures (`m` name `=` value), its
//! requeue count (`r` n) and its trace context (`t` and 50 hex digits:
//! trace id, span id, flags), joined by `;`, then `|`. The library keeps
//! the text it does not read (`r`, `t`) as it is, in order, through
//! flushes, cuts and re-packing. The values of a group's `STATE`, `RULES`
//! and usual items stay within Redis's compact (listpack) hash encoding: a
//! 32-byte parcel with two measures is a 62-byte value.
//!
//! # The flushed set
//!
//! The shard's flushed set remembers each flushed item for the dedup
//! window: its member is the key, the byte [`FLUSHED_SEPARATOR`] (in no
//! UTF-8 text, so the key ends there) and the id, scored by when the
//! window ends (ms).
//!
//! # A batch
//!
//! A batch in the shard stream is an entry whose fields are its items and
//! its own fields, single bytes from 128 too: `OPENED` and `NAMES` as its
//! group had them (`NAMES` absent when none), and those of Lua's `BATCH`:
//!
//! - `KEY`: the group's key.
//! - `REASON`: the flush reason ([`crate::batch::FlushReason`]).
//! - `FLUSHED`: flushed at (ms, Redis clock), as text.
//! - `FOR_GROUP`, `ORIGIN`: on a copy a redrive queued for one consumer
//!   group (`src/lua/redrive_batches.lua`), that group and the id of the
//!   batch it copies.
//! - `PACKED`: its items packed, for a batch of more items than a call can
//!   pass as fields from a list (2,000): for each, `#id ':' id #value ':'
//!   value`.
//!
//! Every other field is an item, its id and its value as in the group's
//! hash. Readers order the items by sequence number, and ignore any other
//! field of one byte from 128: a batch of a whole group is its hash's
//! fields as `HGETALL` gives them, less `STATE`, `RULES` and `LIMITS`, so
//! no item is copied to write it.

/// A field of a group's hash or of a batch's stream entry that is not an
/// item (see the module docs): a single byte from 128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Field {
    Opened = 128,
    State,
    Rules,
    Names,
    Limits,
    Key,
    Reason,
    Flushed,
    ForGroup,
    Origin,
    Packed,
}

impl Field {
    /// Every field and its name in Lua, in byte order: a group's first
    /// (Lua `FIELD`), then a batch's own (Lua `BATCH`).
    pub const ALL: [(Field, &'static str); 11] = [
        (Field::Opened, "OPENED"),
        (Field::State, "STATE"),
        (Field::Rules, "RULES"),
        (Field::Names, "NAMES"),
        (Field::Limits, "LIMITS"),
        (Field::Key, "KEY"),
        (Field::Reason, "REASON"),
        (Field::Flushed, "FLUSHED"),
        (Field::ForGroup, "FOR_GROUP"),
        (Field::Origin, "ORIGIN"),
        (Field::Packed, "PACKED"),
    ];

    /// Its name: one byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// Whether a group's hash has it (else only a batch does).
    pub(crate) const fn of_group(self) -> bool {
        (self as u8) < Field::Key as u8
    }
}

/// What separates the key from the id in a flushed set's member.
pub const FLUSHED_SEPARATOR: u8 = 255;

/// The layout's bytes as Lua: `FIELD` (a group's fields), `BATCH` (a
/// batch's own besides `OPENED` and `NAMES`) and `SEP` (the flushed set's
/// separator), each byte a decimal escape.
pub fn lua() -> String {
    let table = |name: &str, group: bool| {
        let entries: Vec<String> = Field::ALL
            .iter()
            .filter(|(field, _)| field.of_group() == group)
            .map(|(field, word)| format!("{word} = '\\{}'", field.byte()))
            .collect();
        format!("local {name} = {{ {} }}\n", entries.join(", "))
    };
    format!(
        "{}{}local SEP = '\\{FLUSHED_SEPARATOR}'\n",
        table("FIELD", true),
        table("BATCH", false)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes follow each other from 128, in the table's order, and the
    /// Lua tables give each its byte under its name.
    #[test]
    fn fields_come_from_one_table() {
        for (at, (field, _)) in Field::ALL.iter().enumerate() {
            assert_eq!(usize::from(field.byte()), 128 + at);
        }
        assert_eq!(
            lua(),
            "local FIELD = { OPENED = '\\128', STATE = '\\129', RULES = '\\130', NAMES = '\\131', \
             LIMITS = '\\132' }\n\
             local BATCH = { KEY = '\\133', REASON = '\\134', FLUSHED = '\\135', \
             FOR_GROUP = '\\136', ORIGIN = '\\137', PACKED = '\\138' }\n\
             local SEP = '\\255'\n"
        );
    }
}

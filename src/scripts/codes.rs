//! The numbers the add function and the service share: the order of the
//! doubles of a call's header and of a packed policy, an item's flags, the
//! overflow codes, and the outcome and limit codes of its reply. Each is
//! defined here once; the library gets it as a Lua table of named
//! constants ([`lua`]), and the service writes and reads it through these
//! types, so neither side holds a bare number of the other's.

use crate::policy::Overflow;

/// A Lua table `local NAME = { KEY = value, ... }`.
fn table<'a>(name: &str, entries: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let entries: Vec<String> = entries
        .into_iter()
        .map(|(key, value)| format!("{key} = {value}"))
        .collect();
    format!("local {name} = {{ {} }}\n", entries.join(", "))
}

/// What the add function did with one item: the code its reply gives each
/// item (Lua `OUTCOME`), beside a number whose meaning the outcome gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    /// Taken; the number is its group's size after (0 when it flushed).
    Added = 1,
    /// Already open in its group or flushed within the dedup window; the
    /// number is the group's size.
    Duplicate,
    /// Its group could not open past a limit on open groups; the number
    /// is the [`Limit`].
    Refused,
    /// Waiting for room under the shard's limit on open groups (its
    /// policy flushes the oldest); the number is the group to flush, from
    /// 1, or 0 for none yet.
    WaitingShard,
    /// The same under its policy's limit.
    WaitingPolicy,
}

impl Outcome {
    /// Every outcome and its name in Lua.
    pub const ALL: [(Outcome, &'static str); 5] = [
        (Outcome::Added, "ADDED"),
        (Outcome::Duplicate, "DUPLICATE"),
        (Outcome::Refused, "REFUSED"),
        (Outcome::WaitingShard, "WAITING_SHARD"),
        (Outcome::WaitingPolicy, "WAITING_POLICY"),
    ];

    /// The outcome of a code, if it is one.
    pub fn from_code(code: f64) -> Option<Outcome> {
        Self::ALL
            .iter()
            .map(|(outcome, _)| *outcome)
            .find(|outcome| f64::from(*outcome as u8) == code)
    }
}

/// Which limit on open groups an add met (Lua `LIMIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Limit {
    /// The shard's part of `[limits] max_open_groups`.
    Shard = 1,
    /// The shard's part of its policy's `max_groups`.
    Policy,
}

impl Limit {
    /// Every limit and its name in Lua.
    pub const ALL: [(Limit, &'static str); 2] =
        [(Limit::Shard, "SHARD"), (Limit::Policy, "POLICY")];

    /// The limit of a code, if it is one.
    pub fn from_code(code: f64) -> Option<Limit> {
        Self::ALL
            .iter()
            .map(|(limit, _)| *limit)
            .find(|limit| f64::from(*limit as u8) == code)
    }
}

/// The doubles a policy packs first, in their order (Lua `POLICY`, their
/// places from 1, and `POLICY_FORMAT`, their struct layout): what the
/// service writes at [`PolicySlot`]`as usize` the library reads at
/// `POLICY.<NAME>`. Times are in ms and 0 is none throughout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum PolicySlot {
    MaxItems,
    /// `max_bytes`, or 0.
    MaxBytes,
    /// `min_items`, or 0.
    MinItems,
    MaxWait,
    MaxIdle,
    /// The first cutoff after now (less the clock skew).
    Cutoff,
    /// The cutoff after that one.
    NextCutoff,
    DeadlineLead,
    MaxAge,
    /// k, the capacity's measure count: k doubles of its limits follow
    /// the slots, then the scope, then the k names joined by `;`.
    Measures,
    /// The shard's part of the policy's `max_groups`.
    MaxGroups,
    /// The shard's part of `[limits] max_open_groups`.
    MaxOpenGroups,
    /// The overflow, by its [`OVERFLOW`] code.
    Overflow,
    /// The length of the policy's scope.
    ScopeLength,
}

impl PolicySlot {
    /// Every slot and its name in Lua, in order.
    pub const ALL: [(PolicySlot, &'static str); 14] = [
        (PolicySlot::MaxItems, "MAX_ITEMS"),
        (PolicySlot::MaxBytes, "MAX_BYTES"),
        (PolicySlot::MinItems, "MIN_ITEMS"),
        (PolicySlot::MaxWait, "MAX_WAIT"),
        (PolicySlot::MaxIdle, "MAX_IDLE"),
        (PolicySlot::Cutoff, "CUTOFF"),
        (PolicySlot::NextCutoff, "NEXT_CUTOFF"),
        (PolicySlot::DeadlineLead, "DEADLINE_LEAD"),
        (PolicySlot::MaxAge, "MAX_AGE"),
        (PolicySlot::Measures, "MEASURES"),
        (PolicySlot::MaxGroups, "MAX_GROUPS"),
        (PolicySlot::MaxOpenGroups, "MAX_OPEN_GROUPS"),
        (PolicySlot::Overflow, "OVERFLOW"),
        (PolicySlot::ScopeLength, "SCOPE_LENGTH"),
    ];
}

/// The overflow codes of a packed policy (Lua `OVERFLOW`).
pub const OVERFLOW: [(Overflow, &str, u8); 2] = [
    (Overflow::Refuse, "REFUSE", 0),
    (Overflow::FlushOldest, "FLUSH_OLDEST", 1),
];

/// The code of an overflow.
pub fn overflow_code(overflow: Overflow) -> u8 {
    OVERFLOW
        .iter()
        .find(|(o, _, _)| *o == overflow)
        .map_or(0, |(_, _, code)| *code)
}

/// The doubles of an add call's header, in their order (Lua `HEADER`
/// and `HEADER_FORMAT`); the lengths of its policies follow them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum HeaderSlot {
    /// The dedup window (ms).
    Dedup,
    /// The count of the call's distinct policies.
    Policies,
    /// The count of its groups.
    Groups,
    /// The shape of an item's arguments.
    Shape,
    /// How many groups lead (0: none).
    Lead,
}

impl HeaderSlot {
    /// Every slot and its name in Lua, in order.
    pub const ALL: [(HeaderSlot, &'static str); 5] = [
        (HeaderSlot::Dedup, "DEDUP"),
        (HeaderSlot::Policies, "POLICIES"),
        (HeaderSlot::Groups, "GROUPS"),
        (HeaderSlot::Shape, "SHAPE"),
        (HeaderSlot::Lead, "LEAD"),
    ];
}

/// A flag that follows an item's group number (Lua `FLAG`, by byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ItemFlag {
    /// Flush the group after the item.
    Close = b'c',
    /// The item is requeued from the batch whose id follows.
    Requeue = b'q',
}

impl ItemFlag {
    /// Every flag and its name in Lua.
    pub const ALL: [(ItemFlag, &'static str); 2] =
        [(ItemFlag::Close, "CLOSE"), (ItemFlag::Requeue, "REQUEUE")];

    /// Its byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }
}

/// The struct layout of `n` little-endian doubles.
fn doubles(n: usize) -> String {
    format!("'<{}'", "d".repeat(n))
}

/// The codes and orders as Lua.
pub fn lua() -> String {
    let code = |value: u8| value.to_string();
    let place = |at: usize| (at + 1).to_string();
    [
        table("OUTCOME", Outcome::ALL.map(|(o, w)| (w, code(o as u8)))),
        table("LIMIT", Limit::ALL.map(|(l, w)| (w, code(l as u8)))),
        table(
            "POLICY",
            PolicySlot::ALL.map(|(s, w)| (w, place(s as usize))),
        ),
        format!("local POLICY_FORMAT = {}\n", doubles(PolicySlot::ALL.len())),
        table("OVERFLOW", OVERFLOW.map(|(_, w, c)| (w, code(c)))),
        table(
            "HEADER",
            HeaderSlot::ALL.map(|(s, w)| (w, place(s as usize))),
        ),
        format!("local HEADER_FORMAT = {}\n", doubles(HeaderSlot::ALL.len())),
        table("FLAG", ItemFlag::ALL.map(|(f, w)| (w, code(f.byte())))),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes read back as what they were written for; places follow the
    /// tables' order; the Lua tables hold every name with its number.
    #[test]
    fn codes_come_from_one_table() {
        for (outcome, _) in Outcome::ALL {
            assert_eq!(Outcome::from_code(f64::from(outcome as u8)), Some(outcome));
        }
        assert_eq!(Outcome::from_code(0.0), None);
        assert_eq!(Outcome::from_code(6.0), None);
        for (limit, _) in Limit::ALL {
            assert_eq!(Limit::from_code(f64::from(limit as u8)), Some(limit));
        }
        assert_eq!(Limit::from_code(0.0), None);
        for (at, (slot, _)) in PolicySlot::ALL.iter().enumerate() {
            assert_eq!(*slot as usize, at);
        }
        for (at, (slot, _)) in HeaderSlot::ALL.iter().enumerate() {
            assert_eq!(*slot as usize, at);
        }
        assert_eq!(overflow_code(Overflow::FlushOldest), 1);
        assert_eq!(
            lua(),
            "local OUTCOME = { ADDED = 1, DUPLICATE = 2, REFUSED = 3, WAITING_SHARD = 4, \
             WAITING_POLICY = 5 }\n\
             local LIMIT = { SHARD = 1, POLICY = 2 }\n\
             local POLICY = { MAX_ITEMS = 1, MAX_BYTES = 2, MIN_ITEMS = 3, MAX_WAIT = 4, \
             MAX_IDLE = 5, CUTOFF = 6, NEXT_CUTOFF = 7, DEADLINE_LEAD = 8, MAX_AGE = 9, \
             MEASURES = 10, MAX_GROUPS = 11, MAX_OPEN_GROUPS = 12, OVERFLOW = 13, \
             SCOPE_LENGTH = 14 }\n\
             local POLICY_FORMAT = '<dddddddddddddd'\n\
             local OVERFLOW = { REFUSE = 0, FLUSH_OLDEST = 1 }\n\
             local HEADER = { DEDUP = 1, POLICIES = 2, GROUPS = 3, SHAPE = 4, LEAD = 5 }\n\
             local HEADER_FORMAT = '<ddddd'\n\
             local FLAG = { CLOSE = 99, REQUEUE = 113 }\n"
        );
    }
}

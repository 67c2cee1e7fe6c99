//! The policy tables of the file, `[defaults]` and `[keys."..."]`: their
//! fields, how a key table merges over the defaults, and how a merged table
//! becomes a runtime [`Policy`].
//!
//! Times of day and time zones are parsed when the file is read (by the
//! [`CutoffTimes`] and [`TimeZoneName`] types), so a bad one is reported
//! with its line like any other value; `validate` checks the bounds and the
//! rules between fields, on each merged table.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use bytesize::ByteSize;
use jiff::civil::Time;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize, Serializer};

use super::{DEFAULT_MAX_BYTES, DEFAULT_MAX_ITEMS, DEFAULT_MAX_WAIT};
use crate::policy::{Cutoffs, Overflow, Policy};

/// Default `[defaults] timezone`, the zone of `cutoffs`.
pub const DEFAULT_TIMEZONE: &str = "UTC";
/// Default `[defaults] deadline_lead`: due at the earliest item deadline.
pub const DEFAULT_DEADLINE_LEAD: Duration = Duration::ZERO;
/// Default `[defaults] min_items`: no minimum, a TIMEOUT or IDLE always flushes.
pub const DEFAULT_MIN_ITEMS: u32 = 0;

/// `cutoffs`: local times of day ("HH:MM" or "HH:MM:SS"), checked when the
/// file is read; never empty.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct CutoffTimes(Vec<Time>);

impl From<CutoffTimes> for Vec<String> {
    /// "HH:MM", or "HH:MM:SS" when the seconds are not 0.
    fn from(times: CutoffTimes) -> Vec<String> {
        let text = |t: &Time| match t.second() {
            0 => format!("{:02}:{:02}", t.hour(), t.minute()),
            s => format!("{:02}:{:02}:{s:02}", t.hour(), t.minute()),
        };
        times.0.iter().map(text).collect()
    }
}

impl CutoffTimes {
    /// The times, in the order written.
    pub fn times(&self) -> &[Time] {
        &self.0
    }
}

impl TryFrom<Vec<String>> for CutoffTimes {
    type Error = String;

    fn try_from(texts: Vec<String>) -> Result<CutoffTimes, String> {
        if texts.is_empty() {
            return Err("must list at least one time of day (leave cutoffs out for none)".into());
        }
        let times = texts.iter().map(|t| Cutoffs::parse_time(t));
        Ok(CutoffTimes(times.collect::<Result<_, _>>()?))
    }
}

/// `timezone`: an IANA time zone name, looked up when the file is read.
#[derive(Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct TimeZoneName {
    /// The name as written.
    name: String,
    /// Its rules.
    tz: TimeZone,
}

impl TimeZoneName {
    /// The name as written, such as "Europe/Berlin".
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl TryFrom<String> for TimeZoneName {
    type Error = String;

    fn try_from(name: String) -> Result<TimeZoneName, String> {
        let tz = Cutoffs::parse_zone(&name)?;
        Ok(TimeZoneName { name, tz })
    }
}

impl Default for TimeZoneName {
    fn default() -> Self {
        TimeZoneName {
            name: DEFAULT_TIMEZONE.to_owned(),
            tz: TimeZone::UTC,
        }
    }
}

impl Serialize for TimeZoneName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name)
    }
}

impl PartialEq for TimeZoneName {
    fn eq(&self, other: &TimeZoneName) -> bool {
        self.name == other.name
    }
}

impl Eq for TimeZoneName {}

impl fmt::Debug for TimeZoneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.name, f)
    }
}

/// `[defaults]`: the flush policy of keys that no `[keys."..."]` table sets.
/// A key table merged over it ([`KeyPolicy::over`]) is one of these too.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyDefaults {
    /// Flush when a group reaches this many items: bounds batch size.
    pub max_items: NonZeroU32,
    /// Flush when the group's first item has waited this long: bounds latency.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Flush when the group's payload bytes reach this, if set: bounds the
    /// size of a batch message for consumers with a message-size limit.
    pub max_bytes: Option<ByteSize>,
    /// Flush when no item has arrived for this long, if set: a quiet key
    /// does not sit on a half-full group until `max_wait`.
    #[serde(with = "humantime_serde")]
    pub max_idle: Option<Duration>,
    /// The most each named measure (such as `weight_g`) may sum to in one
    /// group: a truck is full by weight or volume, not by a count.
    pub capacity: BTreeMap<String, u64>,
    /// Local departure times, if set: a group is due at the first one after
    /// it opened.
    pub cutoffs: Option<CutoffTimes>,
    /// The time zone `cutoffs` are read in (DST included).
    pub timezone: TimeZoneName,
    /// A group is due this long before its earliest item deadline, so the
    /// batch leaves in time for the work after it.
    #[serde(with = "humantime_serde")]
    pub deadline_lead: Duration,
    /// Below this size a TIMEOUT or IDLE flush is held, so half-empty
    /// trucks wait for more (0: never held). Needs `max_age`.
    pub min_items: u32,
    /// The longest a group may stay open, holds included, if set: what
    /// `min_items` holds still leaves at this age.
    #[serde(with = "humantime_serde")]
    pub max_age: Option<Duration>,
    /// The most groups this policy's keys may hold open at once (0: no
    /// limit): a bad scanner inventing a key per parcel cannot fill Redis.
    pub max_groups: u32,
    /// What an add does that would open a group past `max_groups` or
    /// `[limits] max_open_groups`: "refuse" or "flush_oldest".
    pub overflow: Overflow,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        PolicyDefaults {
            max_items: DEFAULT_MAX_ITEMS,
            max_wait: DEFAULT_MAX_WAIT,
            max_bytes: DEFAULT_MAX_BYTES,
            max_idle: None,
            capacity: BTreeMap::new(),
            cutoffs: None,
            timezone: TimeZoneName::default(),
            deadline_lead: DEFAULT_DEADLINE_LEAD,
            min_items: DEFAULT_MIN_ITEMS,
            max_age: None,
            max_groups: 0,
            overflow: Overflow::Refuse,
        }
    }
}

impl PolicyDefaults {
    /// These defaults (or a merged key table) as a complete policy.
    pub fn policy(&self) -> Policy {
        let cutoffs = self.cutoffs.as_ref().map(|c| {
            let zone = &self.timezone;
            Arc::new(Cutoffs::from_parts(
                c.times().to_vec(),
                zone.name(),
                zone.tz.clone(),
            ))
        });
        Policy {
            max_idle: self.max_idle,
            capacity: Arc::new(self.capacity.clone()),
            cutoffs,
            deadline_lead: self.deadline_lead,
            min_items: self.min_items,
            max_age: self.max_age,
            max_groups: self.max_groups,
            overflow: self.overflow,
            ..Policy::basic(
                self.max_items.get(),
                self.max_wait,
                self.max_bytes.map(|b| b.as_u64()),
            )
        }
    }
}

/// The policy of an empty config file's `[defaults]`.
impl Default for Policy {
    fn default() -> Self {
        PolicyDefaults::default().policy()
    }
}

/// One `[keys."pattern"]` table: the fields it sets override `[defaults]`
/// for the keys it matches; the fields it leaves unset come from `[defaults]`.
/// It is also a document of the policy store, as JSON with the same field
/// names and forms (durations as "4m", `max_bytes` in bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyPolicy {
    /// Overrides `[defaults] max_items` for matching keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_items: Option<NonZeroU32>,
    /// Overrides `[defaults] max_wait` for matching keys.
    #[serde(with = "humantime_serde")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Duration>,
    /// Overrides `[defaults] max_bytes` for matching keys.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "bytes_as_u64"
    )]
    pub max_bytes: Option<ByteSize>,
    /// Overrides `[defaults] max_idle` for matching keys.
    #[serde(with = "humantime_serde")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_idle: Option<Duration>,
    /// Replaces `[defaults] capacity` as a whole for matching keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, u64>>,
    /// Overrides `[defaults] cutoffs` for matching keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cutoffs: Option<CutoffTimes>,
    /// Overrides `[defaults] timezone` for matching keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<TimeZoneName>,
    /// Overrides `[defaults] deadline_lead` for matching keys.
    #[serde(with = "humantime_serde")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_lead: Option<Duration>,
    /// Overrides `[defaults] min_items` for matching keys (0: no minimum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_items: Option<u32>,
    /// Overrides `[defaults] max_age` for matching keys.
    #[serde(with = "humantime_serde")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Overrides `[defaults] max_groups` for matching keys (0: no limit);
    /// the table's keys are counted together, apart from other tables'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_groups: Option<u32>,
    /// Overrides `[defaults] overflow` for matching keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overflow: Option<Overflow>,
}

/// `max_bytes` as a number of bytes (bytesize writes a rounded text).
fn bytes_as_u64<S: Serializer>(bytes: &Option<ByteSize>, serializer: S) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(b) => serializer.serialize_u64(b.as_u64()),
        None => serializer.serialize_none(),
    }
}

impl KeyPolicy {
    /// Every field of `d` set: the defaults as a document of the policy store.
    pub fn complete(d: &PolicyDefaults) -> KeyPolicy {
        KeyPolicy {
            max_items: Some(d.max_items),
            max_wait: Some(d.max_wait),
            max_bytes: d.max_bytes,
            max_idle: d.max_idle,
            capacity: Some(d.capacity.clone()),
            cutoffs: d.cutoffs.clone(),
            timezone: Some(d.timezone.clone()),
            deadline_lead: Some(d.deadline_lead),
            min_items: Some(d.min_items),
            max_age: d.max_age,
            max_groups: Some(d.max_groups),
            overflow: Some(d.overflow),
        }
    }

    /// This table's fields over `defaults`: the complete table its keys get.
    pub fn over(&self, defaults: &PolicyDefaults) -> PolicyDefaults {
        let d = defaults;
        PolicyDefaults {
            max_items: self.max_items.unwrap_or(d.max_items),
            max_wait: self.max_wait.unwrap_or(d.max_wait),
            max_bytes: self.max_bytes.or(d.max_bytes),
            max_idle: self.max_idle.or(d.max_idle),
            capacity: self.capacity.as_ref().unwrap_or(&d.capacity).clone(),
            cutoffs: self.cutoffs.as_ref().or(d.cutoffs.as_ref()).cloned(),
            timezone: self.timezone.as_ref().unwrap_or(&d.timezone).clone(),
            deadline_lead: self.deadline_lead.unwrap_or(d.deadline_lead),
            min_items: self.min_items.unwrap_or(d.min_items),
            max_age: self.max_age.or(d.max_age),
            max_groups: self.max_groups.unwrap_or(d.max_groups),
            overflow: self.overflow.unwrap_or(d.overflow),
        }
    }
}

/// `[policy_store]`: policies as shared live data in Redis. Off by default:
/// then the file's `[defaults]` and `[keys."..."]` are the policies, and
/// SIGHUP reloads them. On, the store is the one truth for every instance;
/// the file's tables only seed an empty store at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyStoreConfig {
    /// Keep the policies in Redis, shared by every instance.
    pub enabled: bool,
    /// How often each instance checks the store's revision: the bound on how
    /// long a change takes to be in force everywhere.
    #[serde(with = "humantime_serde")]
    pub check_every: Duration,
    /// How many revisions the audit history keeps.
    pub history: std::num::NonZeroUsize,
}

/// Default `[policy_store] check_every`.
pub const DEFAULT_POLICY_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Default `[policy_store] history`.
pub const DEFAULT_POLICY_HISTORY: std::num::NonZeroUsize =
    std::num::NonZeroUsize::new(10_000).expect("not 0");

impl Default for PolicyStoreConfig {
    fn default() -> Self {
        PolicyStoreConfig {
            enabled: false,
            check_every: DEFAULT_POLICY_CHECK_EVERY,
            history: DEFAULT_POLICY_HISTORY,
        }
    }
}

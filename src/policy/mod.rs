//! Flush policies: when a group is flushed, which policy a key gets, and the
//! reloadable table that every task reads.
//!
//! A [`Policies`] table is built once from a default [`Policy`] and the
//! per-pattern policies (exact keys and `*` globs), so that
//! [`Policies::resolve`] only looks things up on the hot path; a change of
//! a few patterns makes the next table from it, sharing the rest
//! ([`Policies::with_changes`]). A [`PolicyHandle`] shares the table
//! between tasks and swaps it whole on reload, without locking. `config`
//! builds the table from the file's `[defaults]` and `[keys."..."]` tables;
//! nothing here reads a file.

mod cutoff;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub use cutoff::Cutoffs;

/// When a group is flushed: whichever rule comes first. Its `Default` is the
/// `[defaults]` of an empty config file (see `config`).
///
/// Limits (`max_items`, `max_bytes`, `capacity`) and `min_items` apply to
/// every decision as they are now; the rules that set a due time
/// (`max_wait`, `max_idle`, `cutoffs`, `deadline_lead`, `max_age`) are fixed
/// when a group opens. Cloning is cheap: the tables are shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Flush when the group holds this many items.
    pub max_items: u32,
    /// Flush when the group's first item has waited this long.
    pub max_wait: Duration,
    /// Flush when the group's payload bytes reach this, if set.
    pub max_bytes: Option<u64>,
    /// Flush when no item has arrived for this long, if set.
    pub max_idle: Option<Duration>,
    /// The most each named measure may sum to in one group.
    pub capacity: Arc<BTreeMap<String, u64>>,
    /// Departure times: a group is due at the first one after it opened.
    pub cutoffs: Option<Arc<Cutoffs>>,
    /// A group is due this long before its earliest item deadline.
    pub deadline_lead: Duration,
    /// Below this size a TIMEOUT or IDLE flush is held (0: never held).
    pub min_items: u32,
    /// The longest a group may stay open, holds included, if set.
    pub max_age: Option<Duration>,
    /// The most groups the keys of this policy may hold open at once (0:
    /// no limit), counted per shard (see [`per_shard`]).
    pub max_groups: u32,
    /// What an add does that would open a group past `max_groups` or the
    /// service's `[limits] max_open_groups`.
    pub overflow: Overflow,
    /// What this policy's open groups are counted under when `max_groups`
    /// is set: "d" for the defaults, "k" and the pattern for a glob (an
    /// exact key's one group never passes it). [`Policies::new`] sets it.
    pub scope: Option<Arc<str>>,
}

/// What an add does when its key has no open group and opening one would
/// pass a limit on open groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// The add is refused (RESOURCE_EXHAUSTED, naming the limit); nothing is written.
    #[default]
    Refuse,
    /// The least recently added-to group under the limit is flushed first
    /// (reason OVERFLOW), in the same atomic step as the add.
    FlushOldest,
}

impl Overflow {
    /// The name the config file and the API use.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Refuse => "refuse",
            Overflow::FlushOldest => "flush_oldest",
        }
    }
}

/// A limit on open groups as each shard enforces it: each shard's script
/// counts only that shard's groups (a cluster cannot count across shards in
/// one atomic step), so `limit` is split evenly, rounded up.
pub fn per_shard(limit: u32, shards: u16) -> u32 {
    if limit == 0 {
        return 0;
    }
    limit.div_ceil(u32::from(shards.max(1)))
}

impl Policy {
    /// A policy with only the count, wait and byte thresholds.
    pub fn basic(max_items: u32, max_wait: Duration, max_bytes: Option<u64>) -> Policy {
        Policy {
            max_items,
            max_wait,
            max_bytes,
            max_idle: None,
            capacity: Arc::default(),
            cutoffs: None,
            deadline_lead: Duration::ZERO,
            min_items: 0,
            max_age: None,
            max_groups: 0,
            overflow: Overflow::Refuse,
            scope: None,
        }
    }
}

/// The largest measure or capacity value: the scripts keep numbers as
/// doubles, and sums up to this stay exact.
pub const MAX_MEASURE: u64 = (1 << 53) - 1;

/// The most measures a capacity may name: an item's packed ext (see
/// `src/store/ext.rs`) counts its values in one byte, and every measure a
/// capacity names costs every add of its keys a little.
pub const MAX_CAPACITY_MEASURES: usize = 64;

/// Whether `name` may name a measure: 1 to 64 of A-Z a-z 0-9 _ - . (the
/// scripts separate measures with other characters).
pub fn measure_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// A `*` glob split at its stars, for matching without allocation.
#[derive(Clone, Debug)]
struct Glob {
    /// The pattern as written.
    pattern: String,
    /// Text before the first `*`.
    prefix: String,
    /// Text after the last `*`.
    suffix: String,
    /// Non-empty runs between stars, in order.
    middle: Vec<String>,
}

impl Glob {
    /// `pattern` must contain at least one `*`.
    fn new(pattern: &str) -> Glob {
        let mut parts: Vec<&str> = pattern.split('*').collect();
        debug_assert!(parts.len() >= 2, "a glob has at least one '*'");
        let suffix = parts.pop().unwrap_or_default().to_owned();
        let prefix = parts.first().copied().unwrap_or_default().to_owned();
        let middle = parts
            .iter()
            .skip(1)
            .filter(|p| !p.is_empty())
            .map(|p| (*p).to_owned())
            .collect();
        Glob {
            pattern: pattern.to_owned(),
            prefix,
            suffix,
            middle,
        }
    }

    fn matches(&self, key: &str) -> bool {
        if key.len() < self.prefix.len() + self.suffix.len()
            || !key.starts_with(&self.prefix)
            || !key.ends_with(&self.suffix)
        {
            return false;
        }
        // Both ends are char boundaries: they end `prefix` and start `suffix`.
        let mut rest = &key[self.prefix.len()..key.len() - self.suffix.len()];
        // Leftmost matching of each run leaves the most room for the next.
        for run in &self.middle {
            match rest.find(run.as_str()) {
                Some(i) => rest = &rest[i + run.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Whether `key` matches the `*` glob `pattern` (`*` matches any run of
/// characters, including none; nothing else is special).
pub fn glob_matches(pattern: &str, key: &str) -> bool {
    if pattern.contains('*') {
        Glob::new(pattern).matches(key)
    } else {
        pattern == key
    }
}

/// Exact keys changed since a table's shared map was built, beyond which a
/// change builds that map again: a change costs a clone of at most this
/// many entries, and a map's rebuild is paid once per this many changes.
const RECENT_MAX: usize = 256;

/// The resolved policy table: the policy of every pattern, complete, so
/// that [`Policies::resolve`] only looks things up.
///
/// A table follows a change of a few patterns in time proportional to them
/// ([`Policies::with_changes`]), not to the table: the exact keys' map is
/// shared between a table and the next, which looks its own recent changes
/// up first, until they are [`RECENT_MAX`] and it builds a map of its own.
#[derive(Clone, Debug)]
pub struct Policies {
    defaults: Policy,
    exact: Arc<HashMap<String, Policy>>,
    /// Exact keys changed since `exact` was built (`None`: deleted).
    recent: HashMap<String, Option<Policy>>,
    /// Longest pattern first, ties by pattern string order.
    globs: Vec<(Glob, Policy)>,
}

/// `policy` counting its keys' groups under `scope` when it has a
/// `max_groups`: the defaults and each glob do; an exact key has at most
/// one group, so its max_groups always holds.
fn scoped(mut policy: Policy, scope: impl FnOnce() -> String) -> Policy {
    if policy.max_groups > 0 {
        policy.scope = Some(scope().into());
    }
    policy
}

/// A glob's entry in a table.
fn glob_entry(pattern: &str, policy: Policy) -> (Glob, Policy) {
    let policy = scoped(policy, || format!("k{pattern}"));
    (Glob::new(pattern), policy)
}

/// Longest pattern first, ties by pattern string order.
fn sort_globs(globs: &mut [(Glob, Policy)]) {
    globs.sort_by(|(a, _), (b, _)| {
        b.pattern
            .len()
            .cmp(&a.pattern.len())
            .then_with(|| a.pattern.cmp(&b.pattern))
    });
}

impl Policies {
    /// The table for `defaults` (keys no pattern matches) and the complete
    /// policy of each pattern: an exact key, or a glob if it holds a `*`.
    pub fn new(defaults: Policy, patterns: impl IntoIterator<Item = (String, Policy)>) -> Policies {
        let mut exact = HashMap::new();
        let mut globs = Vec::new();
        for (pattern, policy) in patterns {
            if pattern.contains('*') {
                globs.push(glob_entry(&pattern, policy));
            } else {
                exact.insert(pattern, policy);
            }
        }
        sort_globs(&mut globs);
        Policies {
            defaults: scoped(defaults, || "d".into()),
            exact: Arc::new(exact),
            recent: HashMap::new(),
            globs,
        }
    }

    /// This table with some patterns' complete policies changed (`None`:
    /// the pattern is gone), the defaults' and every other pattern's kept:
    /// what [`Policies::new`] would build from the patterns after the
    /// change, in time proportional to the change and the globs.
    pub fn with_changes(
        &self,
        changes: impl IntoIterator<Item = (String, Option<Policy>)>,
    ) -> Policies {
        let mut next = self.clone();
        let mut globs_changed = false;
        for (pattern, policy) in changes {
            if pattern.contains('*') {
                next.globs.retain(|(glob, _)| glob.pattern != pattern);
                next.globs
                    .extend(policy.map(|policy| glob_entry(&pattern, policy)));
                globs_changed = true;
            } else {
                next.recent.insert(pattern, policy);
            }
        }
        if globs_changed {
            sort_globs(&mut next.globs);
        }
        if next.recent.len() > RECENT_MAX {
            let mut exact = (*next.exact).clone();
            for (pattern, policy) in next.recent.drain() {
                match policy {
                    Some(policy) => exact.insert(pattern, policy),
                    None => exact.remove(&pattern),
                };
            }
            next.exact = Arc::new(exact);
        }
        next
    }

    /// The exact pattern `key` and its policy, if the table has one.
    fn exact_for(&self, key: &str) -> Option<(&str, &Policy)> {
        if !self.recent.is_empty()
            && let Some((pattern, policy)) = self.recent.get_key_value(key)
        {
            return policy.as_ref().map(|policy| (pattern.as_str(), policy));
        }
        let (pattern, policy) = self.exact.get_key_value(key)?;
        Some((pattern.as_str(), policy))
    }

    /// The glob that decides `key`, when no exact pattern does.
    fn glob_for(&self, key: &str) -> Option<&(Glob, Policy)> {
        self.globs.iter().find(|(glob, _)| glob.matches(key))
    }

    /// The policy for a key: an exact key beats a glob, a longer glob beats a
    /// shorter one (ties broken by pattern string order, so the result is
    /// deterministic); a key no pattern matches gets the defaults.
    pub fn resolve(&self, key: &str) -> Policy {
        if let Some((_, policy)) = self.exact_for(key) {
            return policy.clone();
        }
        self.glob_for(key)
            .map_or_else(|| self.defaults.clone(), |(_, policy)| policy.clone())
    }

    /// The pattern that decides `key`'s policy, or `None` for the defaults.
    pub fn matching_pattern(&self, key: &str) -> Option<&str> {
        if let Some((pattern, _)) = self.exact_for(key) {
            return Some(pattern);
        }
        self.glob_for(key).map(|(glob, _)| glob.pattern.as_str())
    }

    /// The complete policy of one pattern (an exact key or a glob), if
    /// the table has it.
    pub fn policy_of_pattern(&self, pattern: &str) -> Option<&Policy> {
        if pattern.contains('*') {
            let glob = self.globs.iter().find(|(g, _)| g.pattern == pattern);
            return glob.map(|(_, policy)| policy);
        }
        self.exact_for(pattern).map(|(_, policy)| policy)
    }

    /// The policy of keys no pattern matches.
    pub fn defaults(&self) -> Policy {
        self.defaults.clone()
    }

    /// The policies that count their keys' groups against their own
    /// `max_groups`: the defaults first, then the globs, longest first.
    pub fn limited(&self) -> Vec<&Policy> {
        let globs = self.globs.iter().map(|(_, policy)| policy);
        std::iter::once(&self.defaults)
            .chain(globs)
            .filter(|policy| policy.scope.is_some())
            .collect()
    }
}

/// Live, reloadable policies shared by all tasks. Readers never block; a
/// reload swaps the whole table at once, so a reader sees the old table or
/// the new one, never a mix.
#[derive(Clone)]
pub struct PolicyHandle(Arc<ArcSwap<Policies>>);

impl PolicyHandle {
    /// A handle holding `p`.
    pub fn new(p: Policies) -> Self {
        PolicyHandle(Arc::new(ArcSwap::from_pointee(p)))
    }

    /// The current table.
    pub fn current(&self) -> Arc<Policies> {
        self.0.load_full()
    }

    /// The current table, for a step that does not wait: cheaper than
    /// [`PolicyHandle::current`], whose count of holders every thread shares.
    pub fn load(&self) -> arc_swap::Guard<Arc<Policies>> {
        self.0.load()
    }

    /// Replaces the table for every holder of this handle (and its clones).
    pub fn replace(&self, p: Policies) {
        self.0.store(Arc::new(p));
    }

    /// The current policy for `key`, without cloning the table.
    pub fn resolve(&self, key: &str) -> Policy {
        self.0.load().resolve(key)
    }
}

impl fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyHandle")
            .field(&*self.0.load())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_items: u32) -> Policy {
        Policy::basic(max_items, Duration::from_secs(60), None)
    }

    fn table(patterns: &[(&str, u32)]) -> Policies {
        Policies::new(
            policy(10),
            patterns.iter().map(|&(p, n)| (p.to_owned(), policy(n))),
        )
    }

    /// An exact key beats any glob, and a key no pattern matches gets the defaults.
    #[test]
    fn exact_beats_glob() {
        let p = table(&[("north-1", 5), ("north-*", 6), ("*", 7)]);
        assert_eq!(p.resolve("north-1").max_items, 5);
        assert_eq!(p.matching_pattern("north-1"), Some("north-1"));
        assert_eq!(p.resolve("north-2").max_items, 6);
        assert_eq!(p.resolve("other").max_items, 7);
        let p = table(&[("north", 5)]);
        assert_eq!(p.resolve("south"), policy(10));
        assert_eq!(p.matching_pattern("south"), None);
        assert_eq!(p.defaults(), policy(10));
    }

    /// A table changed pattern by pattern resolves every key as a table
    /// built from the same patterns does: exact keys set, changed and
    /// deleted (past the recent changes' rebuild of the shared map, and
    /// a deleted key falling back to its glob), and globs added and gone.
    #[test]
    fn changes_resolve_as_a_table_built_whole() {
        let mut patterns: BTreeMap<String, u32> = (0..500)
            .map(|i| (format!("area-{i}"), 1 + i % 7))
            .chain([("area-*".to_owned(), 40), ("*".to_owned(), 50)])
            .collect();
        let mut changed = Policies::new(
            policy(10),
            patterns.iter().map(|(p, &n)| (p.clone(), policy(n))),
        );
        let keys: Vec<String> = (0..600).map(|i| format!("area-{i}")).collect();
        for step in 0..(2 * RECENT_MAX as u32) {
            let pattern = match step % 11 {
                0 => "area-1*".to_owned(),
                1 => "area-*".to_owned(),
                _ => format!("area-{}", (step * 37) % 600),
            };
            let policy_now = if step % 3 == 0 {
                patterns.remove(&pattern);
                None
            } else {
                patterns.insert(pattern.clone(), 100 + step);
                Some(policy(100 + step))
            };
            changed = changed.with_changes([(pattern, policy_now)]);
            if step % 50 == 0 || step == 2 * RECENT_MAX as u32 - 1 {
                let whole = Policies::new(
                    policy(10),
                    patterns.iter().map(|(p, &n)| (p.clone(), policy(n))),
                );
                for key in &keys {
                    assert_eq!(
                        changed.resolve(key),
                        whole.resolve(key),
                        "{key}, step {step}"
                    );
                    assert_eq!(changed.matching_pattern(key), whole.matching_pattern(key));
                }
            }
        }
        assert!(changed.recent.len() <= RECENT_MAX);
    }

    /// A longer glob beats a shorter one, and equal lengths tie-break by
    /// pattern order whatever order the patterns come in.
    #[test]
    fn longer_glob_beats_shorter() {
        let patterns = [("s*", 1), ("south-*", 2), ("*-eu", 3), ("*uth-eu", 4)];
        let mut reversed = patterns;
        reversed.reverse();
        for p in [table(&patterns), table(&reversed)] {
            assert_eq!(p.resolve("south-1").max_items, 2);
            assert_eq!(p.resolve("sea").max_items, 1);
            assert_eq!(p.resolve("x-eu").max_items, 3);
            // "south-*" and "*uth-eu" are both 7 bytes long; "*uth-eu" sorts first.
            assert_eq!(p.resolve("south-eu").max_items, 4);
            assert_eq!(p.matching_pattern("south-eu"), Some("*uth-eu"));
            assert_eq!(p.matching_pattern("east"), None);
        }
    }

    /// `*` matches any run of characters, including none, anywhere in the pattern.
    #[test]
    fn glob_edge_cases() {
        let cases: &[(&str, &str, bool)] = &[
            // prefix
            ("south-*", "south-1", true),
            ("south-*", "south-", true),
            ("south-*", "south", false),
            ("south-*", "xsouth-1", false),
            // suffix
            ("*-eu", "north-eu", true),
            ("*-eu", "-eu", true),
            ("*-eu", "north-eux", false),
            // middle
            ("a*z", "az", true),
            ("a*z", "abcz", true),
            ("a*z", "abc", false),
            ("a*z", "z", false),
            ("aa*aa", "aaa", false),
            ("aa*aa", "aaaa", true),
            // multiple stars
            ("a*b*c", "abc", true),
            ("a*b*c", "a-b-c", true),
            ("a*b*c", "a-c-b", false),
            ("*a*b*", "xaybz", true),
            ("*a*b*", "ba", false),
            ("a**b", "ab", true),
            ("*ab*ab*", "abab", true),
            ("*ab*ab*", "aba", false),
            // lone star and empty key
            ("*", "", true),
            ("*", "anything", true),
            ("**", "", true),
            ("a*", "", false),
            // no star: exact, and other glob characters are literal
            ("north", "north", true),
            ("north", "north1", false),
            ("n?rth", "north", false),
            ("[ab]*", "[ab]x", true),
            // multi-byte characters
            ("é*ü", "éxyzü", true),
            ("*ü", "ü", true),
        ];
        for &(pattern, key, want) in cases {
            assert_eq!(glob_matches(pattern, key), want, "{pattern:?} vs {key:?}");
        }
    }

    /// A PolicyHandle's replacement is seen through every clone.
    #[test]
    fn policy_handle_replace() {
        let handle = PolicyHandle::new(table(&[]));
        let other = handle.clone();
        assert_eq!(other.resolve("north"), policy(10));
        handle.replace(table(&[("north", 25), ("south-*", 3)]));
        assert_eq!(other.resolve("north").max_items, 25);
        assert_eq!(other.current().resolve("south-x").max_items, 3);
    }
}

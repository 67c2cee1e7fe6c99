//! Redis key names. This is the only module that formats them.
//!
//! Every key of one shard carries the shard's hash tag, so all the keys that
//! one script touches hash to one Redis Cluster slot.
//!
//! The tags are spread over the slot space: shard *s* of *S* gets the tag
//! `{<prefix>:<s>:<n>}`, with the smallest `n` that puts its slot near the
//! middle of the *s*-th of *S* equal slot ranges. A cluster whose masters
//! own equal contiguous ranges (what `redis-cli --cluster create` makes)
//! then holds the shards evenly: the counts per master differ by at most
//! one. Plain `{<prefix>:<s>}` tags would land where CRC16 puts them, and
//! 16 shards over 3 masters came out 4, 5 and 7.

/// How keys map to shards and how shard keys are named.
#[derive(Clone, Debug)]
pub struct Keyspace {
    prefix: String,
    /// Each shard's hash tag, braces included.
    tags: std::sync::Arc<[String]>,
    /// Each shard's shard-wide keys, named once: the add path names them
    /// on every call.
    shard_keys: std::sync::Arc<[ShardKeys]>,
}

/// The keys that make up one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardKeys {
    /// Sorted set of open groups: member is the group's key, score its due time (ms).
    pub due: String,
    /// Stream of flushed batches: the shard's outbox.
    pub stream: String,
    /// Sorted set of recently flushed item ids, scored by when they may be forgotten.
    pub flushed: String,
    /// Sorted set of requeued items, `<batch id>:<item id>`, scored by the
    /// batch's stream time: trimming the stream forgets them.
    pub requeued: String,
    /// Sorted set indexing the groups opened under a limit on open groups
    /// (see `src/lua/limits.lua`).
    pub open_index: String,
}

impl Keyspace {
    /// A keyspace of `shards` shards under `prefix`. `prefix` must not contain
    /// `{` or `}` (the config checks that), or the hash tag would break.
    pub fn new(prefix: &str, shards: u16) -> Keyspace {
        assert!(shards > 0, "shards must be at least 1");
        let tags: std::sync::Arc<[String]> =
            (0..shards).map(|s| spread_tag(prefix, s, shards)).collect();
        let shard_keys = tags
            .iter()
            .map(|tag| ShardKeys {
                due: format!("{tag}:due"),
                stream: format!("{tag}:batches"),
                flushed: format!("{tag}:flushed"),
                requeued: format!("{tag}:requeued"),
                open_index: format!("{tag}:open"),
            })
            .collect();
        Keyspace {
            prefix: prefix.to_owned(),
            tags,
            shard_keys,
        }
    }

    /// The prefix every key name starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many shards the keyspace has.
    pub fn shards(&self) -> u16 {
        self.tags.len() as u16
    }

    /// The shard of a key: FNV-1a (64-bit) of its bytes, modulo the shard count.
    /// Stable across versions and platforms, because data written by one
    /// release must be found by the next.
    pub fn shard_of(&self, key: &str) -> u16 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key.as_bytes() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (hash % u64::from(self.shards())) as u16
    }

    /// The hash tag shared by every key of a shard.
    pub fn tag(&self, shard: u16) -> &str {
        &self.tags[usize::from(shard)]
    }

    /// The shard-wide keys.
    pub fn shard(&self, shard: u16) -> ShardKeys {
        self.shard_keys(shard).clone()
    }

    /// The shard-wide keys, borrowed.
    pub fn shard_keys(&self, shard: u16) -> &ShardKeys {
        &self.shard_keys[usize::from(shard)]
    }

    /// The data format marker: the format of everything under the prefix
    /// (see [`crate::store::Store::check_format`]).
    pub fn format_marker(&self) -> String {
        format!("{{{}}}:format", self.prefix)
    }

    /// The shard count the prefix's data is spread over, recorded beside
    /// the format marker (see [`crate::store::Store::check_format`]).
    pub fn shards_marker(&self) -> String {
        format!("{{{}}}:shards", self.prefix)
    }

    /// Hash of durable consumer groups: name -> definition (its key filters).
    /// Read and written by plain commands only, never by a script.
    pub fn consumer_groups(&self) -> String {
        format!("{{{}}}:consumer-groups", self.prefix)
    }

    /// Hash of consumer group name -> how many times a draining instance has
    /// released batches its consumers held, so that the group's consumers
    /// elsewhere claim them without waiting for the ack timeout. Read and
    /// written by plain commands only.
    pub fn released(&self) -> String {
        format!("{{{}}}:released", self.prefix)
    }

    /// Sorted set of a consumer group's dead-lettered stream entries in a shard.
    pub fn dead_letters(&self, shard: u16, group: &str) -> String {
        format!("{}:dead:{group}", self.tag(shard))
    }

    /// A sink's lease on a shard: the consumer of the one instance that
    /// delivers the shard's batches to the sink's group (docs/sinks.md).
    pub fn sink_lease(&self, shard: u16, group: &str) -> String {
        format!("{}:lease:{group}", self.tag(shard))
    }

    /// Hash of a sink's dead letters in a shard: batch id -> why it failed
    /// (the last status and an excerpt of the last answer).
    pub fn sink_failures(&self, shard: u16, group: &str) -> String {
        format!("{}:failures:{group}", self.tag(shard))
    }

    /// Hash mapping a re-driven batch's entry id to its copy's entry id.
    pub fn redriven(&self, shard: u16, group: &str) -> String {
        format!("{}:redriven:{group}", self.tag(shard))
    }

    /// The hash holding one open group's metadata and items.
    pub fn group(&self, shard: u16, key: &str) -> String {
        self.group_parts(shard, key).concat()
    }

    /// [`Keyspace::group`] in its parts, for a caller that writes the name
    /// straight into a command.
    pub fn group_parts<'a>(&'a self, shard: u16, key: &'a str) -> [&'a str; 3] {
        [&self.tags[usize::from(shard)], ":g:", key]
    }

    /// The policy store's keys. They share the tag `{<prefix>:policies}`,
    /// so one script changes them together, on one cluster slot.
    pub fn policy_store(&self) -> PolicyStoreKeys {
        let tag = format!("{{{}:policies}}", self.prefix);
        PolicyStoreKeys {
            docs: format!("{tag}:docs"),
            revision: format!("{tag}:revision"),
            history: format!("{tag}:history"),
            staged: format!("{tag}:staged"),
        }
    }
}

/// The keys of the policy store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyStoreKeys {
    /// Hash: policy name (`defaults`, `keys/<pattern>`) -> its document.
    pub docs: String,
    /// The store's revision: how many changes it has taken.
    pub revision: String,
    /// Stream of changes, one entry per revision (id `<revision>-1`).
    pub history: String,
    /// The start of the hashes a bulk change is staged in (`:<id>` follows).
    pub staged: String,
}

/// Slots of a Redis Cluster.
const SLOTS: u32 = 16384;

/// The hash tag of shard `shard` of `shards`: `{prefix:shard:n}` with the
/// smallest `n` whose slot lies within an eighth of a range of the middle
/// of the shard's range of `SLOTS / shards` slots. A range is at least 16
/// slots wide (at most 1024 shards), so such an `n` exists; about `4 ×
/// shards` tries find it.
fn spread_tag(prefix: &str, shard: u16, shards: u16) -> String {
    use std::fmt::Write;
    let width = SLOTS / u32::from(shards);
    let middle = u32::from(shard) * width + width / 2;
    let reach = (width / 8).max(1);
    let stem = format!("{prefix}:{shard}:");
    let mut tag = String::with_capacity(stem.len() + 10);
    for n in 0u32.. {
        tag.clear();
        let _ = write!(tag, "{stem}{n}");
        if middle.abs_diff(u32::from(cluster_slot(tag.as_bytes()))) < reach {
            return format!("{{{tag}}}");
        }
    }
    unreachable!("some n lands near the middle of every range")
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the
/// whole key when it has no tag, modulo 16384.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|b| *b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|b| *b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for byte in hashed {
        crc = (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ *byte)];
    }
    crc % 16384
}

/// CRC16 (XMODEM, polynomial 0x1021) of every byte value, for [`cluster_slot`].
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Panics (in debug builds) unless every key hashes to one cluster slot. Every
/// script call passes its keys through this, so each test run checks the
/// layout on every call it makes.
pub fn debug_assert_one_slot(keys: &[&str]) {
    if cfg!(debug_assertions)
        && let Some(first) = keys.first()
    {
        let slot = cluster_slot(first.as_bytes());
        for key in keys {
            assert_eq!(
                cluster_slot(key.as_bytes()),
                slot,
                "script keys span slots: {keys:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shard function is stable: these values must never change.
    #[test]
    fn shard_of_is_stable() {
        let ks = Keyspace::new("batcher", 16);
        let got: Vec<u16> = ["north", "south-1", "", "a"]
            .iter()
            .map(|k| ks.shard_of(k))
            .collect();
        assert_eq!(got, vec![4, 12, 5, 12]);
        assert_eq!(Keyspace::new("x", 1).shard_of("anything"), 0);
    }

    /// A user key containing braces cannot move a group out of its shard's slot.
    #[test]
    fn group_key_keeps_shard_tag_first() {
        let ks = Keyspace::new("batcher", 16);
        let g = ks.group(3, "}{evil}");
        assert!(g.starts_with(&format!("{}:g:", ks.tag(3))));
        assert_eq!(
            cluster_slot(g.as_bytes()),
            cluster_slot(ks.tag(3).as_bytes())
        );
    }

    /// Shard tags are stable (data written by one release must be found by
    /// the next), and sit near the middle of their slot ranges, so 16 shards
    /// split 6/5/5 over 3 masters that own equal ranges and 4 each over 4.
    #[test]
    fn tags_spread_over_the_slots() {
        let ks = Keyspace::new("batcher", 16);
        assert_eq!(ks.tag(0), "{batcher:0:20}");
        for masters in [3u32, 4, 5, 7] {
            let mut counts = vec![0u32; masters as usize];
            for shard in 0..16 {
                let slot = u32::from(cluster_slot(ks.tag(shard).as_bytes()));
                // redis-cli's even split: master i owns [i*S/m, (i+1)*S/m).
                let owner = (0..masters).rfind(|i| slot >= i * SLOTS / masters).unwrap();
                counts[owner as usize] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "{masters} masters: {counts:?}");
        }
        // Every count up to the largest allowed finds its tags.
        assert_eq!(Keyspace::new("p", 1024).shards(), 1024);
    }

    /// Slots equal what `CLUSTER KEYSLOT` answers on redis-server 7.0, hash-tag edge cases included.
    #[test]
    fn cluster_slot_matches_redis() {
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"123456789", 0x31C3),
            // A tag hashes only what is between the first `{` and the next `}`.
            (b"{user1000}.following", 3443),
            (b"user1000", 3443),
            (b"foo{bar}{zap}", 5061),
            (b"bar", 5061),
            // An empty first tag means the whole key is hashed, braces and all.
            (b"foo{}{bar}", 8363),
            (b"{}foo", 9500),
            // A tag ends at the first `}`, so it may contain a `{`.
            (b"foo{{bar}}zap", 4015),
            // An unclosed `{` is no tag.
            (b"foo{", 7673),
            // A user key with braces stays in its shard's slot.
            (b"{batcher:3}:g:}{evil}", 1046),
            (b"batcher:3", 1046),
        ] {
            let text = String::from_utf8_lossy(key);
            assert_eq!(cluster_slot(key), slot, "CLUSTER KEYSLOT {text}");
        }
    }
}

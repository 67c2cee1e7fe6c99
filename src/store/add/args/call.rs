//! The writing of one shard's add call, laid out by [`AddArgs`], into a
//! command: its keys, then its arguments, as `src/lua/add_call.lua` reads them.

use std::io::Write;

use redis::RedisWrite;

use super::{AddArgs, ItemArgs};
use crate::scripts::codes::{HeaderSlot, ItemFlag};

/// One shard's add call, laid out: how many keys and arguments it has, and
/// the writing of them into a command (or any [`RedisWrite`]).
pub struct AddCall<'a> {
    pub(super) args: AddArgs<'a>,
    /// Whether each item's arguments start with its group's number.
    pub(super) numbered: bool,
    /// How many groups lead (see [`AddArgs`]).
    pub(super) lead: usize,
    /// Where each item went, when the lead moved some: the reply to the
    /// call's `j`-th item is the reply to the `order[j]`-th item given.
    /// Empty when every item kept its place.
    pub(super) order: Vec<usize>,
}

impl AddCall<'_> {
    /// The call's KEYS count.
    pub fn key_count(&self) -> usize {
        4 + self.args.groups.len() + usize::from(self.args.requeued)
    }

    /// The call's ARGV count.
    pub fn arg_count(&self) -> usize {
        let per_group = 1 + usize::from(self.args.policies.len() > 1);
        1 + per_group * self.args.groups.len() + self.per_item() * self.args.items.len()
    }

    /// About how many bytes the call's keys and arguments take.
    pub fn size_hint(&self) -> usize {
        let tag = self.args.keyspace.tag(self.args.shard).len();
        let groups: usize = self
            .args
            .groups
            .iter()
            .map(|(key, _)| tag + 6 + key.len())
            .sum();
        let items: usize = self.args.items.iter().map(ItemArgs::size_hint).sum();
        let policies: usize = self.args.policies.iter().map(|(_, p)| 8 + p.len()).sum();
        5 * (tag + 10) + groups + items + policies + 40
    }

    /// Where each item went (see the field).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Writes the call's KEYS into `out`.
    pub fn write_keys(&self, out: &mut impl RedisWrite) {
        let args = &self.args;
        let shard = args.keyspace.shard_keys(args.shard);
        for key in [&shard.due, &shard.stream, &shard.flushed, &shard.open_index] {
            out.write_arg(key.as_bytes());
        }
        for (key, _) in &args.groups {
            let parts = args.keyspace.group_parts(args.shard, key);
            write_all(&mut out.writer_for_next_arg(), &parts.map(str::as_bytes));
        }
        if args.requeued {
            out.write_arg(shard.requeued.as_bytes());
        }
    }

    /// Writes the call's ARGV into `out`.
    pub fn write_args(&self, out: &mut impl RedisWrite) {
        let args = &self.args;
        let per_item = self.per_item();
        let shape = if self.numbered {
            per_item as f64
        } else {
            -(per_item as f64)
        };
        let policies = args.policies.len();
        let mut numbers = [0.0; HeaderSlot::ALL.len()];
        for (slot, _) in HeaderSlot::ALL {
            numbers[slot as usize] = match slot {
                HeaderSlot::Dedup => args.dedup.as_millis() as f64,
                HeaderSlot::Policies => policies as f64,
                HeaderSlot::Groups => args.groups.len() as f64,
                HeaderSlot::Shape => shape,
                HeaderSlot::Lead => self.lead as f64,
            };
        }
        {
            let mut header = out.writer_for_next_arg();
            let lengths = args.policies.iter().map(|(_, packed)| packed.len() as f64);
            for number in numbers.into_iter().chain(lengths) {
                write_all(&mut header, &[&number.to_le_bytes()]);
            }
            for (_, packed) in &args.policies {
                write_all(&mut header, &[packed]);
            }
        }
        for (key, policy) in &args.groups {
            out.write_arg(key.as_bytes());
            if policies > 1 {
                out.write_arg_fmt(policy);
            }
        }
        for item in &args.items {
            if self.numbered {
                let mut group = out.writer_for_next_arg();
                let _ = write!(group, "{}", item.group);
                if item.close {
                    write_all(&mut group, &[&[ItemFlag::Close.byte()]]);
                }
                if let Some(batch) = item.requeue_of {
                    write_all(&mut group, &[&[ItemFlag::Requeue.byte()], batch.as_bytes()]);
                }
            }
            out.write_arg(item.id);
            out.write_arg(item.payload);
            if args.exts {
                out.write_arg(&item.ext);
            }
        }
    }

    /// How many arguments each item takes.
    fn per_item(&self) -> usize {
        2 + usize::from(self.numbered) + usize::from(self.args.exts)
    }
}

/// Writes `parts` into one argument. The writers of redis-rs's commands
/// write into memory, so they cannot fail.
fn write_all(out: &mut impl Write, parts: &[&[u8]]) {
    for part in parts {
        out.write_all(part).expect("writing into memory");
    }
}

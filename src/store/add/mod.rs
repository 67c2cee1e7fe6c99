//! The write path, whole: how an add travels from a request to Redis and
//! back. It is the hot path of the service, and this wing holds all of its
//! Rust; the Lua it calls is the library's add function
//! (`src/lua/add_call.lua`, with `add.lua` and `add_ruled.lua`).
//!
//! 1. [`Store::add`] (here) splits a request per shard and queues each part
//!    as an [`AddJob`](job) in that shard's queue (`job`: what a part asks
//!    of a writer and what it answers, with the call deadline it honours).
//! 2. A writer (`writer`) takes whatever parts queued up meanwhile and runs
//!    them in one call of the add function. On one Redis, [`LANES`] writers
//!    serve the shards in rounds, a round's shards in one `add_shards` call;
//!    on a cluster, each shard has a writer of its own, so a slow node holds
//!    up only its shards.
//! 3. The call's KEYS and ARGV are built in one place, [`AddArgs`]
//!    (`args`): the header and each distinct policy packed as doubles in the
//!    orders of [`crate::scripts::codes`], then per group its key and per
//!    item its id, payload and packed ext (an item's deadline, measures,
//!    requeue count and trace context; `store::ext`, which the read path
//!    shares), written straight into the command.
//! 4. In Redis the function takes each group atomically: checks each id
//!    against the group and the dedup window, appends, opens the group if
//!    new, and flushes it into the shard's stream when a threshold is
//!    reached (the layout: [`crate::scripts::layout`]).
//! 5. Its reply (`reply`) gives each item its
//!    [`Outcome`](crate::scripts::codes::Outcome) and size, the batches it
//!    wrote, and the groups to flush to make room.
//! 6. An item that waits for room under a limit on open groups (its
//!    policy flushes the oldest) is settled by `room`: the store flushes
//!    the group the reply named (reason OVERFLOW) and adds the item again.
//!
//! Each shard's queue is bounded in items (`[limits] max_queued_adds`): a
//! call whose part does not fit fails at once with
//! [`StoreError::QueueFull`], and a call spanning shards reserves room in
//! every one of them before it queues anything, so it is never half queued.
//! A call may carry a [`Deadline`]: the writer drops a part whose deadline
//! passed while it waited, so it is not written after its caller was told
//! it failed.

mod args;
mod job;
mod reply;
mod room;
mod writer;

use std::collections::HashMap;

use futures::future::try_join_all;
use tokio::sync::OwnedSemaphorePermit;

use self::job::{AddJob, ShardReply, Slot, writer_gone};
use super::{Result, Store, StoreError};
use crate::batch::{AddResult, DecodeError};

pub use self::args::AddArgs;
pub use self::job::{Deadline, NewItem};
pub use self::writer::LANES;
pub(super) use self::writer::{AddWriter, ShardQueue, start_writers};

/// The results of a set of adds, and the deadlines the adds opened.
#[derive(Debug, Default)]
pub struct AddReport {
    /// One per item, in request order.
    pub results: Vec<AddResult>,
    /// Per shard that had a group opened: the earliest due time opened (ms).
    pub opened: Vec<(u16, u64)>,
}

impl Store {
    /// Adds items, atomically per shard, in request order. A group that
    /// reaches its threshold is flushed by the add that completes it.
    ///
    /// Each shard's part goes to that shard's writer, which runs it in one
    /// add function call, together with whatever other requests queued up for the
    /// shard meanwhile: under load, many small requests share one call.
    pub async fn add(&self, items: Vec<NewItem>) -> Result<AddReport> {
        self.add_within(items, None).await
    }

    /// [`Store::add`], with a deadline: a part still queued when it passes is
    /// dropped, and the call fails with [`StoreError::Timeout`]. Fails at
    /// once with [`StoreError::QueueFull`], queuing nothing, when a shard's
    /// queue has no room for the call's part.
    pub async fn add_within(
        &self,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
    ) -> Result<AddReport> {
        // Nothing is written under a prefix that holds another data format.
        self.check_format().await?;
        let (slots, opened) = self.add_round(items, deadline).await?;
        self.settle(slots, opened, deadline).await
    }

    /// One round of add calls for `items`: one result slot per item, in
    /// order, and the earliest due time opened per shard.
    async fn add_round(
        &self,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
    ) -> Result<(Vec<Slot>, Vec<(u16, u64)>)> {
        let count = items.len();
        let shard_of = |item: &NewItem| self.keys.shard_of(&item.key);
        // All of one shard (a unary Add always is): one part, sent as it is.
        if let Some(shard) = items.first().map(shard_of)
            && items[1..].iter().all(|item| shard_of(item) == shard)
        {
            let room = self.queues[usize::from(shard)].reserve(shard, count)?;
            let (earliest, results) = self.send_part(shard, items, deadline, room).await?;
            if results.len() != count {
                return Err(too_few_results());
            }
            return Ok((
                results,
                earliest.map(|due| vec![(shard, due)]).unwrap_or_default(),
            ));
        }
        // Split the request per shard, keeping each shard's items in order.
        let mut per_shard: HashMap<u16, (Vec<usize>, Vec<NewItem>)> = HashMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let part = per_shard.entry(shard_of(&item)).or_default();
            part.0.push(index);
            part.1.push(item);
        }
        // Room in every shard first, so that a full shard refuses the whole
        // call before any of its parts is queued.
        let mut parts = Vec::with_capacity(per_shard.len());
        for (shard, (indexes, items)) in per_shard {
            let room = self.queues[usize::from(shard)].reserve(shard, items.len())?;
            parts.push((shard, indexes, items, room));
        }
        let calls = parts
            .into_iter()
            .map(|(shard, indexes, items, room)| async move {
                let (earliest, results) = self.send_part(shard, items, deadline, room).await?;
                Ok::<_, StoreError>((shard, indexes, earliest, results))
            });
        let replies = try_join_all(calls).await?;

        let mut results: Vec<Option<Slot>> = std::iter::repeat_with(|| None).take(count).collect();
        let mut opened = Vec::new();
        for (shard, indexes, earliest, shard_results) in replies {
            if let Some(due) = earliest {
                opened.push((shard, due));
            }
            for (index, result) in indexes.into_iter().zip(shard_results) {
                results[index] = Some(result);
            }
        }
        let results = results
            .into_iter()
            .map(|r| r.ok_or_else(too_few_results))
            .collect::<std::result::Result<_, _>>()?;
        Ok((results, opened))
    }

    /// Queues one shard's part, in the room reserved for it, and waits for
    /// its writer's reply.
    async fn send_part(
        &self,
        shard: u16,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
        room: OwnedSemaphorePermit,
    ) -> Result<ShardReply> {
        let (job, done) = AddJob::new(shard, items, deadline, room);
        self.queues[usize::from(shard)].send(job)?;
        done.await.map_err(|_| writer_gone())?
    }
}

fn too_few_results() -> StoreError {
    DecodeError("the add function returned too few results".into()).into()
}

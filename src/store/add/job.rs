//! What a request asks of the add writers (`writer.rs`) and what they
//! answer: the items of one shard's part, as a job with its deadline and
//! its room in the shard's queue, and one result slot per item.

use std::time::Duration;

use redis::{ErrorKind, RedisError};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::time::Instant;

use super::reply::Room;
use crate::batch::{AddResult, Batch, Item, OpenLimit};
use crate::policy::Policy;
use crate::store::{Result, StoreError};

/// One item to add, with the policy of its key resolved.
#[derive(Clone, Debug)]
pub struct NewItem {
    pub key: String,
    pub item: Item,
    pub policy: Policy,
    /// Flush the group right after adding the item (`close_group`).
    pub close: bool,
    /// For a requeued item: the id of the batch it is requeued from. The
    /// item then bypasses the dedup window, once per (batch, item).
    pub requeue_of: Option<String>,
}

/// What a shard writer answers for one job: the earliest due time the call
/// opened, and one result per item of the job.
pub(super) type ShardReply = (Option<u64>, Vec<Slot>);

/// One item's result from a round of add calls: done, or waiting for room
/// under a limit on open groups.
#[derive(Debug)]
pub(super) enum Slot {
    Done(AddResult),
    Waiting(Box<Waiting>),
}

/// An item whose group could not open under a limit on open groups whose
/// overflow flushes the oldest: the group to flush first, if the call named
/// one, and what the item wrote before it waited.
#[derive(Debug)]
pub(super) struct Waiting {
    pub item: NewItem,
    pub room: Option<Room>,
    pub limit: OpenLimit,
    pub flushed: Vec<Batch>,
}

/// When a call must be answered by: the instant, and the whole budget it was
/// given (for the message that says how long Redis had).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    /// A deadline `budget` from now.
    pub fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
            budget,
        }
    }

    /// The error of a call that ran out of time.
    pub fn expired(&self) -> StoreError {
        StoreError::Timeout(self.budget)
    }
}

/// One request's part for one shard, waiting for its shard's writer.
pub(super) struct AddJob {
    pub shard: u16,
    pub items: Vec<NewItem>,
    deadline: Option<Deadline>,
    pub reply: oneshot::Sender<Result<ShardReply>>,
    /// The part's room in the queue, given back when the job is dropped.
    _room: OwnedSemaphorePermit,
}

impl AddJob {
    /// A job of `items` for `shard`, in the room reserved for it, and where
    /// its reply will come.
    pub(super) fn new(
        shard: u16,
        items: Vec<NewItem>,
        deadline: Option<Deadline>,
        room: OwnedSemaphorePermit,
    ) -> (AddJob, oneshot::Receiver<Result<ShardReply>>) {
        let (reply, done) = oneshot::channel();
        let job = AddJob {
            shard,
            items,
            deadline,
            reply,
            _room: room,
        };
        (job, done)
    }

    /// Whether the job's deadline has passed; if so, answers it so.
    pub(super) fn expired(self, now: Instant) -> Option<AddJob> {
        match self.deadline {
            Some(deadline) if deadline.at <= now => {
                let _ = self.reply.send(Err(deadline.expired()));
                None
            }
            _ => Some(self),
        }
    }
}

pub(super) fn writer_gone() -> StoreError {
    StoreError::Redis(RedisError::from((
        ErrorKind::Client,
        "shard writer stopped",
    )))
}

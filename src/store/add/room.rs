//! Making room under a limit on open groups. An add whose group cannot open
//! under a limit (see `src/lua/limits.lua`) and whose key's policy flushes
//! the oldest waits: the store flushes the group the add function named,
//! the least recently added-to under that limit (reason OVERFLOW, by the
//! flush function, which declares that group's hash as every key a
//! function touches must be), then adds the item again. Each open checks
//! the limit atomically, so the limit holds at every instant; an add that
//! still finds no room after [`ROUNDS`] rounds (other adds took the room
//! first) is refused.

use std::collections::HashSet;

use futures::future::try_join_all;

use super::AddReport;
use super::job::{Deadline, Slot, Waiting};
use crate::batch::{AddOutcome, AddResult, Batch};
use crate::store::{Result, Store, StoreError};

/// Most rounds of making room before a waiting add is refused.
pub const ROUNDS: usize = 4;

impl Store {
    /// Makes room for the waiting items of `slots`, a round at a time, and
    /// answers every item: added, duplicate, or refused.
    pub(super) async fn settle(
        &self,
        mut slots: Vec<Slot>,
        mut opened: Vec<(u16, u64)>,
        deadline: Option<Deadline>,
    ) -> Result<AddReport> {
        for _ in 0..ROUNDS {
            let (waiting, parked): (Vec<usize>, Vec<Waiting>) = slots
                .iter_mut()
                .enumerate()
                .filter_map(|(at, slot)| slot.take_waiting().map(|w| (at, w)))
                .unzip();
            if waiting.is_empty() {
                break;
            }
            let mut flushed = self.make_room(&parked).await?;
            let items = parked.into_iter().map(|w| w.item).collect();
            let (again, more) = self.add_round(items, deadline).await?;
            opened.extend(more);
            for ((at, slot), before) in waiting.into_iter().zip(again).zip(flushed.drain(..)) {
                slots[at] = slot.after(before);
            }
        }
        let results = slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(result) => result,
                Slot::Waiting(w) => AddResult {
                    outcome: AddOutcome::Refused(w.limit),
                    group_size: 0,
                    flushed: w.flushed,
                },
            })
            .collect();
        Ok(AddReport { results, opened })
    }

    /// Flushes each group the waiting items name, once, and returns per
    /// item the batches it has written so far: its own, then those of the
    /// group it named first (its OVERFLOW flush).
    async fn make_room(&self, parked: &[Waiting]) -> Result<Vec<Vec<Batch>>> {
        let mut named = HashSet::new();
        let flushes = parked.iter().enumerate().filter_map(|(at, w)| {
            let room = w
                .room
                .as_ref()
                .filter(|room| named.insert(room.key.as_str()))?;
            Some(async move {
                let batches = self.flush_overflow(&room.key).await?;
                Ok::<_, StoreError>((at, batches))
            })
        });
        let done = try_join_all(flushes).await?;
        let mut flushed: Vec<Vec<Batch>> = parked.iter().map(|w| w.flushed.clone()).collect();
        for (at, batches) in done {
            flushed[at].extend(batches);
        }
        Ok(flushed)
    }
}

impl Slot {
    /// The waiting item of this slot, leaving the slot empty (a done slot
    /// with no result), or `None` when it is done.
    fn take_waiting(&mut self) -> Option<Waiting> {
        if !matches!(self, Slot::Waiting(_)) {
            return None;
        }
        let placeholder = Slot::Done(AddResult {
            outcome: AddOutcome::Added,
            group_size: 0,
            flushed: Vec::new(),
        });
        match std::mem::replace(self, placeholder) {
            Slot::Waiting(w) => Some(*w),
            Slot::Done(_) => None,
        }
    }

    /// This slot, with `before` (batches written by the item's earlier
    /// rounds) ahead of its own.
    fn after(self, mut before: Vec<Batch>) -> Slot {
        match self {
            Slot::Done(mut result) => {
                before.append(&mut result.flushed);
                result.flushed = before;
                Slot::Done(result)
            }
            Slot::Waiting(mut w) => {
                before.append(&mut w.flushed);
                w.flushed = before;
                Slot::Waiting(w)
            }
        }
    }
}

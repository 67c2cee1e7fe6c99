//! Policies as shared live data: the policy store in Redis, and this
//! instance's copy of it, which the add path resolves keys against.
//!
//! The store holds one document per policy: `defaults` (its unset fields
//! come from the built-in defaults) and `keys/<pattern>` (an exact key or a
//! `*` glob; its unset fields come from `defaults`), each with the revision
//! that last wrote it, which is its etag. Every change is one revision,
//! written by one script that refuses it if the store moved on since the
//! change was computed (see `store::policies`), and recorded in the history
//! with who made it, why, and each field's old and new value.
//!
//! Each instance keeps every document in memory. A task checks the store's
//! revision every `[policy_store] check_every` and replays the revisions it
//! has not seen from the history (or loads every document again when the
//! history no longer reaches back, or holds a bulk change), then swaps in
//! the new revision's table at once: an add is judged by one revision,
//! never part of one. That table is made from the one in force and the
//! documents that changed, so a change costs each instance time in
//! proportion to it, not to the store (a change of the defaults rebuilds it). A change made here is in force here before its call
//! returns, and everywhere within `check_every` plus one read.
//!
//! `changes` holds the change logic (update masks, etags, the checks a file's
//! tables get, the field changes the history records); `retime` brings open
//! groups under a changed policy.

mod changes;
mod retime;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::Code;

pub use self::changes::{Action, Change, Changed, FIELDS, check_name, not_found};
use crate::config::{Config, KeyPolicy, PolicyDefaults};
use crate::error::Error;
use crate::policy::{Policies, PolicyHandle};
use crate::store::{BULK_CHANGE, Revision, Store, StoredPolicy};

/// The name of the defaults' document.
pub const DEFAULTS: &str = "defaults";
/// The start of every key pattern's document name.
pub const KEYS: &str = "keys/";

/// How many history entries one read replays.
const REPLAY_CHUNK: usize = 1000;

/// `in_force` before any revision's policies are: the handle holds the
/// config file's.
const NONE_IN_FORCE: u64 = u64::MAX;

/// What a catch-up moved in the copy: from revision `from`, the documents
/// `docs` names, each with what it was at `from` (`None`: absent).
struct Moved {
    from: u64,
    docs: BTreeMap<String, Option<StoredPolicy>>,
}

/// The policy store and this instance's copy of it; cheap to clone.
#[derive(Clone)]
pub struct PolicyStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// The configuration whose `[limits]` every policy is checked against.
    base: Config,
    /// The table the add path reads.
    handle: PolicyHandle,
    /// Whether the store was loaded and its policies put in force.
    loaded: AtomicBool,
    /// The revision whose policies the handle holds (`NONE_IN_FORCE`
    /// before the first): a change is put in force on top of the table
    /// only when that table is the revision before it.
    in_force: AtomicU64,
    /// Who the history names for the seeding from the config file.
    seeder: String,
    /// This instance's copy, behind a lock that changes made here and the
    /// checking task take in turn.
    copy: Mutex<Snapshot>,
}

/// Every document, as of one revision.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The store's revision this copy is at.
    pub revision: u64,
    /// Every document, by name; shared, so that a copy costs nothing
    /// until one side changes.
    pub docs: Arc<BTreeMap<String, StoredPolicy>>,
}

impl Snapshot {
    /// The defaults' fields (none set when there is no `defaults` document).
    fn defaults(&self) -> KeyPolicy {
        self.docs
            .get(DEFAULTS)
            .map(|d| d.policy.clone())
            .unwrap_or_default()
    }

    /// The defaults complete: their fields over the built-in defaults.
    fn complete_defaults(&self) -> PolicyDefaults {
        self.defaults().over(&PolicyDefaults::default())
    }

    /// Every key pattern's fields, by pattern.
    fn patterns(&self) -> BTreeMap<String, KeyPolicy> {
        self.docs
            .iter()
            .filter_map(|(name, doc)| {
                Some((name.strip_prefix(KEYS)?.to_owned(), doc.policy.clone()))
            })
            .collect()
    }
}

impl PolicyStore {
    /// The policy store for `config`, putting its policies in force in
    /// `handle` once [`PolicyStore::run`] has loaded it. `who` names the
    /// seeding of an empty store from `config`'s tables in the history.
    pub fn new(store: Store, config: &Config, handle: PolicyHandle, who: &str) -> PolicyStore {
        PolicyStore {
            inner: Arc::new(Inner {
                store,
                base: config.clone(),
                handle,
                copy: Mutex::new(Snapshot::default()),
                loaded: AtomicBool::new(false),
                in_force: AtomicU64::new(NONE_IN_FORCE),
                seeder: who.to_owned(),
            }),
        }
    }

    /// Whether the store has been loaded and its policies are in force;
    /// until then, adds are refused UNAVAILABLE.
    pub fn check_loaded(&self) -> Result<(), Error> {
        if self.inner.loaded.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(Error::refused(
            Code::Unavailable,
            "POLICIES_NOT_LOADED",
            "the policy store has not been read yet (is Redis reachable?); retry later",
        ))
    }

    /// Loads the store and puts its policies in force. An empty store (one
    /// that never took a change) is first seeded from the config file's
    /// `[defaults]` and `[keys."..."]`, as one revision.
    async fn load_first(&self) -> Result<(), Error> {
        let mut copy = self.inner.copy.lock().await;
        self.catch_up(&mut copy).await?;
        if copy.revision == 0 {
            drop(copy);
            self.seed().await?;
        } else {
            self.put_in_force(&copy).await?;
        }
        self.inner.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes the file's tables into the empty store; if another instance
    /// seeded it first, its revision stands.
    async fn seed(&self) -> Result<(), Error> {
        let (config, who) = (&self.inner.base, self.inner.seeder.as_str());
        let mut changes = vec![Change::set(DEFAULTS, KeyPolicy::complete(&config.defaults))];
        for (pattern, table) in &config.keys {
            changes.push(Change::set(&format!("{KEYS}{pattern}"), table.clone()));
        }
        let reason = "seeded from the config file";
        match self.change(changes, who, reason, Some(0)).await {
            Ok(_) => Ok(()),
            Err(Error::Refused {
                reason: "STORE_MOVED",
                ..
            }) => {
                let mut copy = self.inner.copy.lock().await;
                self.catch_up(&mut copy).await?;
                self.put_in_force(&copy).await
            }
            Err(err) => Err(err),
        }
    }

    /// Loads the store (trying again every `every` while it cannot), then
    /// checks it every `every` and puts new revisions in force, until
    /// `shutdown`; a failed check is logged and tried again.
    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        let started = std::time::Instant::now();
        let mut failing = false;
        while let Err(err) = self.load_first().await {
            if !failing {
                tracing::warn!(%err, "cannot load the policy store; adds wait for it");
            }
            failing = true;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
        let policies = self.inner.copy.lock().await.docs.len();
        tracing::info!(policies, took = ?started.elapsed(), "policy store loaded");
        failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let result = self.refresh().await;
            match (&result, failing) {
                (Err(err), false) => tracing::warn!(%err, "cannot read the policy store"),
                (Ok(_), true) => tracing::info!("the policy store answers again"),
                _ => {}
            }
            failing = result.is_err();
        }
    }

    /// Brings this instance's copy up to the store's revision and puts it
    /// in force; returns the revision in force.
    pub async fn refresh(&self) -> Result<u64, Error> {
        let mut copy = self.inner.copy.lock().await;
        if let Some(moved) = self.catch_up(&mut copy).await?
            && let Some(follow) = self.apply(&moved, &copy).await?
        {
            tokio::spawn(follow);
        }
        Ok(copy.revision)
    }

    /// A copy of every document as of the store's revision now.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.refresh().await?;
        Ok(self.inner.copy.lock().await.clone())
    }

    /// Revisions before `before` (all when `None`), newest first, at most
    /// `count`, those touching `name` only when it is given.
    pub async fn history(
        &self,
        name: Option<&str>,
        before: Option<u64>,
        count: usize,
    ) -> Result<(Vec<Revision>, Option<u64>), Error> {
        let store = &self.inner.store;
        let mut found = Vec::new();
        let mut before = before;
        loop {
            let page = store.policy_history_before(before, REPLAY_CHUNK).await?;
            let Some(last) = page.last() else {
                return Ok((found, None));
            };
            before = Some(last.revision);
            let full = page.len() == REPLAY_CHUNK;
            for rev in page {
                let touches = name.is_none_or(|n| rev.changes.iter().any(|c| c.name == n));
                if touches && found.len() == count {
                    let next = found.last().map(|r: &Revision| r.revision);
                    return Ok((found, next));
                }
                if touches {
                    found.push(rev);
                }
            }
            if !full {
                return Ok((found, None));
            }
        }
    }

    /// Makes `changes` as one revision by `who`, for `reason`, and puts it
    /// in force here before returning. With `expect`, only if the store is
    /// at that revision (STORE_MOVED otherwise).
    pub async fn change(
        &self,
        changes: Vec<Change>,
        who: &str,
        reason: &str,
        expect: Option<u64>,
    ) -> Result<Changed, Error> {
        let mut copy = self.inner.copy.lock().await;
        // Another instance may write between our read and our write; the
        // script then refuses ours, and we compute it again on the new state.
        for _ in 0..8 {
            if let Some(moved) = self.catch_up(&mut copy).await?
                && let Some(follow) = self.apply(&moved, &copy).await?
            {
                tokio::spawn(follow);
            }
            if expect.is_some_and(|e| e != copy.revision) {
                return Err(changes::store_moved(copy.revision));
            }
            let plan = changes::plan(&self.inner.base, &copy, &changes)?;
            let written = self.write(&copy, &plan, who, reason).await?;
            if let crate::store::Written::At { revision, .. } = written {
                let follow = match self.catch_up(&mut copy).await? {
                    Some(moved) => self.apply(&moved, &copy).await?,
                    None => None,
                };
                let changed = plan.changed(revision, &copy);
                drop(copy);
                // The groups follow before the call returns, here.
                if let Some(follow) = follow {
                    follow.await;
                }
                return Ok(changed);
            }
        }
        Err(changes::store_moved(copy.revision))
    }

    /// Writes `plan`, computed on `copy`: as one script, or for a bulk
    /// change, staged and swapped in (see `Store::replace_policies`).
    async fn write(
        &self,
        copy: &Snapshot,
        plan: &changes::Plan,
        who: &str,
        reason: &str,
    ) -> Result<crate::store::Written, Error> {
        let store = &self.inner.store;
        let keep = self.inner.base.policy_store.history.get();
        if plan.writes.len() <= BULK_CHANGE {
            return Ok(store
                .write_policies(copy.revision, who, reason, keep, &plan.writes)
                .await?);
        }
        let time = store.redis_time_ms().await?;
        let mut docs = (*copy.docs).clone();
        for write in &plan.writes {
            match &write.body {
                Some(policy) => docs.insert(
                    write.name.clone(),
                    StoredPolicy {
                        revision: copy.revision + 1,
                        updated_at: time,
                        updated_by: who.to_owned(),
                        policy: policy.clone(),
                    },
                ),
                None => docs.remove(&write.name),
            };
        }
        let json = docs
            .iter()
            .map(|(name, doc)| {
                let text = serde_json::to_string(doc)
                    .map_err(|e| crate::batch::DecodeError(format!("policy {name}: {e}")));
                Ok((name.clone(), text.map_err(crate::store::StoreError::from)?))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let count = plan.writes.len();
        Ok(store
            .replace_policies(copy.revision, who, reason, keep, &json, count, time)
            .await?)
    }

    /// Brings `copy` up to the store's revision; says what moved, if
    /// anything did.
    async fn catch_up(&self, copy: &mut Snapshot) -> Result<Option<Moved>, Error> {
        let store = &self.inner.store;
        let revision = store.policy_revision().await?;
        if revision == copy.revision {
            return Ok(None);
        }
        let from = copy.revision;
        let mut docs = BTreeMap::new();
        if revision > from && self.replay(copy, &mut docs).await? {
            return Ok(Some(Moved { from, docs }));
        }
        // Loaded again: what moved is every document that differs from
        // before (or from before the replay, for those it changed).
        let before = Arc::clone(&copy.docs);
        self.load(copy).await?;
        for (name, doc) in before.iter() {
            if copy
                .docs
                .get(name)
                .is_none_or(|now| now.revision != doc.revision)
            {
                docs.entry(name.clone())
                    .or_insert_with(|| Some(doc.clone()));
            }
        }
        for name in copy.docs.keys() {
            if !before.contains_key(name) {
                docs.entry(name.clone()).or_insert(None);
            }
        }
        Ok(Some(Moved { from, docs }))
    }

    /// Replays the history after `copy.revision` onto `copy`, recording in
    /// `was` what each document it changes was before; false when it cannot
    /// (the history no longer reaches back, or holds a bulk change).
    async fn replay(
        &self,
        copy: &mut Snapshot,
        was: &mut BTreeMap<String, Option<StoredPolicy>>,
    ) -> Result<bool, Error> {
        loop {
            let page = self
                .inner
                .store
                .policy_history_after(copy.revision, REPLAY_CHUNK)
                .await?;
            for rev in &page {
                if rev.revision != copy.revision + 1 || rev.bulk.is_some() {
                    return Ok(false);
                }
                let docs = Arc::make_mut(&mut copy.docs);
                for change in &rev.changes {
                    let old = match &change.doc {
                        Some(doc) => docs.insert(change.name.clone(), doc.clone()),
                        None => docs.remove(&change.name),
                    };
                    was.entry(change.name.clone()).or_insert(old);
                }
                copy.revision = rev.revision;
            }
            if page.len() < REPLAY_CHUNK {
                return Ok(true);
            }
        }
    }

    /// Loads every document again: the revision, then the documents, then
    /// the revisions made while they were read (documents are whole, so
    /// replaying a revision the read already saw changes nothing).
    async fn load(&self, copy: &mut Snapshot) -> Result<(), Error> {
        let store = &self.inner.store;
        for _ in 0..8 {
            copy.revision = store.policy_revision().await?;
            copy.docs = Arc::new(store.policy_docs().await?.into_iter().collect());
            if self.replay(copy, &mut BTreeMap::new()).await? {
                return Ok(());
            }
        }
        Err(changes::store_moved(copy.revision))
    }

    /// Puts `copy` in force (`moved` says what changed in it), and returns
    /// the work that brings open groups under it when it may shorten a
    /// `max_wait`.
    async fn apply(
        &self,
        moved: &Moved,
        copy: &Snapshot,
    ) -> Result<Option<impl Future<Output = ()> + use<>>, Error> {
        let old = self.inner.handle.current();
        let Moved { from, docs } = moved;
        // When the table in force is the revision before and the defaults
        // stay, only the changed patterns need putting in force.
        let in_force = self.inner.in_force.load(Ordering::Acquire);
        if in_force == *from && !docs.contains_key(DEFAULTS) {
            self.put_changes_in_force(copy, docs.keys())?;
        } else {
            self.put_in_force(copy).await?;
        }
        let new = self.inner.handle.current();
        let pairs = docs
            .iter()
            .map(|(name, was)| (name.as_str(), was.as_ref(), copy.docs.get(name)));
        // A table in force older than the revision before (one in between
        // broke this instance's [limits]) may differ in any key.
        let older = in_force != *from && in_force != NONE_IN_FORCE;
        let shorten = older || retime::may_shorten(pairs, &old, &new);
        if !shorten {
            return Ok(None);
        }
        Ok(Some(retime::follow(self.inner.store.clone(), old, new)))
    }

    /// Puts the documents `names` (key patterns; never the defaults) of
    /// `copy` in force on top of the table in force, which is the revision
    /// before them: in time proportional to them, not to the table.
    fn put_changes_in_force<'a>(
        &self,
        copy: &Snapshot,
        names: impl Iterator<Item = &'a String>,
    ) -> Result<(), Error> {
        let defaults = copy.complete_defaults();
        let mut changes = Vec::new();
        for name in names {
            let Some(pattern) = name.strip_prefix(KEYS) else {
                continue;
            };
            let policy = match copy.docs.get(name) {
                Some(doc) => Some(
                    self.inner
                        .base
                        .key_policy(&defaults, pattern, &doc.policy)
                        .map_err(|violation| self.breaks_limits(copy, &violation))?,
                ),
                None => None,
            };
            changes.push((pattern.to_owned(), policy));
        }
        let policies = self.inner.handle.current().with_changes(changes);
        self.inner.handle.replace(policies);
        self.in_force(copy);
        Ok(())
    }

    /// Logs that `copy`'s revision breaks this instance's `[limits]`, and
    /// returns the error.
    fn breaks_limits(&self, copy: &Snapshot, violation: &crate::config::Violation) -> Error {
        tracing::error!(
            revision = copy.revision,
            %violation,
            "the policy store's revision breaks this instance's [limits]; keeping the policies in force"
        );
        changes::invalid_policy(violation)
    }

    /// Records that `copy`'s revision is in force.
    fn in_force(&self, copy: &Snapshot) {
        self.inner.in_force.store(copy.revision, Ordering::Release);
        tracing::debug!(revision = copy.revision, "policies in force");
    }

    /// Swaps `copy`'s policies in for the add path, whole. The table is
    /// built on the blocking pool: for a large store it takes a while, and
    /// the runtime's worker goes on serving calls meanwhile.
    async fn put_in_force(&self, copy: &Snapshot) -> Result<(), Error> {
        let inner = Arc::clone(&self.inner);
        let snapshot = copy.clone();
        let built = tokio::task::spawn_blocking(move || {
            let config = inner
                .base
                .with_policies(&snapshot.defaults(), snapshot.patterns())?;
            Ok(config.policies())
        })
        .await
        .map_err(|err| {
            // Only a runtime shutting down cancels it.
            let message = format!("the policy table was not built: {err}");
            Error::refused(Code::Unavailable, "SHUTTING_DOWN", message)
        })?;
        let policies: Policies = built.map_err(|violation| self.breaks_limits(copy, &violation))?;
        self.inner.handle.replace(policies);
        self.in_force(copy);
        Ok(())
    }
}

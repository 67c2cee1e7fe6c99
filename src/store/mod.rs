//! The store: every read and write of batcher's state in Redis.
//!
//! Writes go through the Lua scripts in `scripts`; each call passes all of its
//! keys in KEYS, and they always share one shard's hash tag. Calls made
//! together (AddMany across shards, a sweep's flushes) are issued
//! concurrently on the multiplexed connection, which pipelines them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};

use crate::batch::{Batch, DecodeError, FlushReason, Group, Item, StreamId, decode_items};
use crate::config::Policy;
use crate::keys::{Keyspace, debug_assert_one_slot};
use crate::scripts;

/// Errors of the store layer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis could not be reached, or is not ready to serve (loading, failing over).
    #[error("redis unavailable: {0}")]
    Unavailable(RedisError),
    /// Redis answered with an error that retrying will not fix.
    #[error("redis error: {0}")]
    Redis(RedisError),
    /// Redis holds data that batcher did not write in that shape.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

impl From<RedisError> for StoreError {
    fn from(err: RedisError) -> StoreError {
        let transient = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
            );
        if transient {
            StoreError::Unavailable(err)
        } else {
            StoreError::Redis(err)
        }
    }
}

/// Result type of the store.
pub type Result<T> = std::result::Result<T, StoreError>;

/// One item to add, with the policy of its key resolved.
#[derive(Clone, Debug)]
pub struct NewItem {
    pub key: String,
    pub item: Item,
    pub policy: Policy,
}

/// What an add did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    Added,
    Duplicate,
}

/// The result of one add.
#[derive(Clone, Debug)]
pub struct AddResult {
    pub outcome: AddOutcome,
    /// Size of the open group after the add; 0 when it flushed.
    pub group_size: u32,
    /// The batch this add completed.
    pub flushed: Option<Batch>,
}

/// The results of a set of adds, and the deadlines the adds opened.
#[derive(Debug, Default)]
pub struct AddReport {
    /// One per item, in request order.
    pub results: Vec<AddResult>,
    /// Per shard that had a group opened: the earliest due time opened (ms).
    pub opened: Vec<(u16, u64)>,
}

/// What one sweep step saw in a shard.
#[derive(Debug)]
pub struct DueScan {
    /// Redis's clock at the scan (ms).
    pub now_ms: u64,
    /// The earliest due time of a group not yet due.
    pub next_due_ms: Option<u64>,
    /// Keys of the groups that are due, soonest first.
    pub keys: Vec<String>,
}

/// A position in the list of open groups: (due time, key).
pub type GroupPos = (u64, String);

/// The Redis-backed state of batcher.
#[derive(Clone)]
pub struct Store {
    /// Multiplexed and self-reconnecting; shared by every request. Never used
    /// for blocking reads, which would stall every other caller.
    conn: ConnectionManager,
    /// Kept to open dedicated connections for blocking stream reads.
    client: redis::Client,
    keys: Keyspace,
    dedup_ms: u64,
    /// One add writer per shard (see [`Store::add`]).
    writers: Arc<[mpsc::UnboundedSender<AddJob>]>,
}

/// Timeouts of the command connection.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

impl Store {
    /// A store over the Redis at `url`. Connects lazily, so the service starts
    /// (and answers UNAVAILABLE) while Redis is down. Must be called inside a
    /// tokio runtime: it starts one add writer task per shard, which ends
    /// when the last clone of the store is dropped.
    pub fn open(
        url: &str,
        keys: Keyspace,
        dedup_window: Duration,
        timeouts: Timeouts,
    ) -> Result<Store> {
        // No Nagle: every command is a small write that must not wait for
        // Redis's delayed ACK (redis-rs leaves TCP_NODELAY off by default).
        let info = redis::IntoConnectionInfo::into_connection_info(url)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let dedup_ms = dedup_window.as_millis() as u64;
        let writers = (0..keys.shards())
            .map(|shard| {
                let (tx, rx) = mpsc::unbounded_channel();
                let writer = AddWriter {
                    conn: conn.clone(),
                    keys: keys.clone(),
                    dedup_ms,
                    shard,
                };
                tokio::spawn(writer.run(rx));
                tx
            })
            .collect();
        Ok(Store {
            conn,
            client,
            keys,
            dedup_ms,
            writers,
        })
    }

    /// The key layout.
    pub fn keyspace(&self) -> &Keyspace {
        &self.keys
    }

    /// The client, for dedicated connections.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    async fn run_script(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<Value> {
        invoke(&self.conn, script, keys, args).await
    }

    /// Adds items, atomically per shard, in request order. A group that
    /// reaches its threshold is flushed by the add that completes it.
    ///
    /// Each shard's part goes to that shard's writer, which runs it in one
    /// add script, together with whatever other requests queued up for the
    /// shard meanwhile: under load, many small requests share one script call.
    pub async fn add(&self, items: Vec<NewItem>) -> Result<AddReport> {
        // Split the request per shard, keeping each shard's items in order.
        let count = items.len();
        let mut per_shard: HashMap<u16, (Vec<usize>, Vec<NewItem>)> = HashMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let part = per_shard.entry(self.keys.shard_of(&item.key)).or_default();
            part.0.push(index);
            part.1.push(item);
        }
        let calls = per_shard
            .into_iter()
            .map(|(shard, (indexes, items))| async move {
                let (reply, done) = oneshot::channel();
                let writer = &self.writers[usize::from(shard)];
                if writer.send(AddJob { items, reply }).is_err() {
                    return Err(writer_gone());
                }
                let (earliest, results) = done.await.map_err(|_| writer_gone())??;
                Ok((shard, indexes, earliest, results))
            });
        let replies = try_join_all(calls).await?;

        let mut results: Vec<Option<AddResult>> = vec![None; count];
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
            .map(|r| r.ok_or_else(|| DecodeError("add_items returned too few results".into())))
            .collect::<std::result::Result<_, _>>()?;
        Ok(AddReport { results, opened })
    }

    /// Removes an item from its open group. Returns whether it was there, and
    /// the group's size after.
    pub async fn remove(&self, key: &str, id: &[u8]) -> Result<(bool, u32)> {
        let shard = self.keys.shard_of(key);
        let shard_keys = self.keys.shard(shard);
        let group = self.keys.group(shard, key);
        let reply = self
            .run_script(
                &scripts::REMOVE_ITEM,
                &[&shard_keys.due, &group],
                vec![key.as_bytes().to_vec(), id.to_vec()],
            )
            .await?;
        let [removed, size] = take_array::<2>(reply, "remove_item")?;
        Ok((int(&removed)? == 1, int(&size)? as u32))
    }

    /// Flushes a key's open group. With `Timeout`, only if it is due by the
    /// Redis clock. Returns the batch, if one was written.
    pub async fn flush(&self, key: &str, reason: FlushReason) -> Result<Option<Batch>> {
        let shard = self.keys.shard_of(key);
        self.flush_in_shard(shard, key, reason).await
    }

    async fn flush_in_shard(
        &self,
        shard: u16,
        key: &str,
        reason: FlushReason,
    ) -> Result<Option<Batch>> {
        let shard_keys = self.keys.shard(shard);
        let group = self.keys.group(shard, key);
        let reply = self
            .run_script(
                &scripts::FLUSH_GROUP,
                &[
                    &shard_keys.due,
                    &shard_keys.stream,
                    &shard_keys.flushed,
                    &group,
                ],
                vec![
                    key.as_bytes().to_vec(),
                    reason.as_str().as_bytes().to_vec(),
                    self.dedup_ms.to_string().into_bytes(),
                ],
            )
            .await?;
        match reply {
            Value::Nil => Ok(None),
            value => Ok(Some(batch_from_script(shard, key, value)?)),
        }
    }

    /// Reads which groups of a shard are due (at most `limit`), and when the
    /// next one falls due.
    pub async fn due_groups(&self, shard: u16, limit: usize) -> Result<DueScan> {
        let shard_keys = self.keys.shard(shard);
        let reply = self
            .run_script(
                &scripts::DUE_GROUPS,
                &[&shard_keys.due],
                vec![limit.to_string().into_bytes()],
            )
            .await?;
        let mut values = array(reply)?.into_iter();
        let now_ms = values.next().map(|v| int(&v)).transpose()?.unwrap_or(0) as u64;
        let next = values.next().map(|v| int(&v)).transpose()?.unwrap_or(-1);
        let keys = values.map(string).collect::<std::result::Result<_, _>>()?;
        Ok(DueScan {
            now_ms,
            next_due_ms: (next >= 0).then_some(next as u64),
            keys,
        })
    }

    /// Flushes, by timeout, those of the given groups of one shard that are
    /// still due. The calls are pipelined.
    pub async fn flush_due(&self, shard: u16, keys: &[String]) -> Result<Vec<Batch>> {
        let calls = keys
            .iter()
            .map(|key| self.flush_in_shard(shard, key, FlushReason::Timeout));
        Ok(try_join_all(calls).await?.into_iter().flatten().collect())
    }

    /// Reads a key's open group, with its items in arrival order.
    pub async fn group(&self, key: &str) -> Result<Option<Group>> {
        let shard = self.keys.shard_of(key);
        let mut conn = self.conn.clone();
        let flat: Vec<Vec<u8>> = redis::cmd("HGETALL")
            .arg(self.keys.group(shard, key))
            .query_async(&mut conn)
            .await?;
        if flat.is_empty() {
            return Ok(None);
        }
        let mut meta: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut items: Vec<(u64, Item)> = Vec::new();
        let mut pairs = flat.into_iter();
        while let (Some(field), Some(value)) = (pairs.next(), pairs.next()) {
            if let Some(id) = field.strip_prefix(b":") {
                let comma = value
                    .iter()
                    .position(|b| *b == b',')
                    .ok_or_else(|| DecodeError("group item without sequence".into()))?;
                let seq = parse_u64(&value[..comma])?;
                items.push((
                    seq,
                    Item {
                        id: id.to_vec(),
                        payload: value[comma + 1..].to_vec(),
                    },
                ));
            } else {
                meta.insert(field, value);
            }
        }
        items.sort_by_key(|(seq, _)| *seq);
        let field = |name: &[u8]| -> std::result::Result<u64, DecodeError> {
            meta.get(name)
                .map(|v| parse_u64(v))
                .unwrap_or_else(|| Err(DecodeError("group without metadata".into())))
        };
        Ok(Some(Group {
            key: key.to_owned(),
            size: field(b"n")? as u32,
            bytes: field(b"b")?,
            opened_at_ms: field(b"o")?,
            due_at_ms: field(b"d")?,
            items: items.into_iter().map(|(_, item)| item).collect(),
        }))
    }

    /// Lists open groups soonest-due first, after `after`, whose key starts
    /// with `prefix`. Returns the page and the position to continue from, if
    /// there may be more. Scans a bounded number of entries per shard, so a
    /// rare prefix can yield a short (even empty) page with a continuation.
    pub async fn list_groups(
        &self,
        limit: usize,
        after: Option<&GroupPos>,
        prefix: &str,
    ) -> Result<(Vec<Group>, Option<GroupPos>)> {
        const SCAN_BUDGET: usize = 4096;
        let scans = (0..self.keys.shards())
            .map(|shard| self.scan_due(shard, limit, after, prefix, SCAN_BUDGET));
        let scans = try_join_all(scans).await?;

        // A shard that ran out of budget was read only up to its last position:
        // the page must stop there too, or it would skip that shard's rest.
        let cut = scans
            .iter()
            .filter_map(|(_, stopped)| stopped.clone())
            .min();
        let mut candidates: Vec<(u64, String, u16)> = scans
            .into_iter()
            .enumerate()
            .flat_map(|(shard, (found, _))| {
                found
                    .into_iter()
                    .map(move |(due, key)| (due, key, shard as u16))
            })
            .filter(|(due, key, _)| cut.as_ref().is_none_or(|c| (*due, key) <= (c.0, &c.1)))
            .collect();
        candidates.sort();
        let full = candidates.len() > limit;
        candidates.truncate(limit);

        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for (_, key, shard) in &candidates {
            pipe.cmd("HMGET")
                .arg(self.keys.group(*shard, key))
                .arg(&["o", "d", "n", "b"]);
        }
        let metas: Vec<Vec<Option<u64>>> = if candidates.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut conn).await?
        };
        let mut groups = Vec::with_capacity(candidates.len());
        for ((due, key, _), meta) in candidates.iter().zip(metas) {
            // A group flushed between the two reads is simply left out.
            if let [Some(opened), Some(_), Some(size), Some(bytes)] = meta[..] {
                groups.push(Group {
                    key: key.clone(),
                    size: size as u32,
                    bytes,
                    opened_at_ms: opened,
                    due_at_ms: *due,
                    items: Vec::new(),
                });
            }
        }
        let next = if full || (candidates.len() == limit && cut.is_some()) {
            candidates.last().map(|(due, key, _)| (*due, key.clone()))
        } else {
            cut
        };
        Ok((groups, next))
    }

    /// Reads up to `limit` (due, key) entries of one shard after `after`
    /// matching `prefix`, scanning at most `budget` entries. Also returns the
    /// last position scanned when the budget ran out first.
    async fn scan_due(
        &self,
        shard: u16,
        limit: usize,
        after: Option<&GroupPos>,
        prefix: &str,
        budget: usize,
    ) -> Result<(Vec<GroupPos>, Option<GroupPos>)> {
        let due_key = self.keys.shard(shard).due;
        let mut conn = self.conn.clone();
        let min = after.map_or("-inf".to_owned(), |(due, _)| due.to_string());
        let page = 256.min(budget);
        let mut found = Vec::new();
        let mut scanned = 0;
        let mut last: Option<GroupPos> = None;
        while found.len() <= limit {
            let entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
                .arg(&due_key)
                .arg(&min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(scanned)
                .arg(page)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            let exhausted = entries.len() < page;
            scanned += entries.len();
            for (key, due) in entries {
                let pos = (due, key);
                if after.is_some_and(|a| pos <= *a) {
                    continue;
                }
                if pos.1.starts_with(prefix) {
                    found.push(pos.clone());
                }
                last = Some(pos);
            }
            if exhausted {
                return Ok((found, None));
            }
            if scanned >= budget {
                return Ok((found, last));
            }
        }
        Ok((found, None))
    }

    /// The last entry id each shard's stream ever generated: the position
    /// "now". Unlike the newest retained entry, it survives trimming, so a
    /// cursor stays valid after its batches are trimmed away.
    pub async fn stream_heads(&self) -> Result<Vec<StreamId>> {
        let heads = (0..self.keys.shards()).map(|shard| async move {
            let mut conn = self.conn.clone();
            let info: Value = match redis::cmd("XINFO")
                .arg("STREAM")
                .arg(self.keys.shard(shard).stream)
                .query_async(&mut conn)
                .await
            {
                Ok(info) => info,
                // No stream yet: nothing was ever flushed in this shard.
                Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
                    return Ok(StreamId::ZERO);
                }
                Err(err) => return Err(StoreError::from(err)),
            };
            let mut fields = array(info)?.into_iter();
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                if bytes(name)? == b"last-generated-id" {
                    return Ok(string(value)?.parse()?);
                }
            }
            Err(DecodeError("XINFO STREAM without last-generated-id".into()).into())
        });
        try_join_all(heads).await
    }

    /// Reads up to `count` batches of a shard's stream after `after`.
    pub async fn read_batches(
        &self,
        shard: u16,
        after: StreamId,
        count: usize,
    ) -> Result<Vec<Batch>> {
        let mut conn = self.conn.clone();
        let reply: Value = redis::cmd("XRANGE")
            .arg(self.keys.shard(shard).stream)
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await?;
        Ok(batches_from_entries(shard, reply)?)
    }

    /// Trims a shard's stream of entries older than `min`, but never one that
    /// a consumer group has not yet acked: the cut stays at or below every
    /// group's oldest pending entry, first undelivered entry and oldest dead
    /// letter. Returns the cut used.
    pub async fn trim_before(&self, shard: u16, min: StreamId) -> Result<StreamId> {
        let stream = self.keys.shard(shard).stream;
        let mut conn = self.conn.clone();
        let groups: Value = match redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&stream)
            .query_async(&mut conn)
            .await
        {
            Ok(groups) => groups,
            // No stream yet: nothing to trim.
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
                return Ok(min);
            }
            Err(err) => return Err(err.into()),
        };
        let mut cut = min;
        for group in array(groups)? {
            let mut name = None;
            let mut pending = 0;
            let mut last_delivered = StreamId::ZERO;
            let mut fields = array(group)?.into_iter();
            while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
                match bytes(field)?.as_slice() {
                    b"name" => name = Some(string(value)?),
                    b"pending" => pending = int(&value)?,
                    b"last-delivered-id" => last_delivered = string(value)?.parse()?,
                    _ => {}
                }
            }
            let name = name.ok_or_else(|| DecodeError("XINFO GROUPS without a name".into()))?;
            // Everything after the last delivered entry is undelivered.
            cut = cut.min(StreamId {
                ms: last_delivered.ms,
                seq: last_delivered.seq + 1,
            });
            if pending > 0 {
                let oldest: Value = redis::cmd("XPENDING")
                    .arg(&stream)
                    .arg(&name)
                    .arg("-")
                    .arg("+")
                    .arg(1)
                    .query_async(&mut conn)
                    .await?;
                if let Some(entry) = array(oldest)?.into_iter().next() {
                    let id = array(entry)?
                        .into_iter()
                        .next()
                        .ok_or_else(|| DecodeError("XPENDING entry".into()))?;
                    cut = cut.min(string(id)?.parse()?);
                }
            }
            let dead: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.keys.dead_letters(shard, &name))
                .arg(0)
                .arg(0)
                .query_async(&mut conn)
                .await?;
            if let Some(id) = dead.first() {
                cut = cut.min(id.parse()?);
            }
        }
        // Exact, not approximate (~): with `~` Redis only drops whole nodes,
        // and a quiet stream would keep its old batches indefinitely.
        redis::cmd("XTRIM")
            .arg(&stream)
            .arg("MINID")
            .arg(cut.to_string())
            .query_async::<()>(&mut conn)
            .await?;
        Ok(cut)
    }

    /// Reads a consumer group's definition.
    pub async fn consumer_group(&self, name: &str) -> Result<Option<String>> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("HGET")
            .arg(self.keys.consumer_groups())
            .arg(name)
            .query_async(&mut conn)
            .await?)
    }

    /// Creates a consumer group on every shard stream, starting at the end
    /// (`from_start` false) or at the oldest retained batch, then records its
    /// definition unless another caller recorded one first. Returns the
    /// definition in force.
    pub async fn create_consumer_group(
        &self,
        name: &str,
        definition: &str,
        from_start: bool,
    ) -> Result<String> {
        let mut conn = self.conn.clone();
        for shard in 0..self.keys.shards() {
            let created = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(self.keys.shard(shard).stream)
                .arg(name)
                .arg(if from_start { "0" } else { "$" })
                .arg("MKSTREAM")
                .query_async::<()>(&mut conn)
                .await;
            match created {
                Ok(()) => {}
                Err(err) if err.code() == Some("BUSYGROUP") => {}
                Err(err) => return Err(err.into()),
            }
        }
        let _: bool = redis::cmd("HSETNX")
            .arg(self.keys.consumer_groups())
            .arg(name)
            .arg(definition)
            .query_async(&mut conn)
            .await?;
        Ok(self
            .consumer_group(name)
            .await?
            .unwrap_or_else(|| definition.to_owned()))
    }

    /// Reads up to `count` batches of a shard not yet delivered to the group,
    /// and delivers them to `consumer` (they are pending until acked).
    /// Non-blocking, so it may use the shared connection.
    pub async fn read_group(
        &self,
        shard: u16,
        group: &str,
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Batch>> {
        let mut conn = self.conn.clone();
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(group)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(self.keys.shard(shard).stream)
            .arg(">")
            .query_async(&mut conn)
            .await?;
        let streams = array(reply)?;
        match streams.into_iter().next() {
            Some(stream) => {
                let [_, entries] = take_array::<2>(stream, "XREADGROUP")?;
                Ok(batches_from_entries(shard, entries)?)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Takes over a group's batches that have been pending for at least
    /// `min_idle` (only `owner`'s, if given) for `consumer`, dead-lettering
    /// those delivered `max_deliveries` times. Returns the batches with their
    /// delivery counts.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        shard: u16,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
        max_deliveries: u32,
        owner: Option<&str>,
    ) -> Result<Vec<(Batch, u32)>> {
        let stream = self.keys.shard(shard).stream;
        let dead = self.keys.dead_letters(shard, group);
        let reply = self
            .run_script(
                &scripts::CLAIM_BATCHES,
                &[&stream, &dead],
                vec![
                    group.as_bytes().to_vec(),
                    consumer.as_bytes().to_vec(),
                    (min_idle.as_millis() as u64).to_string().into_bytes(),
                    count.to_string().into_bytes(),
                    max_deliveries.to_string().into_bytes(),
                    owner.unwrap_or("").as_bytes().to_vec(),
                ],
            )
            .await?;
        let mut out = Vec::new();
        for claimed in array(reply)? {
            let [id, fields, deliveries] = take_array::<3>(claimed, "claimed entry")?;
            let deliveries = int(&deliveries)? as u32;
            let entry = Value::Array(vec![Value::Array(vec![id, fields])]);
            for batch in batches_from_entries(shard, entry)? {
                out.push((batch, deliveries));
            }
        }
        Ok(out)
    }

    /// Acks stream entries for a group (batches a consumer group skips).
    pub async fn ack_entries(&self, shard: u16, group: &str, ids: &[StreamId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("XACK");
        cmd.arg(self.keys.shard(shard).stream).arg(group);
        for id in ids {
            cmd.arg(id.to_string());
        }
        cmd.query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Acks batches (by shard and original entry id) for a group. Returns how
    /// many were pending.
    pub async fn ack(&self, group: &str, ids: &[(u16, StreamId)]) -> Result<u32> {
        let calls = per_shard(ids).into_iter().map(|(shard, ids)| async move {
            let stream = self.keys.shard(shard).stream;
            let redriven = self.keys.redriven(shard, group);
            let mut args = vec![group.as_bytes().to_vec()];
            args.extend(ids.iter().map(|id| id.to_string().into_bytes()));
            let reply = self
                .run_script(&scripts::ACK_BATCHES, &[&stream, &redriven], args)
                .await?;
            Ok::<_, StoreError>(int(&reply)? as u32)
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// Re-drives dead-lettered batches of a group. Returns how many were dead letters.
    pub async fn redrive(&self, group: &str, ids: &[(u16, StreamId)]) -> Result<u32> {
        let calls = per_shard(ids).into_iter().map(|(shard, ids)| async move {
            let stream = self.keys.shard(shard).stream;
            let dead = self.keys.dead_letters(shard, group);
            let redriven = self.keys.redriven(shard, group);
            let mut args = vec![group.as_bytes().to_vec()];
            args.extend(ids.iter().map(|id| id.to_string().into_bytes()));
            let reply = self
                .run_script(
                    &scripts::REDRIVE_BATCHES,
                    &[&stream, &dead, &redriven],
                    args,
                )
                .await?;
            Ok::<_, StoreError>(int(&reply)? as u32)
        });
        Ok(try_join_all(calls).await?.into_iter().sum())
    }

    /// A group's dead letters, oldest first, at most `limit`.
    pub async fn dead_letters(&self, group: &str, limit: usize) -> Result<Vec<Batch>> {
        let mut conn = self.conn.clone();
        let mut all = Vec::new();
        for shard in 0..self.keys.shards() {
            let ids: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.keys.dead_letters(shard, group))
                .arg(0)
                .arg(limit as i64 - 1)
                .query_async(&mut conn)
                .await?;
            if ids.is_empty() {
                continue;
            }
            let mut pipe = redis::pipe();
            let stream = self.keys.shard(shard).stream;
            for id in &ids {
                pipe.cmd("XRANGE").arg(&stream).arg(id).arg(id);
            }
            let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
            for reply in replies {
                all.extend(batches_from_entries(shard, reply)?);
            }
        }
        all.sort_by_key(|b| (b.flushed_at_ms, b.shard, b.stream_id));
        all.truncate(limit);
        Ok(all)
    }
}

/// Groups (shard, id) pairs by shard.
fn per_shard(ids: &[(u16, StreamId)]) -> HashMap<u16, Vec<StreamId>> {
    let mut out: HashMap<u16, Vec<StreamId>> = HashMap::new();
    for (shard, id) in ids {
        out.entry(*shard).or_default().push(*id);
    }
    out
}

/// Most items one merged add script call takes, so no call holds Redis for
/// long; a single request's shard part is never split, whatever its size.
const MERGE_LIMIT: usize = 1000;

/// One request's part for one shard, waiting for its shard's writer.
struct AddJob {
    items: Vec<NewItem>,
    reply: oneshot::Sender<Result<(Option<u64>, Vec<AddResult>)>>,
}

fn writer_gone() -> StoreError {
    StoreError::Redis(RedisError::from((
        ErrorKind::Client,
        "shard writer stopped",
    )))
}

/// Runs the add script for one shard, one call at a time. While a call is in
/// flight, new jobs queue up; the next call takes all of them (up to
/// `MERGE_LIMIT` items), so the batching costs no latency when idle and
/// grows with load. Each job's items stay contiguous and in order, so a
/// request's part is still applied atomically.
struct AddWriter {
    conn: ConnectionManager,
    keys: Keyspace,
    dedup_ms: u64,
    shard: u16,
}

impl AddWriter {
    async fn run(self, mut jobs: mpsc::UnboundedReceiver<AddJob>) {
        while let Some(first) = jobs.recv().await {
            let mut total = first.items.len();
            let mut batch = vec![first];
            while total < MERGE_LIMIT {
                match jobs.try_recv() {
                    Ok(job) => {
                        total += job.items.len();
                        batch.push(job);
                    }
                    Err(_) => break,
                }
            }
            let items: Vec<&NewItem> = batch.iter().flat_map(|job| job.items.iter()).collect();
            match self.call(&items).await {
                Ok((earliest, results)) => {
                    let mut results = results.into_iter();
                    for job in batch {
                        let mine = results.by_ref().take(job.items.len()).collect();
                        // A caller that went away no longer needs its reply.
                        let _ = job.reply.send(Ok((earliest, mine)));
                    }
                }
                Err(err) => {
                    for job in batch {
                        let _ = job.reply.send(Err(err.clone()));
                    }
                }
            }
        }
    }

    /// One add script call for `items`, all of this shard, in order.
    async fn call(&self, items: &[&NewItem]) -> Result<(Option<u64>, Vec<AddResult>)> {
        let shard = self.shard;
        let shard_keys = self.keys.shard(shard);
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        let mut group_keys: Vec<String> = Vec::new();
        let mut group_args: Vec<Vec<u8>> = Vec::new();
        let mut item_args: Vec<Vec<u8>> = Vec::with_capacity(items.len() * 3);
        for item in items {
            let next = group_of.len() + 1;
            let group = *group_of.entry(item.key.as_str()).or_insert_with(|| {
                group_keys.push(self.keys.group(shard, &item.key));
                group_args.push(item.key.as_bytes().to_vec());
                group_args.push(item.policy.max_items.to_string().into_bytes());
                group_args.push(
                    (item.policy.max_wait.as_millis() as u64)
                        .to_string()
                        .into_bytes(),
                );
                group_args.push(item.policy.max_bytes.unwrap_or(0).to_string().into_bytes());
                next
            });
            item_args.push(group.to_string().into_bytes());
            item_args.push(item.item.id.clone());
            item_args.push(item.item.payload.clone());
        }
        let mut keys: Vec<&str> = vec![&shard_keys.due, &shard_keys.stream, &shard_keys.flushed];
        keys.extend(group_keys.iter().map(String::as_str));
        let mut args = Vec::with_capacity(2 + group_args.len() + item_args.len());
        args.push(self.dedup_ms.to_string().into_bytes());
        args.push(group_keys.len().to_string().into_bytes());
        args.extend(group_args);
        args.extend(item_args);

        let reply = invoke(&self.conn, &scripts::ADD_ITEMS, &keys, args).await?;
        let [earliest, per_item] = take_array::<2>(reply, "add_items")?;
        let earliest = int(&earliest)?;
        let per_item = array(per_item)?;
        if per_item.len() != items.len() {
            return Err(DecodeError("add_items result count".into()).into());
        }
        let mut results = Vec::with_capacity(per_item.len());
        for (value, item) in per_item.into_iter().zip(items) {
            let [outcome, size, batch] = take_array::<3>(value, "add_items result")?;
            let outcome = match int(&outcome)? {
                1 => AddOutcome::Added,
                2 => AddOutcome::Duplicate,
                other => return Err(DecodeError(format!("add outcome {other}")).into()),
            };
            let flushed = match batch {
                Value::Nil => None,
                value => Some(batch_from_script(shard, &item.key, value)?),
            };
            results.push(AddResult {
                outcome,
                group_size: int(&size)? as u32,
                flushed,
            });
        }
        Ok(((earliest > 0).then_some(earliest as u64), results))
    }
}

/// Runs a script with all of its keys in KEYS (checked, in debug builds, to
/// share one cluster slot).
async fn invoke(
    conn: &ConnectionManager,
    script: &redis::Script,
    keys: &[&str],
    args: Vec<Vec<u8>>,
) -> Result<Value> {
    debug_assert_one_slot(keys);
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(arg);
    }
    let mut conn = conn.clone();
    Ok(invocation.invoke_async(&mut conn).await?)
}

/// Decodes the entries of an XRANGE or XREAD reply into batches.
pub fn batches_from_entries(
    shard: u16,
    reply: Value,
) -> std::result::Result<Vec<Batch>, DecodeError> {
    let entries = array(reply)?;
    let mut batches = Vec::with_capacity(entries.len());
    for entry in entries {
        let [id, fields] = take_array::<2>(entry, "stream entry")?;
        let stream_id: StreamId = string(id)?.parse()?;
        let mut key = None;
        let mut reason = None;
        let (mut opened, mut flushed, mut count, mut blob) = (None, None, None, None);
        let (mut origin, mut for_group) = (None, None);
        let mut fields = array(fields)?.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            match bytes(name)?.as_slice() {
                b"key" => key = Some(string(value)?),
                b"reason" => reason = Some(string(value)?.parse::<FlushReason>()?),
                b"opened" => opened = Some(int(&value)? as u64),
                b"flushed" => flushed = Some(int(&value)? as u64),
                b"n" => count = Some(int(&value)? as usize),
                b"items" => blob = Some(bytes(value)?),
                b"origin" => origin = Some(string(value)?.parse()?),
                b"for_group" => for_group = Some(string(value)?),
                _ => {}
            }
        }
        let missing = || DecodeError(format!("stream entry {stream_id} lacks a field"));
        batches.push(Batch {
            shard,
            stream_id,
            key: key.ok_or_else(missing)?,
            items: decode_items(&blob.ok_or_else(missing)?, count.ok_or_else(missing)?)?,
            reason: reason.ok_or_else(missing)?,
            opened_at_ms: opened.ok_or_else(missing)?,
            flushed_at_ms: flushed.ok_or_else(missing)?,
            origin,
            for_group,
        });
    }
    Ok(batches)
}

/// Decodes a batch as the scripts return it: {stream_id, reason, opened, flushed, n, items}.
fn batch_from_script(
    shard: u16,
    key: &str,
    value: Value,
) -> std::result::Result<Batch, DecodeError> {
    let [id, reason, opened, flushed, count, blob] = take_array::<6>(value, "batch")?;
    Ok(Batch {
        shard,
        stream_id: string(id)?.parse()?,
        key: key.to_owned(),
        reason: string(reason)?.parse()?,
        opened_at_ms: int(&opened)? as u64,
        flushed_at_ms: int(&flushed)? as u64,
        items: decode_items(&bytes(blob)?, int(&count)? as usize)?,
        origin: None,
        for_group: None,
    })
}

fn array(value: Value) -> std::result::Result<Vec<Value>, DecodeError> {
    match value {
        Value::Array(values) => Ok(values),
        Value::Nil => Ok(Vec::new()),
        other => Err(DecodeError(format!("expected an array, got {other:?}"))),
    }
}

fn take_array<const N: usize>(
    value: Value,
    what: &str,
) -> std::result::Result<[Value; N], DecodeError> {
    array(value)?.try_into().map_err(|v: Vec<Value>| {
        DecodeError(format!("{what}: expected {N} values, got {}", v.len()))
    })
}

fn bytes(value: Value) -> std::result::Result<Vec<u8>, DecodeError> {
    match value {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(DecodeError(format!("expected a string, got {other:?}"))),
    }
}

fn string(value: Value) -> std::result::Result<String, DecodeError> {
    String::from_utf8(bytes(value)?).map_err(|_| DecodeError("expected UTF-8".into()))
}

fn int(value: &Value) -> std::result::Result<i64, DecodeError> {
    match value {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| DecodeError(format!("expected an integer, got {b:?}"))),
        other => Err(DecodeError(format!("expected an integer, got {other:?}"))),
    }
}

fn parse_u64(b: &[u8]) -> std::result::Result<u64, DecodeError> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DecodeError(format!("expected a number, got {b:?}")))
}

-- Flushes one open group now. A TIMEOUT flush first re-checks that the group
-- is still due, so racing sweepers yield one batch.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the shard's batch stream
-- KEYS[3]: the shard's recently-flushed sorted set
-- KEYS[4]: the group's hash
-- ARGV[1]: the group's key
-- ARGV[2]: reason: TIMEOUT (only if due) or MANUAL (always)
-- ARGV[3]: dedup window (ms)
-- Returns: the batch {stream_id, reason, opened, flushed, n, items}, or false
--   when there is no open group (or, for TIMEOUT, it is not yet due)

local due_key, stream_key, flushed_key, gkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key, reason, dedup_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()

local due = redis.call('ZSCORE', due_key, key)
if not due then return false end
if reason == 'TIMEOUT' and tonumber(due) > now then return false end

local batch = flush_group(due_key, stream_key, flushed_key, gkey, key, reason, now, dedup_ms, nil)
return batch

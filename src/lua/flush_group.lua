-- Flushes one open group now, cut into batches of at most max_items, oldest
-- first (more than one only when max_items was lowered by a reload while the
-- group was open). A TIMEOUT flush first re-checks that the group is still
-- due, so racing sweepers yield one flush.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the shard's batch stream
-- KEYS[3]: the shard's recently-flushed sorted set
-- KEYS[4]: the group's hash
-- ARGV[1]: the group's key
-- ARGV[2]: reason: TIMEOUT (only if due) or MANUAL (always)
-- ARGV[3]: dedup window (ms)
-- ARGV[4]: max_items in force for the key
-- Returns: {due, batches}: the group's due time (ms) and the batches written, each
--   {stream_id, reason, opened, flushed, n, items}; {0, {}} when there is no open
--   group (or, for TIMEOUT, it is not yet due)

local ctx = context(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[3]))
local gkey, key, reason, max_items = KEYS[4], ARGV[1], ARGV[2], tonumber(ARGV[4])

local due = call('ZSCORE', ctx.due, key)
if not due then return { 0, {} } end
due = tonumber(due)
if reason == REASON.TIMEOUT and due > ctx.now then return { 0, {} } end

local it = { seq = {}, id = {}, payload = {} }
local meta, list = load_group(gkey, it)
local batches = {}
if #list > 0 then
  batches = cut(ctx, key, reason, meta.o, it, list, max_items, false)
end
call('DEL', gkey)
call('ZREM', ctx.due, key)
forget_stale(ctx)
return { due, batches }

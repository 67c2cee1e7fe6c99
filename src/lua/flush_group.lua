-- Flushes one open group now, cut into batches of at most max_items, oldest
-- first (more than one only when max_items was lowered by a reload while the
-- group was open).
--
-- A flush by due time first re-checks that the group is still due, so racing
-- sweepers yield one flush, and takes its reason from the rule that made it
-- due. A group of fewer than min_items whose TIMEOUT or IDLE came is held
-- instead: it stays open, re-armed to the next rule that always flushes.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the shard's batch stream
-- KEYS[3]: the shard's recently-flushed sorted set
-- KEYS[4]: the group's hash
-- ARGV[1]: the group's key
-- ARGV[2]: TIMEOUT (flush by due time, only if due) or MANUAL (always)
-- ARGV[3]: dedup window (ms)
-- ARGV[4]: max_items in force for the key
-- ARGV[5]: min_items in force for the key (0 = none)
-- Returns: {due, batches}: the group's due time (ms) and the batches
--   written, each {stream_id, reason, opened, flushed, n, items, x, names};
--   {0, {}} when there is no open group (or, by due time, it is not yet
--   due), {new due, {}} when it is held

local ctx = context(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[3]))
local gkey, key, reason, max_items = KEYS[4], ARGV[1], ARGV[2], tonumber(ARGV[4])

local due = call('ZSCORE', ctx.due, key)
if not due then return { 0, {} } end
due = tonumber(due)
if reason == REASON.TIMEOUT then
  if due > ctx.now then return { 0, {} } end
  local meta = call('HMGET', gkey, 'n', 'l', 'x', 's')
  local x = meta[3] or ''
  if x == '' then
    reason = REASON.TIMEOUT
  else
    local rules = parse_rules(x)
    -- (A group written under a capacity keeps its count in s.)
    local size, last = counters(meta[4]) or tonumber(meta[1]), tonumber(meta[2] or rules[7])
    local next_due, why = due_of(rules, last, size, tonumber(ARGV[5]), ctx.now)
    if next_due > ctx.now then
      call('HSET', gkey, 'd', format('%d', next_due), 'r', why)
      call('ZADD', ctx.due, next_due, key)
      return { next_due, {} }
    end
    reason = why
  end
end

local it = { seq = {}, id = {}, payload = {}, ext = {} }
local meta, list, names = load_group(gkey, it)
local batches = {}
if #list > 0 then
  batches = cut(ctx, key, reason, meta.o, it, list, max_items, false, names)
end
call('DEL', gkey)
call('ZREM', ctx.due, key)
finish(ctx)
return { due, batches }

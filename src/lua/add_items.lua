-- Adds items to the open groups of one shard, flushing each group that reaches
-- its max_items or max_bytes inside this same atomic step.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the shard's batch stream
-- KEYS[3]: the shard's recently-flushed sorted set
-- KEYS[3 + g]: the hash of group g, for g = 1..G
-- ARGV[1]: dedup window (ms)
-- ARGV[2]: G, the number of groups
-- ARGV[3 + 4(g-1) .. 6 + 4(g-1)]: group g's key, max_items, max_wait (ms), max_bytes (0 = none)
-- then, per item, 3 arguments: its group number g, its id, its payload
-- Returns: {earliest due (ms) among groups this call opened, or 0; then per item
--   {outcome (1 added, 2 duplicate), group size after, batch or false}}
--   where batch is {stream_id, reason, opened, flushed, n, items}

local due_key, stream_key, flushed_key = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local dedup_ms = tonumber(ARGV[1])
local ngroups = tonumber(ARGV[2])
local groups = {}
for g = 1, ngroups do
  local base = 3 + 4 * (g - 1)
  groups[g] = {
    key = ARGV[base],
    max_items = tonumber(ARGV[base + 1]),
    max_wait = tonumber(ARGV[base + 2]),
    max_bytes = tonumber(ARGV[base + 3]),
  }
end

local earliest = 0
local results = {}
for a = 3 + 4 * ngroups, #ARGV, 3 do
  local g = groups[tonumber(ARGV[a])]
  local gkey = KEYS[3 + tonumber(ARGV[a])]
  local id, payload = ARGV[a + 1], ARGV[a + 2]
  local field = ':' .. id
  local size = tonumber(redis.call('HGET', gkey, 'n') or '0')

  local dup = size > 0 and redis.call('HEXISTS', gkey, field) == 1
  if not dup then
    local until_ms = redis.call('ZSCORE', flushed_key, flushed_member(g.key, id))
    dup = until_ms and tonumber(until_ms) > now
  end

  if dup then
    results[#results + 1] = { 2, size, false }
  else
    if size == 0 then
      local due = now + g.max_wait
      redis.call('HSET', gkey, 'o', now, 'd', due, 'n', 0, 'b', 0, 's', 0)
      redis.call('ZADD', due_key, due, g.key)
      if earliest == 0 or due < earliest then earliest = due end
    end
    local seq = redis.call('HINCRBY', gkey, 's', 1)
    redis.call('HSET', gkey, field, seq .. ',' .. payload)
    size = redis.call('HINCRBY', gkey, 'n', 1)
    local bytes = redis.call('HINCRBY', gkey, 'b', #payload)

    local batch = false
    if size >= g.max_items then
      -- Normally one pass. More only when max_items was lowered by a reload
      -- while the group was open: it is then cut into batches of max_items.
      while size >= g.max_items do
        batch, size = flush_group(due_key, stream_key, flushed_key, gkey, g.key, 'SIZE', now, dedup_ms, g.max_items)
      end
      if size > 0 then batch = false end
    elseif g.max_bytes > 0 and bytes >= g.max_bytes then
      batch, size = flush_group(due_key, stream_key, flushed_key, gkey, g.key, 'BYTES', now, dedup_ms, nil)
    end
    results[#results + 1] = { 1, size, batch }
  end
end

return { earliest, results }

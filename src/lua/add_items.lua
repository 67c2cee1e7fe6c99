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
  -- The group's counters, read once per call and kept current here, so each
  -- item costs few Redis calls.
  if not g.size then
    local m = redis.call('HMGET', gkey, 'n', 'b', 's')
    g.size, g.bytes, g.seq = tonumber(m[1] or '0'), tonumber(m[2] or '0'), tonumber(m[3] or '0')
  end

  local until_ms = redis.call('ZSCORE', flushed_key, flushed_member(g.key, id))
  local dup = until_ms and tonumber(until_ms) > now
  if not dup then
    if g.size == 0 then
      local due = now + g.max_wait
      redis.call('HSET', gkey, 'o', now, 'd', due, 'n', 1, 'b', #payload, 's', 1, field, '1,' .. payload)
      redis.call('ZADD', due_key, due, g.key)
      if earliest == 0 or due < earliest then earliest = due end
      g.size, g.bytes, g.seq = 1, #payload, 1
    elseif redis.call('HSETNX', gkey, field, (g.seq + 1) .. ',' .. payload) == 0 then
      dup = true
    else
      g.size, g.bytes, g.seq = g.size + 1, g.bytes + #payload, g.seq + 1
      redis.call('HSET', gkey, 'n', g.size, 'b', g.bytes, 's', g.seq)
    end
  end

  if dup then
    results[#results + 1] = { 2, g.size, false }
  else
    local batch = false
    if g.size >= g.max_items then
      -- Normally one pass. More only when max_items was lowered by a reload
      -- while the group was open: it is then cut into batches of max_items.
      local left = g.size
      while left >= g.max_items do
        batch, left = flush_group(due_key, stream_key, flushed_key, gkey, g.key, 'SIZE', now, dedup_ms, g.max_items)
      end
      if left > 0 then
        batch = false
        local m = redis.call('HMGET', gkey, 'n', 'b', 's')
        g.size, g.bytes, g.seq = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
      else
        g.size, g.bytes, g.seq = 0, 0, 0
      end
    elseif g.max_bytes > 0 and g.bytes >= g.max_bytes then
      batch = flush_group(due_key, stream_key, flushed_key, gkey, g.key, 'BYTES', now, dedup_ms, nil)
      g.size, g.bytes, g.seq = 0, 0, 0
    end
    results[#results + 1] = { 1, g.size, batch }
  end
end

return { earliest, results }

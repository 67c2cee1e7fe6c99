-- Shared by the scripts that write batches (add_items, flush_group). It is
-- prepended to each of them; it defines functions only and touches no key.
--
-- Group hash layout (one hash per open group):
--   o = opened-at (ms, Redis clock)   d = due-at (ms)   n = item count
--   b = payload bytes                 s = last arrival sequence number
--   ':' .. item_id = seq .. ',' .. payload
--
-- A batch in the shard stream has the fields key, reason, opened, flushed, n
-- and items, where items is the concatenation, in arrival order, of
-- #id .. ':' .. id .. #payload .. ':' .. payload for each item.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Calls `cmd key ...list` in chunks, so no call passes more arguments than
-- Lua's unpack can handle.
local function chunked(cmd, key, list)
  local step = 1000
  for i = 1, #list, step do
    local last = math.min(i + step - 1, #list)
    redis.call(cmd, key, unpack(list, i, last))
  end
end

-- The member that records a flushed item id of a key.
local function flushed_member(key, id)
  return #key .. ':' .. key .. id
end

-- Reads a group's metadata and its items sorted by arrival.
local function load_group(gkey)
  local flat = redis.call('HGETALL', gkey)
  local meta, items = {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    if string.byte(f, 1) == 58 then
      local v = flat[i + 1]
      local comma = string.find(v, ',', 1, true)
      items[#items + 1] = { tonumber(string.sub(v, 1, comma - 1)), string.sub(f, 2), string.sub(v, comma + 1) }
    else
      meta[f] = flat[i + 1]
    end
  end
  table.sort(items, function(a, b) return a[1] < b[1] end)
  return meta, items
end

-- Writes the oldest `take` items of a group (all of them when take is nil) as
-- one batch to the shard stream, records their ids as recently flushed, and
-- removes them from the group; an emptied group is deleted with its due entry.
-- Returns the batch as {stream_id, reason, opened, flushed, n, items} and the
-- number of items left open.
local function flush_group(due_key, stream_key, flushed_key, gkey, key, reason, now, dedup_ms, take)
  local meta, items = load_group(gkey)
  local total = #items
  if total == 0 then
    redis.call('DEL', gkey)
    redis.call('ZREM', due_key, key)
    return false, 0
  end
  local count = total
  if take and take < total then count = take end

  local parts, members, fields = {}, {}, {}
  local expire = now + dedup_ms
  local bytes = 0
  for i = 1, count do
    local id, payload = items[i][2], items[i][3]
    parts[#parts + 1] = #id .. ':' .. id .. #payload .. ':' .. payload
    members[#members + 1] = expire
    members[#members + 1] = flushed_member(key, id)
    fields[#fields + 1] = ':' .. id
    bytes = bytes + #payload
  end
  local blob = table.concat(parts)
  local stream_id = redis.call('XADD', stream_key, '*', 'key', key, 'reason', reason,
    'opened', meta.o, 'flushed', now, 'n', count, 'items', blob)
  chunked('ZADD', flushed_key, members)

  -- Forget ids whose dedup window has passed; bounded, so no call stalls Redis.
  local stale = redis.call('ZRANGE', flushed_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, 2 * count + 16)
  if #stale > 0 then chunked('ZREM', flushed_key, stale) end

  if count == total then
    redis.call('DEL', gkey)
    redis.call('ZREM', due_key, key)
  else
    chunked('HDEL', gkey, fields)
    redis.call('HINCRBY', gkey, 'n', 0 - count)
    -- 0 - x, not -x: Lua formats -0 as "-0", which HINCRBY refuses.
    redis.call('HINCRBY', gkey, 'b', 0 - bytes)
  end
  return { stream_id, reason, meta.o, now, count, blob }, total - count
end

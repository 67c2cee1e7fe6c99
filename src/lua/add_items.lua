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
-- Returns: {earliest due (ms) among groups this call opened, or 0, then per
--   item 3 values: outcome (1 added, 2 duplicate), group size after, batch or false}
--   where batch is {stream_id, reason, opened, flushed, n, items}
--
-- The work is done per group, not per item: one ZMSCORE checks every id of
-- the call against the flushed set, one HMGET per group reads its counters
-- and which ids it already holds, and one HSET per group writes its new items
-- and counters at the end. Items added and flushed in the same call are never
-- written to the group's hash at all.

local ctx = context(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]))
local ngroups = tonumber(ARGV[2])
local first = 3 + 4 * ngroups

-- The call's items (see batch_lib); held items a flush reads back from a
-- group's hash are appended after them.
local n = (#ARGV - first + 1) / 3
local it = { seq = presized(n), id = presized(n), payload = presized(n) }
local ids, payloads, seqs = it.id, it.payload, it.seq
for i = 1, n do
  local a = first + 3 * (i - 1)
  ids[i], payloads[i] = ARGV[a + 1], ARGV[a + 2]
end

-- Per group g, one array per field. `arrivals` chains the call's items of a
-- group in arrival order (first_arrival[g], then next_arrival[i]); `pending`
-- chains the items open but not yet in the hash (first_pending[g] ..
-- last_pending[g], then next_pending[i]).
local G = ngroups
local name, prefix, max_items, max_wait, max_bytes = presized(G), presized(G), presized(G), presized(G), presized(G)
local size, bytes, seq, stored = presized(G), presized(G), presized(G), presized(G)
local indexed, reopened, opened, due_at = presized(G), presized(G), presized(G), presized(G)
local first_arrival, last_arrival, next_arrival = presized(G), presized(G), presized(n)
local first_pending, last_pending, next_pending = presized(G), presized(G), presized(n)
for g = 1, ngroups do
  first_arrival[g], last_arrival[g], first_pending[g], last_pending[g] = false, false, false, false
  local base = 3 + 4 * (g - 1)
  name[g], prefix[g] = ARGV[base], flushed_prefix(ARGV[base])
  max_items[g], max_wait[g], max_bytes[g] = num(ARGV[base + 1]), num(ARGV[base + 2]), num(ARGV[base + 3])
  size[g], bytes[g], seq[g], stored[g], indexed[g], reopened[g], opened[g], due_at[g] = 0, 0, 0, 0, false, false, '', 0
end

-- Every item's flushed-set member, and its chain of arrivals.
local members = presized(n)
for i = 1, n do
  next_arrival[i] = false
end
for i = 1, n do
  local g = num(ARGV[first + 3 * (i - 1)])
  members[i] = prefix[g] .. ids[i]
  if last_arrival[g] then next_arrival[last_arrival[g]] = i else first_arrival[g] = i end
  last_arrival[g] = i
end

-- Until when each item's id counts as recently flushed (false: it does not).
local flushed_until = members
for i = 1, n, CHUNK do
  local scores = call('ZMSCORE', ctx.flushed, unpack(members, i, min(i + CHUNK - 1, n)))
  for j = 1, #scores do flushed_until[i + j - 1] = scores[j] end
end

-- Whether each item's id is already open in its group.
local open = presized(n)

local now, earliest = ctx.now, 0
-- The reply, filled in first so that it is one array, not a sparse table.
local out = presized(3 * n + 1)

-- Each group in turn: read it, take its arrivals in order, write it back.
-- This is one block, not a few functions, because a closure over this many
-- locals costs more to create than a whole small call does otherwise.
for g = 1, ngroups do
  local gkey = KEYS[3 + g]

  -- Read the group's counters, and which of its arrivals' ids it holds.
  local i = first_arrival[g]
  local fields, values
  if next_arrival[i] then
    fields = { 'n', 'b', 's' }
    while i do
      fields[#fields + 1] = ':' .. ids[i]
      i = next_arrival[i]
    end
  else
    fields = { 'n', 'b', 's', ':' .. ids[i] }
  end
  if #fields <= CHUNK then
    values = call('HMGET', gkey, unpack(fields))
  else
    values = {}
    for c = 1, #fields, CHUNK do
      local got = call('HMGET', gkey, unpack(fields, c, min(c + CHUNK - 1, #fields)))
      for j = 1, #got do values[c + j - 1] = got[j] end
    end
  end
  if values[1] then
    size[g], bytes[g], seq[g] = num(values[1]), num(values[2]), num(values[3])
    stored[g], indexed[g] = size[g], true
  end
  local k = 3
  i = first_arrival[g]
  while i do
    k = k + 1
    open[i] = values[k]
    i = next_arrival[i]
  end

  -- Take the arrivals in order: a duplicate, or a new pending item that may
  -- complete the group.
  local seen = next_arrival[first_arrival[g]] and {} or nil
  i = first_arrival[g]
  while i do
    local id, until_ms = ids[i], flushed_until[i]
    local at = 3 * i - 1
    if open[i] or (seen and seen[id]) or (until_ms and tonumber(until_ms) > now) then
      out[at], out[at + 1], out[at + 2] = 2, size[g], false
    else
      if seen then seen[id] = true end
      if size[g] == 0 then
        opened[g], due_at[g], reopened[g] = ctx.now_s, now + max_wait[g], true
        if earliest == 0 or due_at[g] < earliest then earliest = due_at[g] end
      end
      seq[g] = seq[g] + 1
      seqs[i] = seq[g]
      if last_pending[g] then next_pending[last_pending[g]] = i else first_pending[g] = i end
      last_pending[g], next_pending[i] = i, false
      size[g], bytes[g] = size[g] + 1, bytes[g] + #payloads[i]
      local reason = false
      if size[g] >= max_items[g] then
        reason = REASON.SIZE
      elseif max_bytes[g] > 0 and bytes[g] >= max_bytes[g] then
        reason = REASON.BYTES
      end
      local batch = false
      if reason then
        -- Flush all the group holds, the hash's items and then the pending
        -- ones. A SIZE flush writes full batches only (more than one when
        -- max_items was lowered by a reload while the group was open) and
        -- keeps the rest open; this add reports the last batch.
        local list = {}
        if stored[g] > 0 then
          local meta
          meta, list = load_group(gkey, it)
          if not reopened[g] then opened[g], due_at[g] = meta.o, tonumber(meta.d) end
          call('DEL', gkey)
          stored[g] = 0
        end
        local p = first_pending[g]
        while p do
          list[#list + 1] = p
          p = next_pending[p]
        end
        local size_cut = reason == REASON.SIZE
        local batches, from = cut(ctx, name[g], reason, opened[g], it, list, size_cut and max_items[g] or 0, size_cut)
        batch = batches[#batches]
        first_pending[g], last_pending[g], size[g], bytes[g] = false, false, 0, 0
        for r = from, #list do
          p = list[r]
          if last_pending[g] then next_pending[last_pending[g]] = p else first_pending[g] = p end
          last_pending[g], next_pending[p] = p, false
          size[g], bytes[g] = size[g] + 1, bytes[g] + #payloads[p]
        end
      end
      out[at], out[at + 1], out[at + 2] = 1, size[g], batch
    end
    i = next_arrival[i]
  end

  -- Write the group back: its pending items and counters in one HSET and
  -- its due entry if it (re)opened, or nothing of an emptied group.
  if size[g] == 0 then
    if indexed[g] then call('ZREM', ctx.due, name[g]) end
  elseif first_pending[g] then
    local args = { 'n', dec(size[g]), 'b', format('%d', bytes[g]), 's', format('%d', seq[g]) }
    if stored[g] == 0 then
      args[7], args[8], args[9], args[10] = 'o', opened[g], 'd', format('%d', due_at[g])
    end
    i = first_pending[g]
    while i do
      args[#args + 1] = ':' .. ids[i]
      args[#args + 1] = dec(seqs[i]) .. ',' .. payloads[i]
      i = next_pending[i]
    end
    chunked('HSET', gkey, args)
    if reopened[g] or not indexed[g] then call('ZADD', ctx.due, due_at[g], name[g]) end
  end
end
forget_stale(ctx)

out[1] = earliest
return out

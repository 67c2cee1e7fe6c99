-- Due rules, reading a group whole, and writing batches (see layout.lua).

-- When a group is due, and the reason: the earliest of opened + max_wait
-- (TIMEOUT), last + max_idle (IDLE), the cutoff (CUTOFF), the earliest item
-- deadline - lead (DEADLINE) and opened + max_age (MAX_AGE). A group of
-- fewer than min_items whose TIMEOUT or IDLE has passed is held: those two
-- no longer count (only with a max_age, so nothing waits forever). On a tie
-- the rule that always flushes wins.
local function due_of(r, last, size, min_items, now)
  local held = r.max_age > 0 and size < min_items
  local due, why = math.huge, false
  local t = r.opened + r.max_wait
  if not (held and t <= now) then due, why = t, REASON.TIMEOUT end
  if r.max_idle > 0 then
    t = last + r.max_idle
    if t < due and not (held and t <= now) then due, why = t, REASON.IDLE end
  end
  if r.cutoff > 0 and r.cutoff <= due then due, why = r.cutoff, REASON.CUTOFF end
  if r.deadline > 0 and r.deadline - r.lead <= due then due, why = r.deadline - r.lead, REASON.DEADLINE end
  if r.max_age > 0 and r.opened + r.max_age <= due then due, why = r.opened + r.max_age, REASON.MAX_AGE end
  return due, why
end

-- A list of items: parallel arrays id, payload, ext and seq (sequence
-- number), and their count n.
local function item_list()
  return { id = {}, payload = {}, ext = {}, seq = {}, n = 0 }
end

local function push_item(list, id, payload, ext, seq)
  local n = list.n + 1
  list.id[n], list.payload[n], list.ext[n], list.seq[n], list.n = id, payload, ext, seq, n
end

-- A group's fields by name (o, s, x, m) and its items in arrival order.
-- A small hash (listpack) returns its fields in insertion order, which is
-- arrival order, so the items are sorted only when they are not already.
local function load_group(gkey)
  local flat = call('HGETALL', gkey)
  local meta, list, sorted, last, n = {}, item_list(), true, -1, 0
  local ids, payloads, exts, seqs = list.id, list.payload, list.ext, list.seq
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if META[f] then
      meta[f] = v
    else
      local seq, ext, payload = split_item(v)
      n = n + 1
      ids[n], payloads[n], exts[n], seqs[n] = f, payload, ext, seq
      if seq < last then sorted = false end
      last = seq
    end
  end
  list.n = n
  if sorted then return meta, list end
  local order = {}
  for j = 1, list.n do order[j] = j end
  table.sort(order, function(a, b) return seqs[a] < seqs[b] end)
  local in_order = item_list()
  for j = 1, list.n do
    local p = order[j]
    push_item(in_order, list.id[p], list.payload[p], list.ext[p], seqs[p])
  end
  return meta, in_order
end

-- What one call shares: the shard's keys, the Redis clock, the dedup
-- window, and the flushed set's new members (2 per item written, written
-- once, by finish). One table for every call (calls never overlap), so a
-- call allocates none for it.
local CTX, RECENT = {}, {}
local function context(due, stream, flushed, dedup_ms, now)
  local c = CTX
  c.due, c.stream, c.flushed, c.now, c.dedup = due, stream, flushed, now, dedup_ms
  c.written, c.recent, c.now_s, c.expire = 0, RECENT, nil, nil
  return c
end

-- The clock as text, and until when an id flushed now counts as a
-- duplicate, made when a call first needs them.
local function now_text(ctx)
  if not ctx.now_s then ctx.now_s = format('%d', ctx.now) end
  return ctx.now_s
end

local function expiry(ctx)
  if not ctx.expire then ctx.expire = format('%d', ctx.now + ctx.dedup) end
  return ctx.expire
end

-- The pieces of a batch's items and exts, joined by table.concat: arrays
-- that stay loaded with the library, so a batch allocates no table for them.
local parts, xparts = {}, {}

-- Writes list's items from..to as one batch of `key` to the shard stream.
-- Returns it as {stream_id, reason, opened, flushed, n, items, x, names}.
local function write_batch(ctx, key, reason, opened, list, from, to, names)
  local members, m, j, extras = ctx.recent, 2 * ctx.written, 0, false
  local expire, ids, payloads, exts = expiry(ctx), list.id, list.payload, list.ext
  for i = from, to do
    local id, payload = ids[i], payloads[i]
    parts[j + 1], parts[j + 2], parts[j + 3], parts[j + 4], parts[j + 5], parts[j + 6] =
      DEC[#id] or dec(#id), ':', id, DEC[#payload] or dec(#payload), ':', payload
    members[m + 1], members[m + 2] = expire, key .. SEP .. id
    j, m = j + 6, m + 2
    if exts[i] ~= '' then extras = true end
  end
  local blob, n, x, stream_id, now_s = table.concat(parts, '', 1, j), dec(to - from + 1), '', nil, now_text(ctx)
  if extras then
    j = 0
    for i = from, to do
      xparts[j + 1], xparts[j + 2], xparts[j + 3] = dec(#exts[i]), ':', exts[i]
      j = j + 3
    end
    x = table.concat(xparts, '', 1, j)
    stream_id = call('XADD', ctx.stream, '*', 'key', key, 'reason', reason, 'opened', opened,
      'flushed', now_s, 'n', n, 'items', blob, 'x', x, 'names', names)
  else
    stream_id = call('XADD', ctx.stream, '*', 'key', key, 'reason', reason, 'opened', opened,
      'flushed', now_s, 'n', n, 'items', blob)
  end
  ctx.written = ctx.written + to - from + 1
  return { stream_id, reason, opened, now_s, n, blob, x, extras and names or '' }
end

-- Writes list's items oldest first as batches of at most `max` (0: one
-- batch of all), appending them to `batches`. With `full_only`, only full
-- batches are written. Returns the index of the first item left unwritten.
local function cut(ctx, key, reason, opened, list, max, full_only, names, batches)
  local from = 1
  while from <= list.n do
    local to = list.n
    if max > 0 and to - from + 1 > max then to = from + max - 1 end
    if full_only and to - from + 1 < max then break end
    batches[#batches + 1] = write_batch(ctx, key, reason, opened, list, from, to, names)
    from = to + 1
  end
  return from
end

-- Ends a call that may have written batches: records the ids it flushed in
-- the flushed set, and forgets flushed ids whose dedup window has passed,
-- bounded by what this call wrote, so the set shrinks as fast as it grows.
local function finish(ctx)
  if ctx.written == 0 then return end
  chunked('ZADD', ctx.flushed, ctx.recent, 2 * ctx.written)
  local stale = call('ZRANGE', ctx.flushed, '-inf', now_text(ctx), 'BYSCORE', 'LIMIT', '0',
    dec(2 * ctx.written + 16))
  if #stale > 0 then chunked('ZREM', ctx.flushed, stale) end
end

-- The sums of list's items' measures that dictionary `dict` names (into
-- `sums`), and their earliest deadline (0: none). Their exts' values follow
-- dictionary `ext_dict`; when that is not `dict`, each ext is written anew
-- for `dict` (a reload renamed the capacity's measures).
local function sum_items(list, ext_dict, dict, sums)
  local names, ext_names = names_of(dict), names_of(ext_dict)
  local earliest = 0
  for j = 1, #names do sums[j] = 0 end
  for p = 1, list.n do
    local ext = list.ext[p]
    if ext ~= '' then
      local deadline, measures, rest = decode_ext(ext, ext_names)
      for j = 1, #names do sums[j] = sums[j] + (measures[names[j]] or 0) end
      if deadline > 0 and (earliest == 0 or deadline < earliest) then earliest = deadline end
      if ext_dict ~= dict then list.ext[p] = encode_ext(deadline, measures, names, rest) end
    end
  end
  return earliest
end

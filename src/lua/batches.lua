-- Due rules, reading a group whole, and writing batches (the layout: src/scripts/layout.rs).

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

-- A group's fields by name (OPENED, STATE, RULES, NAMES) and its items in arrival order,
-- from its hash's fields (HGETALL). A small hash (listpack) returns its
-- fields in insertion order, which is arrival order, so the items are
-- sorted only when they are not already.
local function list_of(flat)
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

local function load_group(gkey)
  return list_of(call('HGETALL', gkey))
end

-- How many items a group's hash fields (HGETALL) hold.
local function items_in(flat)
  local n = 0
  for i = 1, #flat, 2 do
    if not META[flat[i]] then n = n + 1 end
  end
  return n
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

-- The most items a batch carries as fields of its entry (see src/scripts/layout.rs).
local FIELDS_MAX = 2000

-- Whether a flush of `count` items, cut into batches of at most `max` (0:
-- no most), full ones only when `full_only`, writes them all as one batch
-- of fields.
local function whole(count, max, full_only)
  return count <= FIELDS_MAX and (max == 0 or count <= max) and not (full_only and count < max)
end

-- The group's fields a batch keeps (OPENED, NAMES); it drops the others.
local KEPT = { [FIELD.OPENED] = true, [FIELD.NAMES] = true }

-- Writes `fields`' first n as a batch of `key`, with its key, reason and
-- flush time after them. Returns the batch as the functions reply it:
-- {stream_id, fields}.
local function xadd(ctx, key, reason, fields, n)
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4], fields[n + 5], fields[n + 6] =
    BATCH.KEY, key, BATCH.REASON, reason, BATCH.FLUSHED, now_text(ctx)
  return { call('XADD', ctx.stream, '*', unpack(fields, 1, n + 6)), fields }
end

-- Writes a batch of `key` whose items and group fields are `fields`' (id,
-- value) and (field, value) pairs, in any order: a group's HGETALL with
-- the call's items for it after, or a list's. It drops the group fields
-- it does not keep (putting each into `meta`, if given, first) and records
-- each item in the call's new flushed-set members. See write_batch for
-- what it returns.
local function write_fields(ctx, key, reason, fields, meta)
  local members, m, expire, prefix = ctx.recent, 2 * ctx.written, expiry(ctx), key .. SEP
  local i, n = 1, #fields
  while i < n do
    local f = fields[i]
    if not META[f] then
      members[m + 1], members[m + 2], m, i = expire, prefix .. f, m + 2, i + 2
    else
      if meta then meta[f] = fields[i + 1] end
      if KEPT[f] then
        i = i + 2
      else
        fields[i], fields[i + 1] = fields[n - 1], fields[n]
        fields[n - 1], fields[n], n = nil, nil, n - 2
      end
    end
  end
  ctx.written = m / 2
  return xadd(ctx, key, reason, fields, n)
end

-- The pieces of a packed batch's items, joined by table.concat: an array
-- that stays loaded with the library.
local parts = {}

-- Writes list's items from..to as one batch of `key` to the shard stream,
-- as fields, or packed when there are more than FIELDS_MAX. Returns it as
-- {stream_id, fields}: the entry's fields, as src/scripts/layout.rs describes them.
local function write_batch(ctx, key, reason, opened, list, from, to, names)
  local fields, j = { FIELD.OPENED, opened }, 2
  if names ~= '' then fields[3], fields[4], j = FIELD.NAMES, names, 4 end
  local ids, payloads, exts, seqs = list.id, list.payload, list.ext, list.seq
  if to - from < FIELDS_MAX then
    for i = from, to do
      fields[j + 1], fields[j + 2], j = ids[i], item_value(exts[i], seqs[i], payloads[i]), j + 2
    end
    return write_fields(ctx, key, reason, fields)
  end
  local members, m, expire, prefix, k = ctx.recent, 2 * ctx.written, expiry(ctx), key .. SEP, 0
  for i = from, to do
    local id, v = ids[i], item_value(exts[i], seqs[i], payloads[i])
    parts[k + 1], parts[k + 2], parts[k + 3], parts[k + 4], parts[k + 5], parts[k + 6] =
      dec(#id), ':', id, dec(#v), ':', v
    members[m + 1], members[m + 2], k, m = expire, prefix .. id, k + 6, m + 2
  end
  ctx.written = m / 2
  fields[j + 1], fields[j + 2] = BATCH.PACKED, table.concat(parts, '', 1, k)
  return xadd(ctx, key, reason, fields, j + 2)
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

-- Adds items to the open groups of one shard, flushing a group inside this
-- same atomic step when an item completes it (max_items, max_bytes, a
-- capacity reached, close_group), and before an item when the item would
-- not fit its capacity or the group's cutoff has passed.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the shard's batch stream
-- KEYS[3]: the shard's recently-flushed sorted set
-- KEYS[4]: the shard's requeued sorted set (batch_id:item_id, scored by
--   the batch's stream time, so trimming the stream forgets them)
-- KEYS[4 + g]: the hash of group g, for g = 1..G
-- ARGV[1]: dedup window (ms)
-- ARGV[2]: G, the number of groups
-- ARGV[3 + 7(g-1) .. 9 + 7(g-1)]: group g's key, max_items, max_bytes (0 =
--   none), min_items (0 = none), max_wait (ms), the other due rules for a
--   group that opens now ('i,c1,c2,L,a' in ms: max_idle, the next two
--   cutoffs, deadline_lead, max_age; '' when all are 0) and its capacity
--   ('name=v;name=v', '' for none)
-- then, per item, 4 arguments: its group number g, followed by 'c' to close
--   the group and 'q' .. batch_id for a requeued item; its id; its payload;
--   and '' or its packed ext (see batch_lib), whose values are (in the long
--   form) its deadline (0 = none) and then its measure for each of the
--   group's capacity names in order, so that the script reads them without
--   parsing text, and which the group's hash stores as it comes
-- Returns: {earliest due (ms) among groups whose due time this call set, or
--   0, then per item 3 values: outcome (1 added, 2 duplicate), group size
--   after, the batches it wrote or false}
--   where a batch is {stream_id, reason, opened, flushed, n, items, x, names}
--
-- The work is done per group, not per item: one ZMSCORE checks every id of
-- the call against the flushed set, one HMGET per group reads its counters
-- and which ids it already holds, and one HSET per group writes its new items
-- and counters at the end. Items added and flushed in the same call are never
-- written to the group's hash at all.

local ctx = context(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]))
local requeued_key = KEYS[4]
local ngroups = tonumber(ARGV[2])
local first = 3 + 7 * ngroups

-- Unpacks `count` values of struct `layout` from `packed` at `at` into
-- t[o + 1 ..], and returns t: a table made anew from them for every group
-- and item was a good part of a call's cost, most of it the garbage
-- collector's.
local function unpack_into(t, o, count, layout, packed, at)
  if count == 2 then
    t[o + 1], t[o + 2] = struct.unpack(layout, packed, at)
  elseif count == 3 then
    t[o + 1], t[o + 2], t[o + 3] = struct.unpack(layout, packed, at)
  elseif count == 1 then
    t[o + 1] = struct.unpack(layout, packed, at)
  elseif count == 4 then
    t[o + 1], t[o + 2], t[o + 3], t[o + 4] = struct.unpack(layout, packed, at)
  else
    local all = { struct.unpack(layout, packed, at) }
    for k = 1, count do t[o + k] = all[k] end
  end
  return t
end

-- The call's items (see batch_lib); held items a flush reads back from a
-- group's hash are appended after them.
local n = (#ARGV - first + 1) / 4
local it = { seq = presized(n), id = presized(n), payload = presized(n), ext = presized(n) }
local ids, payloads, seqs, exts = it.id, it.payload, it.seq, it.ext
for i = 1, n do
  local a = first + 4 * (i - 1)
  ids[i], payloads[i], exts[i] = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
end

-- Per group g, one array per field. `arrivals` chains the call's items of a
-- group in arrival order (first_arrival[g], then next_arrival[i]); `pending`
-- chains the items open but not yet in the hash (first_pending[g] ..
-- last_pending[g], then next_pending[i]).
local G = ngroups
local name, prefix, max_items, max_bytes, min_items = presized(G), presized(G), presized(G), presized(G), presized(G)
local max_wait, open_rules, caps = presized(G), presized(G), presized(G)
local size, bytes, seq, stored = presized(G), presized(G), presized(G), presized(G)
local indexed, reopened, opened, due_at, why = presized(G), presized(G), presized(G), presized(G), presized(G)
local rules, xs, sums = presized(G), presized(G), presized(G)
-- A group's s as read and where its dictionary starts in it, for a group
-- written under a capacity (false for the others).
local svs, dict_at = presized(G), presized(G)
local due_dirty, rules_dirty = presized(G), presized(G)
local first_arrival, last_arrival, next_arrival = presized(G), presized(G), presized(n)
local first_pending, last_pending, next_pending = presized(G), presized(G), presized(n)
local capacities = {}
for g = 1, ngroups do
  first_arrival[g], last_arrival[g], first_pending[g], last_pending[g] = false, false, false, false
  local base = 3 + 7 * (g - 1)
  name[g], prefix[g] = ARGV[base], flushed_prefix(ARGV[base])
  max_items[g], max_bytes[g], min_items[g] = num(ARGV[base + 1]), num(ARGV[base + 2]), num(ARGV[base + 3])
  max_wait[g], open_rules[g] = num(ARGV[base + 4]), ARGV[base + 5]
  local cap = ARGV[base + 6]
  if cap == '' then
    caps[g] = false
  else
    -- Groups of one policy share its capacity's table: {limits, names, its
    -- dictionary ('=' .. names joined by ';'), an item's values' struct
    -- layout, how many names, the struct layout of s's counters and sums,
    -- name -> position, an item's values (its deadline, then its measures),
    -- the sums, the dictionary as s starts with it (see batch_lib), a short
    -- ext's struct layout, the length of an s that holds the counters, and
    -- the struct layout of such an s whole}.
    -- Sums and limits are arrays in the order of the names. Groups are
    -- taken one at a time, so the group at hand's sums and the item at
    -- hand's values can be the same table each time.
    caps[g] = capacities[cap]
    if not caps[g] then
      local by_name, names = parse_sums(cap)
      local limits, index = {}, {}
      for k = 1, #names do limits[k], index[names[k]] = by_name[names[k]], k end
      local dictionary = '=' .. table.concat(names, ';')
      caps[g] = { limits, names, dictionary, '<' .. string.rep('d', #names + 1), #names,
        '<' .. string.rep('d', #names + 3), index, {}, {}, dictionary .. '=',
        '<' .. string.rep('I4', #names), #dictionary + 1 + 8 * (#names + 3),
        '<c' .. (#dictionary + 1) .. string.rep('d', #names + 3) }
      capacities[cap] = caps[g]
    end
  end
  size[g], bytes[g], seq[g], stored[g], indexed[g], reopened[g], opened[g], due_at[g] = 0, 0, 0, 0, false, false, '', 0
  why[g], rules[g], xs[g], sums[g], svs[g], dict_at[g] = false, false, '', false, false, false
  due_dirty[g], rules_dirty[g] = false, false
end

-- Every item's flushed-set member, its flags, and its chain of arrivals.
local members = presized(n)
local close, requeue_of = {}, {}
for i = 1, n do
  next_arrival[i] = false
end
for i = 1, n do
  local garg = ARGV[first + 4 * (i - 1)]
  local g = num(garg)
  if not g then
    local digits, flags = string.match(garg, '^(%d+)(.*)$')
    g = num(digits)
    if byte(flags, 1) == 99 then close[i], flags = true, sub(flags, 2) end -- 'c'
    if byte(flags, 1) == 113 then requeue_of[i] = sub(flags, 2) end -- 'q'
  end
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

-- Appends item p to group g's pending chain and counts it.
local function append(g, p)
  if last_pending[g] then next_pending[last_pending[g]] = p else first_pending[g] = p end
  last_pending[g], next_pending[p] = p, false
  size[g], bytes[g] = size[g] + 1, bytes[g] + #payloads[p]
end

-- Sets group g's sums of its capacity measures to 0.
local function zero_sums(g)
  local s = caps[g][9]
  for k = 1, caps[g][5] do s[k] = 0 end
  sums[g] = s
end

-- Group g's seq from an s (sv) that is not the seq as text and not the
-- capacity's counters (see batch_lib): a dictionary and then the seq (and
-- an older version's sums), or (older still) the seq as text, then a
-- dictionary and sums.
local function seq_after_dictionary(g, sv)
  if byte(sv, 1) == 61 then -- '=': a dictionary first
    seq[g] = struct.unpack('<d', sv, find(sv, '=', 2, true) + 1)
    svs[g], dict_at[g] = sv, 1
  else
    local at = find(sv, '=', 1, true)
    seq[g], svs[g], dict_at[g] = num(sub(sv, 1, at - 1)), sv, at
  end
end

-- Group g's counters when its s is not in the layout the call reads first
-- (see the reading of a group below): under a capacity, a group written
-- without it or under another one; without one, a group written under a
-- capacity. `text_nb` marks a group whose n and b fields go when it is
-- written back with its counters in s.
local text_nb = {}
local function other_counters(g, sv, cap)
  local n, b, sq = counters(sv)
  if n then
    size[g], bytes[g], seq[g], svs[g], dict_at[g] = n, b, sq, sv, 1
    return
  end
  local nb = call('HMGET', KEYS[4 + g], 'n', 'b')
  text_nb[g] = cap and true
  size[g], bytes[g] = num(nb[1]), num(nb[2])
  seq[g] = #sv < 16 and num(sv)
  if not seq[g] then seq_after_dictionary(g, sv) end
end

-- Group g's due rules (see batch_lib's x), parsed from its x when first
-- needed, or false for a plain group. Most calls need none: a group whose
-- cutoff has passed is due (see the arrivals), and only a new group, an
-- earlier deadline or a hold that ends can move a due time earlier.
local function rules_of(g)
  local r = rules[g]
  if not r then
    local x = xs[g]
    if not x then
      x = call('HGET', KEYS[4 + g], 'x') or ''
      xs[g] = x
    end
    if x ~= '' then
      r = parse_rules(x)
      rules[g] = r
    end
  end
  return r
end

-- Group g's due rules as a table, made from its plain due time if needed.
local function ensure_rules(g)
  if not rules_of(g) then
    local o, d = opened[g], due_at[g]
    if stored[g] > 0 and not reopened[g] then o = call('HGET', KEYS[4 + g], 'o') end
    rules[g] = { d - tonumber(o), 0, 0, 0, 0, 0, tonumber(o) }
    rules_dirty[g] = true
  end
end

-- Records a due time for group g that this call set.
local function set_due(g, due, reason)
  due_at[g], why[g], due_dirty[g] = due, reason, true
  if earliest == 0 or due < earliest then earliest = due end
end

-- Recomputes group g's due time after an arrival at `now`, and records it
-- only when it comes earlier (a deadline, a hold that ended) or is new: a
-- due time that only moved later (max_idle) stays as it is, an early
-- wake-up at which the flush script finds the real due time and re-arms.
local function rearm(g)
  local r = rules_of(g)
  if r then
    local due, reason = due_of(r, now, size[g], min_items[g], now)
    if due_at[g] == 0 or due < due_at[g] then set_due(g, due, reason) end
  end
end

-- Opens group g now, with the due rules the call brought for it. Groups of
-- one policy share the parsed rules (max_idle, cutoff, lead, max_age).
local opening = {}
local function open_group(g)
  opened[g], reopened[g], dict_at[g] = ctx.now_s, true, false
  if caps[g] then zero_sums(g) end
  local r = open_rules[g]
  if r == '' then
    rules[g], xs[g] = false, ''
    set_due(g, now + max_wait[g], REASON.TIMEOUT)
  else
    local o = opening[r]
    if not o then
      local i, c1, c2, lead, a = string.match(r, '^(%d+),(%d+),(%d+),(%d+),(%d+)$')
      c1, c2 = tonumber(c1), tonumber(c2)
      if c1 <= now then c1 = c2 end
      o = { tonumber(i), c1, tonumber(lead), tonumber(a) }
      opening[r] = o
    end
    rules[g] = { max_wait[g], o[1], o[2], o[3], o[4], 0, now }
    rules_dirty[g], due_at[g] = true, 0
  end
end

-- Adds an item's values (see the arguments; false: none) to group g's
-- sums, in one pass over its capacity. Returns 'over', adding nothing, when
-- they would push a sum past its capacity (unless `force`), 'full' when a
-- sum reaches its capacity with them, else false.
local function fill(g, values, force)
  local limits, s = caps[g][1], sums[g]
  local count = #limits
  if count == 2 then
    -- The usual capacity, a weight and a volume, without the loops.
    local a, b = s[1], s[2]
    if values then a, b = a + values[2], b + values[3] end
    if not force and (a > limits[1] or b > limits[2]) then return 'over' end
    if not values then return false end
    s[1], s[2] = a, b
    return (a >= limits[1] or b >= limits[2]) and 'full'
  end
  if not force then
    for k = 1, count do
      if s[k] + (values and values[k + 1] or 0) > limits[k] then return 'over' end
    end
  end
  if not values then return false end
  local full = false
  for k = 1, count do
    local total = s[k] + values[k + 1]
    s[k] = total
    if total >= limits[k] then full = 'full' end
  end
  return full
end

-- Flushes everything group g holds, its hash's items and then the pending
-- ones, appending the batches to `batches` (a new list if false). A SIZE
-- flush writes full batches only (more than one when max_items was lowered
-- by a reload while the group was open) and keeps the rest open.
local function flush_open(g, reason, batches)
  local list, field = {}, false
  if stored[g] > 0 then
    local meta
    meta, list, field = load_group(KEYS[4 + g], it)
    if not reopened[g] then opened[g], xs[g] = meta.o, xs[g] or meta.x or '' end
    call('DEL', KEYS[4 + g])
    stored[g], dict_at[g], text_nb[g] = 0, false, false
  end
  local p = first_pending[g]
  while p do
    list[#list + 1] = p
    p = next_pending[p]
  end
  -- The names of the packed exts' measures: the capacity's (see sum_group),
  -- or with none in force, the dictionary the group was written with.
  local names = caps[g] and caps[g][3] or field
  local size_cut = reason == REASON.SIZE
  local written, from = cut(ctx, name[g], reason, opened[g], it, list, size_cut and max_items[g] or 0, size_cut, names)
  batches = batches or {}
  for k = 1, #written do batches[#batches + 1] = written[k] end
  first_pending[g], last_pending[g], size[g], bytes[g] = false, false, 0, 0
  if from > #list then return batches end
  -- The rest stays open, as it was: its sums and earliest deadline anew.
  -- Without a capacity in force the group keeps no dictionary for its
  -- packed exts' measures once emptied, so they are kept as text.
  if caps[g] then zero_sums(g) end
  local r = rules_of(g)
  if r then r[6], rules_dirty[g] = 0, true end
  local list_names = caps[g] and caps[g][2] or (field and field_names(field))
  for r = from, #list do
    p = list[r]
    append(g, p)
    if exts[p] ~= '' then
      local deadline, measures = parse_ext(exts[p], list_names)
      if measures and caps[g] then add_measures(sums[g], caps[g][7], measures, 1) end
      if deadline and r and (r[6] == 0 or deadline < r[6]) then r[6] = deadline end
      if not caps[g] then exts[p] = ext_text(exts[p], list_names) end
    end
  end
  -- A plain group keeps its due time; one with rules gets it from them.
  local due = due_at[g]
  due_at[g] = 0
  if r then rearm(g) else set_due(g, due, REASON.TIMEOUT) end
  return batches
end

-- The reply, filled in first so that it is one array, not a sparse table.
local out = presized(3 * n + 1)
-- The due set's changes, written once after the last group: each command a
-- script sends costs more than its arguments.
local due_set, due_gone = {}, {}

-- Each group in turn: read it, take its arrivals in order, write it back.
for g = 1, ngroups do
  local gkey = KEYS[4 + g]

  -- Read the group's counters, and which of its arrivals' ids it holds: a
  -- group written under this capacity keeps them all in s (see batch_lib).
  local i = first_arrival[g]
  local cap = caps[g]
  local fields, values
  if cap then fields = { 's', 'd' } else fields = { 'n', 'b', 's', 'd' } end
  local k = #fields
  while i do
    fields[#fields + 1] = ':' .. ids[i]
    i = next_arrival[i]
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
  local sv = values[k - 1]
  if sv then
    local summed = false
    if cap and #sv == cap[12] and find(sv, cap[10], 1, true) == 1 then
      local s = cap[9]
      if cap[5] == 2 then
        seq[g], size[g], bytes[g], s[1], s[2] = struct.unpack(cap[6], sv, #cap[10] + 1)
      else
        local all = { struct.unpack(cap[6], sv, #cap[10] + 1) }
        seq[g], size[g], bytes[g] = all[1], all[2], all[3]
        for k = 1, cap[5] do s[k] = all[k + 3] end
      end
      sums[g], summed, svs[g], dict_at[g] = s, true, sv, 1
    elseif cap or not values[1] then
      other_counters(g, sv, cap)
    else
      size[g], bytes[g] = num(values[1]), num(values[2])
      seq[g] = #sv < 16 and num(sv)
      if not seq[g] then seq_after_dictionary(g, sv) end
    end
    stored[g], indexed[g] = size[g], true
    -- (A group written before x existed has the plain rules.)
    xs[g], due_at[g] = false, tonumber(values[k])
    if cap and not summed then
      zero_sums(g)
      sum_group(gkey, it, cap, sums[g])
    end
  end
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
    local id, until_ms, requeue = ids[i], flushed_until[i], requeue_of[i]
    local at = 3 * i - 1
    local duplicate = open[i] or (seen and seen[id])
    if requeue then
      -- A requeued id skips the dedup window, once per (batch, item).
      duplicate = duplicate or call('ZSCORE', requeued_key, requeue .. ':' .. id)
    elseif until_ms and tonumber(until_ms) > now then
      duplicate = true
    end
    if duplicate then
      out[at], out[at + 1], out[at + 2] = 2, size[g], false
    else
      if seen then seen[id] = true end
      if requeue then
        local batch_ms = string.match(requeue, '^%d+%-(%d+)%-')
        call('ZADD', requeued_key, batch_ms, requeue .. ':' .. id)
      end
      local deadline, values = false, false
      if exts[i] ~= '' then
        local cap = caps[g]
        if cap and byte(exts[i], 1) == 42 then -- '*': measures only
          values = cap[8]
          if cap[5] == 2 then
            values[2], values[3] = struct.unpack(cap[11], exts[i], 3)
          else
            unpack_into(values, 1, cap[5], cap[11], exts[i], 3)
          end
          values[1] = 0
        elseif cap then
          values = unpack_into(cap[8], 0, cap[5] + 1, cap[4], exts[i], 3)
          deadline = values[1]
        else
          deadline = struct.unpack('<d', exts[i], 3)
        end
        if deadline == 0 then deadline = false end
      end
      local batches = false
      -- A group whose cutoff has passed takes no more items (it is due
      -- then: a due time is never after the cutoff); nor one the item would
      -- push past a capacity.
      if size[g] > 0 and due_at[g] <= now then
        local r = rules_of(g)
        if r and r[3] > 0 and r[3] <= now then batches = flush_open(g, REASON.CUTOFF, batches) end
      end
      local full = false
      if size[g] > 0 and caps[g] then
        full = fill(g, values, false)
        if full == 'over' then
          batches, full = flush_open(g, REASON.CAPACITY, batches), false
        end
      end
      if size[g] == 0 then
        open_group(g)
        if values then full = fill(g, values, true) end
      end
      seq[g] = seq[g] + 1
      seqs[i] = seq[g]
      append(g, i)
      -- The due time can only come earlier with a new group, an earlier
      -- deadline or a hold that ends; max_idle only moves it later.
      local moved = due_at[g] == 0 or size[g] == min_items[g]
      if deadline then
        ensure_rules(g)
        local r = rules[g]
        if r[6] == 0 or deadline < r[6] then r[6], rules_dirty[g], moved = deadline, true, true end
      end
      if moved then rearm(g) end
      local reason = false
      if size[g] >= max_items[g] then
        reason = REASON.SIZE
      elseif max_bytes[g] > 0 and bytes[g] >= max_bytes[g] then
        reason = REASON.BYTES
      elseif full then
        reason = REASON.CAPACITY
      elseif close[i] then
        reason = REASON.CLOSED
      end
      if reason then batches = flush_open(g, reason, batches) end
      out[at], out[at + 1], out[at + 2] = 1, size[g], batches
    end
    i = next_arrival[i]
  end

  -- Write the group back: its pending items and counters in one HSET and
  -- its due entry if it moved, or nothing of an emptied group.
  if size[g] == 0 then
    if indexed[g] then due_gone[#due_gone + 1] = name[g] end
  elseif first_pending[g] then
    -- s (see batch_lib): with a capacity in force, its dictionary, then
    -- the seq, the count, the bytes and the sums, and no n and b fields;
    -- without one, n and b, and in s the dictionary the group's packed exts
    -- still use and the seq, with no sums (so that a capacity in force
    -- again sums anew), or else the seq as text.
    local cap, args = caps[g], false
    if cap then
      local sums_g = sums[g]
      local s_field
      if cap[5] == 2 then
        s_field = struct.pack(cap[13], cap[10], seq[g], size[g], bytes[g], sums_g[1], sums_g[2])
      else
        s_field = struct.pack(cap[13], cap[10], seq[g], size[g], bytes[g], unpack(sums_g, 1, cap[5]))
      end
      args = { 's', s_field, 'l', ctx.now_s }
      if text_nb[g] then call('HDEL', gkey, 'n', 'b') end
    else
      local s_field
      if dict_at[g] then
        local at, sv = dict_at[g], svs[g]
        s_field = sub(sv, at, find(sv, '=', at + 1, true)) .. struct.pack('<d', seq[g])
      else
        s_field = dec(seq[g])
      end
      args = { 'n', dec(size[g]), 'b', format('%d', bytes[g]), 's', s_field, 'l', ctx.now_s }
    end
    local whole = stored[g] == 0
    if whole then
      args[#args + 1], args[#args + 2] = 'o', opened[g]
    end
    if due_dirty[g] then
      args[#args + 1], args[#args + 2] = 'd', format('%d', due_at[g])
      if why[g] ~= REASON.TIMEOUT or not whole then
        args[#args + 1], args[#args + 2] = 'r', why[g]
      end
    end
    if whole or rules_dirty[g] then
      if rules_of(g) then xs[g] = format_rules(rules[g]) end
      args[#args + 1], args[#args + 2] = 'x', xs[g]
    end
    i = first_pending[g]
    while i do
      local ext = exts[i]
      args[#args + 1] = ':' .. ids[i]
      if ext == '' then
        args[#args + 1] = dec(seqs[i]) .. ',' .. payloads[i]
      else
        -- Packed, in the value, unless that alone would take the value past
        -- the 64 bytes of the compact encoding.
        local seq_s = dec(seqs[i])
        local plain = #seq_s + 1 + #payloads[i]
        local b = byte(ext, 1)
        if (b == 42 or b == 43) and (plain + #ext <= 64 or plain > 64) then
          args[#args + 1] = ext .. seq_s .. ',' .. payloads[i]
        else
          args[#args + 1] = seq_s .. ',' .. payloads[i]
          args[#args + 1], args[#args + 2] = ';' .. ids[i], ext
        end
      end
      i = next_pending[i]
    end
    chunked('HSET', gkey, args)
    if reopened[g] or not indexed[g] or due_dirty[g] then
      due_set[#due_set + 1], due_set[#due_set + 2] = due_at[g], name[g]
    end
  end
end
if #due_set > 0 then chunked('ZADD', ctx.due, due_set) end
if #due_gone > 0 then chunked('ZREM', ctx.due, due_gone) end
finish(ctx)

out[1] = earliest
return out

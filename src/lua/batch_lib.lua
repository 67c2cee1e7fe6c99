-- Shared by the scripts that read or write groups and batches (add_items,
-- flush_group, remove_item). It is prepended to each of them, after the
-- REASON table that `scripts.rs` makes from the Rust table of flush reasons;
-- it defines functions only and touches no key.
--
-- Group hash layout (one hash per open group):
--   o = opened-at (ms, Redis clock)   n = item count
--   d = due-at (ms); when only max_idle has moved the due time later since,
--       d is an earlier wake-up, at which the flush script re-arms
--   b = payload bytes
--   s = the last arrival's sequence number, as text; or for a group written
--       under a capacity, its dictionary, then its counters and sums as
--       little-endian doubles: '=' .. the capacity's measure names joined
--       by ';' (in the capacity's order) .. '=', then struct '<ddd' ..
--       'd...' of the sequence number, the item count, the payload bytes
--       and the measures' sums over the items. Such a group has no n and b
--       fields: the add script reads and writes all of its counters in one
--       field and one unpack, without parsing text, where each field more
--       costs a lookup in the hash (see `counters`). The dictionary names
--       the measures of the group's packed exts (below). A call under a
--       policy without that capacity writes n and b again and keeps the
--       dictionary and the sequence number only (struct '<d'), and the
--       sums are summed again from the items when the capacity is in force
--       again; a reload that names other measures rewrites the group's
--       packed exts as text, its dictionary changes with them. (Older
--       versions wrote the dictionary, the sequence number and the sums,
--       with n and b as fields; before that, the sequence number as text
--       before the dictionary, and the sums after it. The add script sums
--       such a group anew.)
--   r = the reason that set d (absent: TIMEOUT)   l = last arrival (ms)
--   x = the group's due rules, fixed when it opened: '' when d is just
--       opened + max_wait, else 7 little-endian doubles (struct '<ddddddd'),
--       in ms (0 = none): max_wait, max_idle, the cutoff, deadline_lead,
--       max_age, the earliest item deadline, and opened-at again, so that
--       one field holds all a rule needs and reads without parsing text
--   ':' .. item_id = seq .. ',' .. payload, for an item with no ext, or
--       ext .. seq .. ',' .. payload, for an item with a packed ext
--   ';' .. item_id = the item's ext instead, when it is text (the rest of a
--       group opened before packed exts existed) or when the packed ext in
--       the value would take a short value past 64 bytes (see below)
-- An item's ext holds what it carries besides its payload. Packed (as the
-- service sends it), in one of two forms. Short, for the usual parcel (a
-- value of each measure the group's dictionary names, each under 2^32, and
-- nothing else): '*', then a byte k, then k little-endian u32 values
-- (struct '<I4...'), in the dictionary's order. Long, for any other item:
-- '+', then a byte k, then k little-endian doubles (its deadline in ms or 0,
-- then its value of each measure the group's dictionary names, in that
-- order, -0 for none), then as text its other measures and its requeue
-- count, then '|'. A parcel's packed ext is short enough (10 bytes for two
-- measures, 27 with a deadline) that its value stays within Redis's compact
-- (listpack) hash encoding, whose values are at most 64 bytes by default,
-- and one field per item is all a group writes and reads. Text (as older
-- versions wrote it, and the form a packed ext takes when a reload renames
-- the group's capacity): ';'-separated fields 'r' .. requeue count,
-- 't' .. deadline (ms), 'm' .. name .. '=' .. value. (Older still, a text
-- ext in the item's value: seq .. ';' .. ext .. ',' .. payload.) Measure
-- names are of A-Z a-z 0-9 _ - . only, so the text never holds ',', '|'.
--
-- A batch in the shard stream has the fields key, reason, opened, flushed, n
-- and items, where items is the concatenation, in arrival order, of
-- #id .. ':' .. id .. #payload .. ':' .. payload for each item; and, when
-- any of its items has an ext, x: the concatenation of #ext .. ':' .. ext,
-- and, when its group had a dictionary, names: that dictionary ('=' .. the
-- names of the measures its items' packed exts hold, joined by ';').
--
-- Items live in four arrays indexed alike, `it.seq`, `it.id`, `it.payload`
-- and `it.ext`, and a group's items are a list of indexes into them. Plain
-- arrays, not a table per item or per group: what a script allocates, Lua's
-- garbage collector pays for again, and that was most of a call's cost.
-- `ctx` holds what one script call shares: the shard's keys (due, stream,
-- flushed), the Redis clock (now, and now_s as text), until when an id
-- flushed now counts as a duplicate (expire, as text), how many items the
-- call has written to batches (written), and the flushed set's new members
-- with their scores (recent), written once at the end of the call (see
-- finish), since each command a script sends costs more than its arguments.

-- Library functions as locals: a local is a register, a global a table lookup.
local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local find, sub, byte, min = string.find, string.sub, string.byte, math.min

-- A new table whose array part already holds `count` slots (filled with
-- copies of ARGV's first values, which the caller overwrites), so that
-- filling it never resizes it: Lua 5.1 has no other way to presize.
local function presized(count)
  return { unpack(ARGV, 1, count) }
end

local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The context of one script call, at the Redis clock's now.
local function context(due, stream, flushed, dedup_ms)
  local now = now_ms()
  return { due = due, stream = stream, flushed = flushed, now = now,
    now_s = format('%d', now), expire = format('%d', now + dedup_ms), written = 0,
    recent = {} }
end

-- Most arguments one command gets from a list, so that no call passes more
-- than Lua's unpack can handle.
local CHUNK = 1000

-- Calls `cmd key ...list` in chunks of CHUNK.
local function chunked(cmd, key, list)
  for i = 1, #list, CHUNK do
    call(cmd, key, unpack(list, i, min(i + CHUNK - 1, #list)))
  end
end

-- The decimal form of small counts, remembered: Lua formats a number with
-- sprintf, which costs more than a table lookup.
local decimal = {}
local function dec(n)
  local s = decimal[n]
  if not s then
    s = format('%d', n)
    decimal[n] = s
  end
  return s
end

-- The number a decimal string holds, remembered: tonumber goes through
-- strtod, which costs more than a table lookup, and the same short strings
-- (group numbers, limits, counts) come back again and again.
local numbers = {}
local function num(s)
  local n = numbers[s]
  if not n then
    n = tonumber(s)
    numbers[s] = n
  end
  return n
end

-- The member that records a flushed item id of a key is this prefix, then the id.
local function flushed_prefix(key)
  return dec(#key) .. ':' .. key
end

-- Whether an ext's first byte (b) makes it packed: '+' (long) or '*' (short).
local function is_packed(b)
  return b == 43 or b == 42
end

-- An item's ':' field value split: its seq (as text), its ext ('' for
-- none, or its packed or old-style text ext) and where its payload starts.
local function split_value(v)
  local from = 1
  local ext = ''
  local b = byte(v, 1)
  if b == 42 then -- '*': a short packed ext, of k u32 values
    from = 3 + 4 * byte(v, 2)
    ext = sub(v, 1, from - 1)
  elseif b == 43 then -- '+': a long packed ext, up to its '|'
    from = find(v, '|', 3 + 8 * byte(v, 2), true) + 1
    ext = sub(v, 1, from - 1)
  end
  local comma = find(v, ',', from, true)
  local head = sub(v, from, comma - 1)
  if from == 1 then
    local semi = find(head, ';', 1, true)
    if semi then head, ext = sub(head, 1, semi - 1), sub(head, semi + 1) end
  end
  return head, ext, comma + 1
end

-- A group's dictionary ('=' .. names joined by ';'), from its s, or false.
local function dictionary(s)
  local at = s and find(s, '=', 1, true)
  return at and sub(s, at, find(s, '=', at + 1, true) - 1)
end

-- Appends a group's items to `it`, in arrival order, and returns the group's
-- metadata, the list of their indexes and its dictionary (the names of its
-- packed exts' measures; false: none). A small hash (listpack)
-- returns its fields in insertion order, which is arrival order, so the list
-- is sorted only when it is not already.
local function load_group(gkey, it)
  local flat = call('HGETALL', gkey)
  local meta, list, sorted, last, ext_of = {}, {}, true, 0, false
  local seqs, ids, payloads, exts = it.seq, it.id, it.payload, it.ext
  local top = #ids
  for i = 1, #flat, 2 do
    local f = flat[i]
    local kind = byte(f, 1)
    if kind == 58 then -- ':'
      local v = flat[i + 1]
      local head, ext, at = split_value(v)
      local seq = num(head)
      if seq < last then sorted = false end
      last = seq
      top = top + 1
      seqs[top], ids[top], payloads[top], exts[top] = seq, sub(f, 2), sub(v, at), ext
      list[#list + 1] = top
    elseif kind == 59 then -- ';'
      ext_of = ext_of or {}
      ext_of[sub(f, 2)] = flat[i + 1]
    else
      meta[f] = flat[i + 1]
    end
  end
  if ext_of then
    for k = 1, #list do
      local ext = ext_of[ids[list[k]]]
      if ext then exts[list[k]] = ext end
    end
  end
  if not sorted then
    table.sort(list, function(a, b) return seqs[a] < seqs[b] end)
  end
  return meta, list, dictionary(meta.s)
end

-- Writes the items list[from..to] as one batch to the shard stream and
-- queues their ids for the flushed set (see finish); `names` is the group's dictionary
-- (see load_group). Returns the batch as
-- {stream_id, reason, opened, flushed, n, items, x, names}.
local function write_batch(ctx, key, reason, opened, it, list, from, to, names)
  local parts, members, xparts, extras = {}, ctx.recent, {}, false
  local prefix, expire = flushed_prefix(key), ctx.expire
  local ids, payloads, exts = it.id, it.payload, it.ext
  for i = from, to do
    local id, payload, ext = ids[list[i]], payloads[list[i]], exts[list[i]]
    parts[#parts + 1] = dec(#id) .. ':' .. id .. dec(#payload) .. ':' .. payload
    members[#members + 1] = expire
    members[#members + 1] = prefix .. id
    if ext == '' then
      xparts[#xparts + 1] = '0:'
    else
      xparts[#xparts + 1] = dec(#ext) .. ':' .. ext
      extras = true
    end
  end
  local blob = table.concat(parts)
  local n = dec(to - from + 1)
  local x, stream_id = ''
  if extras and names then
    x = table.concat(xparts)
    stream_id = call('XADD', ctx.stream, '*', 'key', key, 'reason', reason,
      'opened', opened, 'flushed', ctx.now_s, 'n', n, 'items', blob, 'x', x, 'names', names)
  elseif extras then
    x = table.concat(xparts)
    stream_id = call('XADD', ctx.stream, '*', 'key', key, 'reason', reason,
      'opened', opened, 'flushed', ctx.now_s, 'n', n, 'items', blob, 'x', x)
  else
    stream_id = call('XADD', ctx.stream, '*', 'key', key, 'reason', reason,
      'opened', opened, 'flushed', ctx.now_s, 'n', n, 'items', blob)
  end
  ctx.written = ctx.written + to - from + 1
  return { stream_id, reason, opened, ctx.now_s, n, blob, x, extras and names or '' }
end

-- Flushes the items `list` (in arrival order) oldest first, in batches of at
-- most `max` items (0: one batch of all). With `full_only`, only full batches
-- are written and a short rest stays open. `names`: see write_batch. Returns
-- the batches and the index in `list` of the first item left open.
local function cut(ctx, key, reason, opened, it, list, max, full_only, names)
  local batches, from, n = {}, 1, #list
  while from <= n do
    local to = n
    if max > 0 and to - from + 1 > max then to = from + max - 1 end
    if full_only and to - from + 1 < max then break end
    batches[#batches + 1] = write_batch(ctx, key, reason, opened, it, list, from, to, names)
    from = to + 1
  end
  return batches, from
end

-- Ends a script call that may have written batches: records the ids it
-- flushed in the flushed set, and forgets flushed ids whose dedup window
-- has passed, bounded by what this call wrote, so the set shrinks as fast
-- as it grows and no call stalls Redis.
local function finish(ctx)
  if ctx.written == 0 then return end
  chunked('ZADD', ctx.flushed, ctx.recent)
  local stale = call('ZRANGE', ctx.flushed, '-inf', ctx.now_s, 'BYSCORE',
    'LIMIT', 0, 2 * ctx.written + 16)
  if #stale > 0 then chunked('ZREM', ctx.flushed, stale) end
end

-- The due rules of a group whose x is not '': {w, i, c, L, a, e, o} in ms.
local function parse_rules(x)
  local w, i, c, l, a, e, o = struct.unpack('<ddddddd', x)
  return { w, i, c, l, a, e, o }
end

local function format_rules(r)
  return struct.pack('<ddddddd', r[1], r[2], r[3], r[4], r[5], r[6], r[7])
end

-- When a group is due, and the reason: the earliest of opened + max_wait
-- (TIMEOUT), last + max_idle (IDLE), the cutoff (CUTOFF), the earliest item
-- deadline - lead (DEADLINE) and opened + max_age (MAX_AGE). A group of
-- fewer than min_items whose TIMEOUT or IDLE has passed is held: those two
-- no longer count (only with a max_age, so nothing waits forever). On a tie
-- the rule that always flushes wins.
local function due_of(rules, last, size, min_items, now)
  local w, i, c, lead, a, e, opened = rules[1], rules[2], rules[3], rules[4], rules[5], rules[6], rules[7]
  local held = a > 0 and size < min_items
  local due, why = math.huge, false
  local t = opened + w
  if not (held and t <= now) then due, why = t, REASON.TIMEOUT end
  if i > 0 then
    t = last + i
    if t < due and not (held and t <= now) then due, why = t, REASON.IDLE end
  end
  if c > 0 and c <= due then due, why = c, REASON.CUTOFF end
  if e > 0 and e - lead <= due then due, why = e - lead, REASON.DEADLINE end
  if a > 0 and opened + a <= due then due, why = opened + a, REASON.MAX_AGE end
  return due, why
end

-- The item count, payload bytes and sequence number that a group written
-- under a capacity keeps in its s (see the layout above), where its sums
-- start in s and where its dictionary ends; false for an s of any other
-- layout, whose group keeps its count and bytes in n and b. The layouts
-- that start with a dictionary of k names differ in length: 8 bytes after
-- it (the seq), 8 * (1 + k) (the seq and sums, of older versions) or
-- 8 * (3 + k) (these counters).
local function counters(s)
  if not s or byte(s, 1) ~= 61 then return false end -- '='
  local e = find(s, '=', 2, true)
  if not e then return false end
  local _, semis = string.gsub(sub(s, 2, e - 1), ';', ';')
  if #s ~= e + 8 * (4 + semis) then return false end
  local seq, n, b = struct.unpack('<ddd', s, e + 1)
  return n, b, seq, e + 25, e
end

-- 'name=v;name=v' (a capacity) as a table, and its names in order.
local function parse_sums(m)
  local sums, order = {}, {}
  for name, v in string.gmatch(m, '([^;=]+)=(%d+)') do
    sums[name] = tonumber(v)
    order[#order + 1] = name
  end
  return sums, order
end

-- The measure names of a dictionary ('=' .. names joined by ';').
local function field_names(field)
  local names = {}
  for name in string.gmatch(sub(field, 2), '[^;]+') do names[#names + 1] = name end
  return names
end

-- Reads a text ext's fields from `at` (see the layout above) into deadline
-- and measures ({name, value, ...}), and returns them.
local function parse_text(ext, at, deadline, measures)
  local len = #ext
  local count = measures and #measures or 0
  while at <= len do
    local stop = find(ext, ';', at, true) or len + 1
    local kind = byte(ext, at)
    if kind == 116 then -- 't'
      deadline = tonumber(sub(ext, at + 1, stop - 1))
    elseif kind == 109 then -- 'm'
      local eq = find(ext, '=', at, true)
      measures = measures or {}
      measures[count + 1] = sub(ext, at + 1, eq - 1)
      measures[count + 2] = tonumber(sub(ext, eq + 1, stop - 1))
      count = count + 2
    end
    at = stop + 1
  end
  return deadline, measures
end

-- An item ext's deadline (or false) and measures ({name, value, ...} or
-- false). `names`: the measure names of its group's dictionary, as a
-- list, for a packed ext's values (false: they are not read).
local function parse_ext(ext, names)
  local b = byte(ext, 1)
  if b == 42 then
    local k, measures = byte(ext, 2), false
    if names and #names == k then
      local values = { struct.unpack('<' .. string.rep('I4', k), ext, 3) }
      measures = {}
      for j = 1, k do measures[2 * j - 1], measures[2 * j] = names[j], values[j] end
    end
    return false, measures
  end
  if b ~= 43 then return parse_text(ext, 1, false, false) end
  local k = byte(ext, 2)
  local values = { struct.unpack('<' .. string.rep('d', k), ext, 3) }
  local deadline, measures = values[1] ~= 0 and values[1], false
  if names and k > 1 and #names == k - 1 then
    measures = {}
    for j = 2, k do
      local v = values[j]
      if v ~= 0 or 1 / v > 0 then -- -0: the item has no such measure
        measures[#measures + 1], measures[#measures + 2] = names[j - 1], v
      end
    end
  end
  local text = sub(ext, 3 + 8 * k, -2)
  if text == '' then return deadline, measures end
  return parse_text(text, 1, deadline, measures)
end

-- Adds `sign` times an item's measures ({name, value, ...}) to the sums s
-- of the measures `index` (name -> position) names; the others are
-- unlimited and not summed.
local function add_measures(s, index, measures, sign)
  for k = 1, #measures, 2 do
    local m = index[measures[k]]
    if m then s[m] = s[m] + sign * measures[k + 1] end
  end
end

-- A packed ext as text (see the layout above), given its capacity's names.
local function ext_text(ext, names)
  local b = byte(ext, 1)
  if not is_packed(b) then return ext end
  local deadline, measures = parse_ext(ext, names)
  local fields = {}
  if deadline then fields[1] = format('t%d', deadline) end
  for j = 1, measures and #measures or 0, 2 do
    fields[#fields + 1] = format('m%s=%d', measures[j], measures[j + 1])
  end
  if b == 43 then
    for field in string.gmatch(sub(ext, 3 + 8 * byte(ext, 2), -2), '[^;]+') do
      if byte(field, 1) == 114 then fields[#fields + 1] = field end -- 'r'
    end
  end
  return table.concat(fields, ';')
end

-- Sums the capacity measures of a group's items into s (by position in the
-- add script's capacity table `cap`, see add_items), for a group whose s
-- holds no sums for this capacity: one opened under another capacity before
-- a reload (its packed exts hold the other's measures, so they are written
-- again as text, and its dictionary changes with them), one that took or
-- lost items under a policy without this capacity, or one an older version
-- wrote (whose sums field goes). Appends the items to `it`. A function of
-- the library, with everything it needs as arguments, so that the add
-- script does not pay for making it on every call.
local function sum_group(gkey, it, cap, s)
  local meta, held, field = load_group(gkey, it)
  local same = field == cap[3]
  local names = same and cap[2] or (field and field_names(field))
  local index, ids, seqs, payloads, exts = cap[7], it.id, it.seq, it.payload, it.ext
  local rewrite = {}
  for _, p in ipairs(held) do
    local ext = exts[p]
    if ext ~= '' then
      local _, measures = parse_ext(ext, names)
      if measures then add_measures(s, index, measures, 1) end
      if not same and is_packed(byte(ext, 1)) then
        ext = ext_text(ext, names)
        exts[p] = ext
        rewrite[#rewrite + 1], rewrite[#rewrite + 2] = ':' .. ids[p], dec(seqs[p]) .. ',' .. payloads[p]
        if ext ~= '' then rewrite[#rewrite + 1], rewrite[#rewrite + 2] = ';' .. ids[p], ext end
      end
    end
  end
  if #rewrite > 0 then chunked('HSET', gkey, rewrite) end
  for f in pairs(meta) do
    if byte(f, 1) == 61 then call('HDEL', gkey, f) end -- '=': older versions' sums
  end
end

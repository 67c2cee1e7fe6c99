-- The group layout, format 4, and the helpers that read and write it.
-- Every function that reads or writes a group's hash is in this library,
-- and reads its fields by name. The layout is described once, in
-- src/scripts/layout.rs; FIELD, BATCH and SEP (the bytes that name a
-- group's and a batch's own fields, and the flushed set's separator) come
-- from there, and the codes and packed orders (OUTCOME, LIMIT, POLICY,
-- OVERFLOW, HEADER, FLAG) from src/scripts/codes.rs, all made by the
-- service ahead of this file.

local call, tonumber, unpack, format = redis.call, tonumber, unpack, string.format
local find, sub, byte, char, rep, gmatch = string.find, string.sub, string.byte, string.char, string.rep, string.gmatch
local pack, unpack_struct = struct.pack, struct.unpack

local STATE, OPENED = FIELD.STATE, FIELD.OPENED
-- The outcomes most items get, as locals: the add paths write one per item.
local ADDED, DUPLICATE = OUTCOME.ADDED, OUTCOME.DUPLICATE
-- Whether a field of a group's hash is one of FIELD (else it is an item).
local META = {}
for _, name in pairs(FIELD) do META[name] = true end

-- Most arguments one command gets from a list.
local CHUNK = 1000

-- The numbers of the decimal texts 1 to 256 (the group numbers of most
-- calls), looked up without a call.
local NUMBER = {}
for n = 1, 256 do NUMBER[format('%d', n)] = n end

-- -0: a packed measure value that the item does not have.
local NONE = -1 / math.huge

local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A memo of f over short strings or small numbers, emptied when it holds
-- `limit` entries: the library stays loaded, so memos outlive a call.
local function memo(f, limit)
  local cache, count = {}, 0
  return function(x)
    local v = cache[x]
    if v == nil then
      v = f(x)
      if count >= limit then cache, count = {}, 0 end
      cache[x], count = v, count + 1
    end
    return v
  end
end

-- Decimal text of a count, and the number a decimal text holds (tonumber
-- goes through strtod, sprintf through the C library: a lookup is cheaper).
local dec = memo(function(n) return format('%d', n) end, 512)
local num = memo(tonumber, 512)

-- The decimal text of the sequence numbers most items have, looked up
-- without a call.
local DEC = {}
for n = 0, 255 do DEC[n] = format('%d', n) end

-- 'd' repeated: the struct layout of count doubles.
local doubles = memo(function(count) return '<' .. rep('d', count) end, 128)

-- Calls `cmd key ...list` (its first `count`, or all) in chunks of CHUNK.
local function chunked(cmd, key, list, count)
  count = count or #list
  -- The usual lists of one or two (a due time and its key), without unpack.
  if count == 1 then return call(cmd, key, list[1]) end
  if count == 2 then return call(cmd, key, list[1], list[2]) end
  for i = 1, count, CHUNK do
    call(cmd, key, unpack(list, i, math.min(i + CHUNK - 1, count)))
  end
end

-- A group's counters from its s, and into `sums` its k sums when s holds
-- them (the last value returned says whether it does).
local function read_state(s, k, sums)
  if k > 0 and #s == 32 + 8 * k then
    if k == 2 then
      local seq, size, bytes, last, a, b = unpack_struct('<dddddd', s)
      sums[1], sums[2] = a, b
      return seq, size, bytes, last, true
    end
    local all = { unpack_struct(doubles(4 + k), s) }
    for j = 1, k do sums[j] = all[4 + j] end
    return all[1], all[2], all[3], all[4], true
  end
  local seq, size, bytes, last = unpack_struct('<dddd', s)
  return seq, size, bytes, last, false
end

-- A group's s, with the first k of `sums`.
local function state(seq, size, bytes, last, k, sums)
  if k == 0 then return pack('<dddd', seq, size, bytes, last) end
  if k == 2 then return pack('<dddddd', seq, size, bytes, last, sums[1], sums[2]) end
  return pack(doubles(4 + k), seq, size, bytes, last, unpack(sums, 1, k))
end

-- A group's due rules: a table r (new when not given) set to those of
-- an x, or to the values given.
local function set_rules(r, max_wait, max_idle, cutoff, lead, max_age, deadline, opened, due)
  if not r then
    return { max_wait = max_wait, max_idle = max_idle, cutoff = cutoff, lead = lead, max_age = max_age,
      deadline = deadline, opened = opened, due = due }
  end
  r.max_wait, r.max_idle, r.cutoff, r.lead, r.max_age, r.deadline, r.opened, r.due =
    max_wait, max_idle, cutoff, lead, max_age, deadline, opened, due
  return r
end

local function read_rules(x, r)
  return set_rules(r, unpack_struct('<dddddddd', x))
end

local function rules_field(r)
  return pack('<dddddddd', r.max_wait, r.max_idle, r.cutoff, r.lead, r.max_age, r.deadline,
    r.opened, r.due)
end

-- An item's hash value, and back: its sequence number, ext and payload.
local function item_value(ext, seq, payload)
  return ext .. (DEC[seq] or dec(seq)) .. ',' .. payload
end

local function split_item(v)
  local from, ext = 1, ''
  if byte(v, 1) == 43 then -- '+'
    from = find(v, '|', 3 + 8 * byte(v, 2), true) + 1
    ext = sub(v, 1, from - 1)
  end
  local comma = find(v, ',', from, true)
  return num(sub(v, from, comma - 1)), ext, sub(v, comma + 1)
end

-- The names of a dictionary ('a;b'), as a list.
local names_of = memo(function(dictionary)
  local names = {}
  for name in gmatch(dictionary, '[^;]+') do names[#names + 1] = name end
  return names
end, 256)

-- A packed ext's deadline (0: none), its measures by name (values that
-- follow `names`, and those in its text) and the rest of its text.
local function decode_ext(ext, names)
  local k = byte(ext, 2) - 1
  local values = { unpack_struct(doubles(k + 1), ext, 3) }
  local measures, rest = {}, {}
  for j = 1, k do
    local v = values[1 + j]
    if not (v == 0 and 1 / v < 0) then measures[names[j]] = v end
  end
  for field in gmatch(sub(ext, 3 + 8 * (k + 1), -2), '[^;]+') do
    local name, v = string.match(field, '^m([^=]+)=(%d+)$')
    if name then measures[name] = tonumber(v) else rest[#rest + 1] = field end
  end
  return values[1], measures, rest
end

-- A packed ext whose values follow `names` (see decode_ext).
local function encode_ext(deadline, measures, names, rest)
  local values, text, named = {}, {}, {}
  for j = 1, #names do
    values[j], named[names[j]] = measures[names[j]] or NONE, true
  end
  for name, v in pairs(measures) do
    if not named[name] then text[#text + 1] = format('m%s=%d', name, v) end
  end
  table.sort(text)
  for j = 1, #rest do text[#text + 1] = rest[j] end
  return '+' .. char(#names + 1) .. pack(doubles(#names + 1), deadline, unpack(values, 1, #names))
    .. table.concat(text, ';') .. '|'
end

-- A policy as the service packs it (src/scripts/codes.rs, PolicySlot:
-- the doubles of POLICY_FORMAT, read by their places in POLICY; then k
-- doubles, the capacity's limits; then its scope (see limits.lua); then its
-- k measure names joined by ';'), parsed once and remembered while the
-- library stays loaded.
local policy_of = memo(function(blob)
  local v = { unpack_struct(POLICY_FORMAT, blob) }
  local at = v[#v]
  local max_items, max_bytes, min_items = v[POLICY.MAX_ITEMS], v[POLICY.MAX_BYTES], v[POLICY.MIN_ITEMS]
  local idle, c1, lead, age = v[POLICY.MAX_IDLE], v[POLICY.CUTOFF], v[POLICY.DEADLINE_LEAD], v[POLICY.MAX_AGE]
  local k, groups, global = v[POLICY.MEASURES], v[POLICY.MAX_GROUPS], v[POLICY.MAX_OPEN_GROUPS]
  local scope_len = v[POLICY.SCOPE_LENGTH]
  local limits = {}
  if k > 0 then
    limits = { unpack_struct(doubles(k), blob, at) }
    limits[k + 1] = nil
  end
  at = at + 8 * k
  local scope = sub(blob, at, at + scope_len - 1)
  local dictionary = sub(blob, at + scope_len)
  return { max_items = max_items, max_bytes = max_bytes, min_items = min_items,
    -- max_bytes, or, for none, a size no group reaches.
    bytes_cap = max_bytes > 0 and max_bytes or math.huge,
    max_wait = v[POLICY.MAX_WAIT], max_idle = idle, cutoff = c1, next_cutoff = v[POLICY.NEXT_CUTOFF],
    lead = lead, max_age = age, k = k, limits = limits, dictionary = dictionary, names = names_of(dictionary),
    plain = idle == 0 and c1 == 0 and lead == 0 and age == 0,
    groups = groups, global = global, flush_oldest = v[POLICY.OVERFLOW] == OVERFLOW.FLUSH_OLDEST,
    scope = scope, tracked = groups > 0 or global > 0,
    -- No rules, no capacity, no limit on open groups and no min_items: the
    -- policy whose one-item groups add.lua's usual path takes.
    usual = idle == 0 and c1 == 0 and lead == 0 and age == 0 and k == 0 and groups == 0
      and global == 0 and min_items == 0,
    -- Rules, a capacity or min_items, and no limit on open groups: the
    -- policy whose one-item groups add_ruled.lua's path takes.
    ruled = not (idle == 0 and c1 == 0 and lead == 0 and age == 0 and k == 0 and min_items == 0)
      and groups == 0 and global == 0 }
end, 256)

-- The reason a group of policy p flushes by its size with n items of
-- `bytes` payload bytes: SIZE at max_items, else BYTES at max_bytes, else
-- false. Every add path asks it, so the rule is written once.
local function size_reason(p, n, bytes)
  if n >= p.max_items then return REASON.SIZE end
  if bytes >= p.bytes_cap then return REASON.BYTES end
  return false
end

-- Takes one item out of its open group; deletes the group if it empties.
-- Its measures leave the group's capacity sums, and when it held the group's
-- earliest deadline, the group's due time is computed again without it.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the group's hash
-- ARGV[1]: the group's key
-- ARGV[2]: the item id
-- ARGV[3]: min_items in force for the key (0 = none)
-- ARGV[4]: the dictionary of the capacity in force for the key ('=' .. its
--   names joined by ';', see batch_lib), or ''
-- Returns: {removed (1 or 0), group size after}

local due_key, gkey = KEYS[1], KEYS[2]
local key, id = ARGV[1], ARGV[2]
local got = call('HMGET', gkey, ':' .. id, ';' .. id, 's', 'n')
local v, s = got[1], got[3]
-- A group written under a capacity keeps its count, bytes and seq in s.
local size, bytes, seq, sums_at, dict_end = counters(s)
if not v then
  return { 0, size or tonumber(got[4] or '0') }
end
local _, ext, at = split_value(v)
ext = got[2] or ext
if got[2] then
  call('HDEL', gkey, ':' .. id, ';' .. id)
else
  call('HDEL', gkey, ':' .. id)
end
local gone = #v - at + 1
if size then
  size, bytes = size - 1, bytes - gone
else
  size = call('HINCRBY', gkey, 'n', -1)
  -- 0 - x, not -x: Lua formats -0 as "-0", which HINCRBY refuses.
  call('HINCRBY', gkey, 'b', 0 - gone)
end
if size <= 0 then
  call('DEL', gkey)
  call('ZREM', due_key, key)
  return { 1, 0 }
end

-- The group's s holds its dictionary and sums (see batch_lib). When the
-- dictionary is the capacity in force, it names the packed ext's measures,
-- and the sums lose the item's; under another capacity, or none, the sums
-- are dropped, to be summed again from the items when they are needed.
local dictionary = ARGV[4]
local from = s and find(s, '=', 1, true)
local head = dictionary .. '='
local same = dictionary ~= '' and from and find(s, head, from, true) == from
local names = same and field_names(dictionary)
local deadline, measures = false, false
if ext ~= '' then deadline, measures = parse_ext(ext, names) end
-- The sums in s from `at` less the item's measures, packed.
local function sums_less(at)
  local count, index = #names, {}
  for k = 1, count do index[names[k]] = k end
  local layout = '<' .. string.rep('d', count)
  local sums = { struct.unpack(layout, s, at) }
  if measures then add_measures(sums, index, measures, -1) end
  return struct.pack(layout, unpack(sums, 1, count))
end
if sums_at then
  -- The counters go back into s with the sums, or without them into n and b.
  local dict = sub(s, 1, dict_end)
  if same then
    call('HSET', gkey, 's', dict .. struct.pack('<ddd', seq, size, bytes) .. sums_less(sums_at))
  else
    call('HSET', gkey, 'n', format('%d', size), 'b', format('%d', bytes),
      's', dict .. struct.pack('<d', seq))
  end
else
  sums_at = from and find(s, '=', from + 1, true) + 1
  -- (An s that starts with its dictionary holds the seq before the sums.)
  if from == 1 then sums_at = sums_at + 8 end
  if sums_at and sums_at <= #s and ext ~= '' then
    if not same then
      call('HSET', gkey, 's', sub(s, 1, sums_at - 1))
    elseif measures then
      call('HSET', gkey, 's', sub(s, 1, sums_at - 1) .. sums_less(sums_at))
    end
  end
end
if not deadline then return { 1, size } end
local meta = call('HMGET', gkey, 'l', 'x')
if meta[2] and meta[2] ~= '' then
  local rules = parse_rules(meta[2])
  if rules[6] == deadline then
    -- The earliest deadline left, from the items still in the group.
    local it = { seq = {}, id = {}, payload = {}, ext = {} }
    local _, list = load_group(gkey, it)
    local earliest = 0
    for k = 1, #list do
      local e = it.ext[list[k]]
      if e ~= '' then
        local t = parse_ext(e)
        if t and (earliest == 0 or t < earliest) then earliest = t end
      end
    end
    rules[6] = earliest
    local due, why = due_of(rules, tonumber(meta[1] or rules[7]), size, tonumber(ARGV[3]), now_ms())
    call('HSET', gkey, 'x', format_rules(rules), 'd', format('%d', due), 'r', why)
    call('ZADD', due_key, due, key)
  end
end
return { 1, size }

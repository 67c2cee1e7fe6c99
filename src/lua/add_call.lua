-- The add function (add.lua has the call's arguments and state, and the
-- general path of a group), its reply, and the usual path most groups of
-- a call take.
--
-- KEYS[1]: the shard's due set   KEYS[2]: its batch stream
-- KEYS[3]: its recently-flushed set   KEYS[4]: its open-group index
--   (limits.lua)   KEYS[4 + g]: the hash of group g, g = 1..G
-- KEYS[5 + G]: its requeued set (batch_id ':' item_id, scored by the
--   batch's stream time), given when an item is requeued
-- ARGV[1]: the call's header, the doubles of HEADER_FORMAT, by their
--   places in HEADER: the dedup window (ms), P (the count of policies), G
--   (of groups), the shape of an item's arguments (see below) and L (the
--   lead): when items carry group numbers, groups 1..L each
--   get one item and no flags, items 1..L (item g is group g's), and the
--   rest are the other groups' (the lead, taken as a call of one item per
--   group; 0: none); then P doubles, the lengths of the P policies, packed
--   (see policy_of), which follow, joined
-- ARGV[2..]: per group: its key, and when P > 1 its policy's number (1..P)
-- then per item, by the shape: 3 or 4: its group's number, followed by
--   FLAG.CLOSE to close the group after it and FLAG.REQUEUE batch_id for
--   an item requeued from that batch; its id; its payload; for 4, '' or its ext, packed for
--   its policy's capacity. -2 or -3: no group number (the items have no
--   flags, and either G is 1 or item g is group g's only one); its id; its
--   payload; for -3, its ext.
-- Returns: its numbers, packed, struct '<d' .. 'dd' * items: the earliest
--   due time this call set (ms) or 0, then per item its OUTCOME and a
--   number: its group's size after (ADDED, DUPLICATE), the LIMIT it met
--   (REFUSED), or the number of the group to flush, from 1, or 0 for none
--   yet (WAITING_SHARD, WAITING_POLICY). A call that wrote batches or names
--   groups to flush returns {those numbers, W, then W pairs of an item's
--   number (from 1) and the batches it wrote, then the keys of the groups
--   to flush to make room}, a batch being {stream_id, fields}, the fields
--   of its stream entry (see src/scripts/layout.rs). (Packed: a string costs Redis
--   less to reply than a table, and most items write no batch.)

-- out[1..count], packed as doubles: at most CHUNK at a time (Lua
-- unpacks at most some 8,000 values at once).
local function packed(count)
  if count <= CHUNK then return pack(doubles(count), unpack(out, 1, count)) end
  local parts = {}
  for from = 1, count, CHUNK do
    local to = math.min(from + CHUNK - 1, count)
    parts[#parts + 1] = pack(doubles(to - from + 1), unpack(out, from, to))
  end
  return table.concat(parts)
end

-- The reply of a call of n items (see the top), in a table reused by
-- every call.
local REPLY = {}
local function reply_of(earliest, n)
  out[1] = earliest
  local numbers = n == 1 and pack('<ddd', earliest, out[2], out[3]) or packed(2 * n + 1)
  if wrote_n == 0 and room_n == 0 then return numbers end
  REPLY[1], REPLY[2] = numbers, wrote_n / 2
  for j = 1, wrote_n do REPLY[2 + j] = wrote[j] end
  for j = 1, room_n do REPLY[2 + wrote_n + j] = room[j] end
  REPLY[3 + wrote_n + room_n] = nil
  return REPLY
end

-- Whether item i has no deadline.
local function undated(i)
  local ext = EXT_AT and A[B + S * i + EXT_AT] or ''
  return ext == '' or unpack_struct('<d', ext, 3) == 0
end

-- The due time of usual group g (policy p), opened now: recorded for the
-- due set, and returned. Its text (the ZADD score) is made once per policy
-- and clock reading: Redis would format a number score itself, at about
-- twice the cost, for every group.
local function opened_due(ctx, g, p)
  local due_at = ctx.now + p.max_wait
  if p.due_from ~= ctx.now then p.due_from, p.due_text = ctx.now, format('%d', due_at) end
  due_set[due_set_n + 1], due_set[due_set_n + 2] = p.due_text, key[g]
  due_set_n = due_set_n + 2
  return due_at
end

-- Whether the call brings group g at most MANY items, none with a flag,
-- and, unless `dated`, none with a deadline: for a usual policy (see
-- policy_of), whether the group is usual.
local MANY = 64
local function usual(g, dated)
  local i, c = first_arrival[g], 0
  while i do
    c = c + 1
    if c > MANY or close[i] or requeue_of[i] or not (dated or undated(i)) then return false end
    i = next_arrival[i]
  end
  return true
end

-- Takes the items of usual group g (hash h, policy p) when the call brings
-- it more than one and they do not complete it: one HMGET of its counters
-- and their ids, one HSET of the new ones, and each item's reply as take
-- writes it. Returns the due time it set (0: none), or false, having
-- written nothing, when they would complete it (the general path then
-- takes them, flushes included).
local function add_usual_many(ctx, g, h, p)
  local i, c = first_arrival[g], 1
  fields[1] = STATE
  while i do
    c = c + 1
    fields[c] = id_of(i)
    i = next_arrival[i]
  end
  local got = call('HMGET', h, unpack(fields, 1, c))
  local s, seq_n, size_n, bytes_n = got[1], 0, 0, 0
  if s then seq_n, size_n, bytes_n = read_state(s, 0) end
  local seen, writes, w, b, n = {}, { STATE, false }, 2, bytes_n, size_n
  if not s then writes[3], writes[4], w = OPENED, now_text(ctx), 4 end
  i = first_arrival[g]
  for j = 2, c do
    local id, until_ms = fields[j], flushed_until[i]
    if got[j] or seen[id] or until_ms and tonumber(until_ms) > ctx.now then
      out[2 * i], out[2 * i + 1] = DUPLICATE, n
    else
      local _, payload, ext = item_args(i)
      seen[id], n, b, seq_n = true, n + 1, b + #payload, seq_n + 1
      out[2 * i], out[2 * i + 1] = ADDED, n
      writes[w + 1], writes[w + 2], w = id, item_value(ext, seq_n, payload), w + 2
    end
    i = next_arrival[i]
  end
  if size_reason(p, n, b) then return false end
  if n == size_n then return 0 end
  writes[2] = state(seq_n, n, b, ctx.now, 0)
  call('HSET', h, unpack(writes, 1, w))
  return s and 0 or opened_due(ctx, g, p)
end

-- Takes item i, the only one of usual group g (hash h, policy p): what
-- read_group, take and write_group do for it, reading and writing only
-- its counters, its opening time and the item. Returns the due time it
-- set (0: none), or false, having changed nothing, when the group needs
-- the general path (a reload lowered max_items below what it holds).
local function add_usual(ctx, g, i, h, p)
  local a, now = B + S * i, ctx.now
  local field = A[a + ID_AT]
  local got = call('HMGET', h, STATE, field)
  local s, seq_n, size_n, bytes_n = got[1], 0, 0, 0
  if s then seq_n, size_n, bytes_n = unpack_struct('<ddd', s) end
  local until_ms = flushed_until[i]
  if got[2] or until_ms and tonumber(until_ms) > now then
    out[2 * i], out[2 * i + 1] = DUPLICATE, size_n
    return 0
  end
  if size_n >= p.max_items then return false end
  local payload = A[a + PAYLOAD_AT]
  local n, b = size_n + 1, bytes_n + #payload
  seq_n = seq_n + 1
  local reason = size_reason(p, n, b)
  if reason then
    local batches = flush_taken(ctx, g, h, p, size_n, not s and now_text(ctx), i, seq_n, reason)
    if s then
      due_gone[due_gone_n + 1] = key[g]
      due_gone_n = due_gone_n + 1
    end
    out[2 * i], out[2 * i + 1] = ADDED, 0
    wrote_batches(i, batches)
    return 0
  end
  out[2 * i], out[2 * i + 1] = ADDED, n
  -- The item's value (see item_value), made here: a call costs more.
  local item = (DEC[seq_n] or dec(seq_n)) .. ',' .. payload
  if EXT_AT then item = A[a + EXT_AT] .. item end
  if s then
    call('HSET', h, STATE, pack('<dddd', seq_n, n, b, now), field, item)
    return 0
  end
  call('HSET', h, STATE, pack('<dddd', seq_n, n, b, now), OPENED, now_text(ctx), field, item)
  return opened_due(ctx, g, p)
end

-- Takes the lead: groups 1..lead of the call's ng, each given one item
-- without flags (item g is group g's; the group arguments of g are at
-- args[at + step * (g - 1)], its KEYS start after keys[ko], its policy is
-- one of `policies`), with none of the arrival chains: the usual path,
-- or the general one for a group that needs it. First it looks up the
-- flushed set's members of items 1..n (those after the lead's are made
-- already, by arrivals). Returns the earliest due time it set (0: none).
local function add_lead(ctx, keys, ko, args, policies, at, step, lead, ng, n)
  -- Group g's key is args[ka + step * g], item g's id A[ia + S * g], its
  -- hash keys[ko + 4 + g].
  local ka, ia, hk = at - step, B + ID_AT, ko + 4
  for g = 1, lead do
    local k = args[ka + step * g]
    key[g], member[g] = k, k .. SEP .. A[ia + S * g]
  end
  lookup_flushed(ctx.flushed, n)
  local one = not policies[2] and policies[1]
  local earliest = 0
  for g = 1, lead do
    local p = one or policies[num(args[ka + step * g + 1])]
    local h = keys[hk + g]
    local due_at = false
    if p.usual then
      due_at = (not EXT_AT or undated(g)) and add_usual(ctx, g, g, h, p)
    elseif p.ruled then
      due_at = add_ruled(ctx, g, g, h, p)
    end
    if not due_at then
      start_group(g, h, key[g], p)
      first_arrival[g], last_arrival[g], next_arrival[g], close[g], requeue_of[g] = g, g, false, false, false
      due_at = general(ctx, g, keys[ko + 5 + ng])
    end
    if due_at > 0 and (earliest == 0 or due_at < earliest) then earliest = due_at end
  end
  return earliest
end

-- The arrays of a call's state (add.lua's, batches.lua's RECENT and parts,
-- and REPLY) keep the size of the largest call so far, and so does the
-- Lua heap, whose every table and string the collector walks and whose
-- cache lines every later call's commands compete with: a call of 10,000
-- items left it 7 to 11 MB instead of about 1. A call (or section) of more
-- than SHED items or groups ends by shedding them: fresh arrays (its
-- reply keeps the old REPLY), and one full collection.
local SHED = 1024
local function shed()
  REPLY = {}
  key, hash, policy, opened = {}, {}, {}, {}
  seq, size, bytes, last, due = {}, {}, {}, {}, {}
  sums, sums_valid, rules, rules_read, exists, stored = {}, {}, {}, {}, {}, {}
  added, due_dirty, rules_dirty = {}, {}, {}
  first_arrival, last_arrival, first_pending, last_pending = {}, {}, {}, {}
  close, requeue_of, member, flushed_until = {}, {}, {}, {}
  next_arrival, next_pending, item_seq, held, field_of = {}, {}, {}, {}, {}
  fields, values_of_item, out, wrote, WRITES, rules_pool = {}, {}, {}, {}, {}, {}
  indexed, indexed_last, room, named_in, due_set, due_gone = {}, {}, {}, {}, {}, {}
  RECENT, parts = {}, {}
  collectgarbage('collect')
end

-- One call's add, or one section's of add_shards: its KEYS are those after
-- keys[ko], and its ARGV the na after args[ao] (0, 0 and #args: all).
local function add(keys, args, now, ko, ao, na)
  now, ko, ao = now or now_ms(), ko or 0, ao or 0
  na = na or #args
  local h = header_of(args[ao + 1])
  local ng, shape, lead, policies = h.ng, h.shape, h.lead, h.policies
  local ctx = context(keys[ko + 1], keys[ko + 2], keys[ko + 3], h.dedup, now)
  local at_group = ao + 2
  local group_args = h.np > 1 and 2 or 1
  local first = at_group + group_args * ng
  A, S, G_AT, ID_AT, PAYLOAD_AT, EXT_AT = args, shape[1], shape[2], shape[3], shape[4], shape[5]
  B = first - S
  local n = (ao + na - first + 1) / S
  IX, room_n, wrote_n = keys[ko + 4], 0, 0
  if named_shard then named_in, named_shard = {}, false end
  due_set_n, due_gone_n = 0, 0
  local earliest = 0
  if not G_AT and ng == n then
    earliest = add_lead(ctx, keys, ko, args, policies, at_group, group_args, n, ng, n)
  else
    local one = not policies[2] and policies[1]
    for g = lead + 1, ng do
      local at = at_group + group_args * (g - 1)
      start_group(g, keys[ko + 4 + g], args[at], one or policies[num(args[at + 1])])
    end
    arrivals(lead + 1, n)
    earliest = add_lead(ctx, keys, ko, args, policies, at_group, group_args, lead, ng, n)
    for g = lead + 1, ng do
      local p, i, due_at = policy[g], first_arrival[g], false
      if p.usual and usual(g) then
        if next_arrival[i] then
          due_at = add_usual_many(ctx, g, hash[g], p)
        else
          due_at = add_usual(ctx, g, i, hash[g], p)
        end
      elseif p.ruled and usual(g, true) then
        if next_arrival[i] then
          due_at = add_ruled_many(ctx, g, hash[g], p)
        else
          due_at = add_ruled(ctx, g, i, hash[g], p)
        end
      end
      if not due_at then due_at = general(ctx, g, keys[ko + 5 + ng]) end
      if due_at > 0 and (earliest == 0 or due_at < earliest) then earliest = due_at end
    end
  end
  if due_set_n > 0 then chunked('ZADD', ctx.due, due_set, due_set_n) end
  if due_gone_n > 0 then chunked('ZREM', ctx.due, due_gone, due_gone_n) end
  finish(ctx)
  A = nil
  local reply = reply_of(earliest, n)
  if n > SHED or ng > SHED then shed() end
  return reply
end

-- add_shards: the add function for several shards of one Redis (never a
-- cluster, where their keys are in different slots) in one call, so that
-- a round of few adds per shard costs Redis one call, not one per shard.
-- Each section is one shard's add call, as above, run in order, all on
-- one reading of Redis's clock (TIME costs Redis about a tenth of a
-- one-item call).
--
-- KEYS: each section's KEYS, one section after another.
-- ARGV[1]: struct '<d' .. 'dd' * n: n, the count of sections, then per
--   section the counts of its KEYS and of its ARGV.
-- ARGV[2..]: each section's ARGV, one section after another.
-- Returns: per section, add's reply to it.
local function add_shards(keys, args)
  local n, now = unpack_struct('<d', args[1]), now_ms()
  local counts = { unpack_struct(doubles(2 * n), args[1], 9) }
  local replies, k, a = {}, 0, 1
  for s = 1, n do
    local reply = add(keys, args, now, k, a, counts[2 * s])
    k, a = k + counts[2 * s - 1], a + counts[2 * s]
    if type(reply) == 'table' then
      -- add's table is reused by the next section: keep a copy, up to the
      -- nil that ends it.
      local copy, j = {}, 1
      while reply[j] ~= nil do copy[j], j = reply[j], j + 1 end
      reply = copy
    end
    replies[s] = reply
  end
  return replies
end

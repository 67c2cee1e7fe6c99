-- add: adds items to the open groups of one shard. A group is flushed in
-- this same atomic step when an item completes it (max_items, max_bytes, a
-- capacity reached, close), and before an item when the item would not fit
-- its capacity or the group's cutoff has passed. This file holds the
-- call's arguments and state and the general path of a group;
-- add_ruled.lua the path of a group under rules or a capacity that the
-- call brings one item; add_call.lua the function itself, its arguments
-- and reply in full, and the usual path most plain groups take.
--
-- A group that would open past a limit on open groups (see limits.lua) is
-- not opened: its items are refused, or, when its policy's overflow flushes
-- the oldest, they wait for the caller to flush the group the reply names
-- (reason OVERFLOW, with the flush function, which declares its hash) and
-- to add them again.
--
-- The work is per group: one ZMSCORE (a call of one item: ZSCORE) checks
-- every id of the call against the flushed set, one HMGET per group reads
-- its counters and which of the call's ids it holds, and one HSET writes
-- its new items and counters.
-- Items added and flushed in one call never reach the group's hash.

-- The call's ARGV, and where item i's arguments are: its group's number
-- at A[B + S * i] (or none: G_AT false), its id at that + ID_AT, its
-- payload + PAYLOAD_AT, its ext + EXT_AT (or none: false).
local A, B, S, G_AT, ID_AT, PAYLOAD_AT, EXT_AT
-- Per shape of an item's arguments (see add_call.lua): how many there
-- are, and the offsets of its group's number, id, payload and ext.
local SHAPES = { [-2] = { 2, false, 0, 1, false }, [-3] = { 3, false, 0, 1, 2 },
  [3] = { 3, 0, 1, 2, false }, [4] = { 4, 0, 1, 2, 3 } }

local function id_of(i) return A[B + S * i + ID_AT] end

-- Item i's id, payload and ext.
local function item_args(i)
  local a = B + S * i
  return A[a + ID_AT], A[a + PAYLOAD_AT], EXT_AT and A[a + EXT_AT] or ''
end

-- A call's header (see add_call.lua) and its policies, parsed once per
-- distinct header.
local header_of = memo(function(h)
  local v = { unpack_struct(HEADER_FORMAT, h) }
  local np, at = v[HEADER.POLICIES], v[#v]
  local lengths, policies = { unpack_struct(doubles(np), h, at) }, {}
  at = at + 8 * np
  for j = 1, np do
    policies[j] = policy_of(sub(h, at, at + lengths[j] - 1))
    at = at + lengths[j]
  end
  return { dedup = v[HEADER.DEDUP], np = np, ng = v[HEADER.GROUPS], shape = SHAPES[v[HEADER.SHAPE]],
    lead = v[HEADER.LEAD], policies = policies }
end, 64)

-- The state of the call in progress, per group g and per item i: arrays
-- that stay loaded with the library, each entry written before it is read
-- in a call, so that a call allocates no table per group or item.
local key, hash, policy, opened = {}, {}, {}, {}
local seq, size, bytes, last, due = {}, {}, {}, {}, {}
local sums, sums_valid, rules, rules_read, exists, stored = {}, {}, {}, {}, {}, {}
local added, due_dirty, rules_dirty = {}, {}, {}
local first_arrival, last_arrival, first_pending, last_pending = {}, {}, {}, {}
local close, requeue_of, member, flushed_until = {}, {}, {}, {}
local next_arrival, next_pending, item_seq, held, field_of = {}, {}, {}, {}, {}
local fields, values_of_item = {}, {}
-- The call's reply in the making (see add_call.lua): `out`, its numbers,
-- the earliest due time and then per item i its outcome (out[2 * i]) and
-- size (out[2 * i + 1]); `wrote`, its first wrote_n entries pairs of an
-- item and the batches it wrote.
local out, wrote, wrote_n = {}, {}, 0
local function wrote_batches(i, batches)
  wrote[wrote_n + 1], wrote[wrote_n + 2], wrote_n = i, batches, wrote_n + 2
end
-- A group's fields and values to write, in write_group (its first ones).
local WRITES = {}
-- Per group g, a table for its rules that stays with the library (see
-- pooled): a call's groups allocate none.
local rules_pool = {}
local function pooled(g)
  local r = rules_pool[g]
  if not r then
    r = set_rules(nil, 0, 0, 0, 0, 0, 0, 0, 0)
    rules_pool[g] = r
  end
  return r
end
-- Per group g, its scope in the open-group index (false: not indexed) and
-- its last arrival there; the call's index keys; the groups it names to
-- flush to make room, their count, and how many it named per scope and
-- for the shard's limit.
local indexed, indexed_last, IX, room, room_n = {}, {}, false, {}, 0
local named_in, named_shard = {}, false
-- The due set's changes of the call, written once after the last group:
-- (due, key) pairs to add, and keys to remove, with their counts.
local due_set, due_gone, due_set_n, due_gone_n = {}, {}, 0, 0

local function start_group(g, h, k, p)
  key[g], hash[g], policy[g] = k, h, p
  first_arrival[g], last_arrival[g] = false, false
end

-- Readies group g's state for the general path (read_group, take,
-- write_group).
local function reset_group(g)
  first_pending[g], last_pending[g] = false, false
  seq[g], size[g], bytes[g], last[g], due[g] = 0, 0, 0, 0, 0
  rules[g], rules_read[g], exists[g], stored[g], opened[g] = false, false, false, 0, false
  added[g], due_dirty[g], rules_dirty[g], sums_valid[g] = false, false, false, false
  sums[g] = sums[g] or {}
end

-- Looks up the flushed set's members member[1..n]: flushed_until[i] is
-- when member i's dedup window ends, or false.
local function lookup_flushed(flushed, n)
  if n == 1 then
    flushed_until[1] = call('ZSCORE', flushed, member[1])
    return
  end
  if n <= CHUNK then
    flushed_until = call('ZMSCORE', flushed, unpack(member, 1, n))
    return
  end
  for i = 1, n, CHUNK do
    local to = math.min(i + CHUNK - 1, n)
    local scores = call('ZMSCORE', flushed, unpack(member, i, to))
    for j = 1, to - i + 1 do flushed_until[i + j - 1] = scores[j] end
  end
end

-- Items from..n: each one's group, flags and flushed-set member, and the
-- chain of each group's arrivals in order.
local function arrivals(from, n)
  for i = from, n do
    local garg, g = G_AT and A[B + S * i], 1
    if garg then g = NUMBER[garg] end
    close[i], requeue_of[i] = false, false
    if not g then
      local digits, flags = string.match(garg, '^(%d+)(.*)$')
      g = num(digits)
      if byte(flags, 1) == FLAG.CLOSE then close[i], flags = true, sub(flags, 2) end
      if byte(flags, 1) == FLAG.REQUEUE then requeue_of[i] = sub(flags, 2) end
    end
    next_arrival[i], member[i] = false, key[g] .. SEP .. A[B + S * i + ID_AT]
    if last_arrival[g] then next_arrival[last_arrival[g]] = i else first_arrival[g] = i end
    last_arrival[g] = i
  end
end

-- Group g's due time when it is not known here: only the due set holds it.
local UNKNOWN = math.huge

-- Group g's rules (false: none), read from its hash when first needed,
-- and with them its due time.
local function rules_of(g)
  if not rules_read[g] then
    local x = exists[g] and call('HGET', hash[g], FIELD.RULES)
    rules[g], rules_read[g] = x and read_rules(x, pooled(g)) or false, true
    if rules[g] and due[g] == UNKNOWN then due[g] = rules[g].due end
  end
  return rules[g]
end

-- Sums group g's items anew for its policy's capacity, writing their
-- exts anew when the group's measures (dictionary `dict`) are not the
-- capacity's (a reload renamed them).
local function resum(g, dict)
  local p = policy[g]
  local _, list = load_group(hash[g])
  sum_items(list, dict, p.dictionary, sums[g])
  sums_valid[g] = true
  if dict == p.dictionary then return end
  local writes = { FIELD.NAMES, p.dictionary }
  for j = 1, list.n do
    if list.ext[j] ~= '' then
      writes[#writes + 1], writes[#writes + 2] = list.id[j],
        item_value(list.ext[j], list.seq[j], list.payload[j])
    end
  end
  chunked('HSET', hash[g], writes)
end

-- Group g's fields (s, then m and x as its policy needs them, then l when
-- it is under a limit: `base` of them) and the call's ids in it
-- (held[i]), in one HMGET; with one arrival and no limit, the usual case,
-- without building a list of fields.
local function hmget_group(g, base, limited)
  local i = first_arrival[g]
  if not next_arrival[i] and not limited then
    local field, got = id_of(i), false
    field_of[i] = field
    if base == 1 then
      got = call('HMGET', hash[g], FIELD.STATE, field)
    elseif base == 2 then
      got = call('HMGET', hash[g], FIELD.STATE, FIELD.NAMES, field)
    else
      got = call('HMGET', hash[g], FIELD.STATE, FIELD.NAMES, FIELD.RULES, field)
    end
    held[i] = got[base + 1]
    return got
  end
  fields[1], fields[2], fields[3] = FIELD.STATE, FIELD.NAMES, FIELD.RULES
  if limited then fields[base] = FIELD.LIMITS end
  local count = base
  while i do
    count = count + 1
    local field = id_of(i)
    fields[count], field_of[i] = field, field
    i = next_arrival[i]
  end
  local got = call('HMGET', hash[g], unpack(fields, 1, math.min(count, CHUNK)))
  for from = CHUNK + 1, count, CHUNK do
    local more = call('HMGET', hash[g], unpack(fields, from, math.min(from + CHUNK - 1, count)))
    for j = 1, #more do got[from + j - 1] = more[j] end
  end
  i = first_arrival[g]
  for j = base + 1, count do
    held[i] = got[j]
    i = next_arrival[i]
  end
  return got
end

-- Reads group g: its counters, its rules when its policy has any, its
-- index entry when its policy is under a limit, and which of the call's
-- ids it holds (held[i]).
local function read_group(g)
  local p = policy[g]
  local base = p.plain and (p.k > 0 and 2 or 1) or 3
  local limited = p.tracked and base + 1
  if limited then indexed[g] = false end
  local got = hmget_group(g, limited or base, limited)
  if not got[1] then return end
  local dict = base > 1 and got[2] or ''
  exists[g], rules_read[g] = true, base == 3
  due[g] = UNKNOWN
  if base == 3 and got[3] then
    rules[g] = read_rules(got[3], pooled(g))
    due[g] = rules[g].due
  end
  seq[g], size[g], bytes[g], last[g], sums_valid[g] =
    read_state(got[1], dict == p.dictionary and p.k or 0, sums[g])
  stored[g] = size[g]
  if limited and got[limited] then indexed[g], indexed_last[g] = read_limits_field(got[limited]) end
  if p.k > 0 and not sums_valid[g] then resum(g, dict) end
end

-- Sets group g's due time: in the due set, and in its rules, if any.
local function set_due(g, t)
  due[g], due_dirty[g] = t, true
  if rules[g] then rules[g].due, rules_dirty[g] = t, true end
end

-- Recomputes group g's due time after an arrival at `now`, and records it
-- when it comes earlier (a deadline, a hold that ended) or is new: a due
-- time that only moved later (max_idle) stays, an early wake-up at which
-- the flush finds the real due time and re-arms.
local function rearm(g, now)
  local r = rules_of(g)
  if r then
    local t, reason = due_of(r, now, size[g], policy[g].min_items, now)
    if due[g] == 0 or t < due[g] then set_due(g, t) end
  end
end

-- Group g's rules, made from its plain due time if it has none.
local function ensure_rules(g, due_key)
  local r = rules_of(g)
  if not r then
    local o = tonumber(opened[g] or call('HGET', hash[g], FIELD.OPENED))
    if due[g] == UNKNOWN then due[g] = tonumber(call('ZSCORE', due_key, key[g])) end
    r = set_rules(pooled(g), due[g] - o, 0, 0, 0, 0, 0, o, due[g])
    rules[g], rules_dirty[g] = r, true
  end
  return r
end

-- Opens group g at `now`, with its policy's rules.
local function open_group(g, now, now_s)
  local p = policy[g]
  opened[g], rules_read[g] = now_s, true
  for j = 1, p.k do sums[g][j] = 0 end
  sums_valid[g] = p.k > 0
  if p.plain then
    rules[g] = false
    set_due(g, now + p.max_wait)
    return
  end
  local c = p.cutoff
  if c > 0 and c <= now then c = p.next_cutoff end
  rules[g] = set_rules(pooled(g), p.max_wait, p.max_idle, c, p.lead, p.max_age, 0, now, 0)
  rules_dirty[g], due[g] = true, 0
end

-- An item's deadline (0: none) and its values of its policy's k capacity
-- measures (a table reused for every item; false: none), from its ext.
local function item_values(ext, k)
  if ext == '' then return 0, false end
  if byte(ext, 2) ~= k + 1 then return (unpack_struct('<d', ext, 3)), false end
  if k == 2 then
    local deadline, a, b = unpack_struct('<ddd', ext, 3)
    values_of_item[1], values_of_item[2] = a, b
    return deadline, values_of_item
  end
  local all = { unpack_struct(doubles(k + 1), ext, 3) }
  for j = 1, k do values_of_item[j] = all[1 + j] end
  return all[1], k > 0 and values_of_item
end

-- Adds an item's values to group g's sums. Returns 'over', adding
-- nothing, when they would take a sum past its limit (unless `force`),
-- true when a sum reaches its limit with them, else false.
local function fill(g, v, force)
  local limits, s, k = policy[g].limits, sums[g], policy[g].k
  if not force then
    for j = 1, k do
      if s[j] + (v and v[j] or 0) > limits[j] then return 'over' end
    end
  end
  if not v then return false end
  local full = false
  for j = 1, k do
    local t = s[j] + v[j]
    s[j] = t
    if t >= limits[j] then full = true end
  end
  return full
end

-- Keeps list's items from `from` on open in group g, as they were, after a
-- SIZE flush cut the group by a max_items a reload lowered: they go back
-- to its hash (which the flush deleted), with their counters, sums and
-- earliest deadline anew.
local function keep_rest(g, list, from, o, dict, now)
  local p = policy[g]
  local rest, writes = item_list(), { FIELD.OPENED, o }
  for j = from, list.n do
    push_item(rest, list.id[j], list.payload[j], list.ext[j], list.seq[j])
    writes[#writes + 1], writes[#writes + 2] = list.id[j],
      item_value(list.ext[j], list.seq[j], list.payload[j])
    size[g], bytes[g] = size[g] + 1, bytes[g] + #list.payload[j]
  end
  if dict ~= '' then writes[#writes + 1], writes[#writes + 2] = FIELD.NAMES, dict end
  if p.tracked then
    local scope = p.groups > 0 and p.scope or ''
    writes[#writes + 1], writes[#writes + 2] = FIELD.LIMITS, limits_field(scope, last[g])
    index_open(IX, key[g], scope, tonumber(o), last[g])
    indexed[g], indexed_last[g] = scope, last[g]
  end
  chunked('HSET', hash[g], writes)
  local earliest = sum_items(rest, dict, dict, sums[g])
  sums_valid[g] = p.k > 0 and dict == p.dictionary
  stored[g], exists[g], opened[g] = rest.n, true, o
  local r = rules_of(g)
  if r then
    r.deadline, rules_dirty[g], due[g] = earliest, true, 0
    rearm(g, now)
  end
end

-- Flushes everything group g holds, its hash's items and then the call's
-- pending ones, cut into batches of at most max_items, appended to
-- `batches` (a new list if false). A SIZE flush writes full batches only
-- and keeps the rest open (more than one batch, and a rest, only when a
-- reload lowered max_items while the group was open).
local function flush_open(ctx, g, reason, batches)
  local p, o, dict, meta, flat = policy[g], opened[g], policy[g].dictionary, {}, false
  local count, j = stored[g], first_pending[g]
  while j do count, j = count + 1, next_pending[j] end
  if stored[g] > 0 then
    flat = call('HGETALL', hash[g])
    call('DEL', hash[g])
  end
  local size_cut, list, from = reason == REASON.SIZE, false, 1
  batches = batches or {}
  if whole(count, p.max_items, size_cut) then
    -- One batch: the hash's fields as they are, then the call's items.
    if not flat then
      flat = { FIELD.OPENED, o }
      if dict ~= '' then flat[3], flat[4] = FIELD.NAMES, dict end
    end
    local n, i = #flat, first_pending[g]
    while i do
      local id, payload, ext = item_args(i)
      flat[n + 1], flat[n + 2], n, i = id, item_value(ext, item_seq[i], payload), n + 2, next_pending[i]
    end
    batches[#batches + 1] = write_fields(ctx, key[g], reason, flat, meta)
  else
    if flat then
      meta, list = list_of(flat)
      o, dict = meta[FIELD.OPENED], meta[FIELD.NAMES] or ''
    else
      list = item_list()
    end
    local i, n = first_pending[g], list.n
    local ids, payloads, exts, seqs = list.id, list.payload, list.ext, list.seq
    while i do
      n = n + 1
      ids[n], payloads[n], exts[n] = item_args(i)
      seqs[n], i = item_seq[i], next_pending[i]
    end
    list.n = n
    from = cut(ctx, key[g], reason, o, list, p.max_items, size_cut, dict, batches)
  end
  if stored[g] > 0 then
    if not rules_read[g] then
      rules[g], rules_read[g] = meta[FIELD.RULES] and read_rules(meta[FIELD.RULES], pooled(g)) or false, true
    end
    stored[g], indexed[g] = 0, false
    if meta[FIELD.LIMITS] then unindex(IX, key[g], meta) end
  end
  first_pending[g], last_pending[g], size[g], bytes[g] = false, false, 0, 0
  if list and from <= list.n then keep_rest(g, list, from, o, dict, ctx.now) end
  return batches
end

-- Flushes group g (hash h, policy p) for a path that keeps no group
-- state (add_usual, add_ruled): the `count` items its hash holds (opened
-- at o when it holds none), then item i, sequence number seq, if given.
local function flush_taken(ctx, g, h, p, count, o, i, seq, reason)
  hash[g], policy[g], stored[g], opened[g], rules_read[g], rules[g] = h, p, count, o, true, false
  first_pending[g], last_pending[g] = i, i
  if i then next_pending[i], item_seq[i] = false, seq end
  return flush_open(ctx, g, reason, false)
end

-- Whether item i is a duplicate: its id is open in its group or came
-- earlier in the call (`seen`), or it is in its dedup window; a requeued
-- id skips the window once per (batch, item).
local function duplicate(ctx, i, seen, requeued)
  local id, requeue = id_of(i), requeue_of[i]
  if held[i] or (seen and seen[id]) then return true end
  if requeue then
    if call('ZSCORE', requeued, requeue .. ':' .. id) then return true end
    call('ZADD', requeued, string.match(requeue, '^%d+%-(%d+)%-'), requeue .. ':' .. id)
    return false
  end
  local until_ms = flushed_until[i]
  return until_ms and tonumber(until_ms) > ctx.now
end

-- Makes room for item i in group g: flushes the group first when its
-- cutoff has passed or the item would take it past its capacity, and
-- opens it when empty. Returns the batches written, whether the item
-- fills the capacity, and when the group cannot open, the limit it would
-- pass and the group to flush to make room.
local function make_room(ctx, g, v)
  local batches, full, p = false, false, policy[g]
  if size[g] > 0 and due[g] <= ctx.now then
    local r = rules_of(g)
    if r and r.cutoff > 0 and r.cutoff <= ctx.now then batches = flush_open(ctx, g, REASON.CUTOFF, batches) end
  end
  if size[g] > 0 and p.k > 0 then
    full = fill(g, v, false)
    if full == 'over' then batches, full = flush_open(ctx, g, REASON.CAPACITY, batches), false end
  end
  if size[g] == 0 then
    if p.tracked then
      local limit, oldest = over_limit(IX, p, named_in[p.scope] or 0, named_shard or 0)
      if limit then return batches, false, limit, oldest end
    end
    open_group(g, ctx.now, now_text(ctx))
    if p.k > 0 then full = fill(g, v, true) end
  end
  return batches, full
end

-- Writes the reply of item i, whose group could not open past `limit`:
-- refused, or, when its policy flushes the oldest, waiting for room: for
-- the group `oldest` to be flushed (named once in the call's list), or
-- for a next try when the call named every group under the limit (0).
local function turn_away(i, p, limit, oldest, batches)
  if not p.flush_oldest then
    out[2 * i], out[2 * i + 1] = OUTCOME.REFUSED, limit
    if batches then wrote_batches(i, batches) end
    return
  end
  local at = 0
  for j = 1, room_n do
    if room[j] == oldest then at = j end
  end
  if oldest and at == 0 then
    room_n, at = room_n + 1, room_n + 1
    room[at] = oldest
    named_shard = named_shard or 0
    if limit == LIMIT.POLICY then
      named_in[p.scope] = (named_in[p.scope] or 0) + 1
    else
      named_shard = named_shard + 1
    end
  end
  out[2 * i] = limit == LIMIT.POLICY and OUTCOME.WAITING_POLICY or OUTCOME.WAITING_SHARD
  out[2 * i + 1] = at
  if batches then wrote_batches(i, batches) end
end

-- Takes item i into group g, and writes its reply: a duplicate, or an
-- item appended to the group's pending chain, which may complete it.
local function take(ctx, g, i, seen, requeued)
  if duplicate(ctx, i, seen, requeued) then
    out[2 * i], out[2 * i + 1] = DUPLICATE, size[g]
    return
  end
  local p = policy[g]
  local id, payload, ext = item_args(i)
  local deadline, v = item_values(ext, p.k)
  local batches, full, limit, oldest = false, false, false, false
  if size[g] == 0 or p.k > 0 or due[g] <= ctx.now then batches, full, limit, oldest = make_room(ctx, g, v) end
  if limit then return turn_away(i, p, limit, oldest, batches) end
  if seen then seen[id] = true end
  local n = size[g] + 1
  seq[g], last[g], added[g], size[g], bytes[g] = seq[g] + 1, ctx.now, true, n, bytes[g] + #payload
  item_seq[i] = seq[g]
  if last_pending[g] then next_pending[last_pending[g]] = i else first_pending[g] = i end
  last_pending[g], next_pending[i] = i, false
  local moved = due[g] == 0 or n == p.min_items
  if deadline > 0 then
    local r = ensure_rules(g, ctx.due)
    if r.deadline == 0 or deadline < r.deadline then r.deadline, rules_dirty[g], moved = deadline, true, true end
  end
  if moved then rearm(g, ctx.now) end
  local reason = size_reason(p, n, bytes[g]) or full and REASON.CAPACITY or close[i] and REASON.CLOSED
  if reason then batches = flush_open(ctx, g, reason, batches) end
  out[2 * i], out[2 * i + 1] = ADDED, size[g]
  if batches then wrote_batches(i, batches) end
end

-- Writes group g back: its pending items and counters in one HSET (with
-- its opening fields when its hash is new), or nothing of an emptied
-- group. Collects its due-set change.
local function write_group(g)
  if size[g] == 0 then
    if exists[g] then
      due_gone[due_gone_n + 1] = key[g]
      due_gone_n = due_gone_n + 1
    end
    return
  end
  if not added[g] then return end
  if due_dirty[g] then
    due_set[due_set_n + 1], due_set[due_set_n + 2] = dec(due[g]), key[g]
    due_set_n = due_set_n + 2
  end
  local p, i = policy[g], first_pending[g]
  local scope = p.tracked and (indexed[g] or stored[g] == 0 and (p.groups > 0 and p.scope or ''))
  if scope and indexed[g] then
    index_touch(IX, key[g], scope, indexed_last[g], last[g])
  elseif scope then
    index_open(IX, key[g], scope, tonumber(opened[g]), last[g])
  end
  local s = state(seq[g], size[g], bytes[g], last[g], sums_valid[g] and p.k or 0, sums[g])
  if i and not next_pending[i] and not rules_dirty[g] and not scope
    and (stored[g] > 0 or p.plain and p.k == 0) then
    -- The usual write: the counters and one item, without a table for them.
    local _, payload, ext = item_args(i)
    local item = item_value(ext, item_seq[i], payload)
    if stored[g] > 0 then
      call('HSET', hash[g], FIELD.STATE, s, field_of[i], item)
    else
      call('HSET', hash[g], FIELD.STATE, s, FIELD.OPENED, opened[g], field_of[i], item)
    end
    return
  end
  local writes, w = WRITES, 2
  writes[1], writes[2] = FIELD.STATE, s
  if stored[g] == 0 then
    writes[3], writes[4], w = FIELD.OPENED, opened[g], 4
    if p.k > 0 then writes[5], writes[6], w = FIELD.NAMES, p.dictionary, 6 end
  end
  if scope then writes[w + 1], writes[w + 2], w = FIELD.LIMITS, limits_field(scope, last[g]), w + 2 end
  if rules[g] and (stored[g] == 0 or rules_dirty[g]) then
    writes[w + 1], writes[w + 2], w = FIELD.RULES, rules_field(rules[g]), w + 2
  end
  while i do
    local _, payload, ext = item_args(i)
    writes[w + 1], writes[w + 2], w = field_of[i], item_value(ext, item_seq[i], payload), w + 2
    i = next_pending[i]
  end
  chunked('HSET', hash[g], writes, w)
end

-- Takes the call's items of group g by the general path: reads the group,
-- takes each, writes it back. Returns the due time it set (0: none).
local function general(ctx, g, requeued)
  reset_group(g)
  read_group(g)
  local i = first_arrival[g]
  local seen = next_arrival[i] and {} or nil
  while i do
    take(ctx, g, i, seen, requeued)
    i = next_arrival[i]
  end
  write_group(g)
  return due_dirty[g] and size[g] > 0 and due[g] or 0
end

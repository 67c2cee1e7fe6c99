-- flush, remove, group and due: the other operations on open groups.

-- For a group due by time (hash gkey): the reason it flushes now, or
-- false and the time it is due again when min_items holds it (re-armed).
local function hold(ctx, gkey, key, min_items)
  local got = call('HMGET', gkey, FIELD.STATE, FIELD.RULES)
  if not (got[1] and got[2]) then return false, REASON.TIMEOUT end
  local _, size, _, last = read_state(got[1], 0)
  local r = read_rules(got[2])
  local next_due, why = due_of(r, last, size, min_items, ctx.now)
  if next_due <= ctx.now then return false, why end
  r.due = next_due
  call('HSET', gkey, FIELD.RULES, rules_field(r))
  call('ZADD', ctx.due, dec(next_due), key)
  return next_due
end

-- flush: flushes one open group now, cut into batches of at most
-- max_items, oldest first. By due time (TIMEOUT) only if it is still due,
-- so racing sweepers yield one flush, with the reason of the rule that made
-- it due; a group of fewer than min_items whose TIMEOUT or IDLE came is
-- held instead, re-armed to the next rule that always flushes.
--
-- An OVERFLOW flush (an add's overflow made room) that finds no group open
-- takes the key out of the open-group index, so a stale entry cannot keep
-- naming it.
--
-- KEYS[1..3]: the shard's due set, stream and flushed set; KEYS[4]: the group's hash
-- KEYS[5]: the shard's open-group index (limits.lua)
-- ARGV[1]: the group's key   ARGV[2]: TIMEOUT (by due time), MANUAL or OVERFLOW
-- ARGV[3]: the dedup window (ms)   ARGV[4]: max_items   ARGV[5]: min_items (0 = none)
-- Returns: {due, batches}: the due time it had and the batches written;
--   {0, {}} when no group is open (or, by due time, none is due), {new
--   due, {}} when it is held
local function flush(keys, args)
  local ctx = context(keys[1], keys[2], keys[3], tonumber(args[3]), now_ms())
  local gkey, key, reason = keys[4], args[1], args[2]
  local ix = keys[5]
  local due = call('ZSCORE', ctx.due, key)
  if not due then
    if reason == REASON.OVERFLOW then unindex_gone(ix, key) end
    return { 0, {} }
  end
  due = tonumber(due)
  if reason == REASON.TIMEOUT then
    if due > ctx.now then return { 0, {} } end
    local again, why = hold(ctx, gkey, key, tonumber(args[5]))
    if again then return { again, {} } end
    reason = why
  end
  local flat, max, meta, batches = call('HGETALL', gkey), tonumber(args[4]), {}, {}
  if whole(items_in(flat), max, false) then
    batches[1] = write_fields(ctx, key, reason, flat, meta)
  else
    local list
    meta, list = list_of(flat)
    cut(ctx, key, reason, meta[FIELD.OPENED], list, max, false, meta[FIELD.NAMES] or '', batches)
  end
  call('DEL', gkey)
  call('ZREM', ctx.due, key)
  unindex(ix, key, meta)
  finish(ctx)
  return { due, batches }
end

-- The earliest deadline among a group's items (0: none).
local function earliest_deadline(gkey)
  local _, list = load_group(gkey)
  local earliest = 0
  for j = 1, list.n do
    local ext = list.ext[j]
    if ext ~= '' then
      local deadline = unpack_struct('<d', ext, 3)
      if deadline > 0 and (earliest == 0 or deadline < earliest) then earliest = deadline end
    end
  end
  return earliest
end

-- remove: takes one item out of its open group, and deletes the group if it
-- empties. Its measures leave the group's sums; when it held the group's
-- earliest deadline, the group's due time is computed again without it.
--
-- KEYS[1]: the shard's due set   KEYS[2]: the group's hash
-- KEYS[3]: the shard's open-group index (limits.lua)
-- ARGV[1]: the group's key   ARGV[2]: the item id   ARGV[3]: min_items (0 = none)
-- Returns: {removed (1 or 0), the group's size after}
local function remove(keys, args)
  local due_key, gkey, key = keys[1], keys[2], args[1]
  local got = call('HMGET', gkey, args[2], FIELD.STATE, FIELD.NAMES, FIELD.RULES, FIELD.LIMITS,
    FIELD.OPENED)
  if not got[2] then return { 0, 0 } end
  local names, sums = names_of(got[3] or ''), {}
  local seq, size, bytes, last, summed = read_state(got[2], #names, sums)
  if not got[1] then return { 0, size } end
  local _, ext, payload = split_item(got[1])
  call('HDEL', gkey, args[2])
  size, bytes = size - 1, bytes - #payload
  if size <= 0 then
    call('DEL', gkey)
    call('ZREM', due_key, key)
    unindex(keys[3], key, { [FIELD.LIMITS] = got[5], [FIELD.OPENED] = got[6] })
    return { 1, 0 }
  end
  local deadline, measures = 0, {}
  if ext ~= '' then deadline, measures = decode_ext(ext, names) end
  for j = 1, summed and #names or 0 do sums[j] = sums[j] - (measures[names[j]] or 0) end
  local r = got[4] and read_rules(got[4])
  if r and deadline > 0 and r.deadline == deadline then
    r.deadline = earliest_deadline(gkey)
    r.due = due_of(r, last, size, tonumber(args[3]), now_ms())
    call('HSET', gkey, FIELD.RULES, rules_field(r))
    call('ZADD', due_key, dec(r.due), key)
  end
  call('HSET', gkey, FIELD.STATE, state(seq, size, bytes, last, summed and #names or 0, sums))
  return { 1, size }
end

-- group: reads one open group, as its rules make it due now (the due set
-- may hold an earlier wake-up when only max_idle moved the due time later).
--
-- KEYS[1]: the shard's due set   KEYS[2]: the group's hash
-- ARGV[1]: the group's key   ARGV[2]: min_items (0 = none)
-- ARGV[3]: '1' to return its items too
-- Returns: {} when it is not open, else {opened, due, reason, size, bytes,
--   last arrival, max_wait (all ms), names (the measures the sums and the
--   items' packed values follow, joined by ';'), {sums}, {id, payload,
--   ext, ...} in arrival order ({} unless asked)}
local function group(keys, args)
  local got = call('HMGET', keys[2], FIELD.STATE, FIELD.OPENED, FIELD.RULES, FIELD.NAMES)
  if not got[1] then return {} end
  local names, sums = names_of(got[4] or ''), {}
  local _, size, bytes, last, summed = read_state(got[1], #names, sums)
  local opened, reason = tonumber(got[2]), REASON.TIMEOUT
  local due = tonumber(call('ZSCORE', keys[1], args[1]) or opened)
  local max_wait = due - opened
  if got[3] then
    local r = read_rules(got[3])
    due, reason = due_of(r, last, size, tonumber(args[2]), now_ms())
    max_wait = r.max_wait
  end
  local sum_list = {}
  for j = 1, summed and #names or 0 do sum_list[j] = sums[j] end
  local items = {}
  if args[3] == '1' then
    local _, list = load_group(keys[2])
    for j = 1, list.n do
      items[#items + 1], items[#items + 2], items[#items + 3] = list.id[j], list.payload[j], list.ext[j]
    end
  end
  return { opened, due, reason, size, bytes, last, max_wait, got[4] or '', sum_list, items }
end

-- due: reads which groups of a shard are due by the Redis clock, and which
-- come due next. Writes nothing.
--
-- KEYS[1]: the shard's due set   ARGV[1]: the most keys to return of each kind
-- Returns: {now, the earliest due time of a group not yet due or -1, the
--   number of due keys, the due keys in due order, then the keys due at
--   that earliest time}
local function due_scan(keys, args)
  local now, limit = now_ms(), tonumber(args[1])
  local found = call('ZRANGE', keys[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local out = { now, -1, #found }
  for i = 1, #found do out[#out + 1] = found[i] end
  local upcoming = call('ZRANGE', keys[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if #upcoming > 0 then
    out[2] = tonumber(upcoming[2])
    local next_keys = call('ZRANGE', keys[1], upcoming[2], upcoming[2], 'BYSCORE', 'LIMIT', 0, limit)
    for i = 1, #next_keys do out[#out + 1] = next_keys[i] end
  end
  return out
end

-- retime: brings one open group under a shorter max_wait, after a policy
-- change: it is due no later than opened + the new max_wait, so nothing
-- waits past the new window. A longer max_wait changes nothing (it applies
-- to groups opened after the change).
--
-- KEYS[1]: the shard's due set   KEYS[2]: the group's hash
-- ARGV[1]: the group's key   ARGV[2]: the new max_wait (ms)
-- Returns: the group's due time now, or 0 when it is not open
local function retime(keys, args)
  local key, wait = args[1], tonumber(args[2])
  local got = call('HMGET', keys[2], FIELD.OPENED, FIELD.RULES)
  local due = call('ZSCORE', keys[1], key)
  if not (got[1] and due) then return 0 end
  local latest = tonumber(got[1]) + wait
  due = tonumber(due)
  if got[2] then
    local r = read_rules(got[2])
    if r.max_wait > wait then
      r.max_wait = wait
      if r.due > latest then r.due = latest end
      call('HSET', keys[2], FIELD.RULES, rules_field(r))
    end
  end
  if due <= latest then return due end
  call('ZADD', keys[1], dec(latest), key)
  return latest
end

return { add = add, add_shards = add_shards, flush = flush, remove = remove, group = group, due = due_scan,
  retime = retime, open_stats = open_stats }

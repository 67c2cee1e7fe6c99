-- The ruled path: a group whose policy has due rules or a capacity (not
-- usual, see policy_of) and no limit on open groups, which the call brings
-- items without flags. For one item it does what read_group, take and
-- write_group do, on locals: one HMGET of the group's counters, measures,
-- rules and the item's id, then one HSET, or a flush. Several items it
-- takes so only while they fit the open group without completing it. A group it cannot
-- take so (the item alone completes a new group, a due time has passed, a
-- reload changed the group's measures or rules, a deadline under a policy
-- with no rules) goes to the general path before anything is written.

-- The rules and sums of the group in hand: one table each for every call.
local RULED_RULES, RULED_SUMS = set_rules(nil, 0, 0, 0, 0, 0, 0, 0, 0), {}

-- Records group g's new due time t for the due set (as text: a number
-- argument to redis.call costs Redis a sprintf of a double), and returns
-- it.
local function ruled_due(g, t)
  due_set[due_set_n + 1], due_set[due_set_n + 2] = dec(t), key[g]
  due_set_n = due_set_n + 2
  return t
end

-- The rules (x, and the due time they give) of a group that policy p
-- opens now with an item whose deadline is `deadline` (0: none). Those of
-- an item with none are the same for every group p opens in a call, and
-- made once: p keeps them with the clock they were made at.
local function opening_rules(p, deadline, now)
  if deadline == 0 and p.opened_at == now then return p.opening_x, p.opening_due end
  local c = p.cutoff
  if c > 0 and c <= now then c = p.next_cutoff end
  local r = set_rules(RULED_RULES, p.max_wait, p.max_idle, c, p.lead, p.max_age, deadline, now, 0)
  r.due = due_of(r, now, 1, p.min_items, now)
  local x = rules_field(r)
  if deadline == 0 then p.opened_at, p.opening_x, p.opening_due = now, x, r.due end
  return x, r.due
end

-- Opens group g (hash h, policy p) with item i. When the group holds
-- `size` items (the last sequence number seq) that i does not fit beside,
-- flushes them first (CAPACITY). Returns the due time it set, or false,
-- having written nothing, when the item alone would complete the group.
local function ruled_open(ctx, g, i, h, p, size, seq)
  local a, k, now, sums = B + S * i, p.k, ctx.now, RULED_SUMS
  local ext, payload = EXT_AT and A[a + EXT_AT] or '', A[a + PAYLOAD_AT]
  local deadline, v = item_values(ext, k)
  if p.plain and deadline > 0 or size_reason(p, 1, #payload) then
    return false
  end
  for j = 1, k do
    local t = v and v[j] or 0
    if t >= p.limits[j] then return false end
    sums[j] = t
  end
  local batches = size > 0 and flush_taken(ctx, g, h, p, size, false, false, 0, REASON.CAPACITY)
  out[2 * i], out[2 * i + 1] = ADDED, 1
  if batches then wrote_batches(i, batches) end
  local w, n = WRITES, 6
  w[1], w[2] = STATE, state(seq + 1, 1, #payload, now, k, sums)
  w[3], w[4] = OPENED, now_text(ctx)
  w[5], w[6] = A[a + ID_AT], item_value(ext, seq + 1, payload)
  if k > 0 then w[7], w[8], n = FIELD.NAMES, p.dictionary, 8 end
  local due_at = now + p.max_wait
  if not p.plain then
    w[n + 1], w[n + 2], due_at = FIELD.RULES, opening_rules(p, deadline, now)
    n = n + 2
  end
  call('HSET', h, unpack(w, 1, n))
  return ruled_due(g, due_at)
end

-- Group g's rules x (policy p) recomputed when arrivals may bring its due
-- time earlier (the earliest of their deadlines, 0: none, or min_items
-- reached at n items): their new field, and the due time recorded for the
-- due set when it came earlier (0: none).
local function rearmed(ctx, g, p, x, n, deadline)
  local r, due_at = read_rules(x, RULED_RULES), 0
  if deadline > 0 and (r.deadline == 0 or deadline < r.deadline) then r.deadline = deadline end
  local t = due_of(r, ctx.now, n, p.min_items, ctx.now)
  if t < r.due then r.due, due_at = t, ruled_due(g, t) end
  return rules_field(r), due_at
end

-- Takes item i, the only one of group g (hash h, policy p) in the call.
-- Returns the due time it set (0: none), or false, having written
-- nothing, when the group needs the general path.
local function add_ruled(ctx, g, i, h, p)
  local a, k, now, sums = B + S * i, p.k, ctx.now, RULED_SUMS
  local id = A[a + ID_AT]
  local got = call('HMGET', h, STATE, FIELD.NAMES, FIELD.RULES, id)
  local s, x = got[1], got[3]
  local seq, size, bytes, valid, _ = 0, 0, 0, true, nil
  if s then
    if (got[2] or '') ~= p.dictionary or (x and true or false) == p.plain then return false end
    seq, size, bytes, _, valid = read_state(s, k, sums)
    if k > 0 and not valid or size >= p.max_items then return false end
  end
  local until_ms = flushed_until[i]
  if got[4] or until_ms and tonumber(until_ms) > now then
    out[2 * i], out[2 * i + 1] = DUPLICATE, size
    return 0
  end
  if not s then return ruled_open(ctx, g, i, h, p, 0, 0) end
  local ext = EXT_AT and A[a + EXT_AT] or ''
  local deadline, v = item_values(ext, k)
  local earliest, due = 0, 0
  if x then
    earliest, due = unpack_struct('<dxxxxxxxxd', x, 41)
    if due <= now then return false end
  elseif deadline > 0 then
    return false
  end
  local full, limits = false, p.limits
  for j = 1, k do
    local t = sums[j] + (v and v[j] or 0)
    if t > limits[j] then return ruled_open(ctx, g, i, h, p, size, seq) end
    if v and t >= limits[j] then full = true end
    sums[j] = t
  end
  local payload = A[a + PAYLOAD_AT]
  local n, b = size + 1, bytes + #payload
  seq = seq + 1
  local reason = size_reason(p, n, b) or full and REASON.CAPACITY
  if reason then
    local flushed = flush_taken(ctx, g, h, p, size, false, i, seq, reason)
    out[2 * i], out[2 * i + 1] = ADDED, 0
    if flushed then wrote_batches(i, flushed) end
    due_gone[due_gone_n + 1] = key[g]
    due_gone_n = due_gone_n + 1
    return 0
  end
  out[2 * i], out[2 * i + 1] = ADDED, n
  local state_s, item = state(seq, n, b, now, k, sums), item_value(ext, seq, payload)
  if x and (n == p.min_items or deadline > 0 and (earliest == 0 or deadline < earliest)) then
    local rules_x, due_at = rearmed(ctx, g, p, x, n, deadline)
    call('HSET', h, STATE, state_s, FIELD.RULES, rules_x, id, item)
    return due_at
  end
  call('HSET', h, STATE, state_s, id, item)
  return 0
end

-- Takes the items of ruled group g (hash h, policy p), several and none
-- with a flag, when they fit the open group without completing it: one
-- HMGET of its counters, measures, rules and their ids, one HSET, as
-- add_ruled for one. Returns the due time it set (0: none), or false,
-- having written nothing, when the group needs the general path (not
-- open, due, changed by a reload, or completed or overflowed by them).
local function add_ruled_many(ctx, g, h, p)
  local i, c = first_arrival[g], 3
  fields[1], fields[2], fields[3] = STATE, FIELD.NAMES, FIELD.RULES
  while i do
    c, fields[c + 1] = c + 1, id_of(i)
    i = next_arrival[i]
  end
  local got = call('HMGET', h, unpack(fields, 1, c))
  local s, x, k, now, sums = got[1], got[3], p.k, ctx.now, RULED_SUMS
  if not s or (got[2] or '') ~= p.dictionary or (x and true or false) == p.plain then return false end
  local seq, size, bytes, _, valid = read_state(s, k, sums)
  if k > 0 and not valid or size >= p.max_items then return false end
  local earliest, due = 0, 0
  if x then
    earliest, due = unpack_struct('<dxxxxxxxxd', x, 41)
    if due <= now then return false end
  end
  local seen, writes, w, n, b, soonest, limits = {}, WRITES, 2, size, bytes, 0, p.limits
  i = first_arrival[g]
  for j = 4, c do
    local id, until_ms = fields[j], flushed_until[i]
    if got[j] or seen[id] or until_ms and tonumber(until_ms) > now then
      out[2 * i], out[2 * i + 1] = DUPLICATE, n
    else
      local _, payload, ext = item_args(i)
      local deadline, v = item_values(ext, k)
      if deadline > 0 and not x then return false end
      for q = 1, k do
        local t = sums[q] + (v and v[q] or 0)
        if t >= limits[q] then return false end
        sums[q] = t
      end
      n, b, seq, seen[id] = n + 1, b + #payload, seq + 1, true
      if size_reason(p, n, b) then return false end
      if deadline > 0 and (soonest == 0 or deadline < soonest) then soonest = deadline end
      out[2 * i], out[2 * i + 1] = ADDED, n
      writes[w + 1], writes[w + 2], w = id, item_value(ext, seq, payload), w + 2
    end
    i = next_arrival[i]
  end
  if n == size then return 0 end
  writes[1], writes[2] = STATE, state(seq, n, b, now, k, sums)
  local due_at = 0
  if x and (size < p.min_items and n >= p.min_items or soonest > 0 and (earliest == 0 or soonest < earliest)) then
    local rules_x
    rules_x, due_at = rearmed(ctx, g, p, x, n, soonest)
    writes[w + 1], writes[w + 2], w = FIELD.RULES, rules_x, w + 2
  end
  call('HSET', h, unpack(writes, 1, w))
  return due_at
end

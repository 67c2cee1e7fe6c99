-- Limits on open groups: the index of the groups opened under one, and the
-- check an add makes before it opens a group.
--
-- A group opened while its policy (max_groups) or the service (max open
-- groups) set a limit is indexed: its hash has the field LIMITS (its policy's
-- scope, '' when only the service's limit applies, NUL, and its last
-- arrival as the index has it), and its shard's index (one sorted set, KEY
-- ix, every member scored 0 and read by lex range) has it as
--   'l' last arrival key        the shard's groups, least recently added-to first
--   'o' opened key              the same, oldest first
--   's' scope NUL last arrival key   a scope's groups, least recently added-to first
-- (times in ms, 15 digits). A group's last arrival in the index is the one
-- in its LIMITS: an add under a limit moves both (an add whose key's policy no
-- longer has a limit moves neither), and whatever deletes an indexed
-- group's hash takes it out of the index. A limit counts the indexed
-- groups of the shard, so groups opened before it was set are not counted.

local function ms15(t)
  return format('%015d', t)
end

-- The lex ranges of the shard's groups by last arrival, by opening, and of
-- one scope's groups.
local BY_LAST, BY_LAST_END, BY_OPENING, BY_OPENING_END = '[l', '(m', '[o', '(p'
local function scope_range(scope)
  return '[s' .. scope .. '\0', '(s' .. scope .. '\1'
end

-- A group's LIMITS field, and back.
local function limits_field(scope, last)
  return scope .. '\0' .. format('%d', last)
end

local function read_limits_field(l)
  local scope, last = string.match(l, '^(.-)%z(%d+)$')
  return scope, tonumber(last)
end

-- Indexes group `key` of `scope`, opened at `opened`, last added to at `last`.
local function index_open(ix, key, scope, opened, last)
  if scope == '' then
    call('ZADD', ix, '0', 'l' .. ms15(last) .. key, '0', 'o' .. ms15(opened) .. key)
  else
    call('ZADD', ix, '0', 'l' .. ms15(last) .. key, '0', 'o' .. ms15(opened) .. key,
      '0', 's' .. scope .. '\0' .. ms15(last) .. key)
  end
end

-- Moves indexed group `key`'s last arrival from `was` to `last`.
local function index_touch(ix, key, scope, was, last)
  if was == last then return end
  if scope == '' then
    call('ZREM', ix, 'l' .. ms15(was) .. key)
    call('ZADD', ix, '0', 'l' .. ms15(last) .. key)
  else
    call('ZREM', ix, 'l' .. ms15(was) .. key, 's' .. scope .. '\0' .. ms15(was) .. key)
    call('ZADD', ix, '0', 'l' .. ms15(last) .. key, '0', 's' .. scope .. '\0' .. ms15(last) .. key)
  end
end

-- Takes group `key` out of the index as its hash (`meta`, its fields by
-- name, o and l among them) is deleted, if it is indexed.
local function unindex(ix, key, meta)
  local l = meta[FIELD.LIMITS]
  if not l then return end
  local scope, last = read_limits_field(l)
  local o = 'o' .. ms15(tonumber(meta[FIELD.OPENED])) .. key
  if scope == '' then
    call('ZREM', ix, 'l' .. ms15(last) .. key, o)
  else
    call('ZREM', ix, 'l' .. ms15(last) .. key, o, 's' .. scope .. '\0' .. ms15(last) .. key)
  end
end

-- Takes group `key` out of the index when its hash is gone already (an
-- OVERFLOW flush found no group open): a repair, so it may read the whole
-- index.
local function unindex_gone(ix, key)
  local all, gone = call('ZRANGE', ix, '-', '+', 'BYLEX'), {}
  for _, m in ipairs(all) do
    local from = byte(m, 1) == 115 and find(m, '\0', 2, true) + 16 or 17 -- 's'
    if sub(m, from) == key then gone[#gone + 1] = m end
  end
  if #gone > 0 then chunked('ZREM', ix, gone) end
end

-- Whether a group of policy p may open now: false when it may, else the
-- limit it would pass and a group under that limit to flush to make room:
-- the least recently added-to but the first `skip_policy` (of p's scope)
-- or `skip_shard` (of the shard), which the call already named; false when
-- it named them all.
local function over_limit(ix, p, skip_policy, skip_shard)
  if p.groups > 0 then
    local lo, hi = scope_range(p.scope)
    if call('ZLEXCOUNT', ix, lo, hi) >= p.groups then
      local m = call('ZRANGE', ix, lo, hi, 'BYLEX', 'LIMIT', skip_policy, 1)[1]
      return LIMIT.POLICY, m and sub(m, #p.scope + 18) or false
    end
  end
  if p.global > 0 and call('ZLEXCOUNT', ix, BY_LAST, BY_LAST_END) >= p.global then
    local m = call('ZRANGE', ix, BY_LAST, BY_LAST_END, 'BYLEX', 'LIMIT', skip_shard, 1)[1]
    return LIMIT.SHARD, m and sub(m, 17) or false
  end
  return false
end

-- open_stats: the open-group index of one shard, for the gauges and the
-- web view. Writes nothing.
--
-- KEYS[1]: the shard's open-group index   ARGV: scopes to count
-- Returns: {indexed groups, the oldest one's opening time (ms) or -1,
--   then per scope its indexed groups}
local function open_stats(keys, args)
  local ix = keys[1]
  local oldest = call('ZRANGE', ix, BY_OPENING, BY_OPENING_END, 'BYLEX', 'LIMIT', 0, 1)[1]
  local out = { call('ZLEXCOUNT', ix, BY_LAST, BY_LAST_END), oldest and tonumber(sub(oldest, 2, 16)) or -1 }
  for i = 1, #args do
    out[2 + i] = call('ZLEXCOUNT', ix, scope_range(args[i]))
  end
  return out
end

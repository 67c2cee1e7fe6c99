-- The FROZEN FLOOR of `batcher-bench instructions`. DO NOT CHANGE THIS FILE.
--
-- It is the yardstick that batcher's own add path is measured against: the
-- least an add script must do to group items by key, count-flush them and
-- keep them idempotent, run on the same Redis with the same items. It must
-- not follow batcher's scripts when they change (not their layout, not
-- their argument format, not their optimisations), or the ratios to it stop
-- meaning anything. Editing it moves the floor figures in
-- bench/instructions.toml; if it ever has to change, do it in a commit of
-- its own that says why, and regenerate the baseline there.
--
-- Per item: HSETNX of its id into its group's hash (value: the payload) and
-- HLEN; a duplicate (HSETNX returns 0) is reported as 0. The item that opens
-- a group (HLEN 1) ZADDs the group's due time (now + max_wait) to the
-- shard's due set. The item that brings a group to max_items flushes it:
-- HGETALL, XADD of the items (id, payload pairs) to the shard's stream, DEL
-- of the group, ZREM of it from the due set.
--
-- KEYS: the shard's due zset, the shard's stream, then one hash per group.
-- ARGV: max_items, max_wait (ms), then per item: its group's index (1 for
--       KEYS[3], 2 for KEYS[4], ...), its id, its payload.
-- Reply: per item, 0 for a duplicate, the group's size after the add while
--        it stays open, or the stream entry id of the batch it completed.
local due, stream = KEYS[1], KEYS[2]
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local reply = {}
for i = 3, #ARGV, 3 do
  local group = KEYS[2 + tonumber(ARGV[i])]
  if redis.call('HSETNX', group, ARGV[i + 1], ARGV[i + 2]) == 0 then
    reply[#reply + 1] = 0
  else
    local size = redis.call('HLEN', group)
    if size == 1 then
      redis.call('ZADD', due, now + max_wait, group)
    end
    if size >= max_items then
      local items = redis.call('HGETALL', group)
      reply[#reply + 1] = redis.call('XADD', stream, '*', unpack(items))
      redis.call('DEL', group)
      redis.call('ZREM', due, group)
    else
      reply[#reply + 1] = size
    end
  end
end
return reply

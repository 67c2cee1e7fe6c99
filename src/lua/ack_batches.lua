-- Acknowledges batches for a consumer group, including re-driven copies.
--
-- KEYS[1]: the shard's batch stream
-- KEYS[2]: the group's re-driven index in this shard (hash: batch entry id -> copy's entry id)
-- ARGV[1]: consumer group
-- ARGV[2..]: the batches' entry ids (the id part of Batch.id)
-- Returns: how many of them were pending for the group

local stream, redriven, group = KEYS[1], KEYS[2], ARGV[1]
local acked = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local n = redis.call('XACK', stream, group, id)
  local copy = redis.call('HGET', redriven, id)
  if copy then
    local m = redis.call('XACK', stream, group, copy)
    if m > 0 then redis.call('HDEL', redriven, id) end
    n = n + m
  end
  if n > 0 then acked = acked + 1 end
end
return acked

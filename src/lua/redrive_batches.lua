-- Takes batches out of a consumer group's dead letters and queues a copy of
-- each for that group alone; the copy keeps the batch's id.
--
-- KEYS[1]: the shard's batch stream
-- KEYS[2]: the group's dead letters in this shard (sorted set of entry ids)
-- KEYS[3]: the group's re-driven index in this shard (hash: batch entry id -> copy's entry id)
-- ARGV[1]: consumer group
-- ARGV[2..]: the batches' entry ids (the id part of Batch.id)
-- Returns: how many were dead letters and are queued again

local stream, dead, redriven, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local count = 0
for i = 2, #ARGV do
  local origin = ARGV[i]
  local entry_id = redis.call('HGET', redriven, origin) or origin
  if redis.call('ZREM', dead, entry_id) == 1 then
    local entry = redis.call('XRANGE', stream, entry_id, entry_id)
    if #entry > 0 then
      -- The copy's own fields FOR_GROUP and ORIGIN (BATCH, made by the
      -- service ahead of this file; see src/scripts/layout.rs).
      local args = { 'XADD', stream, '*' }
      local fields = entry[1][2]
      for f = 1, #fields, 2 do
        if fields[f] ~= BATCH.FOR_GROUP and fields[f] ~= BATCH.ORIGIN then
          args[#args + 1] = fields[f]
          args[#args + 1] = fields[f + 1]
        end
      end
      args[#args + 1] = BATCH.FOR_GROUP
      args[#args + 1] = group
      args[#args + 1] = BATCH.ORIGIN
      args[#args + 1] = origin
      local copy = redis.call(unpack(args))
      redis.call('HSET', redriven, origin, copy)
      count = count + 1
    end
  end
end
return count

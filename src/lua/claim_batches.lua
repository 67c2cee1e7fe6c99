-- Hands batches that a consumer group has held unacked for too long to a
-- consumer, or dead-letters them once they have been delivered too often.
--
-- KEYS[1]: the shard's batch stream
-- KEYS[2]: the group's dead letters in this shard (sorted set of entry ids, scored by entry ms)
-- ARGV[1]: consumer group
-- ARGV[2]: consumer that takes the batches
-- ARGV[3]: minimum idle time (ms): how long a batch must have gone unacked
-- ARGV[4]: most pending entries to look at
-- ARGV[5]: max deliveries: a batch delivered this often is dead-lettered instead
-- ARGV[6]: only entries held by this consumer, or "" for any consumer
-- Returns: {{entry id, fields, delivery count}, ...} now delivered to the consumer

local stream, dead = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local min_idle, count, max_deliveries = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local owner = ARGV[6]

local pending
if owner == '' then
  pending = redis.call('XPENDING', stream, group, 'IDLE', min_idle, '-', '+', count)
else
  pending = redis.call('XPENDING', stream, group, 'IDLE', min_idle, '-', '+', count, owner)
end

local out = {}
for _, entry in ipairs(pending) do
  local id, deliveries = entry[1], entry[4]
  if deliveries >= max_deliveries then
    redis.call('ZADD', dead, tonumber(string.match(id, '^(%d+)')), id)
    redis.call('XACK', stream, group, id)
  else
    local claimed = redis.call('XCLAIM', stream, group, consumer, min_idle, id)
    -- An entry trimmed from the stream comes back empty; nothing to deliver.
    if type(claimed[1]) == 'table' then
      out[#out + 1] = { claimed[1][1], claimed[1][2], deliveries + 1 }
    end
  end
end
return out

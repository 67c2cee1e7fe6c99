-- Releases the batches a consumer holds unacked (a draining instance's
-- consumer), so that the group's other consumers take them over at once:
-- each stays the consumer's, with its delivery count, but its last delivery
-- is set to the epoch (TIME 0), so it looks idle far longer than any
-- ack_timeout to the next claim. JUSTID leaves the delivery count alone.
--
-- KEYS[1]: the shard's batch stream
-- ARGV[1]: consumer group
-- ARGV[2]: consumer
-- ARGV[3]: most pending entries to release
-- Returns: how many entries were released

local stream = KEYS[1]
local group, consumer, count = ARGV[1], ARGV[2], tonumber(ARGV[3])

local pending = redis.call('XPENDING', stream, group, '-', '+', count, consumer)
local released = 0
for _, entry in ipairs(pending) do
  redis.call('XCLAIM', stream, group, consumer, 0, entry[1], 'TIME', 0, 'JUSTID')
  released = released + 1
end
return released

-- Takes, renews or gives up a lease: one holder at a time, for a while.
--
-- KEYS[1]: the lease (a string: its holder)
-- ARGV[1]: the holder asking
-- ARGV[2]: how long the lease lasts (ms); 0 gives it up
-- Returns: 1 when ARGV[1] holds the lease now (or gave it up), 0 when another does

local lease, holder, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local current = redis.call('GET', lease)
if current and current ~= holder then
  return 0
end
if ttl == 0 then
  if current then redis.call('DEL', lease) end
  return 1
end
redis.call('SET', lease, holder, 'PX', ttl)
return 1

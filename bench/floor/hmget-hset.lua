-- Floor: per item, one HMGET of its group's counters and of its id (what
-- the add script must read to decide) and one HSET of the counters and the
-- item, and nothing else: no flushed-set check, no due time, no flush.
local first = 3 + 7 * tonumber(ARGV[2])
local n = (#ARGV - first + 1) / 4
local out = { 0 }
for i = 1, n do
  local a = first + 4 * (i - 1)
  local g = tonumber(string.match(ARGV[a], '^%d+'))
  local group, field = KEYS[4 + g], ':' .. ARGV[a + 1]
  redis.call('HMGET', group, 'n', 'b', 's', 'x', 'd', field)
  redis.call('HSET', group, 'n', '1', 'b', '1', 's', '1', 'l', '1', field, ARGV[a + 2])
  out[#out + 1], out[#out + 2], out[#out + 3] = 1, 1, false
end
return out

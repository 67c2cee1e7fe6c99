-- Floor: one HSET per item into its group's hash (counters and the item),
-- and nothing else: no duplicate check, no due time, no flush.
local first = 3 + 7 * tonumber(ARGV[2])
local n = (#ARGV - first + 1) / 4
local out = { 0 }
for i = 1, n do
  local a = first + 4 * (i - 1)
  local g = tonumber(string.match(ARGV[a], '^%d+'))
  redis.call('HSET', KEYS[4 + g], 'n', '1', 'b', '1', 's', '1', 'l', '1', ':' .. ARGV[a + 1], ARGV[a + 2])
  out[#out + 1], out[#out + 2], out[#out + 3] = 1, 1, false
end
return out

-- Floor: the add script's call and arguments, and no Redis command. It
-- answers every item as added to a group of one, without writing anything.
local first = 3 + 7 * tonumber(ARGV[2])
local n = (#ARGV - first + 1) / 4
local out = { 0 }
for i = 1, n do
  local g = tonumber(string.match(ARGV[first + 4 * (i - 1)], '^%d+'))
  local _ = KEYS[4 + g]
  out[#out + 1], out[#out + 2], out[#out + 3] = 1, 1, false
end
return out

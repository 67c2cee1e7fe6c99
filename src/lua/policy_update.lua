-- Changes the policy store in one step: checks that the store is still at
-- the revision the change was computed on, writes or deletes each policy
-- document, counts the new revision and appends it to the history.
--
-- KEYS: the documents hash, the revision counter, the history stream.
-- ARGV: the expected revision, who, the reason, how many revisions the
-- history keeps, then for each policy: its name, its body as JSON ('' to
-- delete it) and its changes as JSON (for the history). A bulk change goes
-- through policy_swap.lua instead.
-- Returns {1, revision, time} or, when the store moved on, {0, revision}.
local docs, counter, history = KEYS[1], KEYS[2], KEYS[3]
local rev = tonumber(redis.call('GET', counter) or '0')
if rev ~= tonumber(ARGV[1]) then return {0, rev} end
rev = rev + 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local who = ARGV[2]
local entry = {'revision', rev, 'time', now, 'who', who, 'reason', ARGV[3]}
for i = 5, #ARGV, 3 do
  local name, body, changes = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local doc = ''
  if body == '' then
    redis.call('HDEL', docs, name)
  else
    doc = '{"revision":' .. rev .. ',"updated_at":' .. now .. ',"updated_by":'
      .. cjson.encode(who) .. ',"policy":' .. body .. '}'
    redis.call('HSET', docs, name, doc)
  end
  table.insert(entry, 'name')
  table.insert(entry, name)
  table.insert(entry, 'doc')
  table.insert(entry, doc)
  table.insert(entry, 'changes')
  table.insert(entry, changes)
end
redis.call('SET', counter, rev)
redis.call('XADD', history, 'MAXLEN', '~', ARGV[4], rev .. '-1', unpack(entry))
return {1, rev, now}

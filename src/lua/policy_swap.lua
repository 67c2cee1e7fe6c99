-- Puts a bulk change of the policy store in force in one step: the staged
-- documents (written in chunks beforehand, every policy as it is after the
-- change) replace the store's, if the store is still at the revision the
-- change was computed on; the history records the revision and its count.
--
-- KEYS: the documents hash, the revision counter, the history stream, the
-- staged documents.
-- ARGV: the expected revision, who, the reason, how many revisions the
-- history keeps, how many policies the change wrote, its time (ms).
-- Returns {1, revision, time} or, when the store moved on (the staged
-- documents are dropped), {0, revision}.
local docs, counter, history, staged = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rev = tonumber(redis.call('GET', counter) or '0')
if rev ~= tonumber(ARGV[1]) then
  redis.call('DEL', staged)
  return {0, rev}
end
rev = rev + 1
if redis.call('EXISTS', staged) == 1 then
  redis.call('RENAME', staged, docs)
  redis.call('PERSIST', docs)
else
  redis.call('DEL', docs)
end
redis.call('SET', counter, rev)
redis.call('XADD', history, 'MAXLEN', '~', ARGV[4], rev .. '-1', 'revision', rev, 'time', ARGV[6],
  'who', ARGV[2], 'reason', ARGV[3], 'bulk', ARGV[5])
return {1, rev, tonumber(ARGV[6])}

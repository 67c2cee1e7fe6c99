-- The library's registration. `src/scripts/mod.rs` puts the tables it
-- shares with the service at the top, and every other file of the library
-- (layout, batches, add, groups) in one function, `body`, which returns
-- the functions by verb: a library runs its top level where nothing but
-- `redis.register_function` exists, so the body runs at the first call
-- instead, once. What it makes (memos, the add's arrays) stays with the
-- library until it is loaded again.

local functions

local function entry(verb)
  return function(keys, args)
    functions = functions or body()
    return functions[verb](keys, args)
  end
end

redis.register_function('batcher_add_' .. VERSION, entry('add'))
redis.register_function('batcher_add_shards_' .. VERSION, entry('add_shards'))
redis.register_function('batcher_flush_' .. VERSION, entry('flush'))
redis.register_function('batcher_remove_' .. VERSION, entry('remove'))
redis.register_function('batcher_retime_' .. VERSION, entry('retime'))
redis.register_function { function_name = 'batcher_group_' .. VERSION, callback = entry('group'),
  flags = { 'no-writes' } }
redis.register_function { function_name = 'batcher_due_' .. VERSION, callback = entry('due'),
  flags = { 'no-writes' } }
redis.register_function { function_name = 'batcher_open_stats_' .. VERSION,
  callback = entry('open_stats'), flags = { 'no-writes' } }

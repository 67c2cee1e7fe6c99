# What bench/peer/run uses: a temporary dir, removed
# on exit; BullMQ (npm ci here), redis-server and a release build of
# batcher-bench, installed or built when missing; last_json and
# floor_beside_library (at the end); and start_redis, which
# starts a redis-server as batcher-bench starts its own. Sourced, with
# $here (this dir) and $root (the repository) set.

tmp=$(mktemp -d)
redis_pid=""
stop_redis() {
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=""
  fi
}
trap 'stop_redis; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

if [ ! -d "$here/node_modules" ]; then
  (cd "$here" && npm ci --silent --no-audit --no-fund >/dev/null)
fi
"$root/scripts/ensure-redis"
(cd "$root" && cargo build --release --bin batcher-bench)
bench="$root/target/release/batcher-bench"

# Starts a fresh redis-server on a free loopback port; sets redis_pid and redis_port.
start_redis() {
  local dir
  dir=$(mktemp -d "$tmp/redis.XXXX")
  redis_port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => {
    console.log(s.address().port); s.close(); })')
  redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --logfile "$dir/log" \
    --daemonize no --save '' --appendonly no &
  redis_pid=$!
  for _ in $(seq 100); do
    if redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG; then return 0; fi
    sleep 0.1
  done
  echo "redis-server did not start; its log:" >&2
  cat "$dir/log" >&2
  exit 1
}


# The last line of JSON file $1: the values of its fields $2.., by spaces.
last_json() {
  node -e 'const [file, ...fields] = process.argv.slice(1);
    const j = JSON.parse(require("fs").readFileSync(file, "utf8").trim().split("\n").pop());
    console.log(fields.map((f) => j[f] ?? "-").join(" "))' "$@"
}

# floor_counters.lua beside batcher's library: on a fresh redis-server, $2 s
# of our add path without the service (batcher-bench __store_load --spread
# all, as scenario 1 spreads its items: the library loaded, its Lua heap
# grown), the library then kept ($1 = kept) or deleted (FUNCTION DELETE), then
# the floor as a function of its own in the same Lua VM (floor.mjs --fcall
# 1) on the same data; its JSON line is appended to $3. Arguments after $3
# go to floor.mjs in place of `--script floor_counters.lua --fcall 1` (e.g.
# `--script floor_counters.lua --fcall 0`: the floor by EVALSHA, in Redis's
# script VM, where the library is not).
floor_beside_library() {
  local arm=$1 seconds=$2 out=$3
  shift 3
  local floor=(--script floor_counters.lua --fcall 1)
  if [ $# -gt 0 ]; then floor=("$@"); fi
  start_redis
  "$bench" __store_load --redis-port "$redis_port" --redis-pid "$redis_pid" --spread all \
    --seconds "$seconds" >&2
  if [ "$arm" = deleted ]; then
    for lib in $(redis-cli -p "$redis_port" FUNCTION LIST | grep -o '^batcher_[0-9a-f]*$'); do
      redis-cli -p "$redis_port" FUNCTION DELETE "$lib" >/dev/null
    done
  fi
  node "$here/floor.mjs" --redis-port "$redis_port" --redis-pid "$redis_pid" \
    "${floor[@]}" | tee -a "$out" >&2
  stop_redis
}

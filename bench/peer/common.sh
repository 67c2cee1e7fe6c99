# What bench/peer/run and bench/peer/profile share: a temporary dir, removed
# on exit; BullMQ (npm ci here), redis-server and a release build of
# batcher-bench, installed or built when missing; and start_redis, which
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


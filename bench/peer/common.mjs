// What the drivers bullmq.mjs and floor.mjs share: their flags, and
// redis-server's CPU time.

import { readFileSync } from 'node:fs';

// The command line's `--flag value` pairs, by flag name; exits with a usage
// error naming `driver` on anything else.
export function parseFlags(driver) {
  const flags = {};
  for (let i = 2; i < process.argv.length; i += 2) {
    const name = process.argv[i];
    if (!name.startsWith('--') || i + 1 >= process.argv.length) {
      console.error(`${driver}: expected --flag value pairs, got ${name}`);
      process.exit(2);
    }
    flags[name.slice(2)] = process.argv[i + 1];
  }
  return flags;
}

// redis-server `pid`'s user+sys CPU time so far, in seconds (/proc/PID/stat,
// USER_HZ ticks); null without a pid.
export function redisCpu(pid) {
  if (pid === null) return null;
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/* Preloaded into redis-server by the test harness to put its wall clock
 * SKEW_SECS seconds away from the host's, so tests can prove that due times
 * follow Redis's clock. Only the real-time clocks move; monotonic ones don't.
 * (libfaketime would do this, but it deadlocks with jemalloc's start-up.) */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long skew(void) {
  const char *s = getenv("SKEW_SECS");
  return s ? strtol(s, 0, 10) : 0;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
  long rc = syscall(SYS_clock_gettime, clock, ts);
  if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
    ts->tv_sec += skew();
  return (int)rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
  long rc = syscall(SYS_gettimeofday, tv, tz);
  if (rc == 0 && tv) tv->tv_sec += skew();
  return (int)rc;
}

time_t time(time_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}

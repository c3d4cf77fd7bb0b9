/* clock_step.c: an LD_PRELOAD shim for test_clock_step.py. It moves what
 * clock_gettime(CLOCK_REALTIME) returns by the number of seconds written in the
 * file named by EVB_TEST_CLOCK_FILE (absent: 0), as if the system clock had been
 * set; CLOCK_MONOTONIC is left alone, as a real step leaves it. The file is read
 * again at most every 5 ms; once a new value is in force the shim writes it to
 * that path + ".seen", so the test knows the step has happened. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_fn)(clockid_t, struct timespec*);

static long long offset_s;     /* in force */
static long long checked_ns;   /* monotonic time of the last look at the file */
static int busy;               /* one thread looks at a time */

static long long read_offset(const char* path, int* ok) {
    char buf[64] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *ok = 0;
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    *ok = 1;
    return strtoll(buf, NULL, 10);
}

static void look(clock_fn real) {
    const char* path = getenv("EVB_TEST_CLOCK_FILE");
    struct timespec m;
    if (path == NULL || real(CLOCK_MONOTONIC, &m) != 0) return;
    long long now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
    if (now - __atomic_load_n(&checked_ns, __ATOMIC_RELAXED) < 5000000LL) return;
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) return;
    __atomic_store_n(&checked_ns, now, __ATOMIC_RELAXED);
    int ok;
    long long v = read_offset(path, &ok);
    if (ok && v != __atomic_load_n(&offset_s, __ATOMIC_RELAXED)) {
        __atomic_store_n(&offset_s, v, __ATOMIC_RELAXED);
        char seen[4096], text[32];
        snprintf(seen, sizeof seen, "%s.seen", path);
        int fd = open(seen, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            int len = snprintf(text, sizeof text, "%lld\n", v);
            if (write(fd, text, (size_t)len) != len) { /* the test waits and says so */ }
            close(fd);
        }
    }
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
}

int clock_gettime(clockid_t id, struct timespec* ts) {
    static clock_fn real;
    clock_fn f = __atomic_load_n(&real, __ATOMIC_RELAXED);
    if (f == NULL) {
        f = (clock_fn)dlsym(RTLD_NEXT, "clock_gettime");
        __atomic_store_n(&real, f, __ATOMIC_RELAXED);
    }
    int r = f(id, ts);
    if (r != 0 || (id != CLOCK_REALTIME && id != CLOCK_REALTIME_COARSE)) return r;
    look(f);
    ts->tv_sec += (time_t)__atomic_load_n(&offset_s, __ATOMIC_RELAXED);
    return r;
}

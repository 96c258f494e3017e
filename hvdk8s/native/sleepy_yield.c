/* sched_yield() that stops competing for a busy core: preloaded into every rank (hvdk8s/tuning.py).
 *
 * OpenMPI (with mpi_yield_when_idle) and Horovod wait for a peer by calling sched_yield() in a loop, so
 * the waiting thread stays runnable. Horovod's background threads meet every cycle, and one rank's thread
 * ends up waiting nearly the whole cycle: a full core spent yielding (4.98 CPU-s in 5 s of an idle 2-rank
 * job, measured here). Where other threads want the cores (the ranks' own training threads, another job),
 * that time is taken from them: beside a second 2-rank job a 2-rank step took 1.18x torch DDP's.
 *
 * A wait is a run of calls with little work between them. It yields as before while each yield comes
 * straight back (no other thread wanted this core: polling keeps the wait's latency lowest). Once a
 * yield took longer than BUSY_CORE_NS (another thread ran), the rest of the wait sleeps: FIRST_PAUSE_NS,
 * doubling up to MAX_PAUSE_NS, with the thread's timer slack cut to 1 us so short sleeps stay short. */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum {
    NEW_WAIT_GAP_NS = 20000, /* more work than this between two calls: a new wait */
    BUSY_CORE_NS = 20000,    /* a yield that took longer: another thread wanted this core */
    FIRST_PAUSE_NS = 20000,
    MAX_PAUSE_NS = 500000,
    TIMER_SLACK_NS = 1000,
};

/* Per thread: each waiting thread has its own wait. */
static __thread long long last_return_ns, pause_ns;
static __thread int sleeping, slack_set;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int sched_yield(void) {
    long long called = now_ns();
    /* Measured from the previous call's return: time spent inside a call is not work between calls. */
    if (called - last_return_ns > NEW_WAIT_GAP_NS) {
        sleeping = 0;
        pause_ns = FIRST_PAUSE_NS;
    }
    if (!sleeping) {
        syscall(SYS_sched_yield);
        last_return_ns = now_ns();
        sleeping = last_return_ns - called > BUSY_CORE_NS;
        return 0;
    }
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0);
        slack_set = 1;
    }
    struct timespec pause = {0, pause_ns};
    nanosleep(&pause, NULL);
    pause_ns = pause_ns * 2 < MAX_PAUSE_NS ? pause_ns * 2 : MAX_PAUSE_NS;
    last_return_ns = now_ns();
    return 0;
}

/* Horovod's per-cycle negotiation, waited for asleep: preloaded into ranks (hvdk8s/tuning.py).
 *
 * Every cycle, Horovod's background thread (MPI controller) combines the response cache's bit vectors
 * across ranks with MPI_Allreduce(MPI_BAND) and (MPI_BOR). Each rank sleeps to its next cycle from its own
 * cycle start, so the rank that arrives first waits in that allreduce for the other, and the offset
 * drifts until one rank waits out the whole cycle. Open MPI polls meanwhile (a sched_yield loop under
 * mpi_yield_when_idle), so that rank's thread holds a core: 2.99 CPU-s in 3 s of an idle 2-rank job,
 * measured, taken from the ranks' training threads and from any job beside them.
 *
 * This MPI_Allreduce starts those bitwise reductions as MPI_Iallreduce and sleeps between MPI_Tests
 * (FIRST_PAUSE_NS doubling to MAX_PAUSE_NS, timer slack 1 us so short sleeps stay short). Every other
 * allreduce (gradients: MPI_SUM) goes straight to Open MPI's: polling is what keeps a data exchange fast.
 * Open MPI 4.1 only, the release it was written and measured against: Open MPI names its predefined ops
 * ompi_mpi_op_band/_bor and its handles are pointers, and 4.1 progresses a non-blocking collective inside
 * MPI_Test. Where MPI_Get_library_version names another MPI or release (or those names are not found),
 * every call passes straight through. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

typedef void *Handle; /* MPI_Datatype, MPI_Op, MPI_Comm and MPI_Request in Open MPI */
typedef int (*AllreduceFn)(const void *, void *, int, Handle, Handle, Handle);
typedef int (*IallreduceFn)(const void *, void *, int, Handle, Handle, Handle, Handle *);
typedef int (*TestFn)(Handle *, int *, void *);
typedef int (*VersionFn)(char *, int *);

enum {
    VERSION_BYTES = 8192, /* Open MPI's MPI_MAX_LIBRARY_VERSION_STRING is 256 */
    FIRST_PAUSE_NS = 20000,
    MAX_PAUSE_NS = 200000, /* the most a wait can overrun its peer's arrival */
    TIMER_SLACK_NS = 1000,
};

static struct {
    AllreduceFn allreduce;
    IallreduceFn iallreduce;
    TestFn test;
    Handle band, bor;
} mpi;
static pthread_once_t resolved = PTHREAD_ONCE_INIT;

/* A symbol of the MPI library the caller uses: the next definition after this library or, where that
 * library was loaded without RTLD_GLOBAL, Open MPI's libmpi.so.40 asked directly. */
static void *mpi_symbol(const char *name) {
    void *found = dlsym(RTLD_NEXT, name);
    if (found == NULL) {
        void *libmpi = dlopen("libmpi.so.40", RTLD_LAZY | RTLD_NOLOAD);
        found = libmpi != NULL ? dlsym(libmpi, name) : NULL;
    }
    return found;
}

/* Whether the loaded MPI is the one this was written for (hvdk8s/tuning.py OPEN_MPI_SERIES). */
static int written_for(void) {
    static char text[VERSION_BYTES];
    int length = 0;
    VersionFn version = (VersionFn)mpi_symbol("PMPI_Get_library_version");
    return version != NULL && version(text, &length) == 0 && strncmp(text, "Open MPI v4.1.", 14) == 0;
}

static void resolve(void) {
    mpi.allreduce = (AllreduceFn)mpi_symbol("MPI_Allreduce");
    mpi.iallreduce = (IallreduceFn)mpi_symbol("PMPI_Iallreduce");
    mpi.test = (TestFn)mpi_symbol("PMPI_Test");
    mpi.band = mpi_symbol("ompi_mpi_op_band");
    mpi.bor = mpi_symbol("ompi_mpi_op_bor");
    if (mpi.iallreduce == NULL || mpi.test == NULL || !written_for())
        mpi.band = mpi.bor = NULL; /* not the MPI it knows, or no way to wait asleep: every call passes through */
    if (mpi.allreduce == NULL) { /* a caller linked with MPI, yet no MPI loaded: nothing to pass on to */
        fputs("hvdk8s sleepy negotiation: MPI_Allreduce was called but no MPI library is loaded\n", stderr);
        abort();
    }
}

static long next_pause(long pause_ns) {
    return pause_ns * 2 < MAX_PAUSE_NS ? pause_ns * 2 : MAX_PAUSE_NS;
}

int MPI_Allreduce(const void *send, void *receive, int count, Handle type, Handle op, Handle comm) {
    pthread_once(&resolved, resolve);
    if (op == NULL || (op != mpi.band && op != mpi.bor))
        return mpi.allreduce(send, receive, count, type, op, comm);
    static __thread int slack_set;
    if (!slack_set) {
        prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0);
        slack_set = 1;
    }
    Handle request;
    int rc = mpi.iallreduce(send, receive, count, type, op, comm, &request);
    for (long pause_ns = FIRST_PAUSE_NS; rc == 0; pause_ns = next_pause(pause_ns)) {
        int done = 0;
        rc = mpi.test(&request, &done, NULL); /* NULL is MPI_STATUS_IGNORE in Open MPI */
        if (rc != 0 || done)
            break;
        struct timespec pause = {0, pause_ns};
        nanosleep(&pause, NULL);
    }
    return rc; /* 0 is MPI_SUCCESS */
}

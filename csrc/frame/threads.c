/* narrowmm: a small persistent pool. Workers are started lazily, on the first call that
 * wants them, and sleep on a condition variable between jobs. After fork() the child starts
 * with no workers and a fresh pool (pthread_atfork), so it can compute too.
 *
 * Waking a sleeping thread costs tens of microseconds in a virtual machine (measured here:
 * a 512 x 512 fp16 gemv took 19 us on one thread and 35-39 us on two). So both sides spin
 * briefly before they sleep: a worker watches for the next job for NM_SPIN_NS after its
 * last one (calls come in runs during inference), and the caller watches for its helpers
 * to finish. Spinning threads only read one atomic and pause. Whether workers are in their
 * spin window (nm_pool_awake) lets the frame leave small jobs to the caller alone rather
 * than wake sleeping workers for them. */
#define _POSIX_C_SOURCE 199309L
#include "threads.h"

#include <time.h>

#include <stdatomic.h>

#if defined(_WIN32)
/* No pthreads on MSVC builds: every part runs on the caller. Unverified here. */
static atomic_int num_threads = 1;
void nm_parallel_run(nm_task_fn fn, void *ctx, int parts) {
    for (int i = 0; i < parts; ++i) fn(ctx, i, parts);
}
void nm_set_num_threads(int n) { (void)n; }
int nm_get_num_threads(void) { return atomic_load(&num_threads); }
int nm_pool_awake(void) { return 0; }
void nm_pool_hold(int on) { (void)on; }
void nm_set_spin_ns(int64_t ns) { (void)ns; }
int64_t nm_get_spin_ns(void) { return 0; }
long nm_parallel_jobs(void) { return 0; }
void nm_set_omp_team(void *gomp_parallel) { (void)gomp_parallel; }
int nm_omp_team(void) { return 0; }
#else
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define NM_SPIN_NS 50000L

/* How long a worker spins after a job (nm_set_spin_ns); the caller's wait for its helpers
 * always spins NM_SPIN_NS. */
static _Atomic int64_t worker_spin_ns = NM_SPIN_NS;

void nm_set_spin_ns(int64_t ns) { atomic_store(&worker_spin_ns, ns < 0 ? 0 : ns); }

int64_t nm_get_spin_ns(void) { return atomic_load(&worker_spin_ns); }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct pool_state {
    pthread_mutex_t lock;    /* guards everything below; the atomics may also be read
                                without it, by a spinning thread */
    pthread_cond_t wake;     /* a new job was posted */
    pthread_cond_t done;     /* the last part of a job finished */
    pthread_mutex_t submit;  /* one job at a time */
    int workers;             /* worker threads started */
    atomic_ulong generation;
    nm_task_fn fn;
    void *ctx;
    int parts, next;
    atomic_int remaining;
    atomic_int spinning;     /* workers in their spin window: a job now wakes no one */
    atomic_long parallel_jobs; /* jobs run in more than one part, for tests and info */
    atomic_int held;         /* nm_pool_hold's count: workers spin, calls see them awake */
} pool_state;

static pool_state pool = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, NULL, 0, 0, 0, 0, 0, 0,
};
static atomic_int num_threads = 1;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void install_atfork(void);

/* libgomp's entry for `#pragma omp parallel` (its ABI since GCC 4.9): runs fn(data) on a
 * team of num_threads threads, the caller included, and returns when all have finished. */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads,
                                 unsigned flags);
static _Atomic(gomp_parallel_fn) omp_team; /* NULL: the pool */

typedef struct omp_job {
    nm_task_fn fn;
    void *ctx;
    int parts;
    atomic_int next;
} omp_job;

static void omp_job_main(void *data) {
    omp_job *job = data;
    for (int part; (part = atomic_fetch_add(&job->next, 1)) < job->parts;)
        job->fn(job->ctx, part, job->parts);
}

void nm_set_omp_team(void *gomp_parallel) {
    pthread_once(&atfork_once, install_atfork);
    atomic_store(&omp_team, (gomp_parallel_fn)gomp_parallel);
}

int nm_omp_team(void) { return atomic_load(&omp_team) != NULL; }

/* Take parts of the current job until none is left. Called with the lock held. */
static void work_on_job(void) {
    while (pool.next < pool.parts) {
        const int part = pool.next++;
        const nm_task_fn fn = pool.fn;
        void *const ctx = pool.ctx;
        const int parts = pool.parts;
        pthread_mutex_unlock(&pool.lock);
        fn(ctx, part, parts);
        pthread_mutex_lock(&pool.lock);
        if (atomic_fetch_sub(&pool.remaining, 1) == 1) pthread_cond_broadcast(&pool.done);
    }
}

/* Pause a little; false once the clock passes `until` (a spinning thread's deadline). */
static int keep_spinning(int64_t until) {
    for (int i = 0; i < 64; ++i) cpu_relax();
    return now_ns() < until;
}

static void *worker_main(void *arg) {
    /* the generation before the job this worker was started for, so it joins that job */
    unsigned long seen = (unsigned long)(uintptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        if (atomic_load(&pool.generation) == seen) {
            pthread_mutex_unlock(&pool.lock);
            atomic_fetch_add(&pool.spinning, 1);
            const int64_t until = now_ns() + atomic_load(&worker_spin_ns);
            while (atomic_load(&pool.generation) == seen &&
                   (keep_spinning(until) || atomic_load(&pool.held) > 0))
                continue;
            atomic_fetch_sub(&pool.spinning, 1);
            pthread_mutex_lock(&pool.lock);
        }
        while (atomic_load(&pool.generation) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
        seen = atomic_load(&pool.generation);
        work_on_job();
    }
    return NULL; /* not reached: workers live as long as the process */
}

static void reset_in_child(void) {
    /* The parent's workers do not exist here; locks may have been held by them. Nor is an
     * OpenMP team known to work after fork: back to the pool. */
    atomic_store(&omp_team, NULL);
    pool_state fresh = {
        PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
        PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, NULL, 0, 0, 0, 0, 0, 0,
    };
    memcpy(&pool, &fresh, sizeof pool);
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, reset_in_child); }

/* Start workers until `want` exist (or thread creation fails). Lock held. */
static void ensure_workers(int want) {
    while (pool.workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker_main,
                                (void *)(uintptr_t)atomic_load(&pool.generation));
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer helpers; the caller still finishes every part */
        ++pool.workers;
    }
}

void nm_parallel_run(nm_task_fn fn, void *ctx, int parts) {
    const gomp_parallel_fn team = atomic_load(&omp_team);
    if (parts > 1 && team) {
        omp_job job = {fn, ctx, parts, 0};
        atomic_fetch_add(&pool.parallel_jobs, 1);
        team(omp_job_main, &job, (unsigned)parts, 0);
        return;
    }
    if (parts <= 1 || pthread_mutex_trylock(&pool.submit) != 0) {
        for (int i = 0; i < parts; ++i) fn(ctx, i, parts);
        return;
    }
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(&pool.parallel_jobs, 1);
    ensure_workers(parts - 1);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.parts = parts;
    pool.next = 0;
    atomic_store(&pool.remaining, parts);
    atomic_fetch_add(&pool.generation, 1);
    pthread_cond_broadcast(&pool.wake);
    work_on_job();
    if (atomic_load(&pool.remaining) > 0) {
        pthread_mutex_unlock(&pool.lock);
        const int64_t until = now_ns() + NM_SPIN_NS;
        while (atomic_load(&pool.remaining) > 0 && keep_spinning(until)) continue;
        pthread_mutex_lock(&pool.lock);
    }
    while (atomic_load(&pool.remaining) > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pool.fn = NULL;
    pool.ctx = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.submit);
}

void nm_set_num_threads(int n) {
    if (n < 1) n = 1;
    if (n > NM_MAX_THREADS) n = NM_MAX_THREADS;
    atomic_store(&num_threads, n);
}

int nm_get_num_threads(void) { return atomic_load(&num_threads); }

/* An OpenMP team counts as awake: the framework's own ops keep it spinning between layers
 * (libgomp spins for milliseconds after each region). */
int nm_pool_awake(void) {
    return atomic_load(&pool.spinning) > 0 || atomic_load(&pool.held) > 0 || nm_omp_team();
}

/* Waking: a job of no parts, posted as any job is (so a worker that sleeps, or is started
 * now, runs it and goes on to spin); skipped if another caller's job is running, whose
 * workers are awake. The caller does not wait for them. */
void nm_pool_hold(int on) {
    if (!on) {
        atomic_fetch_sub(&pool.held, 1);
        return;
    }
    atomic_fetch_add(&pool.held, 1);
    const int helpers = nm_get_num_threads() - 1;
    if (helpers < 1 || nm_omp_team() || pthread_mutex_trylock(&pool.submit) != 0) return;
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&pool.lock);
    ensure_workers(helpers);
    pool.fn = NULL;
    pool.ctx = NULL;
    pool.parts = pool.next = 0;
    atomic_store(&pool.remaining, 0);
    atomic_fetch_add(&pool.generation, 1);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.submit);
}

long nm_parallel_jobs(void) { return atomic_load(&pool.parallel_jobs); }
#endif

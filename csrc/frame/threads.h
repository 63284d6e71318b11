/* narrowmm: the persistent thread pool the frame splits work with. */
#ifndef NM_THREADS_H
#define NM_THREADS_H

#include <stdint.h>

/* A task is called once for each part in [0, parts); parts run concurrently. */
typedef void (*nm_task_fn)(void *ctx, int part, int parts);

/* Run fn over `parts` parts on the pool and the calling thread; returns when all are done.
 * A second caller that finds the pool busy runs its parts itself, one after another (the
 * results do not depend on where a part runs). */
void nm_parallel_run(nm_task_fn fn, void *ctx, int parts);

/* Threads a call may use (the caller included); clamped to [1, NM_MAX_THREADS]. */
void nm_set_num_threads(int n);
int nm_get_num_threads(void);

/* How long (ns) a worker spins after a job before it sleeps; default 50 us. Inside a model
 * run by narrowmm.torch the framework's work between two layers outlasts 50 us, so the
 * workers would sleep between layers and every layer would pay to wake them: a longer spin
 * keeps them awake through a forward pass (the cores are narrowmm's there anyway). */
void nm_set_spin_ns(int64_t ns);
int64_t nm_get_spin_ns(void);

/* Whether a worker is spinning after its last job (waking it costs nothing now), or the
 * pool is held awake (nm_pool_hold). */
int nm_pool_awake(void);

/* Hold the pool awake through a run of calls each too small to pay for waking it, but
 * worth it together (a decode step's dozens of small layers): nm_pool_hold(1) wakes the
 * sleeping workers without waiting for them, and until the matching nm_pool_hold(0) they
 * spin instead of sleeping and every call counts the pool as awake. Holds nest. */
void nm_pool_hold(int on);

/* Whether a job of this cost (multiply-adds of time) should be split across threads: it
 * pays for waking sleeping workers, or they are awake (frame/matmul.c keeps the rule; the
 * model ops in ops/ follow it too). Where a part runs never changes a bit. */
int nm_worth_waking(double cost);

/* The cost of an m x k by k x n product in those units: m multiply-adds a weight, or
 * NM_GEMV_WEIGHT_COST for m <= 2, whose gemvs stream the weights (frame/matmul.c). */
double nm_matmul_cost(int64_t m, int64_t n, int64_t k);

/* Run jobs on another OpenMP team instead of the pool: `gomp_parallel` is the address of
 * GOMP_parallel in the libgomp a framework already runs its ops on (narrowmm.torch passes
 * PyTorch's), NULL to return to the pool. Two teams of spinning threads on the same cores
 * take turns on them; one team shared by the framework's ops and narrowmm's never does.
 * The parts are claimed from a counter by the team's threads, so where a part runs still
 * never changes a bit. A forked child goes back to the pool. */
void nm_set_omp_team(void *gomp_parallel);
int nm_omp_team(void);

/* Jobs run in more than one part since the process started (a diagnostic). */
long nm_parallel_jobs(void);

#define NM_MAX_THREADS 256

#endif

// The channels-last inference loop's floor on this machine, outside the op (docs/fused_batch_norm.md,
// "Speed and this machine"). FusedBatchNorm's channels-last inference computes, per row of C channels,
//   y[c] = (x[c] - mean[c]) * alpha[c] + offset[c]      (two roundings, as TF: no FMA)
// so each vector of x needs three coefficient vectors. This times that loop form and its variants against a
// plain copy over the same 12.8 MB (the (64, 256, 14, 14) case), 2 OpenMP threads, one contiguous half each,
// in interleaved repetitions (median of each). A loop whose coefficients are broadcast constants (the
// channels-first form) runs at the copy's speed; the one-row three-array form does not; the op's form
// (`halves`: the two halves of each thread's rows together) comes close.
//
//   gcc -O2 -mavx2 -fopenmp docs/fused_batch_norm_cl_floor.c -o /tmp/cl_floor && OMP_NUM_THREADS=2 /tmp/cl_floor
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define C 256
static float *x, *y;
static long rows;
static float mean[C], alpha[C], offset[C];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define LD(p) _mm256_loadu_ps(p)
#define ST(p, v) _mm256_storeu_ps(p, v)
#define NORM(v, m, a, o) _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, m), a), o)

static void copy(long r0, long r1) {
  for (long i = r0 * C; i < r1 * C; i += 8) ST(y + i, LD(x + i));
}
// The channels-first form: one coefficient set per run, held in registers.
static void broadcast(long r0, long r1) {
  const __m256 m = _mm256_set1_ps(0.1f), a = _mm256_set1_ps(1.1f), o = _mm256_set1_ps(0.2f);
  for (long i = r0 * C; i < r1 * C; i += 8) ST(y + i, NORM(LD(x + i), m, a, o));
}
// Three coefficient loads per vector, one row at a time (torchops' form until 2026-11-26).
static void arrays3(long r0, long r1) {
  for (long r = r0; r < r1; ++r)
    for (int c = 0; c < C; c += 8)
      ST(y + r * C + c, NORM(LD(x + r * C + c), LD(mean + c), LD(alpha + c), LD(offset + c)));
}
// Two, one coefficient load(s) per vector (offset, then alpha too, as constants): how the cost scales.
static void arrays2(long r0, long r1) {
  const __m256 o = _mm256_set1_ps(0.2f);
  for (long r = r0; r < r1; ++r)
    for (int c = 0; c < C; c += 8) ST(y + r * C + c, NORM(LD(x + r * C + c), LD(mean + c), LD(alpha + c), o));
}
static void arrays1(long r0, long r1) {
  const __m256 a = _mm256_set1_ps(1.1f), o = _mm256_set1_ps(0.2f);
  for (long r = r0; r < r1; ++r)
    for (int c = 0; c < C; c += 8) ST(y + r * C + c, NORM(LD(x + r * C + c), LD(mean + c), a, o));
}
// Three coefficient loads shared by R rows (fewer loads, R interleaved streams).
#define ROWS(NAME, R)                                                                             \
  static void NAME(long r0, long r1) {                                                            \
    long r = r0;                                                                                  \
    for (; r + R <= r1; r += R)                                                                   \
      for (int c = 0; c < C; c += 8) {                                                            \
        const __m256 m = LD(mean + c), a = LD(alpha + c), o = LD(offset + c);                     \
        for (int k = 0; k < R; ++k) ST(y + (r + k) * C + c, NORM(LD(x + (r + k) * C + c), m, a, o)); \
      }                                                                                           \
    if (r < r1) arrays3(r, r1);                                                                   \
  }
ROWS(rows2, 2)
ROWS(rows4, 4)
// torchops' form: row r and row r + half together, each coefficient vector loaded once for both (2.5 loads
// per vector of x, two sequential streams far apart instead of interleaved neighbours as in rows2).
static void halves(long r0, long r1) {
  const long h = (r1 - r0) / 2, H = h * C;
  for (long r = r0; r < r0 + h; ++r)
    for (int c = 0; c < C; c += 8) {
      const __m256 m = LD(mean + c), a = LD(alpha + c), o = LD(offset + c);
      ST(y + r * C + c, NORM(LD(x + r * C + c), m, a, o));
      ST(y + r * C + H + c, NORM(LD(x + r * C + H + c), m, a, o));
    }
  if (r0 + 2 * h < r1) arrays3(r0 + 2 * h, r1);
}
// Software prefetch of x 1 KB ahead.
static void prefetch(long r0, long r1) {
  for (long r = r0; r < r1; ++r)
    for (int c = 0; c < C; c += 8) {
      _mm_prefetch((const char*)(x + r * C + c) + 1024, _MM_HINT_T0);
      ST(y + r * C + c, NORM(LD(x + r * C + c), LD(mean + c), LD(alpha + c), LD(offset + c)));
    }
}

typedef void (*Loop)(long, long);
static double run(Loop f) {
  const double t0 = now();
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const long per = (rows + n - 1) / n, a = t * per, b = a + per < rows ? a + per : rows;
    f(a, b);
  }
  return now() - t0;
}

static int cmp(const void* a, const void* b) {
  const double d = *(const double*)a - *(const double*)b;
  return d < 0 ? -1 : d > 0;
}

int main(int argc, char** argv) {
  rows = argc > 1 ? atol(argv[1]) : 64L * 14 * 14;  // 12.8 MB of float32 at C = 256
  const long n = rows * C;
  if (posix_memalign((void**)&x, 64, n * 4) || posix_memalign((void**)&y, 64, n * 4)) return 1;
  for (long i = 0; i < n; ++i) x[i] = (float)(i % 7), y[i] = 0;
  for (int c = 0; c < C; ++c) mean[c] = 0.1f * c, alpha[c] = 1.1f, offset[c] = 0.2f;
  const char* names[] = {"copy", "broadcast", "arrays3", "arrays2", "arrays1", "rows2", "rows4", "halves", "prefetch"};
  Loop loops[] = {copy, broadcast, arrays3, arrays2, arrays1, rows2, rows4, halves, prefetch};
  enum { K = sizeof(loops) / sizeof(loops[0]), REPS = 300 };
  static double t[K][REPS];
  for (int w = 0; w < 5; ++w)
    for (int k = 0; k < K; ++k) run(loops[k]);
  for (int r = 0; r < REPS; ++r)
    for (int k = 0; k < K; ++k) t[k][r] = run(loops[k]);
  double base = 0;
  for (int k = 0; k < K; ++k) {
    qsort(t[k], REPS, sizeof(double), cmp);
    const double med = t[k][REPS / 2];
    if (k == 0) base = med;
    printf("%-10s %.3f ms  x%.2f of copy\n", names[k], med * 1e3, med / base);
  }
  return 0;
}

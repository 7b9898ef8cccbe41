// CPU loops of FusedBatchNormV3 / FusedBatchNormGradV3, one build per CPU capability (Default and AVX2 + FMA;
// 32-byte vectors gain nothing from AVX-512, so AVX-512 CPUs run the AVX2 build; see cpu/cpu_isa.h).
//
// Two loop orders, both reading memory front to back:
//  * channels-first ([N, C, spatial], inner > 1): one task per channel; the channel's runs are summed,
//    then normalised while still in cache (one trip to memory for statistics + output).
//  * channels-last ([rows, C], inner == 1): each thread accumulates per-channel partial sums over a
//    block of rows (inner loop over contiguous channels), partials are combined, then a row pass.
// SIMD sums of U are flushed into double totals every few elements (kRowBlock*, kRunChunk).
#include "cpu/cpu_isa.h"
#include "cpu/fused_batch_norm_kernel_isa.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace torchops {
namespace fbn {
namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE {
namespace {

// Sums accumulate in U for a short stretch (a block of rows, a chunk of a run), then flush into double
// totals: float32 statistics and gradient sums stay accurate over millions of elements at the cost of
// one double add per stretch.
constexpr int64_t kRowBlockStats = 32;  // channels-last rows per flush: statistics (centred by a shift)
// ... gradient sums (products may cancel, so flush more often). 32 rows measured ~10 % faster at C = 256 but
// 1.26-1.37x slower at C = 64 (the channel blocks of 32 then walk every other pair of lines of 32 rows).
constexpr int64_t kRowBlockGrad = 8;
constexpr int64_t kRunChunk = 256;      // channels-first run elements per flush

// 32-byte SIMD vectors through GCC/Clang vector extensions: explicit lanes without intrinsics, so
// the same code is SSE2 on a baseline build and AVX on a wider one.
template <typename U>
struct Simd {
  typedef U V __attribute__((vector_size(32)));
  static constexpr int kWidth = 32 / sizeof(U);

  template <typename T>
  static inline V load(const T* p) {
    V v;
    if constexpr (std::is_same_v<T, U>) {
      std::memcpy(&v, p, sizeof(V));
    } else {
      for (int j = 0; j < kWidth; ++j) v[j] = static_cast<U>(p[j]);
    }
    return v;
  }
  // Every lane s. Not V{} + s: 0 + (-0) is +0, and x - (+0) keeps x = -0 where TF's x - (-0) gives +0.
  // A braced list of equal lanes, which GCC emits as one broadcast (setting lane by lane emitted a chain of
  // eight inserts per coefficient, per plane of the channels-first pass).
  static inline V splat(U s) { return splat_lanes(s, std::make_index_sequence<kWidth>()); }
  template <size_t... I>
  static inline V splat_lanes(U s, std::index_sequence<I...>) {
    return V{((void)I, s)...};
  }
  static inline U hsum(V v) {
    U s = 0;
    for (int j = 0; j < kWidth; ++j) s += v[j];
    return s;
  }
};

// sum(f(x)) over a run; f takes a SIMD vector or a scalar of U (one generic expression serves both).
template <typename T, typename U, typename F>
inline double map_sum_run(const T* p, int64_t len, const F& f) {
  using S = Simd<U>;
  constexpr int W = S::kWidth;
  double total = 0;
  for (int64_t c0 = 0; c0 < len; c0 += kRunChunk) {
    const int64_t end = std::min(len, c0 + kRunChunk);
    typename S::V a0 = {}, a1 = {};
    int64_t i = c0;
    for (; i + 2 * W <= end; i += 2 * W) {
      a0 += f(S::load(p + i));
      a1 += f(S::load(p + i + W));
    }
    U s = S::hsum(a0 + a1);
    for (; i < end; ++i) s += f(static_cast<U>(p[i]));
    total += s;
  }
  return total;
}

template <typename T, typename U>
inline double sum_run(const T* p, int64_t len) {
  return map_sum_run<T, U>(p, len, [](auto v) { return v; });
}

template <typename T, typename U>
inline double sum_sq_dev_run(const T* p, int64_t len, U mean) {
  return map_sum_run<T, U>(p, len, [mean](auto v) {
    const auto d = v - mean;
    return d * d;
  });
}

// Channels-first passes read a channel's runs one image apart (C * inner elements). Runs of up to 4 KB are
// too short for the hardware prefetcher to pick up after each jump, so the loop that first reads a channel
// prefetches (into L2) the run `ahead` images on (about 3 KB ahead), past the last image the next channel's
// first runs; the later passes over the channel find its runs in L2. Measured against the same code without
// it, calls interleaved in a random order (2 processes): backward 0.72-0.80x at (64, 256, 14, 14) (784-byte
// runs), 0.86x at (32, 128, 28, 28) (3 KB), 0.83x at (64, 512, 7, 7) (196 B); training forward 0.90-0.93x,
// 0.82-0.83x and 1.05x, so the forward (one array, a lighter loop) prefetches from 512-byte runs only.
template <typename T>
struct RunPrefetch {
  int64_t C, inner, outer, bytes, ahead;
  bool on;
  RunPrefetch(int64_t C_, int64_t inner_, int64_t outer_, int64_t min_bytes)
      : C(C_), inner(inner_), outer(outer_), bytes(inner_ * static_cast<int64_t>(sizeof(T))) {
    on = bytes >= min_bytes && bytes <= 4096;
    ahead = std::max<int64_t>(4, (3072 + bytes - 1) / std::max<int64_t>(bytes, 1));
  }
  // Run (o, c) is about to be read from p = base + (o * C + c) * inner. An address, not a pointer into the
  // tensor: past the last run it points outside, which a prefetch never faults on.
  void operator()(const T* base, int64_t o, int64_t c) const {
    if (!on) return;
    int64_t o2 = o + ahead, c2 = c;
    if (o2 >= outer) o2 -= outer, ++c2;
    const uintptr_t q = reinterpret_cast<uintptr_t>(base) +
                        static_cast<uintptr_t>((o2 * C + c2) * inner) * sizeof(T);
    for (int64_t l = 0; l < bytes; l += 64) {
#if defined(__x86_64__) || defined(__i386__)
      // prefetcht1 as volatile asm: GCC 12 deleted this loop of __builtin_prefetch calls as dead code.
      asm volatile("prefetcht1 (%0)" : : "r"(q + static_cast<uintptr_t>(l)));
#else
      __builtin_prefetch(reinterpret_cast<const void*>(q + static_cast<uintptr_t>(l)), 0, 2);
#endif
    }
  }
};

// sum(dy) and sum(dy * (x - mu)) over a run.
template <typename T, typename U>
inline void grad_sums_run(const T* dy, const T* x, int64_t len, U mu, double& s_dy, double& s_dyxc) {
  using S = Simd<U>;
  constexpr int W = S::kWidth;
  s_dy = 0, s_dyxc = 0;
  for (int64_t c0 = 0; c0 < len; c0 += kRunChunk) {
    const int64_t end = std::min(len, c0 + kRunChunk);
    // Two accumulator pairs: one pair would serialise on the add latency.
    typename S::V a = {}, b = {}, a1 = {}, b1 = {};
    int64_t i = c0;
    for (; i + 2 * W <= end; i += 2 * W) {
      const auto g = S::load(dy + i), g1 = S::load(dy + i + W);
      a += g;
      b += g * (S::load(x + i) - mu);
      a1 += g1;
      b1 += g1 * (S::load(x + i + W) - mu);
    }
    for (; i + W <= end; i += W) {
      const auto g = S::load(dy + i);
      a += g;
      b += g * (S::load(x + i) - mu);
    }
    U sa = S::hsum(a + a1), sb = S::hsum(b + b1);
    for (; i < end; ++i) {
      const U g = static_cast<U>(dy[i]);
      sa += g;
      sb += g * (static_cast<U>(x[i]) - mu);
    }
    s_dy += sa;
    s_dyxc += sb;
  }
}

// Channels-last column sums over rows [r0, r1) of [rows, C] matrices a, b (b may alias a):
//   s0[c] += t0, s1[c] += t1 with (t0, t1) = f(a[r, c], b[r, c], k[c]), the terms summed in U over these rows
// and the sum added to the double totals s0, s1.
// Blocks of four SIMD vectors of channels stay in registers while the row loop runs inside, instead of a
// load-add-store of the partial sums for every element (which made the statistics pass ~2x slower than
// a plain read of x). f is generic: it takes SIMD vectors or scalars of U.
template <typename T, typename U, typename F>
inline void column_sums2(const T* a, const T* b, int64_t C, int64_t r0, int64_t r1, const U* k, double* s0,
                         double* s1, const F& f) {
  using S = Simd<U>;
  using V = typename S::V;
  constexpr int W = S::kWidth;
  // Widened and added a vector at a time (element by element, GCC kept the sums on the stack and flushed them
  // with scalar converts: the backward's reduction took 1.7x the time).
  typedef double D4 __attribute__((vector_size(32)));
  auto add_to = [](double* p, V v) {
    auto add4 = [](double* q, D4 d) {
      D4 o;
      std::memcpy(&o, q, sizeof(D4));
      o += d;
      std::memcpy(q, &o, sizeof(D4));
    };
    if constexpr (std::is_same_v<U, double>) {
      add4(p, v);
    } else {
      static_assert(std::is_same_v<U, float>, "sums are float or double");
      typedef float F4 __attribute__((vector_size(16)));
      F4 lo, hi;  // the halves by memcpy: __builtin_shufflevector needs GCC 12
      std::memcpy(&lo, &v, sizeof(F4));
      std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(F4), sizeof(F4));
      add4(p, __builtin_convertvector(lo, D4));
      add4(p + 4, __builtin_convertvector(hi, D4));
    }
  };
  // Each block of channels walks the rows with a stride the hardware prefetcher does not follow, so the
  // block's lines two row blocks ahead are prefetched, into L2 only (prefetcht1). Against prefetcht0 one block
  // ahead (the code before), in calls interleaved in a random order (2 processes): the 12.8 MB channels-last
  // backward 0.72-0.74x the time, the training forward 0.86-0.90x. Rows of 256 bytes (C = 64) are prefetched
  // when one matrix is read (the statistics: 0.86-0.90x of no prefetch) but not for two (the gradient sums:
  // 0.85-1.10x, 5 processes).
  const bool prefetch = C * static_cast<int64_t>(sizeof(T)) >= (a == b ? 256 : 512);
  const int64_t ahead_bytes = 2 * (r1 - r0) * C * static_cast<int64_t>(sizeof(T));
  // The two cache lines at p + off (an address, not a pointer into the tensor: the rows past the last are
  // prefetched too, which never faults).
  auto prefetch_lines = [](const T* p, int64_t off) {
    const uintptr_t q = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(off);
    __builtin_prefetch(reinterpret_cast<const void*>(q), 0, 2);
    __builtin_prefetch(reinterpret_cast<const void*>(q + 64), 0, 2);
  };
  int64_t c = 0;
  for (; c + 4 * W <= C; c += 4 * W) {
    V kv[4], x0[4] = {}, x1[4] = {};
    for (int j = 0; j < 4; ++j) kv[j] = S::load(k + c + j * W);
    for (int64_t r = r0; r < r1; ++r) {
      const T* pa = a + r * C + c;
      const T* pb = b + r * C + c;
      if (prefetch) {
        prefetch_lines(pa, ahead_bytes);
        if (pb != pa) prefetch_lines(pb, ahead_bytes);
      }
      for (int j = 0; j < 4; ++j) {
        const auto t = f(S::load(pa + j * W), S::load(pb + j * W), kv[j]);
        x0[j] += t.first;
        x1[j] += t.second;
      }
    }
    for (int j = 0; j < 4; ++j) add_to(s0 + c + j * W, x0[j]), add_to(s1 + c + j * W, x1[j]);
  }
  for (; c + W <= C; c += W) {
    const V kv = S::load(k + c);
    V x0 = {}, x1 = {};
    for (int64_t r = r0; r < r1; ++r) {
      const auto t = f(S::load(a + r * C + c), S::load(b + r * C + c), kv);
      x0 += t.first;
      x1 += t.second;
    }
    add_to(s0 + c, x0), add_to(s1 + c, x1);
  }
  for (; c < C; ++c) {
    U t0 = 0, t1 = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const auto t = f(static_cast<U>(a[r * C + c]), static_cast<U>(b[r * C + c]), k[c]);
      t0 += t.first;
      t1 += t.second;
    }
    s0[c] += t0;
    s1[c] += t1;
  }
}

// Per-thread scratch buffers that live across calls (grow-only; slot = which buffer), so that the kernels
// make no heap allocations per call. Small per-call allocations next to a large output changed glibc's
// heap layout from call to call, and in many processes it then trimmed and re-faulted part of the
// output's pages on every call (~1 ms per call at 25 MB).
template <typename V, int kSlot>
V* scratch(int64_t n) {
  thread_local std::vector<V> buf;
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// Channels-last reductions: the rows are split into one chunk per thread; `accumulate(r0, r1, out)` sums
// rows [r0, r1) (at most kRowBlock of them, in the data's precision) and adds the sums to the chunk's double
// partials out[nk * channels]. The caller adds the chunks in order (deterministic for a given thread count).
// (The sums of each row block went through a buffer, zeroed and then added to the partials in a loop of its
// own: 8-10 % of the channels-last backward's CPU samples at 12.8 MB, perf.)
template <int64_t kRowBlock, typename F>
const double* row_partials(int64_t rows, int64_t channels, int nk, int64_t& nchunks, const F& accumulate) {
  nchunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (rows + kRowBlock - 1) / kRowBlock));
  const int64_t width = nk * channels;
  double* partial = scratch<double, 0>(nchunks * width);
  std::fill(partial, partial + nchunks * width, 0.0);
  const int64_t per = (rows + nchunks - 1) / nchunks;
  at::parallel_for(0, nchunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * per, r1 = std::min(rows, r0 + per);
      double* out = partial + k * width;
      for (int64_t r = r0; r < r1; r += kRowBlock) accumulate(r, std::min(r1, r + kRowBlock), out);
    }
  });
  return partial;
}

// The output is written with non-temporal stores (float32, AVX2 builds) when the tensors of its size that the
// pass reads and writes (`tensors`: x and y forward; dy, x and dx backward) come to 32 MB, the L3 of the
// machine this was measured on: a cached output would then only evict the inputs the pass still reads, and
// the stores skip reading the output's old lines first (ordinary stores, as in ATen's copy loop behind
// x.clone(), read each line before writing it).
// Measured on a 32 MB L3: 25 MB outputs 0.57 instead of 0.8-1.0 of ATen's time (channels-last backward); the
// 12.8 MB backward (38 MB touched) 0.87-0.94 instead of 1.01-1.14 (8 processes, in-process A/B).
// Inference (one read, one write: the pass x.clone() makes) does not stream: once its output stopped changing
// heap blocks between calls, ordinary stores measured 0.76-1.07 of a clone at 25 MB where streamed ones measured
// 0.85-1.28 (6 processes, both layouts, in-process A/B); streaming won only in the machine's fastest state, by
// 2-5 %. At 12.8 MB (x and y stay in L3 from call to call) streaming was slower still.
// A fixed size: the L3 size a VM reports (sysconf) can be the host's.
constexpr int64_t kStreamFootprintBytes = int64_t(32) << 20;

template <typename T>
bool streams_output(int64_t numel, int tensors) {
#if TORCHOPS_CPU_CAPABILITY >= 1
  return std::is_same_v<T, float> && tensors * numel * static_cast<int64_t>(sizeof(T)) >= kStreamFootprintBytes;
#else
  (void)numel, (void)tensors;
  return false;
#endif
}

// The channels-last row passes stream whole 32-byte vectors of each row: C % 8 == 0 and out aligned.
template <typename T>
bool streams_rows(const T* out, int64_t numel, int64_t C, int tensors) {
  return streams_output<T>(numel, tensors) && C % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 32 == 0;
}

inline void stream_fence(bool stream) {
#if TORCHOPS_CPU_CAPABILITY >= 1
  if (stream) _mm_sfence();  // non-temporal stores are weakly ordered: visible before the join
#else
  (void)stream;
#endif
}

// The channels-last row pass after a row_partials reduction, over the same chunk of rows per thread
// (the rows a thread summed are the ones most likely still in its cache), a whole chunk per call: the row
// loops pair the chunk's two halves (normalize_rows). fn(r0, r1) handles rows [r0, r1); stream: fn writes
// with non-temporal stores (fenced per thread).
// (Walking each chunk backwards, to start with the rows read last, measured slower: 1.0 instead of
// 0.8 of ATen's time for the channels-last backward.)
template <typename F>
void rows_by_chunk(int64_t rows, int64_t nchunks, bool stream, const F& fn) {
  const int64_t per = (rows + nchunks - 1) / nchunks;
  at::parallel_for(0, nchunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * per, r1 = std::min(rows, r0 + per);
      if (r0 < r1) fn(r0, r1);
    }
    stream_fence(stream);
  });
}

// y = normalize(x) over a channels-first run of one channel, and over channels-last rows.
template <typename T, typename U>
TORCHOPS_FBN_NO_FP_CONTRACT void normalize_run(const T* __restrict x, T* __restrict y, int64_t n, U mean, U alpha,
                                               U offset) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(normalize(static_cast<U>(x[i]), mean, alpha, offset));
}

// stream: y is written with non-temporal stores (see streams_rows); float only, C % 8 == 0, y 32-byte aligned.
template <typename T, typename U>
TORCHOPS_FBN_NO_FP_CONTRACT void normalize_rows(const T* __restrict x, T* __restrict y, int64_t rows, int64_t C,
                                                const U* __restrict mean, const U* __restrict alpha,
                                                const U* __restrict offset, bool stream) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
#if TORCHOPS_CPU_CAPABILITY >= 1
  if constexpr (std::is_same_v<T, float> && std::is_same_v<U, float>) {
    // Intrinsics, one rounding each: the same (x - mean) * alpha + offset as the loop below.
    auto norm = [](__m256 v, __m256 m, __m256 a, __m256 o) {
      return _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, m), a), o);
    };
    if (stream) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * C;
        float* yr = y + r * C;
        for (int64_t c = 0; c < C; c += 8)
          _mm256_stream_ps(yr + c, norm(_mm256_loadu_ps(xr + c), _mm256_loadu_ps(mean + c), _mm256_loadu_ps(alpha + c),
                                        _mm256_loadu_ps(offset + c)));
      }
      return;
    }
    if (C % 8 == 0) {
      // The rows' two halves walked together, each coefficient vector loaded once for a row of each: four
      // loads per vector of x (x and three coefficients) kept the load ports as busy as the L3 stream; with
      // 2.5 the loop measured 0.97-1.12x a clone in the op's process where the one-row loop ran at 1.23-1.40x
      // (12.8 MB, channels-last). Two far-apart halves, not adjacent rows: adjacent pairs measured 1.5-2x slower.
      const int64_t half = rows / 2, H = half * C;
      for (int64_t r = 0; r < half; ++r) {
        const float* xr = x + r * C;
        float* yr = y + r * C;
        for (int64_t c = 0; c < C; c += 8) {
          __m256 m = _mm256_loadu_ps(mean + c), a = _mm256_loadu_ps(alpha + c), o = _mm256_loadu_ps(offset + c);
          // Held in registers for both rows: otherwise GCC folds each into both rows' arithmetic as a memory
          // operand, eight loads per pair instead of five (12.8 MB: median 1.13x a clone, 1.04x with this).
          asm("" : "+x"(m), "+x"(a), "+x"(o));
          _mm256_storeu_ps(yr + c, norm(_mm256_loadu_ps(xr + c), m, a, o));
          _mm256_storeu_ps(yr + H + c, norm(_mm256_loadu_ps(xr + H + c), m, a, o));
        }
      }
      if (rows % 2) {
        const float* xr = x + (rows - 1) * C;
        float* yr = y + (rows - 1) * C;
        for (int64_t c = 0; c < C; c += 8)
          _mm256_storeu_ps(yr + c, norm(_mm256_loadu_ps(xr + c), _mm256_loadu_ps(mean + c), _mm256_loadu_ps(alpha + c),
                                        _mm256_loadu_ps(offset + c)));
      }
      return;
    }
  }
#endif
  (void)stream;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    for (int64_t c = 0; c < C; ++c)
      yr[c] = static_cast<T>(normalize(static_cast<U>(xr[c]), mean[c], alpha[c], offset[c]));
  }
}

template <typename T, typename U>
void train_forward_typed(const Layout& L, const T* x, const U* scale, const U* offset, U eps, T* y, U* mean_out,
                         U* var_out) {
  const int64_t C = L.channels, inner = L.inner, outer = L.outer, n = L.n();
  if (inner > 1) {
    const RunPrefetch<T> prefetch(C, inner, outer, 512);
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0;
        for (int64_t o = 0; o < outer; ++o) {
          prefetch(x, o, c);
          s += sum_run<T, U>(x + (o * C + c) * inner, inner);
        }
        const U mean = static_cast<U>(s / n);
        double q = 0;
        for (int64_t o = 0; o < outer; ++o) q += sum_sq_dev_run<T, U>(x + (o * C + c) * inner, inner, mean);
        const U var = static_cast<U>(q / n);
        mean_out[c] = mean;
        var_out[c] = var;
        const U alpha = scaling_factor(var, eps, scale[c], c, C), off = offset[c];
        for (int64_t o = 0; o < outer; ++o)
          normalize_run(x + (o * C + c) * inner, y + (o * C + c) * inner, inner, mean, alpha, off);
      }
    });
    return;
  }
  // Channels-last: one reduction pass of sums shifted by the first row (K), then the row pass:
  //   mean = K + S1/n,  var = S2/n - (S1/n)^2  with S1 = sum(x-K), S2 = sum((x-K)^2).
  // Shifting by a sample of the data keeps the difference well conditioned; totals are in double.
  int64_t nchunks = 0;
  U* shift = scratch<U, 2>(3 * C);
  U* mean = shift + C;
  U* alpha = shift + 2 * C;
  for (int64_t c = 0; c < C; ++c) shift[c] = static_cast<U>(x[c]);
  const double* sums = row_partials<kRowBlockStats>(outer, C, 2, nchunks, [&](int64_t r0, int64_t r1, double* out) {
    column_sums2<T, U>(x, x, C, r0, r1, shift, out, out + C, [](auto v, auto, auto k) {
      const auto d = v - k;
      return std::make_pair(d, d * d);
    });
  });
  for (int64_t c = 0; c < C; ++c) {
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < nchunks; ++k) s1 += sums[2 * k * C + c], s2 += sums[2 * k * C + C + c];
    const double d = s1 / n;
    const U var = static_cast<U>(std::max(s2 / n - d * d, 0.0));
    mean[c] = static_cast<U>(shift[c] + d);
    mean_out[c] = mean[c];
    var_out[c] = var;
  }
  scaling_factors(var_out, eps, scale, alpha, C);
  const bool stream = streams_rows(y, outer * C, C, 2);
  rows_by_chunk(outer, nchunks, stream, [&](int64_t r0, int64_t r1) {
    normalize_rows(x + r0 * C, y + r0 * C, r1 - r0, C, mean, alpha, offset, stream);
  });
}

// y = normalize(x) over channels-first planes [k0, k1) (plane k has channel k % C) as one flat run: the
// vectors stay aligned to y and run across plane boundaries, a vector that straddles one taking its first
// lanes' coefficients from one plane and the rest from the next. Walking plane by plane instead (as
// normalize_run does) left 14x14 planes (784 bytes) with a short tail each and half their vectors off
// alignment (12.8 MB in-process: 1.21x a clone, 1.07x with this). Needs inner >= W (a vector straddles at
// most one boundary); same operations per element as normalize_run, so the same bits.
template <typename U>
TORCHOPS_FBN_NO_FP_CONTRACT void normalize_planes_flat(const U* __restrict x, U* __restrict y, int64_t k0,
                                                       int64_t k1, int64_t inner, int64_t C, const U* mean,
                                                       const U* alpha, const U* offset) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
  using S = Simd<U>;
  using V = typename S::V;
  constexpr int W = S::kWidth;
  auto store = [](U* p, V v) { std::memcpy(p, &v, sizeof(V)); };  // at an aligned y + f
  int64_t f = k0 * inner, plane_end = f + inner, c = k0 % C;
  const int64_t end = k1 * inner;
  auto next_plane = [&] {
    c = c + 1 == C ? 0 : c + 1;
    plane_end += inner;
  };
  // Scalar head up to y's vector alignment.
  for (; f < end && reinterpret_cast<uintptr_t>(y + f) % sizeof(V) != 0; ++f) {
    if (f == plane_end) next_plane();
    y[f] = normalize(x[f], mean[c], alpha[c], offset[c]);
  }
  V lane;
  for (int j = 0; j < W; ++j) lane[j] = static_cast<U>(j);
  while (f + W <= end) {
    if (f == plane_end) next_plane();
    const V m = S::splat(mean[c]), a = S::splat(alpha[c]), o = S::splat(offset[c]);
    // Two vectors per step: 12.8 MB of 14x14 planes ran 1.07-1.11x a plain x * 2 pass with one (bench
    // pattern, 5 processes), 0.98-1.01x with two and the broadcast splat above.
    for (; f + 2 * W <= plane_end; f += 2 * W) {
      const V v0 = S::load(x + f), v1 = S::load(x + f + W);
      store(y + f, (v0 - m) * a + o);
      store(y + f + W, (v1 - m) * a + o);
    }
    if (f + W <= plane_end) {
      store(y + f, (S::load(x + f) - m) * a + o);
      f += W;
    }
    if (f == plane_end || f + W > end) continue;
    // The vector across the boundary: lanes below it from channel c, the rest from the next plane's.
    const int64_t c2 = c + 1 == C ? 0 : c + 1;
    const auto first = lane < static_cast<U>(plane_end - f);
    const V m2 = first ? m : S::splat(mean[c2]), a2 = first ? a : S::splat(alpha[c2]);
    const V o2 = first ? o : S::splat(offset[c2]);
    store(y + f, (S::load(x + f) - m2) * a2 + o2);
    f += W;
    next_plane();
  }
  for (; f < end; ++f) {
    if (f == plane_end) next_plane();
    y[f] = normalize(x[f], mean[c], alpha[c], offset[c]);
  }
}

// y = normalize(x) with per-channel (mean, alpha, offset); elementwise over the whole tensor.
template <typename T, typename U>
void normalize_all(const Layout& L, const T* x, const U* mean, const U* alpha, const U* offset, T* y) {
  const int64_t C = L.channels, inner = L.inner;
  if constexpr (std::is_same_v<T, U>) {
    if (inner >= Simd<U>::kWidth) {
      at::parallel_for(0, L.outer * C, std::max<int64_t>(1, 16384 / inner), [&](int64_t k0, int64_t k1) {
        normalize_planes_flat<U>(x, y, k0, k1, inner, C, mean, alpha, offset);
      });
      return;
    }
  }
  if (inner > 1) {
    at::parallel_for(0, L.outer * C, std::max<int64_t>(1, 16384 / inner), [&](int64_t k0, int64_t k1) {
      // The channel advances with the plane (no division per plane: small planes, e.g. 14x14, made it
      // a visible cost).
      for (int64_t k = k0, c = k0 % C; k < k1; ++k, c = c + 1 == C ? 0 : c + 1)
        normalize_run(x + k * inner, y + k * inner, inner, mean[c], alpha[c], offset[c]);
    });
    return;
  }
  // Ordinary stores (see kStreamFootprintBytes).
  at::parallel_for(0, L.outer, std::max<int64_t>(1, 16384 / C), [&](int64_t r0, int64_t r1) {
    normalize_rows(x + r0 * C, y + r0 * C, r1 - r0, C, mean, alpha, offset, false);
  });
}

// The gradient's rsqrt(var + eps): TF's for inference (x_backprop = dy * (rsqrt * scale) is then TF's bit
// for bit); exact for training, whose sums differ from TF's in order anyway.
template <typename U>
inline U grad_rsqrt(U var, U eps, int64_t c, int64_t C, bool training) {
  return training ? inv_std(var, eps) : tf_rsqrt(var, eps, c, C);
}

// dx over channels-last rows: grad_input with the coefficients of channel c in k[c], md[c] (mean_dy), c2[c].
template <typename T, typename U>
void grad_input_rows(const T* __restrict dy, const T* __restrict x, T* __restrict dx, int64_t rows, int64_t C,
                     const U* __restrict mu, const U* __restrict k, const U* __restrict md, const U* __restrict c2,
                     bool stream) {
#if TORCHOPS_CPU_CAPABILITY >= 1
  if constexpr (std::is_same_v<T, float> && std::is_same_v<U, float>) {
    if (stream) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* g = dy + r * C;
        const float* xr = x + r * C;
        float* out = dx + r * C;
        for (int64_t c = 0; c < C; c += 8) {
          // k * ((dy - mean_dy) - (x - mu) * c2), as grad_input (the FMA as the loop below contracts it).
          const __m256 xc = _mm256_sub_ps(_mm256_loadu_ps(xr + c), _mm256_loadu_ps(mu + c));
          const __m256 d = _mm256_fnmadd_ps(xc, _mm256_loadu_ps(c2 + c),
                                            _mm256_sub_ps(_mm256_loadu_ps(g + c), _mm256_loadu_ps(md + c)));
          _mm256_stream_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(k + c), d));
        }
      }
      return;
    }
  }
#endif
  (void)stream;
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = dy + r * C;
    const T* xr = x + r * C;
    T* out = dx + r * C;
    for (int64_t c = 0; c < C; ++c)
      out[c] = static_cast<T>(grad_input(static_cast<U>(g[c]), static_cast<U>(xr[c]), mu[c], GradCoefs<U>{k[c], md[c], c2[c]}));
  }
}

template <typename T, typename U>
void backward_typed(const Layout& L, const T* dy, const T* x, const U* scale, const U* mu, const U* var, U eps,
                    bool training, T* dx, U* dscale, U* doffset) {
  const int64_t C = L.channels, inner = L.inner, outer = L.outer, n = L.n();
  if (inner > 1) {
    const RunPrefetch<T> prefetch(C, inner, outer, 0);
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s_dy = 0, s_dyxc = 0;
        for (int64_t o = 0; o < outer; ++o) {
          double a, b;
          const int64_t off = (o * C + c) * inner;
          prefetch(dy, o, c), prefetch(x, o, c);
          grad_sums_run<T, U>(dy + off, x + off, inner, mu[c], a, b);
          s_dy += a, s_dyxc += b;
        }
        const U r = grad_rsqrt(var[c], eps, c, C, training);
        const GradCoefs<U> g =
            grad_coefs<U>(scale[c], var[c], eps, static_cast<U>(s_dy), static_cast<U>(s_dyxc), n, training, r);
        doffset[c] = static_cast<U>(s_dy);
        dscale[c] = static_cast<U>(s_dyxc) * r;
        const U m = mu[c];
        for (int64_t o = 0; o < outer; ++o) {
          const int64_t off = (o * C + c) * inner;
          const T* gp = dy + off;
          const T* xp = x + off;
          T* out = dx + off;
          for (int64_t i = 0; i < inner; ++i)
            out[i] = static_cast<T>(grad_input(static_cast<U>(gp[i]), static_cast<U>(xp[i]), m, g));
        }
      }
    });
    return;
  }
  int64_t nchunks = 0;
  const double* sums = row_partials<kRowBlockGrad>(outer, C, 2, nchunks, [&](int64_t r0, int64_t r1, double* out) {
    column_sums2<T, U>(dy, x, C, r0, r1, mu, out, out + C,
                       [](auto g, auto v, auto m) { return std::make_pair(g, g * (v - m)); });
  });
  // The coefficients as three arrays (k, mean_dy, c2): the row loop then loads each as a vector.
  U* coefs = scratch<U, 2>(3 * C);
  for (int64_t c = 0; c < C; ++c) {
    double s_dy = 0, s_dyxc = 0;
    for (int64_t k = 0; k < nchunks; ++k) s_dy += sums[2 * k * C + c], s_dyxc += sums[2 * k * C + C + c];
    const U r = grad_rsqrt(var[c], eps, c, C, training);
    const GradCoefs<U> g =
        grad_coefs<U>(scale[c], var[c], eps, static_cast<U>(s_dy), static_cast<U>(s_dyxc), n, training, r);
    coefs[c] = g.k, coefs[C + c] = g.mean_dy, coefs[2 * C + c] = g.c2;
    doffset[c] = static_cast<U>(s_dy);
    dscale[c] = static_cast<U>(s_dyxc) * r;
  }
  const bool stream = streams_rows(dx, outer * C, C, 3);
  rows_by_chunk(outer, nchunks, stream, [&](int64_t r0, int64_t r1) {
    grad_input_rows(dy + r0 * C, x + r0 * C, dx + r0 * C, r1 - r0, C, mu, coefs, coefs + C, coefs + 2 * C, stream);
  });
}

void train_forward_cpu(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       double eps, at::Tensor& y, at::Tensor& mean_out, at::Tensor& var_out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    train_forward_typed<scalar_t, U>(L, x.const_data_ptr<scalar_t>(), scale.const_data_ptr<U>(),
                                     offset.const_data_ptr<U>(), static_cast<U>(eps), y.mutable_data_ptr<scalar_t>(),
                                     mean_out.mutable_data_ptr<U>(), var_out.mutable_data_ptr<U>());
  });
}

void infer_forward_cpu(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       const at::Tensor& mean, const at::Tensor& var, double eps, at::Tensor& y) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    const U* s = scale.const_data_ptr<U>();
    const U* v = var.const_data_ptr<U>();
    U* alpha = scratch<U, 2>(L.channels);
    scaling_factors(v, static_cast<U>(eps), s, alpha, L.channels);
    normalize_all<scalar_t, U>(L, x.const_data_ptr<scalar_t>(), mean.const_data_ptr<U>(), alpha,
                               offset.const_data_ptr<U>(), y.mutable_data_ptr<scalar_t>());
  });
}

void backward_cpu(const Layout& L, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                  const at::Tensor& mu, const at::Tensor& var, double eps, bool training, at::Tensor& dx,
                  at::Tensor& dscale, at::Tensor& doffset) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_grad_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    backward_typed<scalar_t, U>(L, dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                scale.const_data_ptr<U>(), mu.const_data_ptr<U>(), var.const_data_ptr<U>(),
                                static_cast<U>(eps), training, dx.mutable_data_ptr<scalar_t>(),
                                dscale.mutable_data_ptr<U>(), doffset.mutable_data_ptr<U>());
  });
}

}  // namespace
}  // namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE

template <>
const Kernels& cpu_loops<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
  static const Kernels k{train_forward_cpu, infer_forward_cpu, backward_cpu};
  return k;
}

}  // namespace fbn
}  // namespace torchops

// Helpers of the recurrent op families' device-independent time loops (block_rnn, cudnn_rnn): the
// packed recurrent GEMM of the CPU time loops and the per-thread batch slicing.
#pragma once

#include "cpu/packed_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>

// MKL's packed-operand GEMM, exported by libtorch_cpu in MKL builds of PyTorch (x86). Declared weak
// (ELF): in builds without it the pointers are null and StepGemm below falls back to the ATen GEMM. The
// enum arguments are MKL's CBLAS enums (int-sized C enums).
#if defined(__linux__) && defined(__GNUC__)
#define TORCHOPS_MKL_PACKED_GEMM 1
extern "C" {
__attribute__((weak)) size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
__attribute__((weak)) void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                                            const float* src, int ld, float* dest);
__attribute__((weak)) void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k,
                                               const float* a, int lda, const float* b, int ldb, float beta,
                                               float* c, int ldc);
}
#endif

namespace torchops {
namespace rnn_util {

// The recurrent GEMM of a time loop, out (+)= a @ op(w), with the same weight view on every step. On
// the CPU in float32 the weight is packed once per call instead of inside every step's GEMM: for
// torchops' own kernel (cpu/packed_gemm.h, CPUs with AVX2 + FMA) or else for MKL's packed GEMM
// (cblas_sgemm_pack: BlockLSTM T=50 B=32 C=256 spent ~10 % of its time re-packing in plain sgemm), as their
// routes (cpu::gemm_route) allow. Otherwise (other dtypes/devices, one step, neither kernel) the ATen GEMM.
class StepGemm {
 public:
  // w: [K, N] (trans: [N, K], used as its transpose), unit column stride; `rows` = rows of every `a`.
  StepGemm(const at::Tensor& w, bool trans, int64_t rows, int64_t steps) : w_(w), trans_(trans) {
    const int64_t n = trans ? w.size(0) : w.size(1), k = trans ? w.size(1) : w.size(0);
    const int64_t lim = std::numeric_limits<int>::max() / 2;
    if (steps < 2 || !w.is_cpu() || w.scalar_type() != at::kFloat || w.stride(1) != 1 || rows <= 0 || rows > lim ||
        n <= 0 || n > lim || k <= 0 || k > lim || w.stride(0) > lim || w.stride(0) < (trans ? k : n)) {
      if (steps >= 2 && w.is_cpu()) cpu::gemm_route::aten.ran();
      return;
    }
    m_ = static_cast<int>(rows);
    n_ = static_cast<int>(n);
    k_ = static_cast<int>(k);
    variant_ = cpu::packed_gemm_variant();
    if (variant_ >= 0) {
      (variant_ == 0 ? cpu::gemm_route::packed_avx512 : cpu::gemm_route::packed_avx2).ran();
      packed_ = at::empty({cpu::packed_gemm_size(variant_, k, n)}, w.options());
      cpu::packed_gemm_pack(variant_, w.const_data_ptr<float>(), w.stride(0), trans, k, n,
                            packed_.mutable_data_ptr<float>());
      return;
    }
#ifdef TORCHOPS_MKL_PACKED_GEMM
    if (!cblas_sgemm_pack_get_size || !cblas_sgemm_pack || !cblas_sgemm_compute || !cpu::gemm_route::mkl_packed.enabled()) {
      cpu::gemm_route::aten.ran();
      return;
    }
    cpu::gemm_route::mkl_packed.ran();
    const size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, m_, n_, k_);
    packed_ = at::empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, w.options());
    cblas_sgemm_pack(kRowMajor, kBMatrix, trans ? kTrans : kNoTrans, m_, n_, k_, 1.0f, w.const_data_ptr<float>(),
                     static_cast<int>(w.stride(0)), packed_.mutable_data_ptr<float>());
#else
    cpu::gemm_route::aten.ran();
#endif
  }
  // Whether a StepGemm of w would use torchops' kernel (float32 on a CPU with it): callers then also route
  // one-off GEMMs through it (packing costs a copy of w; the kernel beats MKL's generic path on AMD).
  static bool own_kernel(const at::Tensor& w) {
    return w.is_cpu() && w.scalar_type() == at::kFloat && cpu::packed_gemm_variant() >= 0;
  }
  void addmm(at::Tensor& out, const at::Tensor& a) const { run(out, a, 1.0f); }  // out += a @ op(w)
  void mm(at::Tensor& out, const at::Tensor& a) const { run(out, a, 0.0f); }     // out = a @ op(w)
  // out = bias + a @ op(w), bias [N] added to every row (the input projections; any number of rows).
  void bias_addmm(at::Tensor out, const at::Tensor& bias, const at::Tensor& a) const {
    if (variant_ < 0) {
      at::addmm_out(out, bias, a, trans_ ? w_.t() : w_);
      return;
    }
    out.copy_(bias.expand_as(out));
    run(out, a, 1.0f);
  }

 private:
  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
  void run(at::Tensor& out, const at::Tensor& a, float beta) const {
    // BLAS leading dimensions must cover a row: a size-1 dimension may carry any stride (a [1, n]
    // tensor with strides (1, 1) is "contiguous"), so such operands take the ATen path.
    // (torchops' kernel takes any number of rows, and reads a transposed view of `a` in place; MKL's packed
    // B is for `rows` rows.)
    const bool own = variant_ >= 0;
    const bool a_trans = own && a.stride(1) != 1 && a.stride(0) == 1 && a.size(0) > 1;
    const int64_t lda = a_trans ? a.stride(1) : a.stride(0);
    if (!packed_.defined() || (a.stride(1) != 1 && !a_trans) || out.stride(1) != 1 || (!own && a.size(0) != m_) ||
        lda < (a_trans ? a.size(0) : k_) || out.stride(0) < n_ || lda > std::numeric_limits<int>::max() ||
        out.stride(0) > std::numeric_limits<int>::max()) {
      const at::Tensor w = trans_ ? w_.t() : w_;
      if (beta == 0.0f)
        at::mm_out(out, a, w);
      else
        out.addmm_(a, w);
      return;
    }
    if (own) {
      cpu::packed_gemm_compute(variant_, a.size(0), n_, k_, a.const_data_ptr<float>(), lda, a_trans, packed_.const_data_ptr<float>(),
                               beta != 0.0f, out.mutable_data_ptr<float>(), out.stride(0));
      return;
    }
#ifdef TORCHOPS_MKL_PACKED_GEMM
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m_, n_, k_, a.const_data_ptr<float>(),
                        static_cast<int>(a.stride(0)), packed_.const_data_ptr<float>(), n_, beta,
                        out.mutable_data_ptr<float>(), static_cast<int>(out.stride(0)));
#endif
  }
  at::Tensor w_;
  bool trans_;
  int variant_ = -1;  // packed for cpu::packed_gemm_compute of this variant (-1: MKL's format, or none)
  int m_ = 0, n_ = 0, k_ = 0;
  at::Tensor packed_;
};

// The recurrent GEMM of a bfloat16 CPU time loop with float32 output, out32 (+)= a @ op(w): w (bfloat16
// [K, N], trans: [N, K], unit column stride) packed once per call for torchops' AVX-512 BF16 kernel, shared by
// the batch-slice threads. packed() is false where the kernel's route is off or the CPU lacks it (the callers
// then run ATen's bfloat16 GEMM, route rnn.cpu.aten_bf16); built outside the slices, its packing splits over
// the threads.
class Bf16StepGemm {
 public:
  Bf16StepGemm(const at::Tensor& w, bool trans) {
    if (!w.is_cpu() || w.scalar_type() != at::kBFloat16) return;
    if (w.stride(1) != 1 || w.numel() == 0 || !cpu::packed_gemm_bf16_available()) {
      cpu::gemm_route::aten_bf16.ran();
      return;
    }
    cpu::gemm_route::packed_avx512_bf16.ran();
    n_ = trans ? w.size(0) : w.size(1);
    k_ = trans ? w.size(1) : w.size(0);
    packed_ = at::empty({cpu::packed_gemm_bf16_size(k_, n_)}, w.options());
    cpu::packed_gemm_bf16_pack(bits(w), w.stride(0), trans, k_, n_,
                               reinterpret_cast<uint16_t*>(packed_.mutable_data_ptr()));
  }
  bool packed() const { return packed_.defined(); }
  // Counts route rnn.cpu.aten_bf16 where a bfloat16 CPU loop runs ATen's GEMM without trying the kernel (one
  // step: packing w would cost as much as the product).
  static void ran_aten() { cpu::gemm_route::aten_bf16.ran(); }
  // dst (bfloat16, contiguous) = src (float32, contiguous, as many elements) rounded; only where packed().
  static void round_into(const at::Tensor& dst, const at::Tensor& src) {
    cpu::packed_gemm_bf16_round(src.const_data_ptr<float>(), src.numel(),
                                reinterpret_cast<uint16_t*>(dst.mutable_data_ptr()));
  }
  // dst (float32, contiguous) = src (bfloat16, contiguous, as many elements); only where packed().
  static void widen_into(const at::Tensor& dst, const at::Tensor& src) {
    cpu::packed_gemm_bf16_widen(reinterpret_cast<const uint16_t*>(src.const_data_ptr()), src.numel(),
                                dst.mutable_data_ptr<float>());
  }
  // out (bfloat16) = a @ op(w), or += with accumulate, the float32 sum rounded once; scratch32: float32 [M, N],
  // contiguous.
  void run_rounded(const at::Tensor& out, const at::Tensor& a, bool accumulate, const at::Tensor& scratch32) const {
    const bool flat = out.is_contiguous();
    if (accumulate) flat ? widen_into(scratch32, out) : void(scratch32.copy_(out));
    run(scratch32, a, accumulate);
    flat ? round_into(out, scratch32) : void(out.copy_(scratch32));
  }
  // out32 (float32 [M, N], unit column stride) = a @ op(w), or += with accumulate; a: bfloat16 [M, K].
  void run(const at::Tensor& out32, const at::Tensor& a, bool accumulate) const {
    const at::Tensor ac = a.stride(1) == 1 && (a.size(0) == 1 || a.stride(0) >= k_) ? a : a.contiguous();
    cpu::packed_gemm_bf16_compute(ac.size(0), n_, k_, bits(ac), ac.size(0) == 1 ? k_ : ac.stride(0),
                                  reinterpret_cast<const uint16_t*>(packed_.const_data_ptr()), accumulate,
                                  out32.mutable_data_ptr<float>(), out32.stride(0));
  }

 private:
  static const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr()); }
  int64_t n_ = 0, k_ = 0;
  at::Tensor packed_;
};

// The batch-slice threads of a time loop (for_batch_slices) share one StepGemm of w when torchops' kernel
// takes it: its packed weight serves any number of rows, so it is packed once before the slices, over all
// threads, instead of once per slice (each thread packed the whole weight). Else none: each slice builds
// its own (slice_gemm). Only read afterwards, so the threads may use it together.
inline std::optional<StepGemm> shared_step_gemm(const at::Tensor& w, bool trans, int64_t steps) {
  if (steps < 2 || !StepGemm::own_kernel(w)) return std::nullopt;
  return std::optional<StepGemm>(std::in_place, w, trans, /*rows=*/1, steps);
}

// The shared StepGemm if there is one, else one for this slice's rows built into `local`.
inline const StepGemm& slice_gemm(const std::optional<StepGemm>& shared, std::optional<StepGemm>& local,
                                  const at::Tensor& w, bool trans, int64_t rows, int64_t steps) {
  return shared ? *shared : local.emplace(w, trans, rows, steps);
}

// at::parallel_for over [0, n) (grain 1) whose workers carry the caller's thread-local state: the op's
// dispatch state (autograd excluded, grad mode) for the ATen calls they make.
template <typename F>
inline void parallel_with_state(int64_t n, const F& fn) {
  const at::ThreadLocalState tls;
  at::parallel_for(0, n, 1, [&](int64_t k0, int64_t k1) {
    const at::ThreadLocalStateGuard guard(tls);
    fn(k0, k1);
  });
}

// The time loops on the CPU run one slice of the batch per intra-op thread. Batch rows never interact
// inside the recurrence, so each thread runs every step of its own rows (its GEMMs single-threaded, its
// element-wise kernels inline) and the threads meet once per call instead of twice per step (the GEMM's
// and the element-wise kernel's fork/join). fn(b0, b1) runs rows [b0, b1); on other devices, with one
// thread, one row, inside a parallel region, or when `split` is false: fn(0, B).
template <typename F>
inline void for_batch_slices(const at::Tensor& x, int64_t B, bool split, const F& fn) {
  const int64_t n =
      split && x.is_cpu() && !at::in_parallel_region() ? std::min<int64_t>(at::get_num_threads(), B) : 1;
  if (n <= 1) {
    fn(0, B);
    return;
  }
  const int64_t per = (B + n - 1) / n;
  parallel_with_state(n, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t b0 = k * per, b1 = std::min(B, b0 + per);
      if (b0 < b1) fn(b0, b1);
    }
  });
}

// Rows [b0, b0 + nb) of a [T, B, ...] (dim 1) or [B, ...] (dim 0) tensor; undefined stays undefined.
inline at::Tensor rows_of(const at::Tensor& t, int64_t dim, int64_t b0, int64_t nb) {
  return t.defined() ? t.narrow(dim, b0, nb) : t;
}

}  // namespace rnn_util
}  // namespace torchops

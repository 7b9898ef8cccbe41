// CudnnRNN family: validation (TF's order and wording where TF has a message), the params layout,
// and the device-independent orchestration of the forward and backward.
//
// One algorithm on every device. Per layer and direction: one GEMM for the input projection of all time
// steps (written straight into the gate buffer of reserve_space), then per step one recurrent GEMM and
// one fused gate kernel (per-device, csrc/{cpu,cuda}/cudnn_rnn_kernel.*); variable lengths by masking
// (inactive rows keep their state and output 0). The backward runs through time from what the forward
// kept in reserve_space; weight gradients are GEMMs over all steps after the time loop. float16 and
// bfloat16 compute in float32 (their reserve_space is the float32 buffer, bit-packed).
#include "cudnn_rnn/cudnn_rnn.h"
#include "common/arg_checks.h"
#include "rnn_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Storage.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace torchops {
namespace crnn {
namespace {

using at::Tensor;
using rnn_util::for_batch_slices;
using rnn_util::rows_of;
using rnn_util::shared_step_gemm;
using rnn_util::slice_gemm;
using rnn_util::StepGemm;

int parse_mode(Str s) {
  if (s == "rnn_relu") return kRelu;
  if (s == "rnn_tanh") return kTanh;
  if (s == "lstm") return kLstm;
  if (s == "gru") return kGru;
  TORCH_CHECK(false, "rnn_mode must be one of 'rnn_relu', 'rnn_tanh', 'lstm', 'gru', got '", std::string(s), "'");
}
// 0 linear_input, 1 skip_input, 2 auto_select
int parse_input_mode(Str s) {
  if (s == "linear_input") return 0;
  if (s == "skip_input") return 1;
  if (s == "auto_select") return 2;
  TORCH_CHECK(false, "input_mode must be one of 'linear_input', 'skip_input', 'auto_select', got '", std::string(s),
              "'");
}
int64_t parse_direction(Str s) {
  if (s == "unidirectional") return 1;
  if (s == "bidirectional") return 2;
  TORCH_CHECK(false, "direction must be 'unidirectional' or 'bidirectional', got '", std::string(s), "'");
}
int gates_of(int mode) { return mode == kLstm ? 4 : mode == kGru ? 3 : 1; }

void check_dropout(double p) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "dropout must be in [0, 1], got ", p);
}

// Resolves skip_input: explicit skip requires I == H; auto_select picks it iff I == H.
bool resolve_skip(int input_mode, int64_t I, int64_t H) {
  if (input_mode == 1) {
    TORCH_CHECK(I == H, "input_mode 'skip_input' requires input_size == num_units, got input_size ", I,
                " and num_units ", H);
    return true;
  }
  return input_mode == 2 && I == H;
}

int64_t in_width(const Cfg& c, int64_t l) { return l == 0 ? (c.skip ? 0 : c.I) : c.D * c.O; }

Layout make_layout(const Cfg& c) {
  Layout lay;
  const int64_t npl = c.L * c.D;
  int64_t off = 0;
  for (int64_t pl = 0; pl < npl; ++pl) {
    const int64_t in = in_width(c, pl / c.D);
    lay.w_off.push_back(off);
    for (int g = 0; g < c.G; ++g) {
      lay.weights.push_back({off, c.H, in});
      off += c.H * in;
    }
    lay.r_off.push_back(off);
    for (int g = 0; g < c.G; ++g) {
      lay.weights.push_back({off, c.H, c.O});
      off += c.H * c.O;
    }
    lay.p_off.push_back(off);
    if (c.P > 0) {
      lay.weights.push_back({off, c.P, c.H});
      off += c.P * c.H;
    }
  }
  for (int64_t pl = 0; pl < npl; ++pl) {
    const bool skip0 = c.skip && pl / c.D == 0;
    lay.bw_off.push_back(off);
    for (int g = 0; g < c.G; ++g) {
      lay.biases.push_back({off, skip0 ? 0 : c.H, -1});
      off += skip0 ? 0 : c.H;
    }
    lay.br_off.push_back(off);
    for (int g = 0; g < c.G; ++g) {
      lay.biases.push_back({off, c.H, -1});
      off += c.H;
    }
  }
  lay.size = off;
  return lay;
}

// The params size of a configuration in closed form and checked arithmetic (equals make_layout(c).size),
// so that sizes are validated before any per-layer bookkeeping is built.
int64_t params_size_of(const Cfg& c) {
  const char* w = "the params size (CudnnRNNParamsSize) of this configuration";
  const int64_t GH = checked_mul(c.G, c.H, w);
  int64_t per_dir = checked_mul(GH, c.skip ? 0 : c.I, w);  // layer 0's input matrices
  per_dir = checked_add(per_dir, checked_mul(checked_mul(GH, checked_mul(c.D, c.O, w), w), c.L - 1, w), w);
  const int64_t rec = checked_add(checked_mul(GH, c.O, w), checked_mul(c.P, c.H, w), w);  // R (+ projection)
  per_dir = checked_add(per_dir, checked_mul(rec, c.L, w), w);
  per_dir = checked_add(per_dir, checked_mul(GH, checked_mul(2, c.L, w) - (c.skip ? 1 : 0), w), w);  // b_W, b_R
  return checked_mul(per_dir, c.D, w);
}

// TF passes num_layers, num_units and input_size as int32 tensors.
void check_int32_size(int64_t v, const char* name) {
  TORCH_CHECK_VALUE(v <= std::numeric_limits<int32_t>::max(), name, " must be <= 2147483647 (int32), got ", v);
}

// The attributes every op checks first, in TF's order: mode (and its gate count), input mode (into `im`),
// direction, dropout.
Cfg attr_cfg(Str rnn_mode, Str input_mode, Str direction, double dropout, int& im) {
  Cfg c;
  c.mode = parse_mode(rnn_mode);
  c.G = gates_of(c.mode);
  im = parse_input_mode(input_mode);
  c.D = parse_direction(direction);
  check_dropout(dropout);
  return c;
}

// Configuration of the size/converter ops from their int inputs and attrs (torchops' own checks).
Cfg model_cfg(int64_t num_layers, int64_t num_units, int64_t input_size, Str rnn_mode, Str input_mode, Str direction,
              double dropout, int64_t num_proj) {
  int im = 0;
  Cfg c = attr_cfg(rnn_mode, input_mode, direction, dropout, im);
  TORCH_CHECK(num_layers >= 1, "num_layers must be >= 1, got ", num_layers);
  TORCH_CHECK(num_units >= 1, "num_units must be >= 1, got ", num_units);
  TORCH_CHECK(input_size >= 1, "input_size must be >= 1, got ", input_size);
  TORCH_CHECK(num_proj >= 0, "num_proj must be >= 0, got ", num_proj);
  TORCH_CHECK(num_proj == 0 || c.mode == kLstm, "num_proj > 0 is only supported with rnn_mode 'lstm', got num_proj ",
              num_proj, " with rnn_mode '", std::string(rnn_mode), "'");
  TORCH_CHECK(num_proj <= num_units, "num_proj must be <= num_units (", num_units, "), got ", num_proj);
  check_int32_size(num_layers, "num_layers");
  check_int32_size(num_units, "num_units");
  check_int32_size(input_size, "input_size");
  c.L = num_layers;
  c.H = num_units;
  c.I = input_size;
  c.P = num_proj;
  c.O = num_proj > 0 ? num_proj : num_units;
  c.skip = resolve_skip(im, c.I, c.H);
  return c;
}

// ---- forward / backward validation (in TF's order) ----
bool is_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

std::vector<int64_t> state_shape(bool tm, int64_t ld, int64_t B, int64_t n) {
  return tm ? std::vector<int64_t>{ld, B, n} : std::vector<int64_t>{B, ld, n};
}

void check_like(const Tensor& x, const Tensor& t, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " must have the same dtype as input (", x.scalar_type(),
              "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == x.device(), name, " must be on the same device as input (", x.device(), "), got ",
              t.device());
}

Cfg check_forward(const Tensor& input, const Tensor& input_h, const Tensor& input_c, const Tensor& params,
                  const Tensor& lens, bool has_lens, Str rnn_mode, Str input_mode, Str direction, double dropout,
                  int64_t num_proj, bool tm, const Kernels& k) {
  int im = 0;
  Cfg c = attr_cfg(rnn_mode, input_mode, direction, dropout, im);
  check_defined(input, "input");
  check_defined(input_h, "input_h");
  check_defined(input_c, "input_c");
  check_defined(params, "params");
  if (has_lens) check_defined(lens, "sequence_lengths");
  TORCH_CHECK(input.dim() == 3, "RNN input must be a 3-D vector, got rank ", input.dim(), " (shape ", input.sizes(),
              ")");
  TORCH_CHECK(input_h.dim() == 3, "RNN input_h must be a 3-D vector, got rank ", input_h.dim(), " (shape ",
              input_h.sizes(), ")");
  TORCH_CHECK(is_float(input.scalar_type()), "input must be float32, float64, float16 or bfloat16, got ",
              input.scalar_type());
  TORCH_CHECK(input.device().type() == k.device, "input is on ", input.device(), " but another argument is on ",
              c10::DeviceTypeName(k.device, true), ": every tensor must be on input's device");
  c.T = input.size(tm ? 0 : 1);
  c.B = input.size(tm ? 1 : 0);
  c.I = input.size(2);
  c.L = input_h.size(tm ? 0 : 1) / c.D;
  const int64_t o = input_h.size(2);
  const auto want_h = state_shape(tm, c.D * c.L, c.B, o);
  TORCH_CHECK(input_h.sizes() == at::IntArrayRef(want_h), "Invalid input_h shape: expected ",
              at::IntArrayRef(want_h), ", got ", input_h.sizes());
  TORCH_CHECK(c.L >= 1, "Invalid input_h shape: ", input_h.sizes(), ": num_layers (input_h.dim(",
              tm ? 0 : 1, ") / num_dirs) must be >= 1");
  if (c.mode == kLstm) {
    TORCH_CHECK(input_c.dim() == 3, "RNN input_c must be a 3-D vector, got rank ", input_c.dim());
    TORCH_CHECK(num_proj >= 0, "num_proj must be >= 0, got ", num_proj);
    if (num_proj == 0) {
      TORCH_CHECK(input_h.sizes() == input_c.sizes(), "input_h and input_c must have the same shape w/o projection: ",
                  input_h.sizes(), " ", input_c.sizes());
    } else {
      TORCH_CHECK(input_h.size(2) == num_proj && input_h.size(2) <= input_c.size(2) &&
                      input_h.size(0) == input_c.size(0) && input_h.size(1) == input_c.size(1),
                  "Invalid input_h and input_c w/ projection size: num_proj ", num_proj, ", input_h ",
                  input_h.sizes(), ", input_c ", input_c.sizes(),
                  " (input_h.dim(2) must be num_proj, at most input_c.dim(2); the other dims equal)");
    }
    c.H = input_c.size(2);
    c.P = num_proj;
    c.O = num_proj > 0 ? num_proj : c.H;
  } else {
    TORCH_CHECK(num_proj == 0, "num_proj > 0 is only supported with rnn_mode 'lstm', got num_proj ", num_proj);
    c.H = c.O = o;
  }
  // (input_c is ignored without lstm, but its dtype and device take part in dispatch)
  check_like(input, input_c, "input_c");
  TORCH_CHECK(c.H >= 1, "num_units (the state width) must be >= 1, got ", c.H);
  c.skip = resolve_skip(im, c.I, c.H);
  TORCH_CHECK(params.dim() == 1, "params must be a 1-D tensor, got rank ", params.dim());
  // Exactly the size of the configuration the inputs imply: a buffer of another configuration (another
  // input_size or rnn_mode) would be read with the wrong layout.
  const int64_t size = params_size_of(c);
  TORCH_CHECK(params.numel() == size, "params has ", params.numel(), " elements, but must have exactly ", size,
              " (CudnnRNNParamsSize of the configuration the inputs imply: rnn_mode '", std::string(rnn_mode),
              "', num_layers ", c.L, ", num_units ", c.H, ", input_size ", c.I, ", num_proj ", c.P, ", ", c.D,
              " direction(s))");
  if (has_lens) {
    TORCH_CHECK(lens.dim() == 1 && lens.scalar_type() == at::kInt,
                "sequence_lengths must be a 1-D int32 tensor, got rank ", lens.dim(), " dtype ", lens.scalar_type());
    TORCH_CHECK(lens.numel() == c.B, "sequence_lengths must have batch_size (", c.B, ") entries, got ", lens.numel());
    TORCH_CHECK(lens.device() == input.device() || lens.is_cpu(), "sequence_lengths must be on input's device (",
                input.device(), ") or the CPU, got ", lens.device());
  }
  TORCH_CHECK(c.T > 0, "max_seq_length must be > 0, got ", c.T);
  check_like(input, input_h, "input_h");
  check_like(input, params, "params");
  return c;
}

// FNV-1a over the effective sequence lengths (every length T without them): the reserve_space header
// records it, so that a backward with other lengths than its forward's is refused.
struct LensDigest {
  uint64_t h = 1469598103934665603ull;
  void add(int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
  int64_t value() const { return static_cast<int64_t>(h); }
};

// Validated sequence lengths on the compute device, or undefined when every length is T (no masking);
// *digest: their LensDigest; *host (if given): the same lengths on the CPU (the one device-to-host copy).
Tensor prepare_lens(const Tensor& lens, const Cfg& c, const at::Device& dev, int64_t* digest, Tensor* host = nullptr) {
  LensDigest dg;
  if (!lens.defined()) {
    for (int64_t b = 0; b < c.B; ++b) dg.add(c.T);
    *digest = dg.value();
    return Tensor();
  }
  const Tensor h = lens.to(at::kCPU).contiguous();
  const int32_t* p = h.const_data_ptr<int32_t>();
  bool full = true;
  for (int64_t b = 0; b < c.B; ++b) {
    TORCH_CHECK(p[b] >= 0 && p[b] <= c.T, "sequence_lengths[", b, "] = ", p[b], " must be in [0, max_seq_length = ",
                c.T, "]");
    full = full && p[b] == c.T;
    dg.add(p[b]);
  }
  *digest = dg.value();
  if (full) return Tensor();
  if (host != nullptr) *host = h;
  return h.to(dev);
}

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// ---- reserve_space layout ----
constexpr int64_t kHeaderLongs = kReserveHeaderBytes / 8;
constexpr int64_t kMagic = 0x54524e4e;  // "TRNN"

struct Res {
  Tensor buf;
  std::vector<Tensor> gates, hs, cs, ms, ghn;  // per pseudo-layer, [T, B, *]
  std::vector<Tensor> ys, masks;               // per layer boundary l < L - 1, [T, B, D*O]
};

int64_t header_elems(at::ScalarType cdt) { return kHeaderLongs * 8 / static_cast<int64_t>(c10::elementSize(cdt)); }

int64_t reserve_elems(const Cfg& c, bool has_mask, at::ScalarType cdt) {
  const char* w = "the reserve_space size";
  const int64_t TB = checked_mul(c.T, c.B, w);
  int64_t n = c.G * c.H + c.O;  // (G * H + O <= 5 * params size: no overflow)
  if (c.mode == kLstm) n += c.H * (c.P > 0 ? 2 : 1);
  if (c.mode == kGru) n += c.H;
  const int64_t per = checked_mul(TB, n, w);
  const int64_t ys = checked_mul(checked_mul(TB, c.D * c.O, w), (c.L - 1) * (has_mask ? 2 : 1), w);
  return checked_add(checked_add(header_elems(cdt), checked_mul(c.L * c.D, per, w), w), ys, w);
}

Res carve(const Cfg& c, bool has_mask, const Tensor& buf) {
  Res r;
  r.buf = buf;
  int64_t off = header_elems(buf.scalar_type());
  auto take = [&](int64_t n) {
    Tensor t = buf.narrow(0, off, c.T * c.B * n).view({c.T, c.B, n});
    off += c.T * c.B * n;
    return t;
  };
  for (int64_t pl = 0; pl < c.L * c.D; ++pl) {
    r.gates.push_back(take(c.G * c.H));
    r.hs.push_back(take(c.O));
    r.cs.push_back(c.mode == kLstm ? take(c.H) : Tensor());
    r.ms.push_back(c.mode == kLstm && c.P > 0 ? take(c.H) : Tensor());
    r.ghn.push_back(c.mode == kGru ? take(c.H) : Tensor());
  }
  for (int64_t l = 0; l + 1 < c.L; ++l) {
    r.ys.push_back(take(c.D * c.O));
    r.masks.push_back(has_mask ? take(c.D * c.O) : Tensor());
  }
  TORCH_INTERNAL_ASSERT(off == buf.numel());
  return r;
}

constexpr int64_t kLensSlot = 12;    // header slot of the sequence lengths' LensDigest
constexpr int64_t kLayoutSlot = 13;  // who wrote the reserve: the time loops (0) or the library route (1)
constexpr int64_t kLoopLayout = 0, kLibraryLayout = 1;

std::vector<int64_t> header_of(const Cfg& c, bool has_mask, int64_t total, int64_t lens_digest, int64_t layout) {
  std::vector<int64_t> h(kHeaderLongs, 0);
  const int64_t v[] = {kMagic, c.mode, c.skip, c.L, c.D,   c.H,         c.P,
                       c.I,    c.T,    c.B,    has_mask, total, lens_digest, layout};
  std::copy(std::begin(v), std::end(v), h.begin());
  return h;
}

void write_header(const Tensor& buf, const std::vector<int64_t>& hdr) {
  buf.narrow(0, 0, header_elems(buf.scalar_type()))
      .view(at::kLong)
      .copy_(at::tensor(hdr, at::TensorOptions().dtype(at::kLong)));
}

// ---- dropout ----
void fill_masks(Res& r, double p, int64_t seed, int64_t seed2) {
  const double keep = 1.0 - p, scale = p < 1.0 ? 1.0 / keep : 0.0;
  const bool seeded = seed != 0 || seed2 != 0;
  // TF's seed: (uint64(seed) << 32) | seed2. Seeded masks are drawn on the CPU, so they are the same on
  // every device; unseeded ones come from torch's default generator of the data's device.
  c10::optional<at::Generator> gen;
  if (seeded)
    gen = at::detail::createCPUGenerator((static_cast<uint64_t>(seed) << 32) | static_cast<uint32_t>(seed2));
  for (auto& m : r.masks) {
    if (!m.defined()) continue;
    if (seeded) {
      Tensor cpu = at::empty(m.sizes(), m.options().device(at::kCPU));
      cpu.bernoulli_(keep, gen);
      m.copy_(cpu);
    } else {
      m.bernoulli_(keep);
    }
    m.mul_(scale);
  }
}

}  // namespace

Tensor reserve_owning(void* data, int64_t numel, const at::TensorOptions& options, void* state,
                      void (*deleter)(void*), int64_t storage_bytes) {
  const int64_t bytes = std::max(numel * static_cast<int64_t>(options.dtype().itemsize()), storage_bytes);
  c10::DataPtr ptr(data, state, deleter, options.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return at::empty({0}, options).set_(storage, 0, {numel}, {1});
}

const void* reserve_state(const Tensor& reserve, void (*deleter)(void*)) {
  if (!reserve.has_storage() || reserve.storage_offset() != 0) return nullptr;
  const c10::DataPtr& d = reserve.storage().data_ptr();
  return d.get_deleter() == deleter ? d.get_context() : nullptr;
}

PlParams pl_params(const Cfg& c, const Layout& lay, const Tensor& p, int64_t pl) {
  const int64_t l = pl / c.D, in = in_width(c, l), GH = c.G * c.H;
  PlParams v;
  if (!(c.skip && l == 0)) v.W = p.narrow(0, lay.w_off[pl], GH * in).view({GH, in});  // (in may be 0)
  v.R = p.narrow(0, lay.r_off[pl], GH * c.O).view({GH, c.O});
  if (c.P > 0) v.Pm = p.narrow(0, lay.p_off[pl], c.P * c.H).view({c.P, c.H});
  if (!(c.skip && l == 0)) v.bW = p.narrow(0, lay.bw_off[pl], GH);
  v.bR = p.narrow(0, lay.br_off[pl], GH);
  return v;
}

namespace {

// ---- forward of one layer and direction ----
void layer_forward(const Cfg& c, const Layout& lay, const Tensor& p, int64_t l, int64_t d, const Tensor& X,
                   const Tensor& Y, const Tensor& h0, const Tensor& c0, const Tensor& lens, Res& r,
                   const Kernels& k) {
  const int64_t pl = l * c.D + d, T = c.T, B = c.B, H = c.H, O = c.O, GH = c.G * c.H;
  const PlParams w = pl_params(c, lay, p, pl);
  const Tensor gates = r.gates[pl];
  const Tensor g2d = gates.view({T * B, GH});
  // input projection of every step at once
  if (!w.W.defined()) {  // skip_input: x replaces W_g x + b_Wg
    g2d.view({T * B, c.G, H}).copy_(X.reshape({T * B, 1, H}).expand({T * B, c.G, H}));
    if (c.mode != kGru) g2d.add_(w.bR);
  } else {
    const Tensor bias = c.mode == kGru ? w.bW : at::add(w.bW, w.bR);
    at::addmm_out(const_cast<Tensor&>(g2d), bias, X.reshape({T * B, X.size(2)}), w.W.t());
  }
  const bool relu = c.mode == kRelu;
  const Tensor proj = c.P > 0 ? w.Pm : w.R;
  const auto rec_s = shared_step_gemm(w.R, /*trans=*/true, T);
  const auto prj_s = shared_step_gemm(proj, /*trans=*/true, c.P > 0 ? T : 0);
  for_batch_slices(X, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    const Tensor gs = rows_of(gates, 1, b0, nb), hss = rows_of(r.hs[pl], 1, b0, nb), ys = rows_of(Y, 1, b0, nb);
    const Tensor css = rows_of(r.cs[pl], 1, b0, nb), mss = rows_of(r.ms[pl], 1, b0, nb),
                 ghns = rows_of(r.ghn[pl], 1, b0, nb);
    const Tensor ls = rows_of(lens, 0, b0, nb);
    Tensor hprev = h0.select(0, pl).narrow(0, b0, nb);
    Tensor cprev = c.mode == kLstm ? c0.select(0, pl).narrow(0, b0, nb) : Tensor();
    std::optional<StepGemm> l_rec, l_prj;
    const StepGemm& rec = slice_gemm(rec_s, l_rec, w.R, /*trans=*/true, nb, T);
    const StepGemm& prj = slice_gemm(prj_s, l_prj, proj, true, nb, c.P > 0 ? T : 0);
    Tensor gh = c.mode == kGru ? at::empty({nb, GH}, X.options()) : Tensor();
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = d == 0 ? s : T - 1 - s;
      Tensor g_t = gs.select(0, t), h_t = hss.select(0, t);
      const Tensor y_t = ys.select(0, t).narrow(1, d * O, O);
      if (c.mode == kLstm) {
        rec.addmm(g_t, hprev);
        const Tensor c_t = css.select(0, t);
        if (c.P > 0) {
          const Tensor m_t = mss.select(0, t);
          k.lstm_fwd(g_t, cprev, hprev, c_t, m_t, Tensor(), true, ls, t);
          prj.mm(h_t, m_t);
          k.mask_state(h_t, hprev, y_t, ls, t);
        } else {
          k.lstm_fwd(g_t, cprev, hprev, c_t, h_t, y_t, false, ls, t);
        }
        cprev = c_t;
      } else if (c.mode == kGru) {
        rec.mm(gh, hprev);
        k.gru_fwd(g_t, gh, w.bR, hprev, ghns.select(0, t), h_t, y_t, ls, t);
      } else {
        rec.addmm(g_t, hprev);
        k.rnn_fwd(g_t, hprev, h_t, y_t, relu, ls, t);
      }
      hprev = h_t;
    }
  });
}

void forward_core(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0, const Tensor& c0,
                  const Tensor& p, const Tensor& lens, Res& r, const Tensor& out, const Tensor& hN, const Tensor& cN,
                  const Kernels& k) {
  for (int64_t l = 0; l < c.L; ++l) {
    const Tensor X = l == 0 ? x : r.ys[l - 1];
    const Tensor Y = l == c.L - 1 ? out : r.ys[l];
    for (int64_t d = 0; d < c.D; ++d) layer_forward(c, lay, p, l, d, X, Y, h0, c0, lens, r, k);
    if (l + 1 < c.L && r.masks[l].defined()) Y.mul_(r.masks[l]);
  }
  for (int64_t pl = 0; pl < c.L * c.D; ++pl) {
    const int64_t last = pl % c.D == 0 ? c.T - 1 : 0;
    hN.select(0, pl).copy_(r.hs[pl].select(0, last));
    if (c.mode == kLstm) cN.select(0, pl).copy_(r.cs[pl].select(0, last));
  }
}

// ---- backward of one layer and direction ----
void layer_backward(const Cfg& c, const Layout& lay, const Tensor& p, const Tensor& dp, int64_t l, int64_t d,
                    const Tensor& X, const Tensor& dY, const Tensor& dX, const Tensor& h0, const Tensor& c0,
                    const Tensor& dhN, const Tensor& dcN, const Tensor& dh0, const Tensor& dc0, const Tensor& lens,
                    const Res& r, const Kernels& k) {
  const int64_t pl = l * c.D + d, T = c.T, B = c.B, H = c.H, O = c.O, GH = c.G * c.H;
  const PlParams w = pl_params(c, lay, p, pl);
  const auto opts = X.options();
  const Tensor dg_all = at::empty({T, B, GH}, opts);
  const Tensor dgh_all = c.mode == kGru ? at::empty({T, B, GH}, opts) : dg_all;
  const Tensor dht_all = c.P > 0 ? at::empty({T, B, O}, opts) : Tensor();
  const bool relu = c.mode == kRelu;
  const Tensor proj = c.P > 0 ? w.Pm : w.R;
  const auto rec_s = shared_step_gemm(w.R, /*trans=*/false, T);
  const auto prj_s = shared_step_gemm(proj, /*trans=*/false, c.P > 0 ? T : 0);
  for_batch_slices(X, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const Tensor& t) { return rows_of(t, 1, b0, nb); };
    const Tensor gs = s3(r.gates[pl]), hss = s3(r.hs[pl]), css = s3(r.cs[pl]), mss = s3(r.ms[pl]),
                 ghns = s3(r.ghn[pl]), dys = s3(dY), dgs = s3(dg_all), dghs = s3(dgh_all), dhts = s3(dht_all);
    const Tensor ls = rows_of(lens, 0, b0, nb);
    const Tensor h0s = h0.select(0, pl).narrow(0, b0, nb);
    const Tensor c0s = c.mode == kLstm ? c0.select(0, pl).narrow(0, b0, nb) : Tensor();
    Tensor dh_a = dhN.select(0, pl).narrow(0, b0, nb).clone(at::MemoryFormat::Contiguous);
    Tensor dh_b = at::empty({nb, O}, opts);
    Tensor dc = c.mode == kLstm ? dcN.select(0, pl).narrow(0, b0, nb).clone(at::MemoryFormat::Contiguous) : Tensor();
    Tensor dh = c.P > 0 ? Tensor() : at::empty({nb, O}, opts);
    Tensor dm = c.P > 0 ? at::empty({nb, H}, opts) : Tensor();
    std::optional<StepGemm> l_rec, l_prj;
    const StepGemm& rec = slice_gemm(rec_s, l_rec, w.R, /*trans=*/false, nb, T);
    const StepGemm& prj = slice_gemm(prj_s, l_prj, proj, false, nb, c.P > 0 ? T : 0);
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = d == 0 ? T - 1 - s : s;
      const bool first = d == 0 ? t == 0 : t == T - 1;  // first step in the forward's processing order
      const int64_t tp = d == 0 ? t - 1 : t + 1;
      const Tensor hprev = first ? h0s : hss.select(0, tp);
      const Tensor dy_t = dys.select(0, t).narrow(1, d * O, O);
      Tensor dh_t = c.P > 0 ? dhts.select(0, t) : dh;
      k.bwd_prep(dh_a, dy_t, dh_t, dh_b, ls, t);
      Tensor dg_t = dgs.select(0, t);
      if (c.mode == kLstm) {
        const Tensor cprev = first ? c0s : css.select(0, tp);
        if (c.P > 0) prj.mm(dm, dh_t);
        k.lstm_bwd(gs.select(0, t), css.select(0, t), cprev, c.P > 0 ? dm : dh_t, dc, dg_t, ls, t);
        rec.addmm(dh_b, dg_t);
      } else if (c.mode == kGru) {
        Tensor dgh_t = dghs.select(0, t);
        k.gru_bwd(gs.select(0, t), ghns.select(0, t), hprev, dh_t, dh_b, dg_t, dgh_t, ls, t);
        rec.addmm(dh_b, dgh_t);
      } else {
        k.rnn_bwd(gs.select(0, t), dh_t, dg_t, relu, ls, t);
        rec.addmm(dh_b, dg_t);
      }
      std::swap(dh_a, dh_b);
    }
    dh0.select(0, pl).narrow(0, b0, nb).copy_(dh_a);
    if (c.mode == kLstm) dc0.select(0, pl).narrow(0, b0, nb).copy_(dc);
  });
  // weight gradients: GEMMs over all steps
  const PlParams gw = pl_params(c, lay, dp, pl);
  const Tensor dg2d = dg_all.view({T * B, GH}), dgh2d = dgh_all.view({T * B, GH});
  if (w.W.defined()) {
    const Tensor X2d = X.reshape({T * B, X.size(2)});
    at::mm_out(const_cast<Tensor&>(gw.W), dg2d.t(), X2d);
    dX.view({T * B, X.size(2)}).addmm_(dg2d, w.W);
  } else {
    dX.add_(dg_all.view({T, B, c.G, H}).sum(2));
  }
  if (gw.bW.defined()) gw.bW.copy_(at::sum(dg2d, {0}));
  gw.bR.copy_(at::sum(dgh2d, {0}));
  const int64_t t0 = d == 0 ? 0 : T - 1;
  at::mm_out(const_cast<Tensor&>(gw.R), dgh_all.select(0, t0).t(), h0.select(0, pl));
  if (T > 1) {
    const Tensor g_rest = (d == 0 ? dgh_all.narrow(0, 1, T - 1) : dgh_all.narrow(0, 0, T - 1)).reshape({(T - 1) * B, GH});
    const Tensor h_rest =
        (d == 0 ? r.hs[pl].narrow(0, 0, T - 1) : r.hs[pl].narrow(0, 1, T - 1)).reshape({(T - 1) * B, O});
    gw.R.addmm_(g_rest.t(), h_rest);
  }
  if (c.P > 0) at::mm_out(const_cast<Tensor&>(gw.Pm), dht_all.view({T * B, O}).t(), r.ms[pl].view({T * B, H}));
}

void backward_core(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0, const Tensor& c0,
                   const Tensor& p, const Tensor& lens, const Res& r, const Tensor& dY_last, const Tensor& dhN,
                   const Tensor& dcN, const Tensor& dx, const Tensor& dh0, const Tensor& dc0, const Tensor& dp,
                   const Kernels& k) {
  Tensor dY = dY_last;
  for (int64_t l = c.L - 1; l >= 0; --l) {
    const Tensor X = l == 0 ? x : r.ys[l - 1];
    const Tensor dX = l == 0 ? dx : at::zeros({c.T, c.B, c.D * c.O}, x.options());
    for (int64_t d = 0; d < c.D; ++d)
      layer_backward(c, lay, p, dp, l, d, X, dY, dX, h0, c0, dhN, dcN, dh0, dc0, lens, r, k);
    if (l > 0) {
      if (r.masks[l - 1].defined()) dX.mul_(r.masks[l - 1]);
      dY = dX;
    }
  }
}

Tensor to_tm(const Tensor& t, bool tm) { return tm ? t : t.transpose(0, 1); }
Tensor prep(const Tensor& t, bool tm, at::ScalarType cdt) { return to_tm(t, tm).to(cdt).contiguous(); }
Tensor finish(const Tensor& t, bool tm, at::ScalarType dt) { return tm ? t.to(dt) : t.transpose(0, 1).to(dt).contiguous(); }

// The forward's inputs time-major, contiguous, in dtype `t` (params: its lay.size elements).
struct Prepped {
  Tensor x, h0, c0, p;
};
Prepped prep_inputs(const Cfg& c, const Layout& lay, const Tensor& input, const Tensor& input_h,
                    const Tensor& input_c, const Tensor& params, bool tm, at::ScalarType t) {
  return {prep(input, tm, t), prep(input_h, tm, t), c.mode == kLstm ? prep(input_c, tm, t) : Tensor(),
          params.narrow(0, 0, lay.size).to(t).contiguous()};
}

}  // namespace

// =================================================================================================
// Forward / backward ops
// =================================================================================================
T5 cudnn_rnn_forward(int version, const Tensor& input, const Tensor& input_h, const Tensor& input_c,
                     const Tensor& params, const Tensor& sequence_lengths, Str rnn_mode, Str input_mode,
                     Str direction, double dropout, int64_t seed, int64_t seed2, int64_t num_proj, bool is_training,
                     bool time_major, const Kernels& k) {
  const bool tm = time_major;
  const Cfg c = check_forward(input, input_h, input_c, params, sequence_lengths, version == 3, rnn_mode, input_mode,
                              direction, dropout, num_proj, tm, k);
  const Layout lay = make_layout(c);
  const auto dt = input.scalar_type(), cdt = compute_type(dt);
  const bool low = dt != cdt;  // float16 / bfloat16
  const auto copts = input.options().dtype(cdt);
  int64_t lens_digest = 0;
  Tensor host_lens;
  const Tensor lens = prepare_lens(sequence_lengths, c, input.device(), &lens_digest, &host_lens);
  const bool has_mask = is_training && dropout > 0.0 && c.L > 1;
  const int64_t total = reserve_elems(c, has_mask, cdt);
  const int64_t ratio = static_cast<int64_t>(c10::elementSize(cdt) / c10::elementSize(dt));
  // The library entries get the input dtype (see Kernels::LibraryRoute); the time loops the compute dtype.
  const Prepped lib_in = prep_inputs(c, lay, input, input_h, input_c, params, tm, dt);
  for (const auto& library : k.library) {
    if (library.forward == nullptr || !library.takes(dt) || !library.route->enabled()) continue;
    if (auto lib = library.forward(c, lay, lib_in.x, lib_in.h0, lib_in.c0, lib_in.p, host_lens, dropout, is_training,
                                   total * ratio)) {
      library.route->ran();
      Tensor reserve = at::empty({0}, input.options());
      if (is_training) {
        TORCH_INTERNAL_ASSERT(lib->reserve.numel() == total * ratio);
        write_header(lib->reserve, header_of(c, has_mask, total, lens_digest, kLibraryLayout));
        reserve = lib->reserve;
      }
      const Tensor output_c = c.mode == kLstm ? finish(lib->cN, tm, dt) : at::zeros({}, input.options());
      return {finish(lib->out, tm, dt), finish(lib->hN, tm, dt), output_c, reserve,
              at::empty({0}, input.options().dtype(at::kChar))};
    }
  }
  k.loops_route->ran();
  const Prepped in = low ? prep_inputs(c, lay, input, input_h, input_c, params, tm, cdt) : lib_in;
  const Tensor &x = in.x, &h0 = in.h0, &c0 = in.c0, &p = in.p;
  Tensor buf = at::empty({total}, copts);
  Res r = carve(c, has_mask, buf);
  if (has_mask) fill_masks(r, dropout, seed, seed2);
  const Tensor out = at::empty({c.T, c.B, c.D * c.O}, copts), hN = at::empty({c.L * c.D, c.B, c.O}, copts);
  const Tensor cN = c.mode == kLstm ? at::empty({c.L * c.D, c.B, c.H}, copts) : Tensor();
  forward_core(c, lay, x, h0, c0, p, lens, r, out, hN, cN, k);
  Tensor reserve;
  if (is_training) {
    write_header(buf, header_of(c, has_mask, total, lens_digest, kLoopLayout));
    reserve = cdt == dt ? buf : buf.view(dt);
  } else {
    reserve = at::empty({0}, input.options());
  }
  const Tensor output_c = c.mode == kLstm ? finish(cN, tm, dt) : at::zeros({}, input.options());
  return {finish(out, tm, dt), finish(hN, tm, dt), output_c, reserve,
          at::empty({0}, input.options().dtype(at::kChar))};
}

namespace {
void check_shape(const Tensor& x, const Tensor& t, at::IntArrayRef want, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.sizes() == want, "Invalid ", name, " shape: expected ", want, ", got ", t.sizes());
  check_like(x, t, name);
}
}  // namespace

T4 cudnn_rnn_backward(int version, const Tensor& input, const Tensor& input_h, const Tensor& input_c,
                      const Tensor& params, const Tensor& sequence_lengths, const Tensor& output,
                      const Tensor& output_h, const Tensor& output_c, const Tensor& output_backprop,
                      const Tensor& output_h_backprop, const Tensor& output_c_backprop, const Tensor& reserve_space,
                      const Tensor& host_reserved, Str rnn_mode, Str input_mode, Str direction, double dropout,
                      int64_t seed, int64_t seed2, int64_t num_proj, bool time_major, const Kernels& k) {
  const bool tm = time_major;
  const Cfg c = check_forward(input, input_h, input_c, params, sequence_lengths, version == 3, rnn_mode, input_mode,
                              direction, dropout, num_proj, tm, k);
  const std::vector<int64_t> out_shape =
      tm ? std::vector<int64_t>{c.T, c.B, c.D * c.O} : std::vector<int64_t>{c.B, c.T, c.D * c.O};
  check_shape(input, output, out_shape, "output");
  check_shape(input, output_h, input_h.sizes(), "output_h");
  if (c.mode == kLstm) check_shape(input, output_c, input_c.sizes(), "output_c");
  check_shape(input, output_backprop, out_shape, "output_backprop");
  check_shape(input, output_h_backprop, input_h.sizes(), "output_h_backprop");
  if (c.mode == kLstm) check_shape(input, output_c_backprop, input_c.sizes(), "output_c_backprop");
  if (c.mode != kLstm) {  // ignored, but their dtype and device take part in dispatch
    check_like(input, output_c, "output_c");
    check_like(input, output_c_backprop, "output_c_backprop");
  }
  check_defined(reserve_space, "reserve_space");
  if (version >= 2) {
    check_defined(host_reserved, "host_reserved");
    TORCH_CHECK(host_reserved.device() == input.device(), "host_reserved must be on input's device (",
                input.device(), "), got ", host_reserved.device());
  }
  const auto dt = input.scalar_type(), cdt = compute_type(dt);
  // reserve_space: written by a training forward of this configuration (header, then the buffers)
  TORCH_CHECK(reserve_space.numel() > 0,
              "reserve_space is empty: the forward ran with is_training=False, which keeps nothing for the "
              "backward; run the forward with is_training=True to compute gradients");
  TORCH_CHECK(reserve_space.dim() == 1 && reserve_space.scalar_type() == dt && reserve_space.device() == input.device(),
              "reserve_space must be the 1-D ", dt, " tensor on ", input.device(),
              " returned by the forward, got shape ", reserve_space.sizes(), " dtype ", reserve_space.scalar_type(),
              " device ", reserve_space.device());
  const int64_t ratio = static_cast<int64_t>(c10::elementSize(cdt) / c10::elementSize(dt));
  TORCH_CHECK(reserve_space.numel() % ratio == 0 && reserve_space.numel() / ratio >= header_elems(cdt),
              "reserve_space has ", reserve_space.numel(), " elements: not one returned by a CudnnRNN forward");
  const Tensor buf = (cdt == dt ? reserve_space : reserve_space.view(cdt)).contiguous();
  const Tensor hdr = buf.narrow(0, 0, header_elems(cdt)).view(at::kLong).to(at::kCPU);
  const int64_t* hp = hdr.const_data_ptr<int64_t>();
  const bool has_mask = hp[10] != 0;
  const int64_t total = reserve_elems(c, has_mask, cdt);
  int64_t lens_digest = 0;
  const Tensor lens = prepare_lens(sequence_lengths, c, input.device(), &lens_digest);
  const int64_t layout = hp[kLayoutSlot] == kLibraryLayout ? kLibraryLayout : kLoopLayout;
  const auto want = header_of(c, has_mask, total, lens_digest, layout);
  bool same = buf.numel() == total;
  for (int64_t i = 0; i < kHeaderLongs; ++i) same = same && (i == kLensSlot || hp[i] == want[i]);
  same = same && !(layout == kLibraryLayout && has_mask);  // the library route never keeps masks
  TORCH_CHECK(same, "reserve_space does not match this configuration (it has ", reserve_space.numel(),
              " elements; expected one returned by the training forward of rnn_mode '", std::string(rnn_mode),
              "', ", c.L, " layer(s), ", c.D, " direction(s), num_units ", c.H, ", num_proj ", c.P, ", input_size ",
              c.I, ", max_seq_length ", c.T, ", batch_size ", c.B, ")");
  TORCH_CHECK(hp[kLensSlot] == lens_digest,
              "sequence_lengths differ from the ones the forward that returned reserve_space ran with: pass the "
              "forward's sequence_lengths to the backward");
  const Layout lay = make_layout(c);
  auto result = [&](const Tensor& dx, const Tensor& dh0, const Tensor& dc0, const Tensor& dp) -> T4 {
    const Tensor params_backprop = dp.to(params.scalar_type());  // (params has exactly lay.size elements)
    const Tensor dc_out = c.mode == kLstm ? finish(dc0, tm, dt) : at::zeros({}, input.options());
    return {finish(dx, tm, dt), finish(dh0, tm, dt), dc_out, params_backprop};
  };
  const bool library = layout == kLibraryLayout;
  if (library) {  // the library entries get the input dtype, as in the forward
    const Prepped in = prep_inputs(c, lay, input, input_h, input_c, params, tm, dt);
    const Tensor dY = prep(output_backprop, tm, dt), dhN = prep(output_h_backprop, tm, dt);
    const Tensor dcN = c.mode == kLstm ? prep(output_c_backprop, tm, dt) : Tensor();
    for (const auto& lib : k.library) {
      if (lib.backward == nullptr || !lib.takes(dt) || !lib.route->enabled()) continue;
      if (auto g = lib.backward(c, lay, buf, in.x, in.h0, in.c0, in.p, dY, dhN, dcN)) {
        lib.route->ran();
        const T4& d = g->grads;
        return result(std::get<0>(d), std::get<1>(d), std::get<2>(d), std::get<3>(d));
      }
    }
  }
  k.loops_route->ran();
  const Prepped in = prep_inputs(c, lay, input, input_h, input_c, params, tm, cdt);
  const Tensor &x = in.x, &h0 = in.h0, &c0 = in.c0, &p = in.p;
  const Tensor dY = prep(output_backprop, tm, cdt), dhN = prep(output_h_backprop, tm, cdt);
  const Tensor dcN = c.mode == kLstm ? prep(output_c_backprop, tm, cdt) : Tensor();
  const auto copts = input.options().dtype(cdt);
  // A library reserve without the library's state (a copy, or another device): recompute with the loops.
  Res r = carve(c, has_mask, library ? at::empty({total}, copts) : buf);
  if (library) {
    const Tensor out = at::empty({c.T, c.B, c.D * c.O}, copts), hN = at::empty({c.L * c.D, c.B, c.O}, copts);
    const Tensor cN = c.mode == kLstm ? at::empty({c.L * c.D, c.B, c.H}, copts) : Tensor();
    forward_core(c, lay, x, h0, c0, p, lens, r, out, hN, cN, k);
  }
  const Tensor dx = at::zeros({c.T, c.B, c.I}, copts), dh0 = at::empty({c.L * c.D, c.B, c.O}, copts);
  const Tensor dc0 = c.mode == kLstm ? at::empty({c.L * c.D, c.B, c.H}, copts) : Tensor();
  const Tensor dp = at::zeros({lay.size}, copts);
  backward_core(c, lay, x, h0, c0, p, lens, r, dY, dhN, dcN, dx, dh0, dc0, dp, k);
  return result(dx, dh0, dc0, dp);
}

// =================================================================================================
// ParamsSize and the canonical converters (device-independent: CompositeExplicitAutograd)
// =================================================================================================
Tensor params_size(int64_t num_layers, int64_t num_units, int64_t input_size, c10::optional<at::ScalarType> T,
                   c10::optional<at::ScalarType> S, Str rnn_mode, Str input_mode, Str direction, double dropout,
                   int64_t seed, int64_t seed2, int64_t num_proj) {
  const at::ScalarType t = T.value_or(at::kFloat), s = S.value_or(at::kInt);
  TORCH_CHECK(is_float(t), "T must be float16, bfloat16, float32 or float64, got ", t);
  TORCH_CHECK(s == at::kInt || s == at::kLong, "S must be int32 or int64, got ", s);
  const Cfg c = model_cfg(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj);
  const int64_t size = params_size_of(c);
  TORCH_CHECK(s == at::kLong || size <= std::numeric_limits<int32_t>::max(), "params size ", size,
              " does not fit in int32: use S=int64");
  return at::full({1}, size, at::TensorOptions().dtype(s));
}

namespace {

std::tuple<std::vector<Tensor>, std::vector<Tensor>> to_canonical(int64_t num_layers, int64_t num_units,
                                                                  int64_t input_size, const Tensor& params,
                                                                  int64_t n_weights, int64_t n_biases, Str rnn_mode,
                                                                  Str input_mode, Str direction, double dropout,
                                                                  int64_t num_proj, bool v2) {
  const Cfg c = model_cfg(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj);
  const int64_t npl = c.L * c.D;
  const char* wname = v2 ? "num_params_weights" : "num_params";
  const char* bname = v2 ? "num_params_biases" : "num_params";
  TORCH_CHECK(n_weights % npl == 0, wname, " (", n_weights, ") is not a multiple of num_layers * num_dirs (", npl,
              ")");
  TORCH_CHECK(n_biases % npl == 0, bname, " (", n_biases, ") is not a multiple of num_layers * num_dirs (", npl, ")");
  const int64_t per = n_weights / npl;
  if (c.P == 0) {
    TORCH_CHECK(per % 2 == 0, "Number of params (weights) per layer is not an even number with no projection: ", per);
  } else {
    TORCH_CHECK(per % 2 == 1, "Number of params (weights) per layer is not an odd number with projection: ", per);
  }
  const int64_t want_w = npl * (2 * c.G + (c.P > 0 ? 1 : 0)), want_b = npl * 2 * c.G;
  TORCH_CHECK(want_w == n_weights, "Number of params (weights) mismatch. Expected ", n_weights, " (", wname,
              "), got ", want_w, " for this configuration");
  TORCH_CHECK(want_b == n_biases, "Number of params (biases) mismatch. Expected ", n_biases, " (", bname, "), got ",
              want_b, " for this configuration");
  check_defined(params, "params");
  TORCH_CHECK(params.dim() == 1, "params must be a 1-D tensor, got rank ", params.dim());
  TORCH_CHECK(is_float(params.scalar_type()), "params must be float32, float64, float16 or bfloat16, got ",
              params.scalar_type());
  const int64_t size = params_size_of(c);
  TORCH_CHECK(params.numel() == size, "params has ", params.numel(), " elements, but must have exactly ", size,
              " (CudnnRNNParamsSize of this configuration)");
  const Layout lay = make_layout(c);
  std::vector<Tensor> ws, bs;
  for (const auto& rg : lay.weights) ws.push_back(params.narrow(0, rg.off, rg.numel()).view({rg.rows, rg.cols}).clone());
  for (const auto& rg : lay.biases) bs.push_back(params.narrow(0, rg.off, rg.numel()).clone());
  return {ws, bs};
}

Tensor to_params(int64_t num_layers, int64_t num_units, int64_t input_size, at::TensorList weights,
                 at::TensorList biases, Str rnn_mode, Str input_mode, Str direction, double dropout, int64_t num_proj) {
  const Cfg c = model_cfg(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj);
  const int64_t npl = c.L * c.D;
  const int64_t want_w = npl * (2 * c.G + (c.P > 0 ? 1 : 0)), want_b = npl * 2 * c.G;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == want_w, "Number of params (weights) mismatch. Expected ", want_w,
              ", got ", weights.size());
  TORCH_CHECK(static_cast<int64_t>(biases.size()) == want_b, "Number of params (biases) mismatch. Expected ", want_b,
              ", got ", biases.size());
  params_size_of(c);  // (overflow check before the layout)
  const Layout lay = make_layout(c);
  check_defined(weights[0], "weights[0]");
  const Tensor& first = weights[0];
  TORCH_CHECK(is_float(first.scalar_type()), "weights must be float32, float64, float16 or bfloat16, got ",
              first.scalar_type());
  std::vector<Tensor> flat;
  flat.reserve(weights.size() + biases.size());
  auto add = [&](const Tensor& t, const Region& rg, const char* kind, size_t i) {
    TORCH_CHECK_VALUE(t.defined(), kind, "[", i, "] must be a tensor, got None");
    TORCH_CHECK(t.numel() == rg.numel(), "Params size mismatch. Expected ", rg.numel(), ", got ", t.numel(), " (", kind,
                "[", i, "])");
    // The canonical shape, or that tensor flattened (row-major): a transposed or reshaped one is refused.
    const bool ok = rg.cols < 0 ? t.dim() == 1 : (t.dim() == 1 || (t.dim() == 2 && t.size(0) == rg.rows));
    TORCH_CHECK(ok, "Params shape mismatch: ", kind, "[", i, "] must have shape ",
                rg.cols < 0 ? c10::str("[", rg.rows, "]") : c10::str("[", rg.rows, ", ", rg.cols, "]"),
                " (or be flattened to [", rg.numel(), "]), got ", t.sizes());
    TORCH_CHECK(t.scalar_type() == first.scalar_type(), kind, "[", i, "] must have dtype ", first.scalar_type(),
                ", got ", t.scalar_type());
    TORCH_CHECK(t.device() == first.device(), kind, "[", i, "] must be on ", first.device(), ", got ", t.device());
    flat.push_back(t.reshape({-1}));
  };
  for (size_t i = 0; i < weights.size(); ++i) add(weights[i], lay.weights[i], "weights", i);
  for (size_t i = 0; i < biases.size(); ++i) add(biases[i], lay.biases[i], "biases", i);
  return at::cat(flat, 0);
}

}  // namespace

std::tuple<std::vector<Tensor>, std::vector<Tensor>> params_to_canonical(int64_t L, int64_t H, int64_t I,
                                                                         const Tensor& params, int64_t num_params,
                                                                         Str mode, Str im, Str dir, double dropout,
                                                                         int64_t seed, int64_t seed2) {
  return to_canonical(L, H, I, params, num_params, num_params, mode, im, dir, dropout, 0, false);
}
std::tuple<std::vector<Tensor>, std::vector<Tensor>> params_to_canonical_v2(int64_t L, int64_t H, int64_t I,
                                                                            const Tensor& params, int64_t nw,
                                                                            int64_t nb, Str mode, Str im, Str dir,
                                                                            double dropout, int64_t seed,
                                                                            int64_t seed2, int64_t num_proj) {
  return to_canonical(L, H, I, params, nw, nb, mode, im, dir, dropout, num_proj, true);
}
Tensor canonical_to_params(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode, Str im,
                           Str dir, double dropout, int64_t seed, int64_t seed2) {
  return to_params(L, H, I, w, b, mode, im, dir, dropout, 0);
}
Tensor canonical_to_params_v2(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode, Str im,
                              Str dir, double dropout, int64_t seed, int64_t seed2, int64_t num_proj) {
  return to_params(L, H, I, w, b, mode, im, dir, dropout, num_proj);
}

}  // namespace crnn
}  // namespace torchops

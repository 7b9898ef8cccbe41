// CudnnRNN family schemas, and the device-independent ops (ParamsSize, the canonical converters) at
// CompositeExplicitAutograd. Kernels: cpu/ and cuda/cudnn_rnn_kernel.*; autograd: autograd/cudnn_rnn.cpp.
#include "cudnn_rnn/cudnn_rnn.h"

#include <torch/library.h>

#define TORCHOPS_CRNN_ATTRS \
  "str rnn_mode=\"lstm\", str input_mode=\"linear_input\", str direction=\"unidirectional\", float dropout=0.0, " \
  "int seed=0, int seed2=0"

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  m.def("cudnn_rnn(Tensor input, Tensor input_h, Tensor input_c, Tensor params, " TORCHOPS_CRNN_ATTRS
        ", bool is_training=True) -> (Tensor output, Tensor output_h, Tensor output_c, Tensor reserve_space)");
  m.def("cudnn_rnn_v2(Tensor input, Tensor input_h, Tensor input_c, Tensor params, " TORCHOPS_CRNN_ATTRS
        ", bool is_training=True) -> (Tensor output, Tensor output_h, Tensor output_c, Tensor reserve_space, "
        "Tensor host_reserved)");
  m.def("cudnn_rnn_v3(Tensor input, Tensor input_h, Tensor input_c, Tensor params, Tensor sequence_lengths, "
        TORCHOPS_CRNN_ATTRS ", int num_proj=0, bool is_training=True, bool time_major=True) -> (Tensor output, "
        "Tensor output_h, Tensor output_c, Tensor reserve_space, Tensor host_reserved)");
  m.def("cudnn_rnn_backprop(Tensor input, Tensor input_h, Tensor input_c, Tensor params, Tensor output, "
        "Tensor output_h, Tensor output_c, Tensor output_backprop, Tensor output_h_backprop, "
        "Tensor output_c_backprop, Tensor reserve_space, " TORCHOPS_CRNN_ATTRS
        ") -> (Tensor input_backprop, Tensor input_h_backprop, Tensor input_c_backprop, Tensor params_backprop)");
  m.def("cudnn_rnn_backprop_v2(Tensor input, Tensor input_h, Tensor input_c, Tensor params, Tensor output, "
        "Tensor output_h, Tensor output_c, Tensor output_backprop, Tensor output_h_backprop, "
        "Tensor output_c_backprop, Tensor reserve_space, Tensor host_reserved, " TORCHOPS_CRNN_ATTRS
        ") -> (Tensor input_backprop, Tensor input_h_backprop, Tensor input_c_backprop, Tensor params_backprop)");
  m.def("cudnn_rnn_backprop_v3(Tensor input, Tensor input_h, Tensor input_c, Tensor params, "
        "Tensor sequence_lengths, Tensor output, Tensor output_h, Tensor output_c, Tensor output_backprop, "
        "Tensor output_h_backprop, Tensor output_c_backprop, Tensor reserve_space, Tensor host_reserved, "
        TORCHOPS_CRNN_ATTRS ", int num_proj=0, bool time_major=True) -> (Tensor input_backprop, "
        "Tensor input_h_backprop, Tensor input_c_backprop, Tensor params_backprop)");
  m.def("cudnn_rnn_params_size(int num_layers, int num_units, int input_size, ScalarType? T=None, "
        "ScalarType? S=None, " TORCHOPS_CRNN_ATTRS ", int num_proj=0) -> Tensor params_size");
  m.def("cudnn_rnn_params_to_canonical(int num_layers, int num_units, int input_size, Tensor params, "
        "int num_params, " TORCHOPS_CRNN_ATTRS ") -> (Tensor[] weights, Tensor[] biases)");
  m.def("cudnn_rnn_params_to_canonical_v2(int num_layers, int num_units, int input_size, Tensor params, "
        "int num_params_weights, int num_params_biases, " TORCHOPS_CRNN_ATTRS
        ", int num_proj=0) -> (Tensor[] weights, Tensor[] biases)");
  m.def("cudnn_rnn_canonical_to_params(int num_layers, int num_units, int input_size, Tensor[] weights, "
        "Tensor[] biases, " TORCHOPS_CRNN_ATTRS ") -> Tensor params");
  m.def("cudnn_rnn_canonical_to_params_v2(int num_layers, int num_units, int input_size, Tensor[] weights, "
        "Tensor[] biases, " TORCHOPS_CRNN_ATTRS ", int num_proj=0) -> Tensor params");
}

#undef TORCHOPS_CRNN_ATTRS

TORCH_LIBRARY_IMPL(torchops, CompositeExplicitAutograd, m) {
  using namespace torchops::crnn;
  m.impl("cudnn_rnn_params_size", &params_size);
  m.impl("cudnn_rnn_params_to_canonical", &params_to_canonical);
  m.impl("cudnn_rnn_params_to_canonical_v2", &params_to_canonical_v2);
  m.impl("cudnn_rnn_canonical_to_params", &canonical_to_params);
  m.impl("cudnn_rnn_canonical_to_params_v2", &canonical_to_params_v2);
}

// Batch / Unbatch / UnbatchGrad schemas and their device-independent registrations (kernels: ops.cpp;
// autograd: autograd/batching.cpp).
#include "batching/batching.h"

#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  m.def(
      "batch(Tensor[] in_tensors, int num_batch_threads, int max_batch_size, int batch_timeout_micros, "
      "int grad_timeout_micros, int max_enqueued_batches=10, int[] allowed_batch_sizes=[], str container=\"\", "
      "str shared_name=\"\", str batching_queue=\"\") -> (Tensor[] batched_tensors, Tensor batch_index, Tensor id)");
  m.def(
      "unbatch(Tensor batched_tensor, Tensor batch_index, Tensor id, int timeout_micros, str container=\"\", "
      "str shared_name=\"\") -> Tensor unbatched_tensor");
  m.def(
      "unbatch_grad(Tensor original_input, Tensor batch_index, Tensor grad, Tensor id, str container=\"\", "
      "str shared_name=\"\", int timeout_micros=-1) -> Tensor batched_grad");
  // nn.Batched / batch_function without autograd: batch + (non-holders) unbatch in one call.
  m.def(
      "_batch_then_unbatch(Tensor[] in_tensors, int num_batch_threads, int max_batch_size, int batch_timeout_micros, "
      "int grad_timeout_micros, int max_enqueued_batches, int[] allowed_batch_sizes, str container, "
      "str shared_name, str batching_queue, str[] unbatch_names, int unbatch_timeout_micros) -> "
      "(Tensor[] batched_tensors, Tensor batch_index, Tensor id, Tensor[] unbatched)");
  // Helpers of the Python front (torchops.batching): statistics, listing, shutdown, error fan-out.
  m.def("_batching_stats(str container, str shared_name, str batching_queue) -> str",
        &torchops::batching::batching_stats);
  m.def("_batching_list_queues() -> str", &torchops::batching::batching_list_queues);
  m.def("_batching_close_all(bool shutdown=False) -> ()", &torchops::batching::batching_close_all);
  m.def("_batching_in_flight() -> int", &torchops::batching::batching_in_flight);
  // CONSERVATIVE: an op with no outputs is otherwise dead code to TorchScript, which would drop the call.
  m.def(torch::schema("_unbatch_fail(Tensor batch_index, str message, str container=\"\", str shared_name=\"\", "
                      "int timeout_micros=-1) -> ()",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &torchops::batching::unbatch_fail);
  m.def(torch::schema("_arm_unbatch_fail(Tensor batch_index, str message, str container, str shared_name, "
                      "int timeout_micros) -> ()",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &torchops::batching::arm_unbatch_fail);
}

TORCH_LIBRARY_IMPL(torchops, CompositeExplicitAutograd, m) {
  m.impl("batch", &torchops::batching::batch_kernel);
  m.impl("unbatch", &torchops::batching::unbatch_kernel);
  m.impl("unbatch_grad", &torchops::batching::unbatch_grad_kernel);
  m.impl("_batch_then_unbatch", &torchops::batching::batch_then_unbatch_kernel);
}

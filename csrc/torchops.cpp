// The torchops operator library. Each op family adds its schemas with TORCH_LIBRARY_FRAGMENT in
// csrc/<family>.cpp; this file owns the library itself (and, later, its custom classes).
#include <torch/library.h>

TORCH_LIBRARY(torchops, m) {
  // Schemas live with their families; see csrc/<family>.cpp.
}

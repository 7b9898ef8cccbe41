// The torch headers that most of the library's units include, which setup.py compiles once per build into a
// precompiled header given to every unit of the main build (GCC only): parsing them was most of each unit's
// compile time. Units still include what they use, so they build the same without it.
#ifndef TORCHOPS_COMMON_PRECOMPILED_H_
#define TORCHOPS_COMMON_PRECOMPILED_H_

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#endif  // TORCHOPS_COMMON_PRECOMPILED_H_

"""Every torchops op is a dispatcher op with CPU (or device-independent), Autograd and, in CUDA builds,
CUDA kernels, plus a fake kernel for torch.compile."""
import pytest
import torch
from torch._library.simple_registry import singleton as fake_registry

import torchops

ALL_OPS = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("torchops::"))


def returns_tensors(name):
    base, _, overload = name.partition(".")  # (overloaded ops are listed as name.overload)
    schema = torch._C._get_schema(base, overload)
    return any("Tensor" in str(r.type) for r in schema.returns)


# Ops that compute tensors; the others are control entry points of stateful resources (statistics,
# close), which have one device-independent kernel and nothing to differentiate.
OPS = [n for n in ALL_OPS if returns_tensors(n)]
CONTROL_OPS = [n for n in ALL_OPS if not returns_tensors(n)]


def has_kernel(name, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def test_library_registers_ops():
    for expected in ("torchops::fused_batch_norm_v3", "torchops::fused_batch_norm_grad_v3"):
        assert expected in OPS


@pytest.mark.parametrize("name", OPS)
def test_backend_autograd_and_fake_kernels(name):
    composite = has_kernel(name, "CompositeExplicitAutograd")
    assert has_kernel(name, "CPU") or composite, f"{name} has no CPU kernel"
    assert has_kernel(name, "Autograd"), f"{name} has no Autograd kernel"
    assert not has_kernel(name, "AutogradCPU") and not has_kernel(name, "AutogradCUDA")
    if torchops.built_with_cuda():
        assert has_kernel(name, "CUDA") or composite, f"{name} has no CUDA kernel in a CUDA build"
    entry = fake_registry.find(name)
    assert entry.fake_impl.kernel is not None, f"{name} has no fake kernel"


def test_built_with_cuda_matches_build_info():
    from torchops import _build_info

    assert torchops.built_with_cuda() == _build_info.WITH_CUDA


@pytest.mark.parametrize("name", CONTROL_OPS)
def test_control_ops_have_a_kernel_for_every_backend(name):
    assert torch._C._dispatch_has_kernel(name), f"{name} has no kernel"
    assert has_kernel(name, "CompositeImplicitAutograd") or has_kernel(name, "CompositeExplicitAutograd") \
        or torch._C._dispatch_has_kernel_for_any_dispatch_key(name, torch._C.DispatchKeySet(torch._C.DispatchKey.CPU))

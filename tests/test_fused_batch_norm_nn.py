"""torchops.nn.BatchNorm2d/3d and convert_batchnorm: drop-in parity with torch.nn.BatchNorm2d/3d."""
import copy

import pytest
import torch
from torch import nn

import torchops
from conftest import DEVICES

CONFIGS = [dict(), dict(momentum=None), dict(affine=False), dict(track_running_stats=False),
           dict(momentum=0.3, eps=1e-3), dict(momentum=1.0)]


def _pair(cls_t, cls_o, c, device, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    ref = cls_t(c, **kw).to(device=device, dtype=dtype)
    ours = cls_o(c, **kw).to(device=device, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    if ref.affine:  # non-trivial affine parameters
        with torch.no_grad():
            for m in (ref, ours):
                m.weight.copy_(torch.linspace(0.5, 1.5, c))
                m.bias.copy_(torch.linspace(-1, 1, c))
    return ref, ours


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", CONFIGS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_module_matches_torch_over_steps(device, kw, dims, channels_last):
    cls_t, cls_o = (nn.BatchNorm2d, torchops.nn.BatchNorm2d) if dims == 2 else (nn.BatchNorm3d, torchops.nn.BatchNorm3d)
    ref, ours = _pair(cls_t, cls_o, 5, device, **kw)
    shape = (4, 5, 6, 7) if dims == 2 else (3, 5, 4, 3, 2)
    mf = torch.channels_last if dims == 2 else torch.channels_last_3d
    for step in range(4):
        for m in (ref, ours):
            m.train(step != 2)  # one eval step in the middle
        x = torch.randn(shape, device=device) * (step + 1) + step
        if channels_last:
            x = x.contiguous(memory_format=mf)
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, yo = ref(xr), ours(xo)
        torch.testing.assert_close(yo, yr, atol=1e-5, rtol=1e-5)
        if channels_last:
            assert yo.is_contiguous(memory_format=mf)
        g = torch.randn_like(yr)
        yr.backward(g)
        yo.backward(g)
        torch.testing.assert_close(xo.grad, xr.grad, atol=1e-5, rtol=1e-5)
        for pr, po in zip(ref.parameters(), ours.parameters()):
            torch.testing.assert_close(po.grad, pr.grad, atol=1e-4, rtol=1e-5)
        for (kr, br), (ko, bo) in zip(ref.named_buffers(), ours.named_buffers()):
            assert kr == ko
            torch.testing.assert_close(bo, br, atol=1e-6, rtol=1e-5)


def test_state_dict_keys_and_checkpoint_round_trip():
    ref = nn.BatchNorm2d(4)
    ref(torch.randn(3, 4, 5, 5))
    ours = torchops.nn.BatchNorm2d(4)
    assert list(ours.state_dict().keys()) == list(ref.state_dict().keys())
    ours.load_state_dict(ref.state_dict())
    back = nn.BatchNorm2d(4)
    back.load_state_dict(ours.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    assert isinstance(ours, nn.BatchNorm2d)
    assert repr(ours) == repr(ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_input_with_float32_module(dtype):
    ref, ours = _pair(nn.BatchNorm2d, torchops.nn.BatchNorm2d, 3, "cpu")
    x = torch.randn(4, 3, 5, 5).to(dtype)
    yo = ours(x)
    yr = ref(x.float()).to(dtype)
    assert yo.dtype == dtype
    torch.testing.assert_close(yo.float(), yr.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours.running_var, ref.running_var, atol=1e-3, rtol=1e-3)


def test_half_module_keeps_half_buffers():
    ours = torchops.nn.BatchNorm2d(3).half()
    ours(torch.randn(4, 3, 5, 5).half())
    assert ours.running_mean.dtype == torch.float16 and ours.num_batches_tracked.item() == 1


def test_double_module_with_float32_input_rounds_parameters_to_float32():
    # (documented leniency: torch's module refuses this mix)
    torch.manual_seed(0)
    ours = torchops.nn.BatchNorm2d(3).double()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 2.0)
        ours.bias.uniform_(-1.0, 1.0)
    ref = torchops.nn.BatchNorm2d(3)  # the same module in float32
    ref.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ours.state_dict().items()})
    x = torch.randn(4, 3, 5, 5)
    yo, yr = ours(x), ref(x)
    assert yo.dtype == torch.float32 and ours.running_mean.dtype == torch.float64
    torch.testing.assert_close(yo, yr, atol=0, rtol=0)
    torch.testing.assert_close(ours.running_var.float(), ref.running_var, atol=0, rtol=0)


def test_errors_like_torch():
    ours = torchops.nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match="expected 4D input"):
        ours(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        ours(torch.randn(1, 3, 1, 1))
    ours.eval()
    assert ours(torch.randn(1, 3, 1, 1)).shape == (1, 3, 1, 1)
    with pytest.raises(RuntimeError, match="scale must have the same number of elements as the channels of x"):
        ours(torch.randn(2, 4, 3, 3))
    with pytest.raises(RuntimeError, match="got 3 and 0"):  # zero channels (was a ZeroDivisionError)
        ours.train()(torch.randn(2, 0, 3, 3))
    assert torchops.nn.BatchNorm2d(0)(torch.randn(2, 0, 3, 3)).shape == (2, 0, 3, 3)


@pytest.mark.parametrize("momentum", [None, 1.0, 0.1])
def test_empty_training_batch_keeps_running_stats_like_torch(momentum):
    # Found by fuzzing: with momentum None / 1.0 an empty batch reached the op with eaf == 1, whose batch
    # statistics of an empty set are NaN (TF semantics), and they became the running statistics.
    torch.manual_seed(0)
    ref, ours = nn.BatchNorm2d(3, momentum=momentum), torchops.nn.BatchNorm2d(3, momentum=momentum)
    for x in (torch.randn(0, 3, 4, 4), torch.randn(8, 3, 4, 4), torch.randn(0, 3, 4, 4), torch.randn(5, 3, 4, 4)):
        torch.testing.assert_close(ours(x), ref(x))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(ours, name), getattr(ref, name))
    assert torch.isfinite(ours.running_mean).all() and torch.isfinite(ours.running_var).all()


def test_channels_last_input_is_not_copied():
    m = torchops.nn.BatchNorm2d(8)
    x = torch.randn(4, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    with torch.profiler.profile(record_shapes=True) as prof:
        y = m(x)
    big_copies = [e for e in prof.events() if e.name in ("aten::copy_", "aten::clone", "aten::contiguous",
                                                         "aten::empty_like")
                  and any(list(s) == list(x.shape) for s in e.input_shapes if s)]
    assert not [e for e in big_copies if e.name != "aten::empty_like"], [e.name for e in big_copies]
    assert y.is_contiguous(memory_format=torch.channels_last)


def _conv_net(bn2d):
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), bn2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), bn2d(8),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def test_convert_batchnorm_keeps_state_and_identity():
    model = _conv_net(nn.BatchNorm2d)
    model(torch.randn(4, 1, 8, 8))
    model.eval()
    bn = model[1]
    state = copy.deepcopy(model.state_dict())
    x = torch.randn(2, 1, 8, 8)
    before = model(x)
    params_before = [id(p) for p in model.parameters()]
    out = torchops.nn.convert_batchnorm(model)
    assert out is model and model[1] is bn and type(bn) is torchops.nn.BatchNorm2d and not bn.training
    assert [id(p) for p in model.parameters()] == params_before
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k])
    torch.testing.assert_close(model(x), before, atol=1e-6, rtol=1e-6)
    single = torchops.nn.convert_batchnorm(nn.BatchNorm3d(2))
    assert type(single) is torchops.nn.BatchNorm3d
    sync_like = nn.BatchNorm1d(3)
    assert type(torchops.nn.convert_batchnorm(sync_like)) is nn.BatchNorm1d  # only 2d/3d are converted


def test_small_conv_net_trains_like_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 8, 8, generator=g)
    target = (x.mean(dim=(1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    losses = {}
    for name, bn in (("torch", nn.BatchNorm2d), ("torchops", torchops.nn.BatchNorm2d)):
        model = _conv_net(bn)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hist = []
        for step in range(15):
            idx = torch.arange(16) + (step % 4) * 16
            loss = nn.functional.cross_entropy(model(x[idx]), target[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            hist.append(loss.item())
        model.eval()
        hist.append(nn.functional.cross_entropy(model(x), target).item())
        losses[name] = hist
    torch.testing.assert_close(torch.tensor(losses["torchops"]), torch.tensor(losses["torch"]), atol=1e-4, rtol=1e-4)
    assert losses["torchops"][-2] < losses["torchops"][0]


def test_scripted_module_matches_eager():
    m = torchops.nn.BatchNorm2d(3, momentum=None)
    s = torch.jit.script(torchops.nn.BatchNorm2d(3, momentum=None))
    for step in range(3):
        x = torch.randn(4, 3, 5, 5) + step
        torch.testing.assert_close(s(x), m(x))
    torch.testing.assert_close(s.running_mean, m.running_mean)
    assert int(s.num_batches_tracked) == 3
    s.eval()
    m.eval()
    x = torch.randn(2, 3, 5, 5)
    torch.testing.assert_close(s(x), m(x))


@pytest.mark.parametrize("cls,ref_cls,shape", [(torchops.nn.BatchNorm2d, nn.BatchNorm2d, (2, 3, 4, 4)),
                                               (torchops.nn.BatchNorm3d, nn.BatchNorm3d, (2, 3, 2, 3, 4))])
@pytest.mark.parametrize("eps,training", [(0.0, True), (-1e-5, True), (-1e-5, False)])
def test_nonpositive_eps_refused_like_torch(cls, ref_cls, shape, eps, training):
    x = torch.randn(shape)
    msgs = []
    for c in (cls, ref_cls):
        m = c(3, eps=eps).train(training)
        with pytest.raises(ValueError) as e:
            m(x)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    assert ("eps must be positive during training" if training else "eps must be non-negative") in msgs[0]


def test_zero_eps_allowed_in_eval_like_torch():
    x = torch.randn(2, 3, 4, 4)
    m, ref = torchops.nn.BatchNorm2d(3, eps=0.0).eval(), nn.BatchNorm2d(3, eps=0.0).eval()
    torch.testing.assert_close(m(x), ref(x))

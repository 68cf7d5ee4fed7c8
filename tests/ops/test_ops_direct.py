"""tiledsl.ops' eager calls skip torch's custom-op dispatcher only where it adds nothing
(torch_ops.call): plain tensors, no gradient wanted, no mode, transform or profiler active. Anywhere
else the call goes through torch.ops.tiledsl.*, whose fake implementation FakeTensorMode runs."""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tiledsl.ops
from tiledsl.ops import torch_ops


def test_every_op_has_its_body_recorded():
    assert set(torch_ops.IMPLS) == {name for name in tiledsl.ops.__all__ if hasattr(torch.ops.tiledsl, name)}


def test_an_eager_call_runs_the_body_without_the_dispatcher(monkeypatch):
    seen = []

    def body(x, group_name, impl=None, tune=None):
        seen.append((x, group_name, impl, tune))
        return x * 2

    monkeypatch.setitem(torch_ops.IMPLS, "all_reduce", body)
    x = torch.randn(8)
    out = torch_ops.call("all_reduce", x, "g", "torch", False)
    assert seen == [(x, "g", "torch", False)] and torch.equal(out, x * 2)


def test_what_needs_the_dispatcher_goes_through_it():
    x = torch.randn(4)
    assert torch_ops.direct((x, "g", None, None))
    with torch.no_grad():
        assert torch_ops.direct((x.requires_grad_(), "g"))
    assert not torch_ops.direct((x, "g"))  # a gradient wanted: autograd must see the op
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(4))
        assert not torch_ops.direct((fake,))
    with torch.autograd.profiler.profile():
        assert not torch_ops.direct((torch.randn(4),))


def test_a_fake_call_gets_the_fake_implementation():
    """Under FakeTensorMode the op's shapes come from register_fake, as torch.compile needs."""
    with FakeTensorMode():
        recv, count = torch_ops.call("moe_dispatch", torch.empty(6, 16), torch.zeros(6, 2, dtype=torch.int64),
                                     2, 4, "g", None, None, 3)
    assert tuple(recv.shape) == (2, 3, 4, 16) and tuple(count.shape) == (2, 3) and count.dtype == torch.int32

"""Functions and classes the tests call by name; every test process imports this, so each
is registered on every Python worker of the job."""

import threading
import time

import torch

import drpc


@drpc.function("test.scale")
def scale(t, s):
    return t * s


@drpc.function("test.echo")
def echo(*args, **kwargs):
    return [list(args), kwargs]


@drpc.function
def bare(n):
    return n + 1


@drpc.function("test.whoami")
def whoami():
    return drpc.get_worker_info().name


@drpc.function("test.fail")
def fail(message):
    raise ValueError(message)


@drpc.function("test.reject")
def reject(t, s):
    raise ValueError(f"rejected {s}")


@drpc.function("test.bad_argument")
def bad_argument():
    raise drpc.BadArgumentError("refused on purpose")


@drpc.function("test.sleep")
def sleep(seconds):
    time.sleep(seconds)
    return seconds


_count = 0
_count_lock = threading.Lock()


@drpc.function("test.count")
def count(*unused):
    global _count
    with _count_lock:
        _count += 1
        return _count


@drpc.function("test.get_count")
def get_count():
    return _count


@drpc.function("test.relay")
def relay(to, fn, args):
    """Calls `fn` on `to` from a handler thread: nested RPCs release the GIL."""
    return drpc.rpc_sync(to, fn, args=tuple(args))


@drpc.function("test.async_relay")
def async_relay(to, fn, args):
    """Answers when the nested call's future does, without holding a handler thread."""
    return drpc.rpc_async(to, fn, args=tuple(args)).then(lambda f: [f.value(), "then"])


@drpc.function("test.call_forward")
def call_forward(layer, x):
    """A proxy used away from the caller: the RRef came in as an argument."""
    return layer.rpc_sync().forward(x)


@drpc.function("test.returns_object")
def returns_object():
    return threading.Lock()


@drpc.function("test.Linear")
class Linear:
    """A layer whose parameters live where it was created (remote), as in torch's examples."""

    def __init__(self, n_in, n_out, seed):
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(n_in, n_out, generator=g).requires_grad_()
        self.bias = torch.randn(n_out, generator=g).requires_grad_()

    def forward(self, x):
        return torch.tanh(x @ self.weight + self.bias)

    def parameter_rrefs(self):
        return [drpc.RRef(self.weight), drpc.RRef(self.bias)]

    def parameters(self):
        return [self.weight.detach().clone(), self.bias.detach().clone()]

    def gradients(self, context_id):
        grads = drpc.dist_autograd.get_gradients(context_id)
        return [grads[self.weight], grads[self.bias]]


def linear_reference(weight, bias, x):
    return torch.tanh(x @ weight + bias)


@drpc.function("test.fetch")
def fetch(rref):
    return rref.to_here()


@drpc.async_function("test.async_scale")
def async_scale(to, x, s):
    """Scales on `to`, then adds 1 when that answers: the caller waits, no handler does."""
    return drpc.rpc_async(to, scale, args=(x, s)).then(lambda f: f.value() + 1)


@drpc.async_function("test.not_a_future")
def not_a_future():
    return 1


# TorchScript, served by Python workers under a name: a function and a module instance.
@torch.jit.script
def script_mul(x, s: float):
    return x * s


drpc.function("test.script_mul")(script_mul)


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.full((1,), 0.5))

    def forward(self, x):
        return x * 2 + self.shift


scripted_affine = drpc.function("test.scripted_affine")(torch.jit.script(Affine()))

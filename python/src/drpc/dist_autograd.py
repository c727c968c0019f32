"""Distributed autograd, as torch.distributed.autograd:

    with drpc.dist_autograd.context() as context_id:
        loss = drpc.rpc_sync("w1", my_layer, args=(x,)).sum()
        drpc.dist_autograd.backward(context_id, [loss])
        grads = drpc.dist_autograd.get_gradients(context_id)   # {tensor: gradient}
"""

from . import _drpc


class context:
    """A distributed autograd context for this thread; `with` gives its id. RPCs made on
    this thread inside it are recorded; it is released on every worker when left."""

    def __init__(self):
        self._context = None

    def __enter__(self):
        self._context = _drpc.AutogradContext()
        return self._context.id

    def __exit__(self, *exc):
        self._context.close()
        self._context = None
        return False


def backward(context_id, roots, retain_graph=False):
    """Runs the distributed backward pass from the scalar tensors `roots`; returns when
    every worker involved is done. Gradients go to the context, not to .grad."""
    _drpc.backward(context_id, list(roots), retain_graph)


def get_gradients(context_id):
    """This worker's gradients in the context: {leaf tensor: gradient}."""
    return _drpc.get_gradients(context_id)

"""DistributedOptimizer, as torch.distributed.optim's: one optimizer per parameter owner,
run there on a distributed autograd context's gradients. drpc sends no code, so the
optimizer class maps to one libtorch implements (torch.optim.SGD, torch.optim.Adam) and
its arguments to drpc::optim::sgd / adam."""

import inspect

import torch

from . import _drpc

# Per class: the arguments drpc::optim carries, and torch's others, accepted only at the
# value that changes nothing (a different one would silently train differently).
_SUPPORTED = {
    torch.optim.SGD: ("sgd", ("lr", "momentum", "weight_decay")),
    torch.optim.Adam: ("adam", ("lr", "betas", "eps", "weight_decay")),
}


def _spec(optimizer_class, args, kwargs):
    if optimizer_class not in _SUPPORTED:
        raise TypeError(f"DistributedOptimizer: {optimizer_class!r} is not supported "
                        "(torch.optim.SGD and torch.optim.Adam are)")
    kind, carried = _SUPPORTED[optimizer_class]
    # Bound against torch's own signature, so positional arguments mean what they mean there.
    signature = inspect.signature(optimizer_class.__init__)
    try:
        bound = signature.bind(None, None, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"DistributedOptimizer({optimizer_class.__name__}): {e}") from None
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop("self"), values.pop("params")
    for name, value in values.items():
        if name in carried:
            continue
        default = signature.parameters[name].default
        if value != default:
            raise TypeError(f"DistributedOptimizer({optimizer_class.__name__}): {name}={value!r} is not "
                            f"supported (drpc's {kind} takes {', '.join(carried)})")
    lr = values["lr"]
    if not isinstance(lr, (int, float)):  # SGD's lr is `required`
        raise TypeError(f"DistributedOptimizer({optimizer_class.__name__}): lr is required")
    beta1, beta2 = values.get("betas", (0.9, 0.999))
    return dict(kind=kind, lr=float(lr), momentum=float(values.get("momentum", 0.0)),
                weight_decay=float(values.get("weight_decay", 0.0)), beta1=float(beta1), beta2=float(beta2),
                eps=float(values.get("eps", 1e-8)))


class DistributedOptimizer:
    """DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05, momentum=0.9).
    step(context_id) updates every parameter on its owner with that context's gradients
    and returns when all are done."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        s = _spec(optimizer_class, args, kwargs)
        self._optimizer = _drpc.DistributedOptimizer(s["kind"], s["lr"], s["momentum"], s["weight_decay"],
                                                     s["beta1"], s["beta2"], s["eps"], list(params_rref))

    def step(self, context_id):
        self._optimizer.step(context_id)

    def close(self):
        """Drops the optimizers on the owners now (else when it is garbage-collected)."""
        self._optimizer.close()

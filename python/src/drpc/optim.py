"""DistributedOptimizer, as torch.distributed.optim's: one optimizer per parameter owner,
run there on a distributed autograd context's gradients. drpc sends no code, so the
optimizer class maps to one libtorch implements (torch.optim.SGD, torch.optim.Adam)."""

import torch

from . import _drpc


def _spec(optimizer_class, kwargs):
    kwargs = dict(kwargs)
    spec = dict(lr=kwargs.pop("lr", None), momentum=0.0, weight_decay=kwargs.pop("weight_decay", 0.0),
                beta1=0.9, beta2=0.999, eps=1e-8)
    if optimizer_class in (torch.optim.SGD, "sgd"):
        kind = "sgd"
        spec["momentum"] = kwargs.pop("momentum", 0.0)
        if spec["lr"] is None:
            raise TypeError("DistributedOptimizer(SGD): lr is required")
    elif optimizer_class in (torch.optim.Adam, "adam"):
        kind = "adam"
        if spec["lr"] is None:
            spec["lr"] = 1e-3
        spec["beta1"], spec["beta2"] = kwargs.pop("betas", (0.9, 0.999))
        spec["eps"] = kwargs.pop("eps", 1e-8)
    else:
        raise TypeError(f"DistributedOptimizer: {optimizer_class!r} is not supported "
                        "(torch.optim.SGD and torch.optim.Adam are)")
    if kwargs:
        raise TypeError(f"DistributedOptimizer({kind}): unsupported arguments {sorted(kwargs)}")
    return kind, spec


class DistributedOptimizer:
    def __init__(self, optimizer_class, params_rref, **kwargs):
        kind, spec = _spec(optimizer_class, kwargs)
        self._optimizer = _drpc.DistributedOptimizer(
            kind, float(spec["lr"]), float(spec["momentum"]), float(spec["weight_decay"]),
            float(spec["beta1"]), float(spec["beta2"]), float(spec["eps"]), list(params_rref))

    def step(self, context_id):
        """Updates every parameter with the context's gradients, on its owner."""
        self._optimizer.step(context_id)

    def close(self):
        """Drops the optimizers on the owners (also done when it is garbage-collected)."""
        self._optimizer.close()

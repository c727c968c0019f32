"""PyTorch's side of tools/bench/dist_autograd.sh (run with /usr/bin/python3).

python3 dist_autograd_torch.py WORLD_SIZE ITERS -> step_ms=X
One training step: forward through remote Linear(256,256)+ReLU layers (one per other
worker), a local head, MSE loss, distributed backward, DistributedOptimizer SGD step.
"""
import socket
import sys
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef


def make_linear():
    torch.manual_seed(1)
    return torch.nn.Linear(256, 256)


def linear_relu(layer, x):
    return torch.relu(layer.local_value()(x))


def param_rrefs(layer):
    return [RRef(p) for p in layer.local_value().parameters()]


def run(rank, world, port, iters):
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
    if rank == 0:
        layers = [rpc.remote(f"worker{r}", make_linear) for r in range(1, world)]
        head = torch.nn.Linear(256, 1, bias=False)
        params = [RRef(p) for p in head.parameters()]
        for r, layer in enumerate(layers, start=1):
            params += rpc.rpc_sync(f"worker{r}", param_rrefs, args=(layer,))
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.01)
        x, target = torch.randn(32, 256), torch.randn(32, 1)

        def step():
            with dist_autograd.context() as ctx:
                h = x
                for r, layer in enumerate(layers, start=1):
                    h = rpc.rpc_sync(f"worker{r}", linear_relu, args=(layer, h))
                loss = (head(h) - target).pow(2).mean()
                dist_autograd.backward(ctx, [loss])
                opt.step(ctx)

        for _ in range(10):
            step()
        start = time.perf_counter()
        for _ in range(iters):
            step()
        print(f"step_ms={(time.perf_counter() - start) / iters * 1e3:.3f}", flush=True)
    rpc.shutdown()


def main():
    world, iters = int(sys.argv[1]), int(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(world, port, iters), nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""drpc from Python: a small regression model split across three processes, trained with
distributed autograd and a DistributedOptimizer, as one would with torch.distributed.rpc.

    export PYTHONPATH=$(tools/python.sh)
    /usr/bin/python3 tools/demo.py [--steps=N] [--lr=X]

This process is the trainer (rank 0, it serves the store); it starts two workers (this
file again, with --rank), each holding one stage of the model behind an RRef. Functions
and classes travel by name (@drpc.function), never as code.
"""

import argparse
import os
import socket
import subprocess
import sys

import torch

import drpc


@drpc.function("demo.Stage")
class Stage:
    """One stage of the model; its parameters live on the worker that built it."""

    def __init__(self, n_in, n_out, seed):
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.relu(self.layer(x)) if self.layer.out_features > 1 else self.layer(x)

    def parameter_rrefs(self):
        return [drpc.RRef(p) for p in self.layer.parameters()]


def options(port):
    return drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=30)


def worker(rank, port):
    drpc.init_rpc(f"worker{rank}", rank=rank, world_size=3, rpc_backend_options=options(port))
    drpc.shutdown()  # serves the trainer until the whole job is done


def trainer(args, port):
    drpc.init_rpc("trainer", rank=0, world_size=3, rpc_backend_options=options(port))
    stage1 = drpc.remote("worker1", Stage, args=(8, 16, 1))
    stage2 = drpc.remote("worker2", Stage, args=(16, 1, 2))
    params = stage1.rpc_sync().parameter_rrefs() + stage2.rpc_sync().parameter_rrefs()
    opt = drpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    true_w = torch.randn(8, 1, generator=g)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 8, generator=g)
        y = x @ true_w
        with drpc.dist_autograd.context() as context_id:
            h = stage1.rpc_sync().forward(x)                 # on worker1
            pred = stage2.rpc_async().forward(h).wait()      # on worker2, as a future
            loss = torch.nn.functional.mse_loss(pred, y)
            drpc.dist_autograd.backward(context_id, [loss])  # through both workers
            opt.step(context_id)                              # each owner updates its own
        if step == 1 or step % max(1, args.steps // 10) == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    print("a builtin on worker1: torch.add ->", drpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)).tolist())
    try:
        drpc.rpc_sync("worker2", "no.such.function")
    except drpc.BadArgumentError as e:
        print("an error comes back as a Python exception:", type(e).__name__, "-", e)
    drpc.shutdown()
    return loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--expect_loss_below", type=float, default=None, help="exit 1 unless the last loss is")
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank > 0:
        return worker(args.rank, args.port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOG_minloglevel=os.environ.get("GLOG_minloglevel", "1"))
    workers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), f"--rank={r}", f"--port={port}"], env=env)
               for r in (1, 2)]
    try:
        loss = trainer(args, port)
        codes = [w.wait(timeout=60) for w in workers]
        if codes != [0, 0]:
            sys.exit(f"workers exited with {codes}")
        if args.expect_loss_below is not None and not loss < args.expect_loss_below:
            sys.exit(f"the loss {loss:.4f} is not below {args.expect_loss_below}")
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


if __name__ == "__main__":
    main()

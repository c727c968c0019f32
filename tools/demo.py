#!/usr/bin/python3
"""The main job in Python: an MLP trained on Fashion-MNIST (Debian's dataset-fashion-mnist)
with the model split across processes, written as one would with torch.distributed.rpc.
The trainer (rank 0) holds the input layer and the head; every other worker one hidden
block (torch.nn.Linear(256, 256) + ReLU) behind an RRef. Forward goes through RPC, backward
is distributed autograd, the update a DistributedOptimizer (SGD with momentum): the same
model, data and settings as the C++ job (tools/demo.sh), reaching the same accuracy.

    tools/demo.sh --python [--workers=3] [--epochs=2] [--batch_size=64] [--lr=0.05] [--limit=N]
    (or: export PYTHONPATH=$(tools/python.sh -c opt); /usr/bin/python3 tools/demo.py ...)

This process is the trainer and serves the job's store; it starts the other workers (this
file again, with --rank). Classes and functions travel by name (@drpc.function), never as
code.
"""

import argparse
import gzip
import os
import socket
import subprocess
import sys
import time

import torch

import drpc

DATA_DIR = "/usr/share/datasets/fashion-mnist"


@drpc.function("demo.Block")
class Block(torch.nn.Module):
    """One hidden block; its parameters live on the worker that built it."""

    def __init__(self, seed):
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)
        # kaiming_normal_(nonlinearity="relu"), drawn from the block's own generator: remote()
        # builds it on a handler thread, where seeding torch's global one would race.
        with torch.no_grad():
            self.layer.weight.normal_(0.0, (2.0 / 256) ** 0.5, generator=torch.Generator().manual_seed(seed))
        torch.nn.init.zeros_(self.layer.bias)

    def forward(self, x):
        return torch.relu(self.layer(x))

    def parameter_rrefs(self):
        return [drpc.RRef(p) for p in self.parameters()]


def read_idx(path):
    """A gzipped IDX file of bytes as a uint8 tensor of its shape."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        sys.exit(f"cannot open {path} (install dataset-fashion-mnist: tools/demo.sh does)")
    magic = int.from_bytes(data[0:4], "big")
    dims = magic & 0xFF
    if magic >> 8 != 0x08 or not 1 <= dims <= 3:
        sys.exit(f"{path} is not an IDX file of bytes")
    sizes = [int.from_bytes(data[4 + 4 * d:8 + 4 * d], "big") for d in range(dims)]
    body = data[4 + 4 * dims:]
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(sizes)


def images(path):
    raw = read_idx(path)
    return ((raw.float().reshape(raw.shape[0], -1) / 255.0) - 0.2860) / 0.3530


def options(port):
    # A call may wait for a whole training step of its peer: longer than a worker's.
    return drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)


def serve(rank, world_size, port):
    torch.set_num_threads(1)  # the workers share the machine's cores
    drpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options(port))
    drpc.shutdown()  # serves the trainer until the whole job is done


def train(args, port):
    torch.set_num_threads(1)
    drpc.init_rpc("worker0", rank=0, world_size=args.workers, rpc_backend_options=options(port))
    train_x, train_y = images(f"{DATA_DIR}/train-images-idx3-ubyte.gz"), read_idx(f"{DATA_DIR}/train-labels-idx1-ubyte.gz").long()
    test_x, test_y = images(f"{DATA_DIR}/t10k-images-idx3-ubyte.gz"), read_idx(f"{DATA_DIR}/t10k-labels-idx1-ubyte.gz").long()
    if args.limit:
        train_x, train_y = train_x[:args.limit], train_y[:args.limit]
    if args.test_limit:
        test_x, test_y = test_x[:args.test_limit], test_y[:args.test_limit]
    n = train_x.shape[0]
    print(f"Fashion-MNIST: {n} training and {test_x.shape[0]} test images; model split over {args.workers} workers "
          "(Python)", flush=True)

    torch.manual_seed(1)
    input_layer, head = torch.nn.Linear(784, 256), torch.nn.Linear(256, 10)
    for layer in (input_layer, head):
        torch.nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        torch.nn.init.zeros_(layer.bias)
    blocks = [drpc.remote(f"worker{r}", Block, args=(r + 10,)) for r in range(1, args.workers)]
    params = [drpc.RRef(p) for p in list(input_layer.parameters()) + list(head.parameters())]
    for block in blocks:
        params += block.rpc_sync().parameter_rrefs()
    optimizer = drpc.optim.DistributedOptimizer(torch.optim.SGD, params, lr=args.lr, momentum=0.9)

    def forward(x):
        h = torch.relu(input_layer(x))
        for block in blocks:
            h = block.rpc_sync().forward(h)  # on the block's worker
        return head(h)

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(n, generator=torch.Generator().manual_seed(100 + epoch))
        steps = (n + args.batch_size - 1) // args.batch_size
        running = total = 0.0
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            with drpc.dist_autograd.context() as context_id:
                loss = torch.nn.functional.cross_entropy(forward(train_x[idx]), train_y[idx])
                drpc.dist_autograd.backward(context_id, [loss])  # through every worker
                optimizer.step(context_id)                       # each owner updates its own
            running = loss.item() if s == 0 else 0.98 * running + 0.02 * loss.item()
            total += loss.item()
            if (s + 1) % args.log_every == 0 or s == steps - 1:
                print(f"epoch {epoch} step {s + 1}/{steps} loss {running:.4f}", flush=True)
        # Test accuracy, through the same split model, without recording gradients.
        correct = 0
        with torch.no_grad():
            for b in range(0, test_x.shape[0], 1000):
                correct += (forward(test_x[b:b + 1000]).argmax(1) == test_y[b:b + 1000]).sum().item()
        accuracy = 100.0 * correct / test_x.shape[0]
        print(f"epoch {epoch}: train loss {total / steps:.4f}, test accuracy {accuracy:.2f}% "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    drpc.shutdown()
    return accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="processes, the trainer included (at least 2)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="use only this many training images (0: all)")
    parser.add_argument("--test_limit", type=int, default=0, help="use only this many test images (0: all)")
    parser.add_argument("--log_every", type=int, default=100, help="print a progress line every this many steps")
    parser.add_argument("--expect_accuracy_above", type=float, default=None,
                        help="exit 1 unless the last test accuracy (in %%) is above this")
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("epochs", "batch_size", "log_every"):
        if getattr(args, name) < (0 if name == "epochs" else 1):
            parser.error(f"--{name} is out of range: {getattr(args, name)}")
    if args.workers < 2:
        parser.error(f"--workers must be at least 2 (the trainer and one block), got {args.workers}")
    if args.rank > 0:
        return serve(args.rank, args.workers, args.port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOG_minloglevel=os.environ.get("GLOG_minloglevel", "2"))
    workers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), f"--rank={r}", f"--port={port}",
                                 f"--workers={args.workers}"], env=env)
               for r in range(1, args.workers)]
    try:
        accuracy = train(args, port)
        codes = [w.wait(timeout=120) for w in workers]
        if any(codes):
            sys.exit(f"workers exited with {codes}")
        if args.expect_accuracy_above is not None and not accuracy > args.expect_accuracy_above:
            sys.exit(f"the test accuracy {accuracy:.2f}% is not above {args.expect_accuracy_above}%")
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


if __name__ == "__main__":
    main()

"""PyTorch's side of tools/bench/rref.sh (run with /usr/bin/python3).

python3 rref_torch.py ITERS -> rref_us=X (remote(torch.add) + to_here(), us per pair)
"""
import socket
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def run(rank, port, iters):
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        a, b = torch.ones(2), torch.ones(2)
        for _ in range(100):
            rpc.remote("worker1", torch.add, args=(a, b)).to_here()
        start = time.perf_counter()
        for _ in range(iters):
            rpc.remote("worker1", torch.add, args=(a, b)).to_here()
        print(f"rref_us={(time.perf_counter() - start) / iters * 1e6:.1f}", flush=True)
    rpc.shutdown()


def main():
    iters = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(port, iters), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()

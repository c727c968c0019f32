"""PyTorch's side of tools/bench/rref.sh (run with /usr/bin/python3).

python3 rref_torch.py ITERS [DROPS] -> rref_us=X rref_drop_us=X
(remote(torch.add) + to_here(), us per pair; then DROPS RRefs owned by worker1 dropped at
once, us per RRef until worker1 has freed them all, its count polled with rpc_sync)
"""
import socket
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def owned():
    return int(rpc._rref_context_get_debug_info()["num_owner_rrefs"])


def run(rank, port, iters, drops):
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
        pair_us = (time.perf_counter() - start) / iters * 1e6
        rrefs = [rpc.remote("worker1", torch.add, args=(a, b)) for _ in range(drops)]
        for r in rrefs:
            r.to_here()
        del r
        assert rpc.rpc_sync("worker1", owned) >= drops
        start = time.perf_counter()
        del rrefs
        while rpc.rpc_sync("worker1", owned) > 0:
            pass
        drop_us = (time.perf_counter() - start) / drops * 1e6
        print(f"rref_us={pair_us:.1f} rref_drop_us={drop_us:.2f}", flush=True)
    rpc.shutdown()


def main():
    iters = int(sys.argv[1])
    drops = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(port, iters, drops), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()

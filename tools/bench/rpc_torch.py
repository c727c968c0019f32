"""PyTorch RPC's side of tools/bench/rpc.sh (TensorPipe backend; run with /usr/bin/python3).

python3 rpc_torch.py SYNC_CALLS ASYNC_CALLS ECHO_ITERS -> one line, as rpc_bench prints:
sync_us=X async_cps=X echo_MBps=X

measure() and spawn_pair() are shared with rpc_drpc.py, which makes the same calls through
drpc's API of the same names: both sides of the comparison run one piece of code.
"""
import socket
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp


def echo(t):
    return t


def measure(api, options, echo_fn, rank, sync_calls, async_calls, echo_iters):
    """Rank `rank` of a 2-process job through `api` (torch.distributed.rpc or drpc): rank 0
    times rpc_sync, windows of 1000 rpc_async and a 64 MiB echo to rank 1, and prints them."""
    torch.set_num_threads(1)
    api.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        a, b = torch.ones(2), torch.ones(2)
        for _ in range(200):
            api.rpc_sync("worker1", torch.add, args=(a, b))
        start = time.perf_counter()
        for _ in range(sync_calls):
            api.rpc_sync("worker1", torch.add, args=(a, b))
        sync_us = (time.perf_counter() - start) / sync_calls * 1e6

        start = time.perf_counter()
        for _ in range(0, async_calls, 1000):
            futs = [api.rpc_async("worker1", torch.add, args=(a, b)) for _ in range(1000)]
            torch.futures.wait_all(futs)
        async_cps = async_calls / (time.perf_counter() - start)

        big = torch.ones(16 << 20)
        api.rpc_sync("worker1", echo_fn, args=(big,))
        start = time.perf_counter()
        for _ in range(echo_iters):
            api.rpc_sync("worker1", echo_fn, args=(big,))
        echo_mbps = big.numel() * 4 / ((time.perf_counter() - start) / echo_iters) / 1e6
        print(f"sync_us={sync_us:.1f} async_cps={async_cps:.0f} echo_MBps={echo_mbps:.0f}", flush=True)
    api.shutdown()


def spawn_pair(run):
    """Runs run(rank, port, SYNC_CALLS, ASYNC_CALLS, ECHO_ITERS) in 2 spawned processes."""
    sync_calls, async_calls, echo_iters = (int(a) for a in sys.argv[1:4])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(port, sync_calls, async_calls, echo_iters), nprocs=2, start_method="spawn")


def run(rank, port, sync_calls, async_calls, echo_iters):
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)
    measure(rpc, options, echo, rank, sync_calls, async_calls, echo_iters)


if __name__ == "__main__":
    spawn_pair(run)

"""drpc's Python side of tools/bench/rpc.sh --python: rpc_torch.py's measurements, made
with drpc's Python API (`import drpc`, PYTHONPATH from tools/python.sh; /usr/bin/python3).

python3 rpc_drpc.py SYNC_CALLS ASYNC_CALLS ECHO_ITERS -> one line, as rpc_torch.py prints:
sync_us=X async_cps=X echo_MBps=X
"""
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

import drpc


@drpc.function("bench.echo")  # registered in both processes: spawn imports this file in each
def echo(t):
    return t


def run(rank, port, sync_calls, async_calls, echo_iters):
    torch.set_num_threads(1)
    options = drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)
    drpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        a, b = torch.ones(2), torch.ones(2)
        for _ in range(200):
            drpc.rpc_sync("worker1", torch.add, args=(a, b))
        start = time.perf_counter()
        for _ in range(sync_calls):
            drpc.rpc_sync("worker1", torch.add, args=(a, b))
        sync_us = (time.perf_counter() - start) / sync_calls * 1e6

        start = time.perf_counter()
        for _ in range(0, async_calls, 1000):
            futs = [drpc.rpc_async("worker1", torch.add, args=(a, b)) for _ in range(1000)]
            torch.futures.wait_all(futs)
        async_cps = async_calls / (time.perf_counter() - start)

        big = torch.ones(16 << 20)
        drpc.rpc_sync("worker1", echo, args=(big,))
        start = time.perf_counter()
        for _ in range(echo_iters):
            drpc.rpc_sync("worker1", echo, args=(big,))
        echo_mbps = big.numel() * 4 / ((time.perf_counter() - start) / echo_iters) / 1e6
        print(f"sync_us={sync_us:.1f} async_cps={async_cps:.0f} echo_MBps={echo_mbps:.0f}", flush=True)
    drpc.shutdown()


def main():
    sync_calls, async_calls, echo_iters = (int(a) for a in sys.argv[1:4])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(port, sync_calls, async_calls, echo_iters), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()

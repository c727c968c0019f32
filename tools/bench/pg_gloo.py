"""PyTorch Gloo's side of tools/bench/process_group.sh (run with /usr/bin/python3).

python3 pg_gloo.py WORLD_SIZE LARGE_ITERS SMALL_ITERS -> one line, as pg_bench prints:
busbw_MBps=X lat_us=X barrier_us=X
"""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, port, large_iters, small_iters):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    big = torch.ones(16 << 20)
    dist.all_reduce(big)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(large_iters):
        dist.all_reduce(big)
    large_s = (time.perf_counter() - start) / large_iters
    busbw = big.numel() * 4 * 2.0 * (world - 1) / world / large_s / 1e6

    small = torch.ones(1)
    for _ in range(50):
        dist.all_reduce(small)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(small_iters):
        dist.all_reduce(small)
    lat_us = (time.perf_counter() - start) / small_iters * 1e6

    dist.barrier()
    start = time.perf_counter()
    for _ in range(small_iters):
        dist.barrier()
    barrier_us = (time.perf_counter() - start) / small_iters * 1e6
    dist.barrier()
    if rank == 0:
        print(f"busbw_MBps={busbw:.0f} lat_us={lat_us:.1f} barrier_us={barrier_us:.1f}", flush=True)
    dist.destroy_process_group()


def main():
    world, large_iters, small_iters = (int(a) for a in sys.argv[1:4])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(world, port, large_iters, small_iters), nprocs=world,
                       start_method="spawn")


if __name__ == "__main__":
    main()

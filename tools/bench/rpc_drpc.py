"""drpc's Python side of tools/bench/rpc.sh --python: rpc_torch.py's measurements, made
with drpc's Python API (`import drpc`, PYTHONPATH from tools/python.sh; /usr/bin/python3).

python3 rpc_drpc.py SYNC_CALLS ASYNC_CALLS ECHO_ITERS -> one line, as rpc_torch.py prints:
sync_us=X async_cps=X echo_MBps=X
"""
import drpc
from rpc_torch import measure, spawn_pair


@drpc.function("bench.echo")  # registered in both processes: spawn imports this file in each
def echo(t):
    return t


def run(rank, port, sync_calls, async_calls, echo_iters):
    options = drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120)
    measure(drpc, options, echo, rank, sync_calls, async_calls, echo_iters)


if __name__ == "__main__":
    spawn_pair(run)

"""A Python worker of a test job: joins, serves until the whole job shuts down, exits 0.
Usage: worker.py NAME RANK WORLD_SIZE PORT; PORT "env" joins through env:// (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE). TEST_TOKEN_FILE, if set, is the job's token file;
TEST_TLS_CERT, TEST_TLS_KEY and TEST_TLS_CA, if set, its TLS files. Joins with torch's
positional form, init_rpc(name, backend, rank, world_size, rpc_backend_options)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import drpc  # noqa: E402
import examples  # noqa: E402,F401  (registers the ported examples' classes)
import functions  # noqa: E402,F401  (registers the test functions)


def main():
    name, rank, world_size, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    options = drpc.RpcBackendOptions(init_method="env://" if port == "env" else f"tcp://127.0.0.1:{port}",
                                     init_timeout=60, token_file=os.environ.get("TEST_TOKEN_FILE"),
                                     tls_cert=os.environ.get("TEST_TLS_CERT", ""),
                                     tls_key=os.environ.get("TEST_TLS_KEY", ""),
                                     tls_ca=os.environ.get("TEST_TLS_CA", ""))
    if port == "env":
        drpc.init_rpc(name, rpc_backend_options=options)
    else:
        drpc.init_rpc(name, None, rank, world_size, options)
    drpc.shutdown(graceful=True)
    print(f"{name}: shut down", flush=True)


if __name__ == "__main__":
    main()

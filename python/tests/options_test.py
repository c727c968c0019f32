"""init_rpc's options reach drpc: env:// rendezvous (MASTER_ADDR/MASTER_PORT, RANK and
WORLD_SIZE), a job token from token_file, rpc_timeout as the default of every call; its
arguments are torch's. This process is rank 0; worker1 is a subprocess joining the same way."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import drpc  # noqa: E402
import functions  # noqa: E402
import job  # noqa: E402

WORKER = None
PORT = None


def setUpModule():
    global WORKER, PORT
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write("s3cret-job-token\n")
    port = PORT = job.free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1", WORLD_SIZE="2",
               TEST_TOKEN_FILE=token_file)
    WORKER = subprocess.Popen([sys.executable, os.path.join(job.HERE, "worker.py"), "worker1", "-1", "-1", "env"],
                              env=env, start_new_session=True)
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="2")
        options = drpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=0.5, num_worker_threads=2,
                                                   token_file=token_file, heartbeat_interval=0.2,
                                                   heartbeat_misses=20, init_timeout=60)
        drpc.init_rpc("worker0", rpc_backend_options=options)
    except BaseException:
        WORKER.kill()
        raise


def tearDownModule():
    job.shutdown_and_reap(WORKER)


class Options(unittest.TestCase):
    def test_ranks_and_world_from_the_environment(self):
        self.assertEqual(drpc.get_worker_info().id, 0)
        self.assertEqual([w.name for w in drpc.get_worker_infos()], ["worker0", "worker1"])
        self.assertEqual(drpc.rpc_sync(1, functions.whoami, timeout=10), "worker1")

    def test_rpc_timeout_is_the_default_of_every_call(self):
        self.assertEqual(drpc._get_rpc_timeout(), 0.5)
        start = time.monotonic()
        with self.assertRaises(drpc.TimeoutError):
            drpc.rpc_sync("worker1", functions.sleep, args=(3.0,))
        self.assertLess(time.monotonic() - start, 2.5)
        self.assertEqual(drpc.rpc_sync("worker1", functions.sleep, args=(1.0,), timeout=10), 1.0)  # its own

    def test_a_process_without_the_token_is_refused(self):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        wrong = os.path.join(tmp, "wrong")
        with open(wrong, "w") as f:
            f.write("not-the-token\n")
        intruder = (
            "import sys, drpc\n"
            "try:\n"
            f"    drpc.init_rpc('intruder', rank=1, world_size=2, rpc_backend_options=drpc.RpcBackendOptions("
            f"init_method='tcp://127.0.0.1:{PORT}', token_file={wrong!r}, init_timeout=20))\n"
            "except drpc.UnauthenticatedError as e:\n"
            "    print('refused:', e); sys.exit(3)\n")
        out = subprocess.run([sys.executable, "-c", intruder], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 3, out.stdout + out.stderr)
        self.assertIn("wrong or missing job token", out.stdout)
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami, timeout=10), "worker1")  # the job is unharmed

    def test_bad_options_are_refused_before_joining(self):
        with self.assertRaisesRegex(ValueError, "tcp://HOST:PORT"):
            drpc._master("tcp://nohost")
        with self.assertRaisesRegex(TypeError, "device_maps"):
            drpc.RpcBackendOptions(device_maps={"w1": {0: 0}})
        with self.assertRaises(drpc.BadArgumentError):
            drpc._drpc.read_token("/no/such/token/file")
        with self.assertRaises(drpc.BadArgumentError):  # one init per process
            drpc.init_rpc("again", rank=0, world_size=1,
                          rpc_backend_options=drpc.RpcBackendOptions(init_method="tcp://127.0.0.1:1"))

    def test_init_rpc_takes_torchs_arguments_and_any_name_of_drpcs_backend(self):
        import inspect
        import torch.distributed.rpc as rpc
        self.assertEqual(inspect.signature(drpc.init_rpc), inspect.signature(rpc.init_rpc))
        # These get as far as joining, refused here only because this process has joined.
        options = drpc.RpcBackendOptions(init_method="tcp://127.0.0.1:1")
        for backend in (None, drpc.BackendType.DRPC, drpc.BackendType.TENSORPIPE, rpc.BackendType.TENSORPIPE,
                        "drpc", "TensorPipe", "process_group"):
            with self.assertRaisesRegex(drpc.BadArgumentError, "already called"):
                drpc.init_rpc("again", backend, 0, 1, options)
            with self.assertRaisesRegex(drpc.BadArgumentError, "already called"):
                drpc.init_rpc("again", backend=backend, rank=0, world_size=1, rpc_backend_options=options)

    def test_init_rpc_refuses_other_backends_and_options_before_joining(self):
        import enum
        options = drpc.RpcBackendOptions(init_method="tcp://127.0.0.1:1")
        with self.assertRaisesRegex(ValueError, "unknown backend 'gloo'") as caught:
            drpc.init_rpc("w", "gloo", 0, 1, options)
        self.assertNotIsInstance(caught.exception, drpc.Error)
        other = enum.Enum("BackendType", ["TENSORPIPE", "MY_BACKEND"])  # torch's, after register_backend
        with self.assertRaisesRegex(ValueError, "is not drpc's"):
            drpc.init_rpc("w", other.MY_BACKEND, 0, 1, options)
        # drpc's old order (name, rank, world_size, options) puts the rank where torch has backend.
        with self.assertRaisesRegex(TypeError, r"backend must be a BackendType .*init_rpc\(name, backend=None, rank"):
            drpc.init_rpc("w", 0, 1, options)
        with self.assertRaisesRegex(TypeError, "rpc_backend_options must be a drpc.RpcBackendOptions"):
            drpc.init_rpc("w", None, 0, 1, object())
        saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE")}
        try:
            with self.assertRaisesRegex(ValueError, "rank not given and RANK is not set"):
                drpc.init_rpc("w", rpc_backend_options=options)
            with self.assertRaisesRegex(ValueError, "world_size not given and WORLD_SIZE is not set"):
                drpc.init_rpc("w", rank=0, rpc_backend_options=options)
        finally:
            os.environ.update(saved)


if __name__ == "__main__":
    job.main()

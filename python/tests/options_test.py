"""init_rpc's options reach drpc: env:// rendezvous (MASTER_ADDR/MASTER_PORT, RANK and
WORLD_SIZE), a job token from token_file, rpc_timeout as the default of every call.
This process is rank 0; worker1 is a subprocess joining the same way."""

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
    try:
        drpc.shutdown()
        assert WORKER.wait(timeout=60) == 0
    finally:
        if WORKER.poll() is None:
            WORKER.kill()
            WORKER.wait()


class Options(unittest.TestCase):
    def test_ranks_and_world_from_the_environment(self):
        self.assertEqual(drpc.get_worker_info().id, 0)
        self.assertEqual([w.name for w in drpc.get_worker_infos()], ["worker0", "worker1"])
        self.assertEqual(drpc.rpc_sync(1, functions.whoami), "worker1")

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
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami), "worker1")  # the job is unharmed

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


if __name__ == "__main__":
    job.main()

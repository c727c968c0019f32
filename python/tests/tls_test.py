"""A job over TLS with a job token, formed by Python processes: this process (worker0,
rank 0, serving the store) and worker1, a subprocess, both given the certificate, key, CA
and token files through rpc_backend_options. Processes without the job's CA, or without
TLS, cannot join: they fail within their init_timeout with a clear error, and the job goes on.
The certificates are made here with /usr/bin/openssl, as testing/tls_certs.cc does."""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed.rpc as torch_rpc  # noqa: E402

import drpc  # noqa: E402
import functions  # noqa: E402
import job  # noqa: E402

DIR = None
PORT = None
WORKER = None


def openssl(*args):
    subprocess.run(["/usr/bin/openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(prefix, subject):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject,
            "-keyout", prefix + ".key", "-out", prefix + ".pem")


def make_signed(prefix, ca_prefix):
    ext = os.path.join(DIR, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=drpc-worker", "-keyout", prefix + ".key",
            "-out", prefix + ".csr")
    openssl("x509", "-req", "-in", prefix + ".csr", "-CA", ca_prefix + ".pem", "-CAkey", ca_prefix + ".key",
            "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", prefix + ".pem")


def path(name):
    return os.path.join(DIR, name)


def setUpModule():
    global DIR, PORT, WORKER
    DIR = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    make_ca(path("ca"), "/CN=drpc-test-ca")
    make_ca(path("other_ca"), "/CN=someone-else-ca")
    make_signed(path("worker"), path("ca"))
    make_signed(path("impostor"), path("other_ca"))
    with open(path("token"), "w") as f:
        f.write("correct horse battery staple\n")
    PORT = job.free_port()
    env = dict(os.environ, TEST_TOKEN_FILE=path("token"), TEST_TLS_CERT=path("worker.pem"),
               TEST_TLS_KEY=path("worker.key"), TEST_TLS_CA=path("ca.pem"))
    WORKER = subprocess.Popen(job.python_worker("worker1", 1, 2, PORT), env=env, start_new_session=True)
    try:
        options = drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{PORT}", init_timeout=60,
                                         token_file=path("token"), tls_cert=path("worker.pem"),
                                         tls_key=path("worker.key"), tls_ca=path("ca.pem"))
        # torch's keywords and backend, as torch code passes them (worker1 uses the positional form).
        drpc.init_rpc("worker0", backend=torch_rpc.BackendType.TENSORPIPE, rank=0, world_size=2,
                      rpc_backend_options=options)
    except BaseException:
        WORKER.kill()
        raise


def tearDownModule():
    job.shutdown_and_reap(WORKER)


def try_to_join(**tls):
    """Runs a process that tries to join the job as rank 1 with the job's token and `tls`;
    returns (its exit code, its output, the seconds init_rpc took in it: importing torch and
    drpc is left out, as it takes long under a sanitizer). Exit 3: a drpc.Error, printed."""
    code = (
        "import sys, time, drpc\n"
        "start = time.monotonic()\n"
        "try:\n"
        f"    drpc.init_rpc('intruder', rank=1, world_size=2, rpc_backend_options=drpc.RpcBackendOptions("
        f"init_method='tcp://127.0.0.1:{PORT}', token_file={path('token')!r}, init_timeout=5, **{tls!r}))\n"
        "except drpc.Error as e:\n"
        "    print('refused:', type(e).__name__, e, flush=True)\n"
        "    print('init_rpc took', time.monotonic() - start, flush=True); sys.exit(3)\n"
        "print('joined', flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    took = re.search(r"init_rpc took ([0-9.]+)", out.stdout)
    return out.returncode, out.stdout + out.stderr, float(took.group(1)) if took else float("inf")


class Tls(unittest.TestCase):
    def test_calls_both_ways_over_tls(self):
        x = torch.arange(4.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", functions.scale, args=(x, 2.0)), x * 2))
        self.assertTrue(torch.equal(drpc.rpc_async("worker1", torch.add, args=(x, x)).wait(), x * 2))
        # worker1 calls back into this process.
        self.assertEqual(drpc.rpc_sync("worker1", functions.relay, args=("worker0", "test.whoami", [])), "worker0")

    def test_a_process_trusting_another_ca_cannot_join(self):
        code, output, took = try_to_join(tls_cert=path("impostor.pem"), tls_key=path("impostor.key"),
                                         tls_ca=path("other_ca.pem"))
        self.assertEqual(code, 3, output)
        self.assertIn("refused: PeerUnavailableError cannot reach the store", output)
        self.assertIn("within 5000 ms (TLS: is the store's certificate signed by our CA", output)
        self.assertLess(took, 20)  # refused within init_timeout (5 s), not hung
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami), "worker1")  # the job is unharmed

    def test_a_process_without_tls_cannot_join(self):
        code, output, took = try_to_join()
        self.assertEqual(code, 3, output)
        self.assertIn("refused: PeerUnavailableError cannot reach the store", output)
        self.assertIn("within 5000 ms", output)
        self.assertLess(took, 20)  # refused within init_timeout (5 s), not hung
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami), "worker1")


if __name__ == "__main__":
    job.main()

"""Python and C++ workers in one job, calling each other by name: this process (worker0,
Python), `py` (a Python worker), `cpp` (tests/cpp_peer, C++ calling back into Python)
and `served` (the shipped tools/worker/drpc_worker, hosting TorchScript)."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import drpc  # noqa: E402
import functions  # noqa: E402
import job  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(job.HERE))  # the runfiles root
JOB = None
TMP = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
SCRIPT = os.path.join(TMP, "triple.pt")


class Triple(torch.nn.Module):
    def forward(self, x):
        return x * 3

    @torch.jit.export
    def plus(self, x, y: float):
        return x + y


def cpp_peer(name, rank, world_size, port):
    return [os.path.join(ROOT, "python/cpp_peer"), name, str(rank), str(world_size), str(port)]


def drpc_worker(name, rank, world_size, port):
    return [os.path.join(ROOT, "tools/worker/drpc_worker"), f"--name={name}", f"--rank={rank}",
            f"--world_size={world_size}", f"--master_port={port}", f"--load=triple={SCRIPT}"]


def setUpModule():
    global JOB
    torch.jit.script(Triple()).save(SCRIPT)
    JOB = job.Job({"py": job.python_worker, "cpp": cpp_peer, "served": drpc_worker})


def tearDownModule():
    codes = JOB.finish()
    assert all(code == 0 for code in codes.values()), f"workers' exit codes: {codes}"


class PythonCallsCpp(unittest.TestCase):
    def test_registered_cpp_functions_builtins_and_torchscript(self):
        x = torch.arange(4.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.double", args=(x,)), x * 2))
        self.assertEqual(drpc.rpc_sync("cpp", "cpp.name"), "cpp")
        self.assertTrue(torch.equal(drpc.rpc_sync("served", torch.add, args=(x, x)), x * 2))
        self.assertTrue(torch.equal(drpc.rpc_sync("served", "torchscript:triple", args=(x,)), x * 3))
        self.assertTrue(torch.equal(drpc.rpc_async("served", "torchscript:triple:plus", args=(x, 1.0)).wait(), x + 1))

    def test_cpp_errors_are_python_exceptions(self):
        with self.assertRaises(drpc.BadArgumentError) as caught:
            drpc.rpc_sync("cpp", "cpp.double", args=("not a tensor",))
        self.assertIn("must be Tensor", str(caught.exception))
        with self.assertRaises(drpc.BadArgumentError):
            drpc.rpc_sync("served", "test.scale", args=(torch.ones(1), 2.0))  # Python functions live in Python

    def test_proxies_on_a_cpp_owned_torchscript_object_call_its_methods(self):
        module = drpc.remote("cpp", "cpp.load_module", args=(SCRIPT,))
        x = torch.ones(3)
        self.assertTrue(torch.equal(module.rpc_sync().forward(x), x * 3))
        self.assertTrue(torch.equal(module.rpc_async().plus(x, 2.0).wait(), x + 2))
        self.assertTrue(torch.equal(module.remote().forward(x).to_here(), x * 3))

    def test_rrefs_owned_by_cpp(self):
        rref = drpc.remote("served", torch.ones, args=((2, 2),))
        self.assertEqual(rref.owner_name(), "served")
        self.assertTrue(torch.equal(rref.to_here(), torch.ones(2, 2)))
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "aten::neg", args=(rref.to_here(),)), -torch.ones(2, 2)))

    def test_rrefs_cross_both_ways(self):
        x = torch.arange(3.0)
        # Python-owned RRefs used by C++: this process's own, and the Python worker `py`'s.
        mine = drpc.RRef(x)
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.fetch_twice", args=(mine,)), x * 2))
        on_py = drpc.remote("py", functions.scale, args=(x, 5.0))
        self.assertEqual(on_py.owner_name(), "py")
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.fetch_twice", args=(on_py,)), x * 10))
        # A C++-owned RRef made in a C++ handler, used here and handed back to C++.
        kept = drpc.rpc_sync("cpp", "cpp.keep", args=(x,))
        self.assertIsInstance(kept, drpc.RRef)
        self.assertEqual(kept.owner_name(), "cpp")
        self.assertTrue(torch.equal(kept.to_here(), x * 3))
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.fetch_twice", args=(kept,)), x * 6))
        # and to the Python worker, which fetches it from C++.
        self.assertTrue(torch.equal(drpc.rpc_sync("py", functions.fetch, args=(kept,)), x * 3))


class CppCallsPython(unittest.TestCase):
    def test_a_cpp_handler_calls_a_python_function_by_name(self):
        x = torch.arange(3.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.call", args=("py", "test.scale", x)), x * 2))
        # Into this very process, whose main thread waits on the call meanwhile.
        self.assertTrue(torch.equal(drpc.rpc_sync("cpp", "cpp.call", args=("worker0", "test.scale", x)), x * 2))

    def test_a_python_exception_crosses_cpp_with_its_type_and_message(self):
        with self.assertRaises(drpc.RemoteError) as caught:
            drpc.rpc_sync("cpp", "cpp.call", args=("py", "test.reject", torch.ones(1)))
        self.assertEqual(caught.exception.remote_type, "ValueError")
        self.assertEqual(caught.exception.remote_message, "rejected 2.0")
        self.assertIn("on cpp failed", str(caught.exception))

    def test_python_workers_call_cpp_from_their_handlers(self):
        x = torch.ones(2)
        self.assertTrue(torch.equal(drpc.rpc_sync("py", functions.relay, args=("cpp", "cpp.double", [x])), x * 2))
        self.assertTrue(torch.equal(drpc.rpc_sync("py", functions.relay, args=("served", "torchscript:triple", [x])), x * 3))

    def test_distributed_autograd_through_cpp_and_python(self):
        x = torch.randn(4, requires_grad=True)
        with drpc.dist_autograd.context() as context_id:
            # worker0 -> cpp (a C++ handler) -> py (test.scale: x2, in Python) and back.
            y = drpc.rpc_sync("cpp", "cpp.call", args=("py", "test.scale", x))
            loss = (y * y).sum()
            drpc.dist_autograd.backward(context_id, [loss])
            grad = drpc.dist_autograd.get_gradients(context_id)[x]
        self.assertTrue(torch.allclose(grad, 2 * (2 * x.detach()) * 2))


if __name__ == "__main__":
    job.main()

"""drpc's Python API in a job of real processes: this process (worker0, rank 0) and
Python workers worker1 and worker2, plus `victim`, which one test kills."""

import os
import sys
import time
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import drpc  # noqa: E402
import functions  # noqa: E402
import job  # noqa: E402

JOB = None
KEPT_PAST_SHUTDOWN = []


def setUpModule():
    global JOB
    JOB = job.Job({name: job.python_worker for name in ("worker1", "worker2", "victim")})


def tearDownModule():
    codes = JOB.finish()
    codes.pop("victim")  # killed by its test (or it exits 0 if that test did not run)
    assert all(code == 0 for code in codes.values()), f"workers' exit codes: {codes}"


class Calls(unittest.TestCase):
    def test_rpc_sync_runs_a_registered_function_given_by_name_or_as_the_function(self):
        x = torch.arange(4.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", "test.scale", args=(x, 2.0)), x * 2))
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", functions.scale, args=(x, 3)), x * 3))
        self.assertEqual(drpc.rpc_sync("worker2", functions.whoami), "worker2")

    def test_a_function_registered_without_a_name_goes_by_its_qualified_name(self):
        self.assertEqual(functions.bare._drpc_name, "functions.bare")
        self.assertEqual(drpc.rpc_sync("worker1", functions.bare, args=(2,)), 3)
        self.assertEqual(drpc.rpc_sync("worker1", "functions.bare", args=(5,)), 6)

    def test_workers_by_name_info_or_rank(self):
        info = drpc.get_worker_info("worker2")
        self.assertEqual(info.name, "worker2")
        self.assertEqual(drpc.get_worker_info().name, "worker0")
        self.assertEqual(drpc.get_worker_info().id, 0)
        self.assertEqual(drpc.rpc_sync(info, functions.whoami), "worker2")
        self.assertEqual(drpc.rpc_sync(info.id, functions.whoami), "worker2")

    def test_builtins_as_torch_functions_or_qualified_names(self):
        a, b = torch.ones(2, 3), torch.full((2, 3), 2.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", torch.add, args=(a, b)), a + b))
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", "aten::mul", args=(a, b)), a * b))
        # Sizes given as tuples, as torch users write them.
        self.assertTrue(torch.equal(drpc.rpc_sync("worker2", torch.ones, args=((2, 2),)), torch.ones(2, 2)))
        self.assertTrue(torch.equal(drpc.rpc_sync("worker2", torch.add, args=(a, b), kwargs={"alpha": 2}), a + 2 * b))

    def test_values_round_trip(self):
        t = torch.randn(3)
        value = [1, 2.5, "text", True, None, t, (1, "a"), {"k": [t, 3]}, [], {}]
        args, kwargs = drpc.rpc_sync("worker1", functions.echo, args=tuple(value), kwargs={"named": (t, None)})
        self.assertEqual(args[:5], value[:5])
        self.assertTrue(torch.equal(args[5], t))
        self.assertEqual(args[6], (1, "a"))
        self.assertTrue(torch.equal(args[7]["k"][0], t))
        self.assertEqual(args[7]["k"][1], 3)
        self.assertEqual(args[8:], [[], {}])
        self.assertTrue(torch.equal(kwargs["named"][0], t))
        self.assertIsNone(kwargs["named"][1])
        self.assertIs(type(args[3]), bool)

    def test_rpc_async_returns_a_torch_future_with_then_and_wait_all(self):
        x = torch.arange(3.0)
        futures = [drpc.rpc_async("worker1", functions.scale, args=(x, float(i))) for i in range(5)]
        self.assertIsInstance(futures[0], torch.futures.Future)
        values = torch.futures.wait_all(futures)
        for i, v in enumerate(values):
            self.assertTrue(torch.equal(v, x * i))
        chained = futures[2].then(lambda f: f.value() + 1)
        self.assertTrue(torch.equal(chained.wait(), x * 2 + 1))
        self.assertEqual(len(drpc.wait_all([drpc.rpc_async("worker2", functions.whoami)])), 1)

    def test_a_future_gives_the_same_values_as_rpc_sync(self):
        # Plain data completes the future without the GIL and torch converts it when asked;
        # RRefs are converted by drpc. Both must give what rpc_sync gives.
        owned = drpc.remote("worker2", functions.scale, args=(torch.ones(2), 3.0))
        data = (torch.arange(2.0), 7, 2.5, True, None, "s", [1, 2], [torch.ones(1), "x"], {"k": (1, [2.0])})
        for args in (data, data + (owned,)):  # data only (torch converts it), and with an RRef (drpc does)
            via_future = drpc.rpc_async("worker1", functions.echo, args=args, kwargs={"n": {1: False}}).wait()
            via_sync = drpc.rpc_sync("worker1", functions.echo, args=args, kwargs={"n": {1: False}})
            for got in (via_future, via_sync):
                got_args, got_kwargs = got
                self.assertEqual([type(a) for a in got_args], [type(a) for a in args])
                self.assertTrue(torch.equal(got_args[0], args[0]))
                self.assertEqual(list(got_args[1:7]), list(args[1:7]))
                self.assertEqual(got_args[8], args[8])
                self.assertTrue(torch.equal(got_args[7][0], torch.ones(1)))
                self.assertEqual(got_args[7][1], "x")
                self.assertEqual(got_kwargs, {"n": {1: False}})
            if len(args) == len(data) + 1:
                self.assertTrue(torch.equal(got_args[9].to_here(), torch.ones(2) * 3))

    def test_a_future_whose_result_has_no_python_form_fails_instead_of_hanging(self):
        # A builtin applied to a local RRef's value never crosses the wire, so its result
        # (here a torch.device's C++ form) reaches the future as it is.
        owned = drpc.RRef(torch.ones(2))
        future = torch.futures.Future()
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        owned._rpc_async("prim::device", (), {}, 5.0, future)
        self.assertTrue(done.wait(30), "the future was never completed")
        with self.assertRaisesRegex(drpc.BadArgumentError, "cannot be made into Python.*Device"):
            future.wait()

    def test_async_functions_answer_when_their_future_does(self):
        x = torch.arange(3.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", functions.async_scale, args=("worker2", x, 2.0)), x * 2 + 1))
        self.assertTrue(torch.equal(drpc.rpc_async("worker1", "test.async_scale", args=("worker0", x, 3.0)).wait(),
                                    x * 3 + 1))
        with self.assertRaises(drpc.RemoteError) as caught:
            drpc.rpc_sync("worker2", functions.not_a_future)
        self.assertEqual(caught.exception.remote_type, "TypeError")
        self.assertIn("not a torch.futures.Future", caught.exception.remote_message)

    def test_torchscript_functions_and_modules_by_name(self):
        x = torch.arange(3.0)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", functions.script_mul, args=(x, 4.0)), x * 4))
        self.assertTrue(torch.equal(drpc.rpc_async("worker2", functions.scripted_affine, args=(x,)).wait(), x * 2 + 0.5))
        self.assertTrue(torch.equal(drpc.remote("worker1", "test.script_mul", args=(x, 2.0)).to_here(), x * 2))
        with self.assertRaises(TypeError):  # an unregistered script travels no more than other code
            drpc.rpc_sync("worker1", torch.jit.script(functions.Affine()), args=(x,))

    def test_a_then_callback_may_make_rpcs(self):
        x = torch.ones(2)
        f = drpc.rpc_async("worker1", functions.scale, args=(x, 2.0))
        chained = f.then(lambda f: drpc.rpc_sync("worker2", functions.scale, args=(f.value(), 5.0)))
        self.assertTrue(torch.equal(chained.wait(), x * 10))

    def test_handlers_make_nested_rpcs(self):
        x = torch.ones(2)
        self.assertTrue(torch.equal(drpc.rpc_sync("worker1", functions.relay, args=("worker2", "test.scale", [x, 4.0])), x * 4))
        # Back into this process, whose main thread waits meanwhile without the GIL.
        self.assertEqual(drpc.rpc_sync("worker1", functions.relay, args=("worker0", "test.whoami", [])), "worker0")

    def test_a_function_returning_a_future_is_answered_when_it_completes(self):
        x = torch.ones(2)
        value, tag = drpc.rpc_sync("worker1", functions.async_relay, args=("worker2", "test.scale", [x, 3.0]))
        self.assertTrue(torch.equal(value, x * 3))
        self.assertEqual(tag, "then")
        with self.assertRaises(drpc.RemoteError) as caught:
            drpc.rpc_sync("worker1", functions.async_relay, args=("worker2", "test.fail", ["async"]))
        self.assertEqual(caught.exception.remote_type, "ValueError")
        self.assertEqual(caught.exception.remote_message, "async")

    def test_many_python_threads_call_at_once(self):
        from concurrent.futures import ThreadPoolExecutor
        x = torch.arange(3.0)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: drpc.rpc_sync(f"worker{1 + i % 2}", functions.scale, args=(x, float(i))),
                                    range(64)))
        for i, r in enumerate(results):
            self.assertTrue(torch.equal(r, x * i))

    def test_calls_to_oneself(self):
        self.assertEqual(drpc.rpc_sync("worker0", functions.whoami), "worker0")
        self.assertTrue(torch.equal(drpc.rpc_async("worker0", torch.neg, args=(torch.ones(1),)).wait(), -torch.ones(1)))


class Errors(unittest.TestCase):
    def test_a_remote_python_exception_comes_back_with_its_type_and_message(self):
        with self.assertRaises(drpc.RemoteError) as caught:
            drpc.rpc_sync("worker1", functions.fail, args=("no good",))
        self.assertEqual(caught.exception.remote_type, "ValueError")
        self.assertEqual(caught.exception.remote_message, "no good")
        self.assertIn("worker1", str(caught.exception))
        self.assertIsInstance(caught.exception, drpc.Error)

    def test_the_same_through_a_future(self):
        f = drpc.rpc_async("worker1", functions.fail, args=("later",))
        with self.assertRaises(drpc.RemoteError) as caught:
            f.wait()
        self.assertEqual(caught.exception.remote_message, "later")
        with self.assertRaises(drpc.RemoteError):
            torch.futures.wait_all([drpc.rpc_async("worker2", functions.whoami), f])

    def test_a_drpc_error_raised_in_python_keeps_its_kind(self):
        with self.assertRaises(drpc.BadArgumentError) as caught:
            drpc.rpc_sync("worker2", functions.bad_argument)
        self.assertIn("refused on purpose", str(caught.exception))

    def test_unknown_function(self):
        with self.assertRaises(drpc.BadArgumentError) as caught:
            drpc.rpc_sync("worker1", "no.such.function")
        self.assertIn("unknown function 'no.such.function'", str(caught.exception))
        with self.assertRaises(drpc.BadArgumentError):
            drpc.rpc_sync("worker1", "aten::no_such_op", args=(torch.ones(1),))

    def test_unregistered_python_function_is_a_type_error(self):
        with self.assertRaisesRegex(TypeError, "registered with @drpc.function"):
            drpc.rpc_sync("worker1", lambda: 1)

    def test_a_value_that_is_not_data_is_a_type_error_naming_it_before_anything_is_sent(self):
        before = drpc.rpc_sync("worker2", functions.get_count)
        with self.assertRaisesRegex(TypeError, r"test.count: argument 1: a value of type object cannot be sent"):
            drpc.rpc_sync("worker2", functions.count, args=(1, object()))
        with self.assertRaisesRegex(TypeError, r"test.count: argument 'k'\['x'\]\[0\]: a value of type function"):
            drpc.rpc_async("worker2", functions.count, kwargs={"k": {"x": [lambda: 0]}})
        with self.assertRaisesRegex(TypeError, "argument 0"):
            drpc.remote("worker2", functions.count, args=(object(),))
        self.assertEqual(drpc.rpc_sync("worker2", functions.get_count), before)
        drpc.rpc_sync("worker2", functions.count, args=(1,))
        self.assertEqual(drpc.rpc_sync("worker2", functions.get_count), before + 1)

    def test_a_result_that_is_not_data_fails_the_call(self):
        with self.assertRaisesRegex(drpc.Error, "cannot be sent"):
            drpc.rpc_sync("worker1", functions.returns_object)
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami), "worker1")

    def test_timeout(self):
        start = time.monotonic()
        with self.assertRaises(drpc.TimeoutError):
            drpc.rpc_sync("worker2", functions.sleep, args=(5.0,), timeout=0.3)
        self.assertLess(time.monotonic() - start, 4.0)
        with self.assertRaises(drpc.TimeoutError):
            drpc.rpc_async("worker2", functions.sleep, args=(5.0,), timeout=0.3).wait()
        self.assertIsInstance(drpc.TimeoutError("x"), TimeoutError)  # the builtin, too
        self.assertEqual(drpc.rpc_sync("worker2", functions.sleep, args=(0.01,), timeout=10), 0.01)

    def test_the_default_timeout_changes_at_run_time(self):
        default = drpc._get_rpc_timeout()
        self.assertEqual(default, 60.0)
        drpc._set_rpc_timeout(0.3)
        try:
            with self.assertRaises(drpc.TimeoutError):
                drpc.rpc_sync("worker1", functions.sleep, args=(5.0,))
        finally:
            drpc._set_rpc_timeout(default)
        self.assertEqual(drpc.rpc_sync("worker1", functions.sleep, args=(0.01,)), 0.01)

    def test_zz_a_killed_peer_fails_pending_and_later_calls(self):
        self.assertEqual(drpc.rpc_sync("victim", functions.whoami), "victim")
        pending = drpc.rpc_async("victim", functions.sleep, args=(60.0,), timeout=0)
        JOB.kill_worker("victim")
        with self.assertRaises(drpc.PeerUnavailableError) as caught:
            pending.wait()
        self.assertIn("victim", str(caught.exception))
        with self.assertRaises(drpc.PeerUnavailableError):
            drpc.rpc_sync("victim", functions.whoami, timeout=10)
        # The rest of the job goes on.
        self.assertEqual(drpc.rpc_sync("worker1", functions.whoami), "worker1")


class RRefs(unittest.TestCase):
    def test_remote_builtin_and_rref_methods(self):
        rref = drpc.remote("worker1", torch.ones, args=((2, 3),))
        self.assertTrue(torch.equal(rref.to_here(), torch.ones(2, 3)))
        self.assertEqual(rref.owner_name(), "worker1")
        self.assertEqual(rref.owner(), drpc.get_worker_info("worker1"))
        self.assertFalse(rref.is_owner())
        deadline = time.monotonic() + 10
        while not rref.confirmed_by_owner() and time.monotonic() < deadline:
            time.sleep(0.01)  # the owner's confirmation has no event to wait on from here
        self.assertTrue(rref.confirmed_by_owner())
        with self.assertRaises(drpc.BadArgumentError):
            rref.local_value()

    def test_local_rref(self):
        t = torch.arange(3)
        rref = drpc.RRef(t)
        self.assertTrue(rref.is_owner())
        self.assertTrue(rref.confirmed_by_owner())
        self.assertTrue(torch.equal(rref.local_value(), t))
        self.assertEqual(rref.owner_name(), "worker0")
        # Passed as an argument, it is fetched there.
        self.assertTrue(torch.equal(drpc.rpc_sync("worker2", functions.relay, args=("worker1", "test.echo", [rref]))[0][0].to_here(), t))

    def test_proxies_call_methods_of_a_python_object_on_its_owner(self):
        layer = drpc.remote("worker1", functions.Linear, args=(4, 3, 0))
        x = torch.randn(2, 4)
        weight, bias = layer.rpc_sync().parameters()
        expected = functions.linear_reference(weight, bias, x)
        self.assertTrue(torch.allclose(layer.rpc_sync().forward(x), expected))
        self.assertTrue(torch.allclose(layer.rpc_async().forward(x).wait(), expected))
        out = layer.remote().forward(x)
        self.assertIsInstance(out, drpc.RRef)
        self.assertTrue(torch.allclose(out.to_here(), expected))
        # A tensor's own methods, too.
        t = drpc.remote("worker2", torch.ones, args=((2, 5),))
        self.assertEqual(t.rpc_sync().size(), (2, 5))
        # The object itself cannot travel.
        with self.assertRaisesRegex(drpc.Error, "cannot be sent"):
            layer.to_here()

    def test_a_python_object_in_a_local_rref_is_reached_from_other_workers(self):
        layer = functions.Linear(3, 2, 7)
        rref = drpc.RRef(layer)
        self.assertIs(rref.local_value(), layer)
        x = torch.randn(4, 3)
        expected = layer.forward(x)
        self.assertTrue(torch.allclose(rref.rpc_sync().forward(x), expected))  # on the owner: here
        self.assertTrue(torch.allclose(drpc.rpc_sync("worker2", functions.call_forward, args=(rref, x)), expected))

    def test_remote_errors_surface_on_use(self):
        rref = drpc.remote("worker2", functions.fail, args=("in remote",))
        with self.assertRaises(drpc.RemoteError) as caught:
            rref.to_here()
        self.assertEqual(caught.exception.remote_message, "in remote")

    def test_rrefs_returned_by_workers(self):
        layer = drpc.remote("worker2", functions.Linear, args=(2, 2, 1))
        params = layer.rpc_sync().parameter_rrefs()
        self.assertEqual(len(params), 2)
        self.assertTrue(all(isinstance(p, drpc.RRef) and p.owner_name() == "worker2" for p in params))
        weight, bias = layer.rpc_sync().parameters()
        self.assertTrue(torch.equal(params[0].to_here(), weight))
        self.assertTrue(torch.equal(params[1].to_here(), bias))


class Autograd(unittest.TestCase):
    def test_backward_across_workers_matches_local_autograd_and_the_optimizer_steps(self):
        l1 = drpc.remote("worker1", functions.Linear, args=(4, 3, 10))
        l2 = drpc.remote("worker2", functions.Linear, args=(3, 1, 20))
        w1, b1 = l1.rpc_sync().parameters()
        w2, b2 = l2.rpc_sync().parameters()
        x = torch.randn(5, 4, requires_grad=True)
        params = l1.rpc_sync().parameter_rrefs() + l2.rpc_sync().parameter_rrefs()
        opt = drpc.optim.DistributedOptimizer(torch.optim.SGD, params, 0.1, dampening=0)  # torch's positions

        with drpc.dist_autograd.context() as context_id:
            h = l1.rpc_sync().forward(x)
            loss = l2.rpc_sync().forward(h).pow(2).sum()
            drpc.dist_autograd.backward(context_id, [loss])
            grads = drpc.dist_autograd.get_gradients(context_id)
            remote_grads = l1.rpc_sync().gradients(context_id) + l2.rpc_sync().gradients(context_id)
            opt.step(context_id)

        # The same model, locally.
        local = [p.clone().requires_grad_() for p in (w1, b1, w2, b2)]
        xl = x.detach().clone().requires_grad_()
        local_loss = functions.linear_reference(local[2], local[3], functions.linear_reference(local[0], local[1], xl)).pow(2).sum()
        local_loss.backward()
        self.assertTrue(torch.allclose(loss, local_loss))
        self.assertTrue(torch.allclose(grads[x], xl.grad))
        self.assertIsNone(x.grad)  # gradients go to the context
        for got, p in zip(remote_grads, local):
            self.assertTrue(torch.allclose(got, p.grad, atol=1e-6))
        stepped = l1.rpc_sync().parameters() + l2.rpc_sync().parameters()
        for new, p in zip(stepped, local):
            self.assertTrue(torch.allclose(new, p.detach() - 0.1 * p.grad, atol=1e-6))

    def test_adam_maps_to_drpcs_adam(self):
        layer = drpc.remote("worker1", functions.Linear, args=(2, 2, 3))
        before = layer.rpc_sync().parameters()
        opt = drpc.optim.DistributedOptimizer(torch.optim.Adam, layer.rpc_sync().parameter_rrefs(), lr=0.01)
        with drpc.dist_autograd.context() as context_id:
            loss = layer.rpc_sync().forward(torch.ones(1, 2)).sum()
            drpc.dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        after = layer.rpc_sync().parameters()
        # Adam's first step moves every parameter by about lr, against its gradient's sign.
        for b, a in zip(before, after):
            self.assertTrue(torch.allclose((b - a).abs(), torch.full_like(a, 0.01), atol=1e-4))
        with self.assertRaisesRegex(TypeError, "not supported"):
            drpc.optim.DistributedOptimizer(torch.optim.RMSprop, [], lr=0.1)
        # torch's other arguments only where they change nothing.
        with self.assertRaisesRegex(TypeError, "nesterov=True is not supported"):
            drpc.optim.DistributedOptimizer(torch.optim.SGD, [], lr=0.1, momentum=0.9, nesterov=True)
        with self.assertRaisesRegex(TypeError, "lr is required"):
            drpc.optim.DistributedOptimizer(torch.optim.SGD, [])
        # Python objects outlive the runtime easily: this one goes after the final shutdown.
        KEPT_PAST_SHUTDOWN.append(opt)

    def test_a_second_context_on_a_thread_is_refused(self):
        with drpc.dist_autograd.context() as first:
            with self.assertRaises(drpc.BadArgumentError):
                with drpc.dist_autograd.context():
                    pass
            self.assertGreaterEqual(first, 0)


if __name__ == "__main__":
    job.main()

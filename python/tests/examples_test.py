"""PyTorch's documented RPC examples, ported to drpc (tests/examples.py), in a job of real
processes: this process (worker0, a trainer), `ps` (the parameter server) and `trainer2`."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import drpc  # noqa: E402
import examples  # noqa: E402
import job  # noqa: E402

JOB = None


def setUpModule():
    global JOB
    JOB = job.Job({name: job.python_worker for name in ("ps", "trainer2")})


def tearDownModule():
    codes = JOB.finish()
    assert all(code == 0 for code in codes.values()), f"workers' exit codes: {codes}"


class ParameterServer(unittest.TestCase):
    def test_two_trainers_train_the_servers_model(self):
        # One trainer here, one on trainer2, one after the other (as torch's example runs
        # them, concurrently, an optimizer step may change a weight another trainer's
        # backward still needs), against the one model on `ps`.
        first = examples.run_trainer("ps", 60, 1)
        second = drpc.rpc_sync("trainer2", examples.run_trainer, args=("ps", 60, 2))
        self.assertLess(first[1], first[0] - 0.2, f"the first trainer's loss did not fall: {first}")
        self.assertLess(second[1], first[1], f"the second trainer did not start from the trained model: {second}")
        self.assertGreater(drpc.rpc_sync("ps", examples.accuracy, args=(9,)), 0.8)


class ModelParallelRNN(unittest.TestCase):
    def test_trains_as_the_same_model_does_in_one_process(self):
        ntoken, ninp, nhid, nlayers, steps = 10, 16, 32, 1, 100
        model = examples.RNNModel("ps", ntoken, ninp, nhid, nlayers)
        opt = drpc.optim.DistributedOptimizer(torch.optim.SGD, model.parameter_rrefs(), lr=2.0)
        self.assertEqual(len(model.parameter_rrefs()), 1 + 4 * nlayers + 2)

        # The reference: the same modules, seeds and data, trained in this process alone.
        emb, dec = examples.EmbeddingTable(ntoken, ninp), examples.Decoder(ntoken, nhid)
        torch.manual_seed(3)
        rnn = torch.nn.LSTM(ninp, nhid, nlayers)
        local_opt = torch.optim.SGD(list(emb.parameters()) + list(rnn.parameters()) + list(dec.parameters()), lr=2.0)

        g = torch.Generator().manual_seed(4)
        losses, local_losses = [], []
        for _ in range(steps):
            start = torch.randint(0, ntoken, (1, 4), generator=g)
            seq = (start + torch.arange(9).reshape(9, 1)) % ntoken  # the next token follows
            data, target = seq[:-1], seq[1:].reshape(-1)
            hidden = (torch.zeros(nlayers, 4, nhid), torch.zeros(nlayers, 4, nhid))
            with drpc.dist_autograd.context() as context_id:
                output, _ = model(data, hidden)
                loss = torch.nn.functional.cross_entropy(output.reshape(-1, ntoken), target)
                drpc.dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
            losses.append(loss.item())
            local_opt.zero_grad()
            output, _ = rnn(emb(data), hidden)
            local_loss = torch.nn.functional.cross_entropy(dec(output).reshape(-1, ntoken), target)
            local_loss.backward()
            local_opt.step()
            local_losses.append(local_loss.item())
        self.assertLess(sum(losses[-10:]) / 10, 0.5, f"the loss did not fall: {losses[:3]} ... {losses[-3:]}")
        for step, (distributed, local) in enumerate(zip(losses[:20], local_losses[:20])):
            self.assertAlmostEqual(distributed, local, delta=1e-4, msg=f"step {step}")


if __name__ == "__main__":
    job.main()

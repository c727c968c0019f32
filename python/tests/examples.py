"""PyTorch's documented RPC examples, ported to drpc: the classes their workers host. Every
test process imports this (tests/worker.py does), so each is registered on every Python
worker. Where torch's code sends a function or a method by pickle (`_remote_method`),
drpc calls the RRef's proxy (`rref.rpc_sync().forward(x)`), which sends only its name.

- The parameter server ("Implementing a Parameter Server Using Distributed RPC Framework"):
  one ParameterServer per job holds the model; trainers run its forward over RPC, back-
  propagate through it with distributed autograd and update it with DistributedOptimizer.
- The RRef model-parallel RNN ("Getting Started with Distributed RPC Framework", part 2):
  the embedding table and the decoder live on a parameter server behind RRefs, the LSTM on
  the trainer.
"""

import threading

import torch

import drpc


# --- the parameter server --------------------------------------------------------------------

class Net(torch.nn.Module):
    """The tutorial's model, smaller: a classifier of 16 features into 4 classes."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        # torch's default init, from the model's own generator: this runs on a handler thread,
        # where seeding torch's global generator would race with whatever else runs there.
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in (self.fc1, self.fc2):
                bound = layer.in_features ** -0.5
                layer.weight.uniform_(-bound, bound, generator=g)
                layer.bias.uniform_(-bound, bound, generator=g)

    def forward(self, x):
        return torch.nn.functional.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)


class ParameterServer:
    def __init__(self):
        self.model = Net()

    def forward(self, x):
        return self.model(x)

    def get_param_rrefs(self):
        return [drpc.RRef(p) for p in self.model.parameters()]


_param_server = None
_param_server_lock = threading.Lock()


@drpc.function("examples.get_parameter_server")
def get_parameter_server():
    """The job's one parameter server on this worker, made by the first trainer to ask."""
    global _param_server
    with _param_server_lock:
        if _param_server is None:
            _param_server = ParameterServer()
        return _param_server


class TrainerNet(torch.nn.Module):
    def __init__(self, ps):
        super().__init__()
        self.param_server_rref = drpc.remote(ps, get_parameter_server)

    def get_global_param_rrefs(self):
        return self.param_server_rref.rpc_sync().get_param_rrefs()

    def forward(self, x):
        return self.param_server_rref.rpc_sync().forward(x)


def synthetic_batch(generator, batch=32):
    """A batch of a learnable task: the class is which quarter of the features sums most."""
    x = torch.randn(batch, 16, generator=generator)
    y = x.reshape(batch, 4, 4).sum(2).argmax(1)
    return x, y


@drpc.function("examples.run_trainer")
def run_trainer(ps, steps, seed):
    """The tutorial's run_training_loop: returns the mean loss of the first and last 10 steps."""
    net = TrainerNet(ps)
    opt = drpc.optim.DistributedOptimizer(torch.optim.SGD, net.get_global_param_rrefs(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x, y = synthetic_batch(g)
        with drpc.dist_autograd.context() as cid:
            loss = torch.nn.functional.nll_loss(net(x), y)
            drpc.dist_autograd.backward(cid, [loss])
            opt.step(cid)
        losses.append(loss.item())
    return [sum(losses[:10]) / 10, sum(losses[-10:]) / 10]


@drpc.function("examples.accuracy")
def accuracy(seed):
    """The server's model on fresh data, where it lives."""
    g = torch.Generator().manual_seed(seed)
    x, y = synthetic_batch(g, 1000)
    with torch.no_grad():
        return (get_parameter_server().forward(x).argmax(1) == y).float().mean().item()


# --- the model-parallel RNN ------------------------------------------------------------------

def _init_uniform(weight, seed):
    """The tutorial's uniform(-0.1, 0.1), drawn from the module's own generator: `remote()`
    builds the embedding table and the decoder on the server's handler threads, possibly at the
    same time, so seeding torch's global generator would let one constructor draw from the
    other's seed."""
    with torch.no_grad():
        weight.uniform_(-0.1, 0.1, generator=torch.Generator().manual_seed(seed))


@drpc.function("examples.EmbeddingTable")
class EmbeddingTable(torch.nn.Module):
    def __init__(self, ntoken, ninp):
        super().__init__()
        self.encoder = torch.nn.Embedding(ntoken, ninp)
        _init_uniform(self.encoder.weight, seed=1)

    def forward(self, input):
        return self.encoder(input)

    def parameter_rrefs(self):
        return [drpc.RRef(p) for p in self.parameters()]


@drpc.function("examples.Decoder")
class Decoder(torch.nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.decoder = torch.nn.Linear(nhid, ntoken)
        _init_uniform(self.decoder.weight, seed=2)
        torch.nn.init.zeros_(self.decoder.bias)

    def forward(self, output):
        return self.decoder(output)

    def parameter_rrefs(self):
        return [drpc.RRef(p) for p in self.parameters()]


class RNNModel(torch.nn.Module):
    def __init__(self, ps, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.emb_table_rref = drpc.remote(ps, EmbeddingTable, args=(ntoken, ninp))
        torch.manual_seed(3)
        self.rnn = torch.nn.LSTM(ninp, nhid, nlayers)
        self.decoder_rref = drpc.remote(ps, Decoder, args=(ntoken, nhid))

    def forward(self, input, hidden):
        emb = self.emb_table_rref.rpc_sync().forward(input)       # on the parameter server
        output, hidden = self.rnn(emb, hidden)                    # here
        decoded = self.decoder_rref.rpc_sync().forward(output)    # on the parameter server
        return decoded, hidden

    def parameter_rrefs(self):
        remote_params = self.emb_table_rref.rpc_sync().parameter_rrefs()
        remote_params += [drpc.RRef(p) for p in self.rnn.parameters()]
        remote_params += self.decoder_rref.rpc_sync().parameter_rrefs()
        return remote_params

"""drpc for Python: torch.distributed.rpc's API over drpc's C++ runtime, in the same jobs
as C++ workers. Functions travel by name, never as pickled code:

    import drpc, torch

    @drpc.function("my.scale")          # registered in every process that imports this
    def scale(t, s):
        return t * s

    drpc.init_rpc("worker0", rank=0, world_size=2,
                  rpc_backend_options=drpc.RpcBackendOptions(init_method="tcp://127.0.0.1:29500"))
    y = drpc.rpc_sync("worker1", scale, args=(torch.ones(2), 3.0))     # sends "my.scale"
    z = drpc.rpc_async("worker1", torch.add, args=(y, y)).wait()       # builtins: aten::add
    drpc.shutdown()
"""

import atexit
import enum
import os

import torch  # before _drpc: it needs torch's Python types

from . import _drpc
from . import dist_autograd
from . import optim
from .errors import (BY_KIND, BadArgumentError, Error, InternalError, MismatchError, PeerUnavailableError,
                     ProtocolError, RemoteError, ShutdownError, TimeoutError, UnauthenticatedError)

_drpc._set_error_types(Error, BY_KIND)

WorkerInfo = _drpc.WorkerInfo
RRef = _drpc.RRef
wait_all = torch.futures.wait_all
Future = torch.futures.Future

__all__ = [
    "init_rpc", "BackendType", "shutdown", "rpc_sync", "rpc_async", "remote", "RRef", "WorkerInfo", "get_worker_info",
    "function", "async_function", "RpcBackendOptions", "TensorPipeRpcBackendOptions", "wait_all", "dist_autograd", "optim",
    "Error", "TimeoutError", "PeerUnavailableError", "RemoteError", "BadArgumentError", "MismatchError",
    "ShutdownError", "ProtocolError", "UnauthenticatedError", "InternalError",
]

UNSET_RPC_TIMEOUT = -1.0


class RpcBackendOptions:
    """TensorPipeRpcBackendOptions' fields where they apply, plus drpc's own.

    init_method: "tcp://HOST:PORT" (rank 0 serves the store there) or "env://"
        (MASTER_ADDR, MASTER_PORT). rpc_timeout: default per-call timeout, seconds
        (0: none). token_file: the job token (else DRPC_TOKEN). tls_cert/tls_key/tls_ca:
        PEM files, all or none. heartbeat_interval (seconds, 0: off) x heartbeat_misses:
        how long a silent peer may be silent. data_plane: "auto" (UCX shared memory between
        workers on one host, gRPC between hosts), "ucx" or "grpc"; None: DRPC_DATA_PLANE, else auto.
        shm_arena_mb: MiB of shared-memory arena per peer on this host for large tensors (0: none).
    """

    def __init__(self, init_method="env://", rpc_timeout=60.0, num_worker_threads=4, token_file=None,
                 tls_cert="", tls_key="", tls_ca="", tls_server_name="", heartbeat_interval=1.0,
                 heartbeat_misses=10, init_timeout=60.0, listen_host="127.0.0.1", advertise_host="",
                 host_store=True, data_plane=None, shm_arena_mb=512, **unsupported):
        if unsupported:
            # TensorPipe's device_maps, devices, _transports: CUDA and transports drpc picks itself.
            raise TypeError(f"RpcBackendOptions: unsupported options {sorted(unsupported)}")
        self.init_method = init_method
        self.rpc_timeout = rpc_timeout
        self.num_worker_threads = num_worker_threads
        self.token_file = token_file
        self.tls_cert, self.tls_key, self.tls_ca, self.tls_server_name = tls_cert, tls_key, tls_ca, tls_server_name
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_misses = heartbeat_misses
        self.init_timeout = init_timeout
        self.listen_host = listen_host
        self.advertise_host = advertise_host
        self.host_store = host_store
        self.data_plane = data_plane
        self.shm_arena_mb = shm_arena_mb


TensorPipeRpcBackendOptions = RpcBackendOptions


def _master(init_method):
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"init_method {init_method!r}: expected tcp://HOST:PORT")
        return host, int(port)
    if init_method == "env://":
        try:
            return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except KeyError as e:
            raise ValueError(f"init_method env:// needs the environment variable {e.args[0]}") from None
    raise ValueError(f"init_method {init_method!r}: drpc supports tcp://HOST:PORT and env://")


class BackendType(enum.Enum):
    """init_rpc's `backend`, as torch's BackendType: drpc has one, its own transport.
    TENSORPIPE names it too (as TensorPipeRpcBackendOptions names RpcBackendOptions), so
    torch code passing BackendType.TENSORPIPE runs unchanged."""

    DRPC = "drpc"
    TENSORPIPE = "tensorpipe"


# Strings init_rpc takes for `backend`, besides BackendType's names.
_BACKEND_STRINGS = ("drpc", "tensorpipe", "process_group")


def _check_backend(backend):
    """Any way of naming drpc's backend passes (None, drpc.BackendType's members, torch's
    BackendType.TENSORPIPE, "drpc", "tensorpipe", "process_group"); another backend is a
    ValueError, a value of another type (a rank given where torch has backend) a TypeError."""
    if backend is None or isinstance(backend, BackendType):
        return
    if isinstance(backend, enum.Enum):  # torch.distributed.rpc.BackendType, which torch rebuilds on registration
        if backend.name in BackendType.__members__:
            return
        raise ValueError(f"init_rpc: backend {backend!r} is not drpc's; drpc runs its own transport "
                         "(pass None, drpc.BackendType.DRPC or BackendType.TENSORPIPE)")
    if isinstance(backend, str):
        if backend.lower() in _BACKEND_STRINGS:
            return
        raise ValueError(f"init_rpc: unknown backend {backend!r} (drpc takes None, a BackendType, or one of "
                         f"{', '.join(_BACKEND_STRINGS)})")
    raise TypeError(f"init_rpc: backend must be a BackendType (or None), got {type(backend).__name__} {backend!r}; "
                    "the arguments are torch's: init_rpc(name, backend=None, rank=-1, world_size=None, "
                    "rpc_backend_options=None)")


def _from_environment(variable, argument):
    try:
        return int(os.environ[variable])
    except KeyError:
        raise ValueError(f"init_rpc: {argument} not given and {variable} is not set "
                         "(drpc's jobs have a fixed membership)") from None


def init_rpc(name, backend=None, rank=-1, world_size=None, rpc_backend_options=None):
    """torch.distributed.rpc.init_rpc: joins the job as worker `name` (rank 0 serves the
    store) and returns once every worker is connected. backend: None or any name of drpc's
    (see BackendType; another is refused). rank -1 / world_size None: RANK / WORLD_SIZE.
    rpc_backend_options: a drpc.RpcBackendOptions (default: env://)."""
    _check_backend(backend)
    if rpc_backend_options is not None and not isinstance(rpc_backend_options, RpcBackendOptions):
        raise TypeError(f"init_rpc: rpc_backend_options must be a drpc.RpcBackendOptions (alias "
                        f"drpc.TensorPipeRpcBackendOptions), got {type(rpc_backend_options).__module__}."
                        f"{type(rpc_backend_options).__qualname__}")
    options = rpc_backend_options or RpcBackendOptions()
    if rank is None or rank < 0:
        rank = _from_environment("RANK", "rank")
    if world_size is None:
        world_size = _from_environment("WORLD_SIZE", "world_size")
    host, port = _master(options.init_method)
    token = _drpc.read_token(options.token_file or "")
    _drpc.init_rpc(name, rank, world_size, host, port, float(options.rpc_timeout), float(options.init_timeout),
                   int(options.num_worker_threads), token, options.tls_cert, options.tls_key, options.tls_ca,
                   options.tls_server_name, float(options.heartbeat_interval), int(options.heartbeat_misses),
                   options.listen_host, options.advertise_host, bool(options.host_store), options.data_plane or "",
                   int(options.shm_arena_mb))


def shutdown(graceful=True, timeout=0):
    """graceful: waits until every worker has called shutdown and nothing is outstanding
    (timeout seconds bound it; 0: none). Otherwise stops at once. Idempotent."""
    _drpc.shutdown(graceful, float(timeout))


def is_initialized():
    return _drpc.is_initialized()


def get_worker_info(worker_name=None):
    return _drpc.get_worker_info() if worker_name is None else _drpc.get_worker_info(worker_name)


def get_worker_infos():
    return _drpc.get_worker_infos()


def _set_rpc_timeout(seconds):
    _drpc.set_rpc_timeout(float(seconds))


def _get_rpc_timeout():
    return _drpc.get_rpc_timeout()


# --- functions by name -------------------------------------------------------------------

def _qualified_name(fn):
    """The name a function decorated without one is registered under."""
    return f"{fn.__module__}.{fn.__qualname__}"


def function(name):
    """Registers the decorated function (or class) under `name` in this process, so any
    worker can call it by that name. Pass the name or the function itself to rpc_sync,
    rpc_async and remote: only the name is sent. Returns the function unchanged."""
    if callable(name):  # @drpc.function without a name: its qualified name
        fn = name
        return function(_qualified_name(fn))(fn)
    if not isinstance(name, str) or not name or "::" in name or name.startswith("torchscript:"):
        raise ValueError(f"drpc.function: {name!r} is not a valid name (builtins own 'ns::op', "
                         "TorchScript 'torchscript:')")

    def register(fn):
        _drpc.register_function(name, fn)
        _remember_name(fn, name)
        return fn

    return register


def async_function(name):
    """As function(), for a function that returns a torch.futures.Future (torch's
    @rpc.functions.async_execution): its caller is answered when that future completes,
    and no handler thread waits meanwhile. Returning anything else fails the call with a
    TypeError the caller sees as a RemoteError."""
    if callable(name):
        fn = name
        return async_function(_qualified_name(fn))(fn)

    def register(fn):
        def answered_later(*args, **kwargs):
            result = fn(*args, **kwargs)
            if not isinstance(result, torch._C.Future):
                raise TypeError(f"{name} is an @drpc.async_function but returned {type(result).__name__}, "
                                "not a torch.futures.Future")
            return result

        function(name)(answered_later)
        _remember_name(fn, name)
        return fn

    return register


# Names of registered objects that take no attributes (TorchScript functions and modules).
_registered_names = {}


def _remember_name(fn, name):
    try:
        fn._drpc_name = name
    except (AttributeError, TypeError, RuntimeError):
        _registered_names[id(fn)] = (fn, name)  # kept alive: registered for good anyway


# Builtins' names by function: looking one up on every call (a failed getattr of
# _drpc_name, the import, torch's table) took 1.7 us, half of the Python before the call.
_builtin_names = {}


def _name_of(func):
    if isinstance(func, str):
        return func
    try:
        return _builtin_names[func]
    except (KeyError, TypeError):  # TypeError: an unhashable callable
        pass
    name = getattr(func, "_drpc_name", None)
    if name is not None:
        return name
    registered = _registered_names.get(id(func))
    if registered is not None and registered[0] is func:
        return registered[1]
    from torch.jit._builtins import _find_builtin
    builtin = _find_builtin(func)
    if builtin is not None:
        try:
            _builtin_names[func] = builtin
        except TypeError:
            pass
        return builtin
    raise TypeError(f"{getattr(func, '__qualname__', func)!r} is neither a builtin operator nor registered "
                    "with @drpc.function(name): drpc calls functions by name and never sends code")


def _to_name(to):
    if isinstance(to, str):
        return to
    if isinstance(to, WorkerInfo):
        return to.name
    if isinstance(to, int):
        return _drpc.get_worker_info_by_rank(to).name
    raise TypeError(f"expected a worker name, WorkerInfo or rank, got {type(to).__name__}")


def _call(func, args, kwargs):
    name = _name_of(func)
    args = tuple(args) if args is not None else ()
    kwargs = dict(kwargs) if kwargs is not None else {}
    if "::" in name:
        # Python users pass sizes as tuples (or torch.Size); operators take int[].
        args = tuple(list(a) if isinstance(a, tuple) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    return name, args, kwargs


def rpc_sync(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs `func` (a registered name or function, or a builtin) on `to` and returns its
    result. timeout in seconds; -1: the job's default; 0: none."""
    name, args, kwargs = _call(func, args, kwargs)
    return _drpc.rpc_sync(_to_name(to), name, args, kwargs, float(timeout))


def rpc_async(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """As rpc_sync, returning at once a torch.futures.Future of the result. It completes
    (and its then-callbacks run) on drpc's callback threads."""
    name, args, kwargs = _call(func, args, kwargs)
    future = torch.futures.Future()
    _drpc.rpc_async(_to_name(to), name, args, kwargs, float(timeout), future)
    return future


def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    """Runs `func` on `to` and returns at once an RRef to the result, which stays there."""
    name, args, kwargs = _call(func, args, kwargs)
    return _drpc.remote(_to_name(to), name, args, kwargs, float(timeout))


# --- RRef proxies: rref.rpc_sync().method(*args) runs the method on the owner -----------

# What a Python owner runs for a proxy: the method of the value (a Python object, tensor, ...).
@function("drpc.py.method")
def _call_method(value, method, *args, **kwargs):
    return getattr(value, method)(*args, **kwargs)


# Answers only in Python workers: how a proxy tells a C++ owner (whose RRef values are
# TorchScript objects, called by method name) from a Python one.
@function("drpc.py.is_python")
def _is_python():
    return True


_python_workers = {}


def _owner_is_python(rref, timeout):
    owner = rref.owner_name()
    if rref.is_owner():
        return True
    if owner not in _python_workers:
        try:
            _python_workers[owner] = bool(_drpc.rpc_sync(owner, "drpc.py.is_python", (), {}, float(timeout)))
        except BadArgumentError:
            _python_workers[owner] = False
    return _python_workers[owner]


def _target(rref, method, args, timeout):
    if _owner_is_python(rref, timeout):
        return "drpc.py.method", (method,) + tuple(args)
    return method, tuple(args)


class _Proxy:
    def __init__(self, rref, kind, timeout):
        self._rref, self._kind, self._timeout = rref, kind, float(timeout)

    def __getattr__(self, method):
        rref, kind, timeout = self._rref, self._kind, self._timeout

        def call(*args, **kwargs):
            fn, full_args = _target(rref, method, args, timeout)
            if kind == "rpc_sync":
                return rref._rpc_sync(fn, full_args, kwargs, timeout)
            if kind == "rpc_async":
                future = torch.futures.Future()
                rref._rpc_async(fn, full_args, kwargs, timeout, future)
                return future
            return rref._remote(fn, full_args, kwargs, timeout)

        return call


def _rref_rpc_sync(self, timeout=UNSET_RPC_TIMEOUT):
    """rref.rpc_sync().m(*args): runs method m of the value on its owner and returns the result."""
    return _Proxy(self, "rpc_sync", timeout)


def _rref_rpc_async(self, timeout=UNSET_RPC_TIMEOUT):
    """rref.rpc_async().m(*args): as rpc_sync(), returning a torch.futures.Future."""
    return _Proxy(self, "rpc_async", timeout)


def _rref_remote(self, timeout=UNSET_RPC_TIMEOUT):
    """rref.remote().m(*args): runs the method on the owner, keeping the result there (an RRef)."""
    return _Proxy(self, "remote", timeout)


def _rref_repr(self):
    return f"RRef(owner={self.owner_name()}, id={self._id()})"


RRef.rpc_sync = _rref_rpc_sync
RRef.rpc_async = _rref_rpc_async
RRef.remote = _rref_remote
RRef.__repr__ = _rref_repr


def _exit():
    # Handler threads must stop running Python before the interpreter goes.
    if _drpc.is_initialized():
        _drpc.shutdown(False, 0.0)


atexit.register(_exit)

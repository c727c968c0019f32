"""drpc's errors as Python exceptions: one class per drpc::ErrorKind (common/error.h)."""

import builtins
import re


class Error(RuntimeError):
    """Base of every drpc error; `kind` names the drpc::ErrorKind."""

    kind = "Internal"


class TimeoutError(Error, builtins.TimeoutError):
    kind = "Timeout"


class PeerUnavailableError(Error, ConnectionError):
    kind = "PeerUnavailable"


class RemoteError(Error):
    """A remote function raised. `remote_type` and `remote_message` are what it raised
    ("ValueError", "bad input") when the text says so, at the innermost of nested calls
    (the original error); str() is the whole remote text."""

    kind = "Remote"
    # "<fn> raised on <worker>: <Type>: <message>", as the function registry words it; the
    # last such, and without the "At:" traceback torch's future callbacks append.
    _PATTERN = re.compile(r".*raised on [^:\s]+: ([A-Za-z_][\w.]*): (.*?)(?:\n\nAt:\n.*)?$", re.S)

    def __init__(self, message=""):
        super().__init__(message)
        match = self._PATTERN.search(message)
        self.remote_type = match.group(1) if match else None
        self.remote_message = match.group(2) if match else message


class BadArgumentError(Error, ValueError):
    kind = "BadArgument"


class MismatchError(Error):
    kind = "Mismatch"


class ShutdownError(Error):
    kind = "Shutdown"


class ProtocolError(Error):
    kind = "Protocol"


class UnauthenticatedError(Error, PermissionError):
    kind = "Unauthenticated"


class InternalError(Error):
    kind = "Internal"


BY_KIND = {
    cls.kind: cls
    for cls in (TimeoutError, PeerUnavailableError, RemoteError, BadArgumentError, MismatchError,
                ShutdownError, ProtocolError, UnauthenticatedError, InternalError)
}

"""Exceptions raised by the refit package, one per outcome a caller handles differently.

RefitError carries the C ABI's code (the canonical status codes) and refitd's message, which
names the offending tensor or field.
"""
from __future__ import annotations


class RefitError(Exception):
    """A call into librefit_client failed. `code` and `code_name` say how."""

    def __init__(self, message: str, code: int = 2, code_name: str = "UNKNOWN"):
        super().__init__(message)
        self.code = code
        self.code_name = code_name


class RefitInvalidArgument(RefitError, ValueError):
    """Bad input (dtype, shape, name, struct); nothing was sent for it."""


class RefitRefused(RefitError):
    """refitd refused the refit (incomplete, duplicate or mismatched tensors): the engine is unchanged."""


class RefitUnavailable(RefitError, ConnectionError):
    """refitd is unreachable, went away, or is busy with another session: retry later."""


class RefitAborted(RefitError):
    """The session was aborted (by the trainer, an operator, or refitd's deadline)."""


class RefitUnimplemented(RefitError, NotImplementedError):
    """This build of librefit_client lacks the feature (e.g. CUDA memory before the GPU path)."""


class WeightsDirty(RuntimeError):
    """refitd disconnected between pause and resume: the engine's weights may mix two versions
    and must not be served until a later refit completes."""


_BY_CODE = {3: RefitInvalidArgument, 9: RefitRefused, 14: RefitUnavailable, 10: RefitAborted,
            12: RefitUnimplemented}


def error_for_code(code: int, code_name: str, message: str) -> RefitError:
    return _BY_CODE.get(code, RefitError)(message, code, code_name)

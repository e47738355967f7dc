"""Exceptions raised by the refit package, one per outcome a caller handles differently.

RefitError carries the C ABI's code (the canonical status codes) and refitd's message, which
names the offending tensor or field; `cause`, refitd's cause where it gave one (an EndCause name:
"busy", "engine_dirty", "deadline_exceeded", ...); and `report`, the RefitReport of the refit the
error ended (a commit refused, aborted or failed), else None.

The class follows the cause where the code alone does not say how to handle the failure (busy
and a missing engine are both UNAVAILABLE; a dirty engine is UNAVAILABLE after a failed commit,
FAILED_PRECONDITION at a partial begin), else the code. docs/python.md has the table.
"""
from __future__ import annotations

from typing import Optional


class RefitError(Exception):
    """A call into librefit_client failed. `code` and `code_name` say how; `cause` is refitd's
    cause (None when it gave none), `report` the RefitReport of the refit that ended (None when
    there is none)."""

    def __init__(self, message: str, code: int = 2, code_name: str = "UNKNOWN", cause: Optional[str] = None,
                 report=None):
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.cause = cause
        self.report = report


class RefitInvalidArgument(RefitError, ValueError):
    """Bad input (dtype, shape, name, struct, manifest); nothing was sent for it, or refitd refused
    the session for it. Fix the input; retrying as is fails again."""


class RefitRefused(RefitError):
    """refitd refused the refit (incomplete, duplicate or mismatched tensors): the engine is
    unchanged. Fix the refit; retrying as is fails again."""


class RefitUnavailable(RefitError, ConnectionError):
    """refitd is unreachable or went away, or has no engine (or one not answering): retry later."""


class RefitBusy(RefitUnavailable):
    """Another session or commit holds refitd (cause "busy"): begin again soon, once it ended."""


class RefitEngineDirty(RefitError):
    """The engine's weights may mix two versions (cause "engine_dirty"): a commit failed inside its
    window, or a partial refit was refused for such an engine. Only a full refit lands (and cleans
    it); retrying a partial refit, or waiting, does not."""


class RefitAborted(RefitError):
    """The session was aborted (by the trainer, an operator, a peer gone, or refitd's deadline):
    the engine is unchanged."""


class RefitDeadlineExceeded(RefitAborted, TimeoutError):
    """The session stalled past its deadline (refitd's default, or the session's deadline_ms) and
    was aborted: the engine is unchanged."""


class RefitOverloaded(RefitError):
    """refitd ran out of a resource (staging memory, a limit; cause "overloaded"): retry later, or
    smaller."""


class RefitDataLoss(RefitError):
    """Bytes were lost or corrupted (DATA_LOSS)."""


class RefitVerifyMismatch(RefitDataLoss, RefitEngineDirty):
    """verify_after_commit read engine bytes unlike the staged ones after the copy (cause
    "verify_mismatch"): the engine stays paused and dirty until a full refit lands."""


class RefitNotFound(RefitError, LookupError):
    """What the call names does not exist (e.g. no held version has the tag)."""


class RefitUnimplemented(RefitError, NotImplementedError):
    """This build of librefit_client lacks the feature (e.g. CUDA memory before the GPU path)."""


class RefitInternal(RefitError):
    """A bug or an unexpected device error in refitd or the library."""


class WeightsDirty(RuntimeError):
    """refitd disconnected between pause and resume: the engine's weights may mix two versions
    and must not be served until a later refit completes."""


# Causes that say more than their code.
_BY_CAUSE = {"busy": RefitBusy, "engine_dirty": RefitEngineDirty, "verify_mismatch": RefitVerifyMismatch,
             "deadline_exceeded": RefitDeadlineExceeded, "overloaded": RefitOverloaded}
_BY_CODE = {3: RefitInvalidArgument, 4: RefitDeadlineExceeded, 5: RefitNotFound, 8: RefitOverloaded, 9: RefitRefused,
            10: RefitAborted, 12: RefitUnimplemented, 13: RefitInternal,
            14: RefitUnavailable, 15: RefitDataLoss}


def error_for_code(code: int, code_name: str, message: str, cause: Optional[str] = None, report=None) -> RefitError:
    """The RefitError subclass for a failure of `code` with refitd's `cause` (None or "" when it
    gave none; then the report's cause, when it has one)."""
    if not cause and report is not None and report.cause not in ("", "none"):
        cause = report.cause
    cls = _BY_CAUSE.get(cause) or _BY_CODE.get(code, RefitError)
    return cls(message, code, code_name, cause or None, report)

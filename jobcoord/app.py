"""Python handlers for the worker: an application object, a decorator per job kind, and the
context a handler uses to report progress while it runs.

    from jobcoord.app import App, PermanentError, Result

    app = App()

    @app.handler("summarize", role="gpu", timeout=600)
    def summarize(payload, ctx):
        if "doc" not in payload:
            raise PermanentError("payload has no doc")      # dead, no retry
        text = model.summarize(payload["doc"])             # any exception: retried
        ctx.check_cancelled()                              # stop if the lease was lost
        return Result({"summary": text}, provenance={"model": "llama-3-8b-q4"})

Run it with `jobcoord worker --app mymodule:app`. The handler runs in a thread of the worker
process, outside any database transaction. Python cannot stop a thread from outside, so a
long handler must look at `ctx.cancelled` (or call `ctx.check_cancelled()`, or wait with
`ctx.sleep()`): once the lease is lost, the job cancelled, the budget spent or the worker
shutting down, its result is discarded whatever it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInput

#: Default wall-clock budget of one attempt, seconds.
DEFAULT_TIMEOUT_S = 600.0


class PermanentError(Exception):
    """Raise from a handler to fail the job without retrying (it goes to `dead`)."""


class Cancelled(Exception):
    """Raised by `Context.check_cancelled()` once the attempt must stop."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Result:
    """A handler's return value with what produced it (model, runtime versions, settings).
    Returning a plain value is the same as `Result(value)`."""

    value: Any
    provenance: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HandlerSpec:
    kind: str
    fn: Callable[[Any, Context], Any] | None
    #: The role a worker serves by running this handler (None: jobs without a role only).
    role: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Largest result accepted; None means the coordinator's limit.
    max_result_bytes: int | None = None
    retry_on_timeout: bool = True
    retry_on_too_large: bool = False
    #: For command handlers: the argv run per job.
    command: tuple[str, ...] | None = None

    def describe(self) -> dict[str, Any]:
        if self.command is not None:
            return {"kind": self.kind, "type": "command", "command": list(self.command)}
        fn = self.fn
        name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        return {"kind": self.kind, "type": "python", "callable": name}


class App:
    """An allowlist of handlers by job kind."""

    def __init__(self) -> None:
        self.handlers: dict[str, HandlerSpec] = {}

    def handler(self, kind: str, *, role: str | None = None,
                timeout: float = DEFAULT_TIMEOUT_S, max_result_bytes: int | None = None,
                retry_on_timeout: bool = True, retry_on_too_large: bool = False
                ) -> Callable[[Callable[[Any, Context], Any]], Callable[[Any, Context], Any]]:
        from . import validate as v

        kind = v.name(kind, "kind")
        role = v.optional_name(role, "role")
        timeout = v.seconds(timeout, "timeout", 0, v.TEN_YEARS_S, lo_inclusive=False)
        if max_result_bytes is not None:
            max_result_bytes = v.integer(max_result_bytes, "max_result_bytes", 1, 2**40)

        def register(fn: Callable[[Any, Context], Any]) -> Callable[[Any, Context], Any]:
            if kind in self.handlers:
                raise InvalidInput("invalid_input", f"a handler for kind {kind!r} is already "
                                   "registered")
            self.handlers[kind] = HandlerSpec(kind, fn, role, float(timeout), max_result_bytes,
                                              retry_on_timeout, retry_on_too_large)
            return fn

        return register


class Context:
    """What a running handler knows about its attempt, and how it reports progress.

    `checkpoint` and `mark_external_effect` are fenced writes: they succeed only while this
    worker holds the lease at this epoch; otherwise they raise `Cancelled` and the handler
    should stop."""

    def __init__(self, *, job_id: int, epoch: int, attempt: int, kind: str, worker_id: str,
                 checkpoints: Mapping[str, Any], coordinator: Any, tenant: str | None = None,
                 log: Callable[..., None] | None = None):
        self.job_id = job_id
        self.epoch = epoch
        self.attempt = attempt
        self.kind = kind
        self.worker_id = worker_id
        self.tenant = tenant
        #: Checkpoints saved by earlier attempts (and this one), by name.
        self.checkpoints: dict[str, Any] = dict(checkpoints)
        self._coordinator = coordinator
        self._log = log
        self._stop = threading.Event()
        self._reason: str | None = None
        self.effect_started = False
        #: Artifacts this attempt staged through `artifact` (its completion checks them).
        self.artifacts_staged = 0

    # -- cancellation (set by the worker) --

    def cancel(self, reason: str) -> None:
        if not self._stop.is_set():
            self._reason = reason
            self._stop.set()

    @property
    def cancelled(self) -> bool:
        """True once the attempt must stop (lease lost, job cancelled, timeout, shutdown)."""
        return self._stop.is_set()

    @property
    def cancel_reason(self) -> str | None:
        return self._reason

    def check_cancelled(self) -> None:
        if self._stop.is_set():
            raise Cancelled(self._reason or "cancelled")

    def sleep(self, seconds: float) -> None:
        """Wait, but raise `Cancelled` as soon as the attempt must stop."""
        if self._stop.wait(max(0.0, seconds)):
            raise Cancelled(self._reason or "cancelled")

    # -- progress the next attempt can rely on --

    def _fenced(self, op: str, fn: Callable[[], Any]) -> Any:
        from .errors import Refused

        self.check_cancelled()
        try:
            out = fn()
        except Refused as e:
            # The lease is gone (expired, cancelled, superseded): this attempt must stop.
            self.cancel(e.code)
            raise Cancelled(e.code) from e
        if self._log is not None:
            self._log(op, job_id=self.job_id, epoch=self.epoch)
        return out

    def mark_external_effect(self) -> None:
        """Call right before an effect that cannot be undone (a paid call, a sent message).
        If this attempt's lease then expires, the job goes to `unknown` for an operator
        instead of running the effect again."""
        if not self.effect_started:
            self._fenced("effect_marked", lambda: self._coordinator.mark_effect(
                self.job_id, self.worker_id, self.epoch, tenant=self.tenant))
            self.effect_started = True

    def checkpoint(self, name: str, data: Any = None) -> None:
        """Commit step progress (e.g. the id a remote service gave this request); the next
        attempt finds it in `ctx.checkpoints` and can resume instead of starting over."""
        self._fenced("checkpointed", lambda: self._coordinator.checkpoint(
            self.job_id, self.worker_id, self.epoch, name, {} if data is None else data,
            tenant=self.tenant))
        self.checkpoints[name] = {} if data is None else data

    def artifact(self, name: str, source: Any, media_type: str | None = None) -> dict[str, Any]:
        """Stage an artifact (a path, bytes or a binary file object) under this attempt's
        lease; it becomes part of the result when this attempt's completion is accepted."""
        staged = self._fenced("artifact_staged", lambda: self._coordinator.put_artifact(
            self.job_id, self.worker_id, self.epoch, name, source, media_type,
            tenant=self.tenant))
        self.artifacts_staged += 1
        return staged


def load_app(spec: str) -> App:
    """`module:attribute` -> the App object (the module is imported from sys.path, which
    includes the current directory)."""
    import importlib
    import sys

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput("invalid_input", f"--app must look like module:attribute, got "
                           f"{spec!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidInput("invalid_input", f"--app: cannot import {module_name!r}: {e}"
                           ) from None
    except (Exception, SystemExit) as e:
        # The user's module failed while loading: say where, no traceback. A sys.exit() in
        # it too: it ended the worker with the module's own code (0, or 3 that reads as "no
        # eligible job") and no word of why.
        raise InvalidInput("invalid_input", f"--app: importing {module_name!r} failed: "
                           f"{type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise InvalidInput("invalid_input", f"--app: {module_name!r} has no {attr!r}")
    if not isinstance(obj, App):
        raise InvalidInput("invalid_input", f"--app: {spec} is a {type(obj).__name__}, not a "
                           "jobcoord.app.App")
    return obj

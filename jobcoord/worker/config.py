"""The worker's settings (`WorkerConfig`) and the parsing of the `jobcoord worker` options into
them."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Any

from ..app import HandlerSpec
from ..errors import InvalidInput

#: How long a --burst worker's claims may fail (the coordinator unreachable, busy, restarting)
#: before it gives up and exits with the error's code, once nothing of its own is running.
#: The same 10 s a remote worker's single call retries for (`http.client.DEFAULT_RETRY_S`).
GIVE_UP_S = 10.0


@dataclass
class WorkerConfig:
    worker_id: str
    handlers: dict[str, HandlerSpec]
    roles: list[str]
    lease_s: float = 30.0
    heartbeat_s: float = 10.0
    #: Reap expired leases this often (0: never; a dedicated `jobcoord reap --every` does it).
    reap_s: float = 5.0
    poll_s: float = 1.0
    concurrency: int = 1
    #: After SIGTERM/SIGINT, running jobs get this long to finish before they are released.
    grace_s: float = 10.0
    #: A command gets this long between SIGTERM and SIGKILL.
    kill_grace_s: float = 5.0
    readings_override: dict[str, Any] = field(default_factory=dict)
    log_format: str = "text"
    #: Database URL handed to commands (JOBCOORD_URL).
    database_url: str | None = None
    #: What a remote worker hands its commands instead (JOBCOORD_SERVER, JOBCOORD_TOKEN_FILE,
    #: JOBCOORD_CA_FILE), so `jobcoord checkpoint` / `effect` reach the same server.
    server_env: dict[str, str] = field(default_factory=dict)
    #: Stop after this many jobs were claimed (None: no limit).
    max_jobs: int | None = None
    #: Exit once nothing is running and a claim gets nothing, whatever the reason (no job,
    #: or a gate): a script running the queue dry must not hang on a busy machine.
    burst: bool = False
    #: With `burst`: give up once claims have failed this long without one getting through
    #: and nothing of this worker's is running, and exit with the last error's code (a
    #: server gone: 6). Without `burst` the worker keeps trying.
    give_up_s: float = GIVE_UP_S
    #: Claim up to the free slots per call and accept results in groups (complete_many).
    batch: bool = True
    #: Longest a finished job's result waits for its group to fill before it is flushed.
    flush_delay_s: float = 0.005
    #: Claim only this tenant's jobs (None: every tenant's), as a tenant-bound token does.
    tenant: str | None = None


def parse_exec(items: tuple[str, ...] | list[str]) -> dict[str, tuple[str, ...]]:
    """`--exec KIND=COMMAND` (repeatable) -> {kind: argv}. The command is split like a shell
    would (quotes respected) but never run through a shell."""
    from .. import validate as v

    out: dict[str, tuple[str, ...]] = {}
    for item in items:
        kind, sep, command = item.partition("=")
        if not sep or not command.strip():
            raise InvalidInput("invalid_input", f"--exec must look like KIND='COMMAND ARGS', "
                               f"got {item!r}")
        kind = v.name(kind.strip(), "kind")
        try:
            argv = tuple(shlex.split(command))
        except ValueError as e:
            raise InvalidInput("invalid_input", f"--exec {kind}: {e}") from None
        if not argv or not argv[0]:
            # `k=''`: no program to run; every job of the kind would fail, one by one.
            raise InvalidInput("invalid_input", f"--exec {kind}: an empty command (the "
                               f"program's name is empty in {command!r})")
        if kind in out:
            raise InvalidInput("invalid_input", f"--exec: kind {kind!r} given twice")
        # Looked up as the command will be (PATH, or a path from the worker's directory):
        # one that is not there would fail every job of its kind, an attempt at a time.
        program = shutil.which(argv[0])
        if program is None:
            raise InvalidInput("invalid_input", f"--exec {kind}: no program {argv[0]!r} to "
                               "run (not on PATH, or not an executable file)")
        missing = _missing_interpreter(program)
        if missing is not None:
            raise InvalidInput("invalid_input", f"--exec {kind}: {argv[0]!r} starts with "
                               f"#!{missing}, and there is no such program to run it")
        out[kind] = argv
    return out


def _missing_interpreter(program: str) -> str | None:
    """The `#!` line of a script whose interpreter is not there (the exec would fail as a
    missing program does), else None. `#!/usr/bin/env NAME` looks NAME up on PATH."""
    try:
        with open(program, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None  # not readable by this user: the exec will say what it finds
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    wanted = [words[0]]
    if os.path.basename(words[0]) == "env" and len(words) > 1 and not words[1].startswith("-"):
        wanted.append(words[1])
    if all(shutil.which(word) is not None for word in wanted):
        return None
    return " ".join(words)


def parse_kind_values(items: tuple[str, ...] | list[str], option: str, lo: float, hi: float
                      ) -> dict[str, float]:
    """`--timeout KIND=SECONDS`-style options."""
    from .. import validate as v

    out: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep:
            raise InvalidInput("invalid_input", f"{option} must look like KIND=VALUE, got "
                               f"{item!r}")
        out[v.name(kind.strip(), "kind")] = v.seconds(value.strip(), option.lstrip("-"), lo, hi,
                                                      lo_inclusive=False)
    return out


def parse_kind_sizes(items: tuple[str, ...] | list[str], option: str, hi: int
                     ) -> dict[str, int]:
    """`--max-result-bytes KIND=BYTES`-style options: whole bytes from 1 to `hi` (a byte
    count is not a duration: no fractions, and the messages speak of bytes)."""
    from .. import validate as v

    out: dict[str, int] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep:
            raise InvalidInput("invalid_input", f"{option} must look like KIND=BYTES, got "
                               f"{item!r}")
        out[v.name(kind.strip(), "kind")] = v.whole(value.strip(), option.lstrip("-"), 1, hi)
    return out


def make_config(*, app_spec: str | None, execs: tuple[str, ...], roles: tuple[str, ...],
                worker_id: str | None, lease: Any, concurrency: Any, grace: Any,
                kill_grace: Any, heartbeat_every: Any, reap_every: Any, poll: Any,
                timeouts: tuple[str, ...], max_results: tuple[str, ...],
                readings_override: str | None, log_format: str, max_jobs: Any, burst: bool,
                database_url: str | None, policy: Any, flush_delay: Any = "0.005",
                batch: bool = True, tenant: str | None = None,
                server_env: dict[str, str] | None = None,
                give_up_s: float = GIVE_UP_S) -> WorkerConfig:
    """Validate the `jobcoord worker` options into a WorkerConfig (InvalidInput on any
    mistake, before anything runs)."""
    import dataclasses

    from .. import validate as v
    from ..app import load_app
    from ..core.workers import default_worker_id
    from ..readings import parse_override

    handlers: dict[str, HandlerSpec] = {}
    if app_spec is not None:
        handlers.update(load_app(app_spec).handlers)
    for kind, argv in parse_exec(execs).items():
        if kind in handlers:
            raise InvalidInput("invalid_input", f"kind {kind!r} has both a Python handler and "
                               "--exec")
        handlers[kind] = HandlerSpec(kind, None, command=argv)
    if not handlers:
        raise InvalidInput("invalid_input", "give at least one handler: --app MODULE:APP or "
                           "--exec KIND='COMMAND'")
    lease_s = v.seconds(lease, "lease", 0, policy.max_lease_s, lo_inclusive=False)
    hb_s = v.seconds(heartbeat_every, "heartbeat-every", 0.05, 3600.0)
    if hb_s >= policy.heartbeat_max_age_s:
        raise InvalidInput("invalid_input", f"--heartbeat-every must be shorter than the "
                           f"policy's heartbeat_max_age_s ({policy.heartbeat_max_age_s:g}s)")
    for kind, seconds in parse_kind_values(timeouts, "--timeout", 0, v.TEN_YEARS_S).items():
        if kind not in handlers:
            raise InvalidInput("invalid_input", f"--timeout: no handler for kind {kind!r}")
        handlers[kind] = dataclasses.replace(handlers[kind], timeout_s=seconds)
    for kind, size in parse_kind_sizes(max_results, "--max-result-bytes", 2**40).items():
        if kind not in handlers:
            raise InvalidInput("invalid_input", f"--max-result-bytes: no handler for kind "
                               f"{kind!r}")
        handlers[kind] = dataclasses.replace(handlers[kind], max_result_bytes=size)
    all_roles = {v.name(r, "role") for r in roles}
    all_roles |= {h.role for h in handlers.values() if h.role is not None}
    return WorkerConfig(
        # Only an id not given defaults: an empty one (an unset shell variable) became
        # HOST:PID, a new id at every start, where every other command refuses it.
        worker_id=v.name(default_worker_id() if worker_id is None else worker_id, "worker",
                         max_len=v.MAX_WORKER_ID),
        handlers=handlers, roles=sorted(all_roles), lease_s=lease_s, heartbeat_s=hb_s,
        reap_s=v.seconds(reap_every, "reap-every", 0, 3600.0),
        poll_s=v.seconds(poll, "poll", 0.01, 60.0),
        concurrency=v.integer(concurrency, "concurrency", 1, 256),
        grace_s=v.seconds(grace, "grace", 0, 24 * 3600.0),
        kill_grace_s=v.seconds(kill_grace, "kill-grace", 0, 3600.0),
        readings_override=parse_override(readings_override), log_format=log_format,
        database_url=database_url, server_env=dict(server_env or {}),
        max_jobs=None if max_jobs is None else v.integer(max_jobs, "max-jobs", 1, 2**31),
        burst=burst, give_up_s=give_up_s, batch=batch,
        flush_delay_s=v.seconds(flush_delay, "flush-delay", 0, 1.0),
        tenant=v.optional_name(tenant, "tenant"),
    )

"""Every input the remote client (RemoteCoordinator) accepts either works or is refused as a
JobcoordError, as the Coordinator's own methods are: never a TypeError, KeyError or
ValueError of the client's plumbing. Against a real `jobcoord serve`; a call refused as
invalid input changes nothing on the server."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.errors import InvalidInput, JobcoordError
from jobcoord.http.client import RemoteCoordinator
from jobcoord.service import Coordinator
from tests.conftest import dump
from tests.serve_procs import served, token
from tests.test_api_arguments import EPOCH, JOB, METHODS, WORKER, arg, check_calls
from tests.test_artifacts_rules import install
from tests.timeline import IDLE_ON_AC

#: The Coordinator's methods the client has, with the same argument strategies, and its own.
REMOTE = {name: METHODS[name] for name in (
    "enqueue", "heartbeat", "claim", "claim_many", "complete", "complete_and_claim", "fail",
    "complete_many", "renew", "mark_effect", "checkpoint", "show")}
REMOTE["put_artifact"] = (
    [JOB, WORKER, EPOCH, arg("out.txt", "a b#?%.txt", optional=False),
     arg(b"bytes", optional=False)], {"media_type": arg(None, "text/plain")})


def _serving(target: Target) -> tuple[str, Coordinator]:
    install(target)
    secret = token(target, "w1", "worker", worker="w1")
    coord = Coordinator.open(target)
    for kind in ("k", "j", "k"):
        coord.enqueue(kind, {})
    return secret, coord


@contextlib.contextmanager
def _holding(target: Target
             ) -> Iterator[tuple[Coordinator, Any, RemoteCoordinator, str, int, int]]:
    """A server, its client as worker w1 (and w1's token), and the job w1 holds (job id,
    epoch)."""
    secret, coord = _serving(target)
    with coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        got = remote.claim("w1", lease_s=600)
        yield coord, s, remote, secret, got["job"]["job_id"], got["lease"]["epoch"]


def test_every_client_method_either_works_or_refuses_input(target: Target) -> None:
    secret, coord = _serving(target)
    with coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        remote.claim("w1", lease_s=600)

        check_calls(remote, coord, REMOTE, 300)


def test_what_the_client_refuses_itself_is_invalid_input_and_changes_nothing(
        target: Target) -> None:
    """The reproductions: each raised a plain Python error in the client before."""
    with _holding(target) as (coord, s, remote, secret, job, epoch):
        before = dump(coord)
        refused = {
            "complete_many([1])": lambda: remote.complete_many([1]),
            "an item without its epoch": lambda: remote.complete_many([{"job_id": job}]),
            "an item with an unknown field": lambda: remote.complete_many(
                [{"job_id": job, "worker_id": "w1", "epoch": epoch, "colour": 1}]),
            "renew('1x')": lambda: remote.renew("1x", "w1", epoch),  # type: ignore[arg-type]
            "show(None)": lambda: remote.show(None),  # type: ignore[arg-type]
            "a job id of 2**70": lambda: remote.complete(2**70, "w1", epoch),
            "provenance='abc'": lambda: remote.complete(job, "w1", epoch, provenance="abc"),
            "an item's provenance 'abc'": lambda: remote.complete_many(
                [{"job_id": job, "worker_id": "w1", "epoch": epoch, "provenance": "abc"}]),
            "a text stream": lambda: remote.put_artifact(job, "w1", epoch, "out.txt",
                                                         io.StringIO("text")),
            "a closed file": lambda: remote.put_artifact(job, "w1", epoch, "out.txt",
                                                         closed),
            # The server reads no `n` as a single claim: it leased a job, and the answer
            # had no "claimed".
            "claim_many(n=None)": lambda: remote.claim_many("w1", None),  # type: ignore
            "a wait of 'soon'": lambda: remote.claim("w1", wait="soon"),  # type: ignore
            "a wait of 31 s": lambda: remote.claim("w1", wait=31),
            # A header cannot carry it: it was retried as an unreachable server.
            "a key with a space at its end": lambda: remote.enqueue("k", {}, key="doc-42 "),
            "a token of None": lambda: RemoteCoordinator(s.url, None),  # type: ignore
            "a token of bytes": lambda: RemoteCoordinator(s.url, b"x"),  # type: ignore
            "a claim_wait of 'x'": lambda: RemoteCoordinator(
                s.url, secret, claim_wait="x"),  # type: ignore[arg-type]
            "a timeout of []": lambda: RemoteCoordinator(
                s.url, secret, timeout=[]),  # type: ignore[arg-type]
            # Shown in the refusal as it was: an int past 4300 digits has no repr.
            "a tenant of 10**5000 (enqueue)": lambda: remote.enqueue(
                "k", {}, tenant=10**5000),  # type: ignore[arg-type]
            "a tenant of 10**5000 (claim)": lambda: remote.claim(
                "w1", tenant=10**5000),  # type: ignore[arg-type]
        }
        closed = open(__file__, "rb")  # noqa: SIM115 - closed at once, on purpose
        closed.close()
        for what, call in refused.items():
            try:
                call()
            except InvalidInput:
                pass
            except Exception as e:
                raise AssertionError(f"{what}: {type(e).__name__}: {e}") from None
            else:
                raise AssertionError(f"{what}: accepted")
            assert dump(coord) == before, what
        # Seconds as decimal digits are taken, as the Coordinator takes them (they raised
        # TypeError deep in a claim).
        with RemoteCoordinator(s.url, secret, claim_wait="0", timeout="5") as digits:  # type: ignore[arg-type]
            assert digits.claim("w1", kinds="zz", wait="0")["job"] is None  # type: ignore[arg-type]
        # The same job still completes.
        assert remote.complete(job, "w1", epoch, {"ok": 1})["status"] == "succeeded"



def test_a_remote_failure_saying_its_effect_did_not_happen_takes_the_retry_path(
        target: Target) -> None:
    """`fail(..., effect_not_applied=True)` over HTTP, as in the Python API and the CLI: the
    job waits again (without it, an attempt that marked its effect ends `unknown`)."""
    secret, coord = _serving(target)
    with coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        remote.heartbeat("w1", readings=IDLE_ON_AC)
        ends = []
        for flag in (True, False):
            got = remote.claim("w1", lease_s=600)
            job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
            remote.mark_effect(job, "w1", epoch)
            out = remote.fail(job, "w1", epoch, "refused before sending",
                              effect_not_applied=flag)
            ends.append((out["status"],
                         coord.show(job)["events"][-1]["detail"].get("effect_not_applied")))
        assert ends == [("waiting", True), ("unknown", None)], ends


def test_a_bare_string_is_one_role_or_kind_over_http_too(target: Target) -> None:
    """As in every Coordinator method: `roles="gpu"` is the role gpu, not g, p and u."""
    secret, coord = _serving(target)
    with coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        remote.heartbeat("w1", roles="gpu", kinds="k", readings=IDLE_ON_AC)
        (row,) = coord.workers()["workers"]
        assert (row["roles"], row["kinds"]) == (["gpu"], ["k"]), row
        got = remote.claim("w1", kinds="k")
        assert got["job"]["kind"] == "k", got


BIG = "x" * (2 * 1024 * 1024)

#: Calls on a job leased to w1 at epoch `e`, which the client must answer as the Coordinator
#: does (the same success, or the same error class and code). Over HTTP the first sent
#: digits the server refuses (the Coordinator reads "1" as 1, as its CLI does), and the
#: rest hit the server's body limit (`body_too_large`, whatever was too large) first.
ALIKE: dict[str, Any] = {
    "complete, epoch in digits": lambda c, j, e: c.complete(j, "w1", str(e), {"n": 1}),
    "complete_and_claim, epoch in digits":
        lambda c, j, e: c.complete_and_claim(j, "w1", str(e), {"n": 1})["completed"],
    "complete_many, ids in digits": lambda c, j, e: c.complete_many(
        [{"job_id": str(j), "worker_id": "w1", "epoch": str(e)}])["results"][0],
    "renew, epoch in digits": lambda c, j, e: c.renew(j, "w1", str(e), lease_s="600"),
    "fail, epoch in digits": lambda c, j, e: c.fail(j, "w1", str(e), "broke"),
    "mark_effect, epoch in digits": lambda c, j, e: c.mark_effect(j, "w1", str(e)),
    "checkpoint, epoch in digits": lambda c, j, e: c.checkpoint(j, "w1", str(e), "s", {}),
    "a result too large": lambda c, j, e: c.complete(j, "w1", e, BIG),
    "a result too large, chained": lambda c, j, e: c.complete_and_claim(j, "w1", e, BIG),
    "one item's result too large": lambda c, j, e: c.complete_many(
        [{"job_id": j, "worker_id": "w1", "epoch": e, "result": BIG}]),
    "a provenance too large": lambda c, j, e: c.complete(j, "w1", e, {}, provenance={"x": BIG}),
    "checkpoint data too large": lambda c, j, e: c.checkpoint(j, "w1", e, "s", BIG),
    "an error too long": lambda c, j, e: c.fail(j, "w1", e, BIG),
    "heartbeat readings too large":
        lambda c, j, e: c.heartbeat("w1", readings={"memory_used_pct": 1, "pad": BIG}),
    "heartbeat readings as text": lambda c, j, e: c.heartbeat(
        "w1", readings='{"memory_used_pct": 50, "on_battery": false}')["readings"],
    "a result whose keys mix text and numbers":
        lambda c, j, e: c.complete(j, "w1", e, {"a": 1, 2: 3}),
    "one item's result whose keys mix text and numbers": lambda c, j, e: c.complete_many(
        [{"job_id": j, "worker_id": "w1", "epoch": e, "result": {"a": 1, 2: 3}}]),
    "checkpoint data whose keys mix text and numbers":
        lambda c, j, e: c.checkpoint(j, "w1", e, "s", {"a": 1, 2: 3}),
    "heartbeat readings as text too large":
        lambda c, j, e: c.heartbeat("w1", readings='{"pad": "' + BIG + '"}'),
}

#: Submissions the client must answer as the Coordinator does (a submitter's token).
SUBMITS: dict[str, Any] = {
    "a payload too large": lambda c: c.enqueue("k", {"pad": BIG}),
    "a payload too large, with a key": lambda c: c.enqueue("k", {"pad": BIG}, key="big-1"),
    "a payload that is a long string": lambda c: c.enqueue("k", BIG),
    "a payload whose keys mix text and numbers": lambda c: c.enqueue("k", {"a": 1, 2: 3}),
}

#: Submissions both take, making the same job: options read as the Coordinator reads them.
SUBMITTED_ALIKE: dict[str, Any] = {
    "max_attempts in digits": lambda c: c.enqueue("k", {}, max_attempts="2"),
    "deadline in digits": lambda c: c.enqueue("k", {}, deadline_s="20"),
    "delay in digits": lambda c: c.enqueue("k", {}, delay_s="20"),
    "needs as text": lambda c: c.enqueue("k", {}, needs="gpu_mem_mb=100, ram_mb=8"),
    "payload as JSON text": lambda c: c.enqueue("k", '{"a": [1, 2]}'),
    "payload as JSON bytes": lambda c: c.enqueue("k", b'{"b": 1}'),
    "the token's own tenant": lambda c: c.enqueue("k", {}, tenant="alice"),
}


def _made(coord: Coordinator, job_id: int) -> tuple[Any, ...]:
    j = coord.show(job_id)["job"]
    return (j["kind"], j["payload"], j["max_attempts"], j["needs"], j["tenant"],
            j["deadline_at"] is None, j["run_after"] == j["created_at"])


def _outcome(call: Any) -> tuple[Any, ...]:
    try:
        got = call()
    except JobcoordError as e:
        return (type(e).__name__, e.code)
    return ("ok", got.get("status"), got.get("error", {}).get("code"))


def test_the_client_answers_each_call_as_the_coordinator_does(target: Target) -> None:
    secret = token(target, "w1", "worker", worker="w1")
    failures = []
    with Coordinator.open(target) as coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        for name, call in ALIKE.items():
            got = []
            for subject in (coord, remote):
                job = coord.enqueue("k", {})["job_id"]
                epoch = subject.claim("w1", lease_s=600)["lease"]["epoch"]
                before = dump(coord)
                got.append(_outcome(lambda subject=subject, job=job, epoch=epoch, call=call:
                                    call(subject, job, epoch)))
                if got[-1][0] != "ok":
                    assert dump(coord) == before, name
                if coord.show(job)["job"]["status"] == "running":
                    coord.fail(job, "w1", epoch, "done", permanent=True)
            if got[0] != got[1]:
                failures.append(f"{name}: Coordinator {got[0]}, client {got[1]}")
    assert not failures, "\n".join(failures)


def test_the_client_refuses_a_submission_as_the_coordinator_does(target: Target) -> None:
    """A payload over the server's body limit was `body_too_large` with no detail; the
    Coordinator says `payload_too_large` (with its limit and size) or why the payload is
    not one."""
    secret = token(target, "ci", "submitter")
    failures = []
    with Coordinator.open(target) as coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        before = dump(coord)
        for name, call in SUBMITS.items():
            got = [_outcome(lambda subject=subject, call=call: call(subject))
                   for subject in (coord, remote)]
            assert dump(coord) == before, name
            if got[0] != got[1] or got[0][0] == "ok":
                failures.append(f"{name}: Coordinator {got[0]}, client {got[1]}")
    assert not failures, "\n".join(failures)


def test_the_client_reads_a_submissions_options_as_the_coordinator_does(
        target: Target) -> None:
    """Digits for max_attempts, deadline_s or delay_s, needs as NAME=INT text, a payload
    as JSON text: the Coordinator reads each, and the client sent them as they were, which
    the server refused (invalid_input)."""
    secret = token(target, "ci", "submitter", tenant="alice")
    failures = []
    with Coordinator.open(target) as coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        for name, call in SUBMITTED_ALIKE.items():
            try:
                made = [_made(coord, call(subject)["job_id"]) for subject in (coord, remote)]
            except JobcoordError as e:
                failures.append(f"{name}: {e.code}: {e.message}")
                continue
            # (the Coordinator's jobs go to the tenant named, else the default one)
            if made[0][:4] != made[1][:4] or made[0][5:] != made[1][5:]:
                failures.append(f"{name}: Coordinator {made[0]}, client {made[1]}")
        # A keyword neither knows is a TypeError on both (the client sent it, and the
        # server refused an unknown field).
        for subject in (coord, remote):
            with pytest.raises(TypeError):
                subject.enqueue("k", {}, bogus=1)  # type: ignore[call-arg]
        # The job goes to the token's tenant: naming another is refused, never dropped.
        before = dump(coord)
        with pytest.raises(InvalidInput) as other:
            remote.enqueue("k", {}, tenant="bob")
        assert "alice" in other.value.message and dump(coord) == before
    assert not failures, "\n".join(failures)


def test_a_closed_client_refuses_as_a_closed_coordinator_does(target: Target) -> None:
    """A call on a closed client raised httpx's RuntimeError, which no caller catching
    JobcoordError (as the worker runtime does) catches; closed from another thread while
    threads were in calls, the same. Now `coordinator_closed`, as a closed Coordinator."""
    import threading

    secret = token(target, "w1", "worker", worker="w1")
    with Coordinator.open(target) as coord, served(target, "--reap-every", "0") as s:
        coord.heartbeat("w1", readings=IDLE_ON_AC)
        remote = RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0)
        raised: list[BaseException] = []
        stop = threading.Event()

        def calls() -> None:
            while not stop.is_set():
                try:
                    remote.heartbeat("w1", readings=IDLE_ON_AC)
                    remote.claim("w1", wait=0)
                except JobcoordError as e:
                    if e.code == "coordinator_closed":
                        return
                    raised.append(e)  # (a claim cut by close() said server_unreachable)
                    return
                except BaseException as e:  # what a caller catching JobcoordError would miss
                    raised.append(e)
                    return

        threads = [threading.Thread(target=calls) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # calls in flight as it closes
        remote.close()
        stop.set()
        for t in threads:
            t.join(30)
        with pytest.raises(InvalidInput) as closed:
            remote.renew(1, "w1", 1)
        with pytest.raises(InvalidInput) as closed_coord:
            coord.close()
            coord.renew(1, "w1", 1)
        # Interrupted (a worker's SIGTERM) and closed: claims answered "nothing", as if
        # the client still served.
        stopped = RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0)
        stopped.interrupt()
        stopped.close()
        with pytest.raises(InvalidInput) as closed_claim:
            stopped.claim("w1", wait=0)
        with pytest.raises(InvalidInput) as closed_many:
            stopped.claim_many("w1", 2, wait=0)
    assert raised == [], raised
    assert closed.value.code == closed_coord.value.code == "coordinator_closed"
    assert closed_claim.value.code == closed_many.value.code == "coordinator_closed"

def _fenced_calls(remote: RemoteCoordinator, job: int, epoch: int
                  ) -> dict[str, Callable[[str, str | None], Any]]:
    """Every worker call of the client, as (worker, tenant) -> the call."""
    return {
        "heartbeat": lambda w, t: remote.heartbeat(w, readings=IDLE_ON_AC),
        "claim": lambda w, t: remote.claim(w, tenant=t),
        "claim_many": lambda w, t: remote.claim_many(w, 2, tenant=t),
        "renew": lambda w, t: remote.renew(job, w, epoch, lease_s=900, tenant=t),
        "complete": lambda w, t: remote.complete(job, w, epoch, {"r": 1}, tenant=t),
        "complete_and_claim": lambda w, t: remote.complete_and_claim(
            job, w, epoch, {"r": 1}, tenant=t),
        "complete_many": lambda w, t: remote.complete_many(
            [{"job_id": job, "worker_id": w, "epoch": epoch, "result": {"r": 1},
              **({} if t is None else {"tenant": t})}]),
        "fail": lambda w, t: remote.fail(job, w, epoch, "boom", tenant=t),
        "mark_effect": lambda w, t: remote.mark_effect(job, w, epoch, tenant=t),
        "checkpoint": lambda w, t: remote.checkpoint(job, w, epoch, "c", {}, tenant=t),
        "put_artifact": lambda w, t: remote.put_artifact(job, w, epoch, "out.txt", b"x",
                                                         tenant=t),
    }


def _refused_each(calls: dict[str, Callable[[str, str | None], Any]], worker: str,
                  tenant: str | None, coord: Coordinator, said: str) -> None:
    before = dump(coord)
    for name, call in calls.items():
        if name == "heartbeat" and tenant is not None:
            continue  # a heartbeat names no tenant
        with pytest.raises(InvalidInput, match=said):
            call(worker, tenant)
        assert dump(coord) == before, (name, worker, tenant)


def test_a_worker_other_than_the_tokens_is_refused_and_changes_nothing(
        target: Target) -> None:
    """The server acts as the token's worker. The client took any `worker_id` and dropped
    it: `renew(job, "w2", ...)` renewed w1's lease, as the CLI's `--worker w2` never does
    (it refuses the mismatch)."""
    with _holding(target) as (coord, _s, remote, _secret, job, epoch):
        _refused_each(_fenced_calls(remote, job, epoch), "w2", None, coord,
                      "worker 'w2': this token acts as worker 'w1'")
        # The token's own worker is taken.
        assert remote.renew(job, "w1", epoch, lease_s=900)["job_id"] == job
        assert remote.complete(job, "w1", epoch, {"ok": 1})["status"] == "succeeded"


def test_a_tenant_bound_tokens_call_naming_another_tenant_is_refused(target: Target) -> None:
    """A token bound to tenant alice acts on alice's jobs: a call naming bob was sent as
    alice's, the tenant dropped. Naming alice, or no tenant, is taken."""
    install(target)
    secret = token(target, "w3", "worker", tenant="alice", worker="w3")
    coord = Coordinator.open(target)
    coord.enqueue("k", {}, tenant="alice")
    coord.enqueue("k", {}, tenant="alice")
    with coord, served(target, "--reap-every", "0") as s, \
            RemoteCoordinator(s.url, secret, claim_wait=0, retry_s=1.0) as remote:
        remote.heartbeat("w3", readings=IDLE_ON_AC)
        got = remote.claim("w3", lease_s=600, tenant="alice")
        job, epoch = got["job"]["job_id"], got["lease"]["epoch"]
        _refused_each(_fenced_calls(remote, job, epoch), "w3", "bob", coord,
                      "tenant 'bob': this token claims tenant 'alice''s jobs")
        assert remote.renew(job, "w3", epoch, tenant="alice")["job_id"] == job
        assert remote.complete(job, "w3", epoch, {"ok": 1},
                               tenant="alice")["status"] == "succeeded"

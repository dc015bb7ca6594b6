"""`jobcoord serve`: trusted identity. The access matrix (every endpoint x every role x own /
other tenant) against a real server process over real HTTP, on SQLite and PostgreSQL;
revocation on the very next request; token commands."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from jobcoord.db import Target
from jobcoord.errors import Refused
from jobcoord.service import Coordinator
from tests.serve_procs import db_args, jobcoord_argv, served, token
from tests.sql import sql

ROLES = ("submitter", "viewer", "worker", "operator")


class World:
    """Jobs of tenant alice ("own") and bob ("other"), and leases of worker wa ("own") and
    wb ("other"), made in-process on the same database the server serves."""

    def __init__(self, c: Coordinator):
        self.c = c
        c.heartbeat("wa", roles=["r-wa"], readings={"memory_used_pct": 10})
        c.heartbeat("wb", roles=["r-wb"], readings={"memory_used_pct": 10})

    def waiting(self, tenant: str) -> int:
        # A role nobody serves: the matrix's claims never take these.
        return int(self.c.enqueue("k", {}, tenant=tenant, role="nobody")["job_id"])

    def leased(self, worker: str, tenant: str) -> tuple[int, int]:
        job = self.c.enqueue("k", {}, tenant=tenant, role=f"r-{worker}")["job_id"]
        got = self.c.claim(worker, lease_s=300)
        assert got["job"]["job_id"] == job
        return job, got["lease"]["epoch"]

    def accepted_artifact(self, tenant: str) -> int:
        """A job of `tenant` completed with an accepted artifact `a.txt`."""
        self.n = getattr(self, "n", 0) + 1
        worker = f"wx{self.n}"
        self.c.heartbeat(worker, roles=[f"r-{worker}"], readings={"memory_used_pct": 10})
        job, epoch = self.leased(worker, tenant)
        self.c.put_artifact(job, worker, epoch, "a.txt", ARTIFACT)
        self.c.complete(job, worker, epoch, {})
        return job

    def dead(self, tenant: str) -> int:
        # A worker of its own: an operator's retry puts the job back under its role.
        self.n = getattr(self, "n", 0) + 1
        worker = f"wd{self.n}"
        self.c.heartbeat(worker, roles=[f"r-{worker}"], readings={"memory_used_pct": 10})
        job, epoch = self.leased(worker, tenant)
        self.c.fail(job, worker, epoch, "boom", permanent=True)
        return job


# (world, own|other) -> method, path, JSON body, and optionally other request arguments
Cell = Callable[[World, str], tuple[Any, ...]]
ARTIFACT = b"artifact bytes\n"
UPLOAD = {"content": ARTIFACT, "headers": {
    "X-Content-Digest": "sha256:" + hashlib.sha256(ARTIFACT).hexdigest()}}
#: The worker's fenced endpoints and a valid body of each.
FENCED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("renew", {"lease_s": 60}), ("effect", {}), ("checkpoint", {"name": "step"}),
    ("complete", {"result": {"ok": True}}), ("fail", {"error": "e"}))


def _read(suffix: str = "") -> Cell:
    return lambda w, side: ("GET", f"/v1/jobs/{w.waiting('alice' if side == 'own' else 'bob')}"
                            f"{suffix}", None)


def _fenced(op: str, body: dict[str, Any]) -> Cell:
    def cell(w: World, side: str) -> tuple[str, str, Any]:
        job, epoch = w.leased("wa" if side == "own" else "wb", "alice" if side == "own"
                              else "bob")
        return "POST", f"/v1/jobs/{job}/{op}", {"epoch": epoch, **body}
    return cell


def _completions() -> Cell:
    def cell(w: World, side: str) -> tuple[str, str, Any]:
        job, epoch = w.leased("wa" if side == "own" else "wb", "alice" if side == "own"
                              else "bob")
        return "POST", "/v1/completions", {"items": [{"job_id": job, "epoch": epoch}]}
    return cell


def _foreign(op: str, body: dict[str, Any]) -> Cell:
    """A lease the worker token may not touch: "own" is another worker's lease in the
    token's own tenant, "other" is a lease held under the token's own worker id on a job of
    another tenant (claimed around the server, through the Python API)."""
    def cell(w: World, side: str) -> tuple[str, str, Any]:
        job, epoch = w.leased("wb", "alice") if side == "own" else w.leased("wa", "bob")
        return "POST", f"/v1/jobs/{job}/{op}", {"epoch": epoch, **body}
    return cell


def _upload(foreign: bool) -> Cell:
    """An artifact upload: this token's lease ("own") or another worker's of another tenant
    ("other"); with `foreign`, the two leases it may not touch, as in _foreign."""
    def cell(w: World, side: str) -> tuple[Any, ...]:
        if foreign:
            job, epoch = w.leased("wb", "alice") if side == "own" else w.leased("wa", "bob")
        else:
            job, epoch = (w.leased("wa", "alice") if side == "own"
                          else w.leased("wb", "bob"))
        return ("PUT", f"/v1/jobs/{job}/artifacts/a.txt", None,
                {**UPLOAD, "params": {"epoch": epoch}})
    return cell


def _artifact(suffix: str) -> Cell:
    def cell(w: World, side: str) -> tuple[Any, ...]:
        job = w.accepted_artifact("alice" if side == "own" else "bob")
        return "GET", f"/v1/jobs/{job}/artifacts{suffix}", None
    return cell


def _operator(op: str, body: Any = None, dead: bool = False) -> Cell:
    def cell(w: World, side: str) -> tuple[str, str, Any]:
        tenant = "alice" if side == "own" else "bob"
        job = w.dead(tenant) if dead else w.waiting(tenant)
        return "POST", f"/v1/jobs/{job}/{op}", body
    return cell


def _fixed(method: str, path: str, body: Any = None) -> Cell:
    return lambda w, side: (method, path, body)


# endpoint -> (cell, {role: (own status, other-tenant status)}). "Other" for the worker's
# endpoints is a lease held by another worker of another tenant: 404, as if absent (the
# worker token, bound to tenant alice, sees its own leases only); reads by a worker are
# refused by role.
MATRIX: dict[str, tuple[Cell, dict[str, tuple[int, int]]]] = {
    "POST /v1/jobs": (_fixed("POST", "/v1/jobs", {"kind": "k", "role": "nobody"}),
                      {"submitter": (201, 201), "viewer": (403, 403), "worker": (403, 403),
                       "operator": (201, 201)}),
    "GET /v1/jobs": (_fixed("GET", "/v1/jobs"),
                     {"submitter": (200, 200), "viewer": (200, 200), "worker": (403, 403),
                      "operator": (200, 200)}),
    "GET /v1/jobs/{id}": (_read(), {"submitter": (200, 404), "viewer": (200, 404),
                                    "worker": (403, 403), "operator": (200, 404)}),
    "GET /v1/jobs/{id}/explain": (_read("/explain"),
                                  {"submitter": (200, 404), "viewer": (200, 404),
                                   "worker": (403, 403), "operator": (200, 404)}),
    "POST /v1/heartbeat": (_fixed("POST", "/v1/heartbeat",
                                  {"roles": ["r-wa"], "readings": {"memory_used_pct": 10}}),
                           {"submitter": (403, 403), "viewer": (403, 403), "worker": (200, 200),
                            "operator": (403, 403)}),
    "POST /v1/claims": (_fixed("POST", "/v1/claims", {"wait": 0}),
                        {"submitter": (403, 403), "viewer": (403, 403), "worker": (200, 200),
                         "operator": (403, 403)}),
    "POST /v1/claims (n)": (_fixed("POST", "/v1/claims", {"wait": 0, "n": 4}),
                            {"submitter": (403, 403), "viewer": (403, 403),
                             "worker": (200, 200), "operator": (403, 403)}),
    # A group answers 200 with each item's own answer (another tenant's lease is refused
    # as absent inside it: tests/test_serve_batches.py).
    "POST /v1/completions": (_completions(), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (200, 200),
        "operator": (403, 403)}),
    **{f"POST /v1/jobs/{{id}}/{op}": (_fenced(op, body), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (200, 404),
        "operator": (403, 403)}) for op, body in FENCED},
    # Another worker's lease in the token's tenant; the token's own worker id on another
    # tenant's job: both as if absent.
    **{f"POST /v1/jobs/{{id}}/{op} (not this token's lease)": (_foreign(op, body), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (404, 404),
        "operator": (403, 403)}) for op, body in FENCED},
    # The completion that also claims the next job: fenced like a completion.
    "POST /v1/jobs/{id}/complete (claim_next)": (_fenced("complete", {"claim_next": True}), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (200, 404),
        "operator": (403, 403)}),
    "POST /v1/jobs/{id}/complete (claim_next, not this token's lease)": (
        _foreign("complete", {"claim_next": True}), {
            "submitter": (403, 403), "viewer": (403, 403), "worker": (404, 404),
            "operator": (403, 403)}),
    "PUT /v1/jobs/{id}/artifacts/{name}": (_upload(False), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (200, 404),
        "operator": (403, 403)}),
    "PUT /v1/jobs/{id}/artifacts/{name} (not this token's lease)": (_upload(True), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (404, 404),
        "operator": (403, 403)}),
    "GET /v1/jobs/{id}/artifacts": (_artifact(""), {
        "submitter": (200, 404), "viewer": (200, 404), "worker": (403, 403),
        "operator": (200, 404)}),
    "GET /v1/jobs/{id}/artifacts/{name}": (_artifact("/a.txt"), {
        "submitter": (200, 404), "viewer": (200, 404), "worker": (403, 403),
        "operator": (200, 404)}),
    "POST /v1/jobs/{id}/cancel": (_operator("cancel"), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (403, 403),
        "operator": (200, 404)}),
    "POST /v1/jobs/{id}/retry": (_operator("retry", dead=True), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (403, 403),
        "operator": (200, 404)}),
    "POST /v1/jobs/{id}/reconcile": (_operator("reconcile", {"as": "dead", "reason": "r"}), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (403, 403),
        # A waiting job cannot be reconciled (409); another tenant's is not there at all.
        "operator": (409, 404)}),
    "POST /v1/prune": (_fixed("POST", "/v1/prune", {"older_than": "30d", "dry_run": True}), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (403, 403),
        "operator": (200, 200)}),
    "GET /v1/workers": (_fixed("GET", "/v1/workers"), {
        "submitter": (403, 403), "viewer": (403, 403), "worker": (403, 403),
        "operator": (200, 200)}),
    "GET /v1/whoami": (_fixed("GET", "/v1/whoami"), {r: (200, 200) for r in ROLES}),
}


def _tokens(target: Target) -> dict[str, str]:
    return {
        "submitter": token(target, "sub", "submitter", tenant="alice"),
        "viewer": token(target, "view", "viewer", tenant="alice"),
        "worker": token(target, "wa", "worker", tenant="alice", worker="wa"),
        "operator": token(target, "op", "operator", tenant="alice"),
    }


def test_access_matrix_every_endpoint_role_and_tenant(target: Target, tmp_path: Any) -> None:
    from tests.test_artifacts_rules import install

    install(target)
    store = str(tmp_path / "store")
    secrets = _tokens(target)
    c = Coordinator.open(target)
    c.artifacts_dir = store
    world = World(c)
    failures = []
    with served(target, "--reap-every", "0", env={"JOBCOORD_ARTIFACTS": store}) as s:
        clients = {role: s.client(secret) for role, secret in secrets.items()}
        anonymous = s.client()
        for endpoint, (cell, expected) in MATRIX.items():
            for role in ROLES:
                for i, side in enumerate(("own", "other")):
                    method, path, body, *more = cell(world, side)
                    resp = clients[role].request(method, path, json=body,
                                                 **(more[0] if more else {}))
                    want = expected[role][i]
                    if resp.status_code != want:
                        failures.append(f"{endpoint} as {role} ({side}): {resp.status_code} "
                                        f"{resp.text[:200]}, expected {want}")
                    elif want >= 400:
                        error = resp.json()["error"]
                        assert set(error) <= {"code", "message", "details"}, resp.text
            # Without a token, every /v1 endpoint is 401 (the bearer scheme, never 422).
            method, path, body, *more = cell(world, "own")
            extra = more[0] if more else {}
            resp = anonymous.request(method, path, json=body, **extra)
            if resp.status_code != 401 or resp.json()["error"]["code"] != "unauthorized":
                failures.append(f"{endpoint} without a token: {resp.status_code}")
            unknown = {**extra, "headers": {**extra.get("headers", {}),
                                            "Authorization": "Bearer jct_not-a-token"}}
            resp = anonymous.request(method, path, json=body, **unknown)
            if resp.status_code != 401:
                failures.append(f"{endpoint} with an unknown token: {resp.status_code}")
        assert anonymous.get("/healthz").status_code == 200
        for client in [*clients.values(), anonymous]:
            client.close()
    c.close()
    assert not failures, "\n".join(failures)


def test_other_tenants_job_is_404_exactly_like_a_missing_one(target: Target) -> None:
    secret = token(target, "sub", "submitter", tenant="alice")
    with Coordinator.open(target) as c:
        bobs = c.enqueue("k", {}, tenant="bob")["job_id"]
        missing = bobs + 1000
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        for suffix in ("", "/explain"):
            seen = http.get(f"/v1/jobs/{bobs}{suffix}")
            absent = http.get(f"/v1/jobs/{missing}{suffix}")
            assert seen.status_code == absent.status_code == 404
            assert seen.json() == json.loads(absent.text.replace(str(missing), str(bobs)))
        listed = http.get("/v1/jobs").json()["jobs"]
        assert bobs not in [j["job_id"] for j in listed]


def test_tenant_and_worker_come_from_the_token_never_the_body(target: Target) -> None:
    sub = token(target, "sub", "submitter", tenant="alice")
    wa = token(target, "wa", "worker", worker="wa")
    with served(target, "--reap-every", "0") as s, s.client(sub) as http, \
            s.client(wa) as worker:
        assert http.post("/v1/jobs", json={"kind": "k", "tenant": "bob"}).status_code == 400
        job = http.post("/v1/jobs", json={"kind": "k"}).json()["job_id"]
        assert worker.post("/v1/heartbeat", json={"worker_id": "wb"}).status_code == 400
        assert worker.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 5}}
                           ).status_code == 200
        got = worker.post("/v1/claims", json={}).json()
        assert got["job"]["job_id"] == job and got["job"]["tenant"] == "alice"
        assert got["lease"]["worker_id"] == "wa"
        assert worker.post(f"/v1/jobs/{job}/complete",
                           json={"epoch": 1, "worker_id": "wb"}).status_code == 400
    with Coordinator.open(target) as c:
        shown = c.show(job)
        assert shown["job"]["tenant"] == "alice" and shown["lease"]["worker_id"] == "wa"


def test_a_results_provenance_never_names_another_worker(target: Target) -> None:
    """A worker token completed its own lease with `provenance: {"worker": "evil"}` and
    `show` then named "evil" as the worker of the result. A provenance naming a worker
    other than the completing one is refused (400 here, InvalidInput in Python, exit 2),
    nothing recorded, in a single completion and in a batch; its own name is accepted."""
    wa = token(target, "wa", "worker", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa")
        jobs = [c.enqueue("k", {})["job_id"] for _ in range(3)]
        from jobcoord.errors import InvalidInput

        got = c.claim("wa", lease_s=300)
        with pytest.raises(InvalidInput):
            c.complete(got["job"]["job_id"], "wa", got["lease"]["epoch"], {},
                       provenance={"worker": "wb"})
        assert c.show(got["job"]["job_id"])["job"]["status"] == "running"
    with served(target, "--reap-every", "0") as s, s.client(wa) as worker:
        for path, body in ((f"/v1/jobs/{jobs[0]}/complete",
                            {"epoch": 1, "result": {}, "provenance": {"worker": "evil"}}),
                           ("/v1/completions", {"items": [
                               {"job_id": jobs[0], "epoch": 1, "result": {},
                                "provenance": {"worker": "evil"}}]})):
            r = worker.post(path, json=body)
            assert r.status_code == 400 and "provenance" in r.json()["error"]["message"], (
                r.status_code, r.text)
        r = worker.post(f"/v1/jobs/{jobs[0]}/complete",
                        json={"epoch": 1, "result": {}, "provenance": {"worker": "wa"}})
        assert r.status_code == 200, r.text
    with Coordinator.open(target) as c:
        shown = c.show(jobs[0])
        assert shown["job"]["status"] == "succeeded"
        assert shown["job"]["provenance"] == {"worker": "wa"}, shown["job"]


def test_revoked_token_is_refused_on_its_next_request(target: Target) -> None:
    secret = token(target, "ci", "submitter", tenant="alice")
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.get("/v1/jobs").status_code == 200
        done = subprocess.run([*jobcoord_argv(), *db_args(target), "token", "revoke", "ci",
                               "--json"], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["revoked"] is True
        # The very next request, on the same kept-alive connection: no cache outlives it.
        resp = http.get("/v1/jobs")
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"
        assert resp.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("submitted", ["through the server", "by another process"])
def test_a_revoked_workers_waiting_long_poll_takes_no_job(target: Target,
                                                          submitted: str) -> None:
    """A worker token revoked while its claim long-poll waits: the poll was handed the next
    job (in the submission's transaction, or by its own claim once woken) under a lease its
    worker could never renew or complete (401 on every call), and the job died of expired
    leases without running. The poll's next claim looks the token up again: 401, and the
    job stays waiting for a live worker."""
    import threading
    import time

    worker = token(target, "laptop", "worker", worker="laptop")
    submitter = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0", "--poll", "0.2") as s, \
            s.client(worker) as w, s.client(submitter) as sub:
        assert w.post("/v1/heartbeat", json={}).status_code == 200
        answer: dict[str, Any] = {}
        poll = threading.Thread(target=lambda: answer.update(r=w.post(
            "/v1/claims", json={"wait": 10, "lease_s": 30})))
        poll.start()
        time.sleep(1.0)  # the poll is waiting
        done = subprocess.run([*jobcoord_argv(), *db_args(target), "token", "revoke",
                               "laptop", "--json"], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        if submitted == "through the server":
            assert sub.post("/v1/jobs", json={"kind": "k", "payload": {}}).status_code == 201
        else:
            with Coordinator.open(target) as c:
                c.enqueue("k", {})
        poll.join(30)
        assert answer["r"].status_code in (401, 204), answer["r"].text
        with Coordinator.open(target) as c:
            assert [j["status"] for j in c.jobs()["jobs"]] == ["waiting"]


#: A request each route refuses as invalid input (400) once its token may call it.
INVALID: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/jobs", {"kind": 5}),
    ("/v1/heartbeat", {"roles": "r-wa"}),
    ("/v1/claims", {"wait": "soon"}),
    ("/v1/jobs/1/renew", {"epoch": "1"}),
    ("/v1/jobs/1/complete", {"epoch": 1, "claim_next": "yes"}),
    ("/v1/jobs/1/fail", {"epoch": 1}),
    ("/v1/jobs/1/effect", {"epoch": 1, "worker_id": "wb"}),
    ("/v1/jobs/1/checkpoint", {"epoch": 1, "name": "step", "tenant": "bob"}),
    ("/v1/jobs/0/complete", {"epoch": 1}),  # the path's job id
)


def test_a_bad_token_is_refused_before_its_invalid_request(target: Target) -> None:
    """401 (an unknown token) and 403 (a role the route does not allow) come before the 400
    of an invalid body or path, though the route looks its token up only in its own call."""
    sub = token(target, "sub", "submitter", tenant="alice")
    wa = token(target, "wa", "worker", tenant="alice", worker="wa")
    with served(target, "--reap-every", "0") as s, s.client(sub) as submitter, \
            s.client(wa) as worker, s.client("jct_not-a-token") as unknown, \
            s.client() as anonymous:
        for path, body in INVALID:
            allowed, refused = (submitter, worker) if path == "/v1/jobs" else (worker,
                                                                              submitter)
            got = {name: http.post(path, json=body) for name, http in (
                ("anonymous", anonymous), ("unknown", unknown), ("refused", refused),
                ("allowed", allowed))}
            codes = {name: resp.status_code for name, resp in got.items()}
            assert codes == {"anonymous": 401, "unknown": 401, "refused": 403,
                             "allowed": 400}, (path, body, codes)
            assert got["unknown"].json()["error"]["code"] == "unauthorized"
            assert got["unknown"].headers["WWW-Authenticate"] == "Bearer"
            assert got["refused"].json()["error"]["code"] == "forbidden"
            assert got["allowed"].json()["error"]["code"] == "invalid_input"


def test_token_create_shows_the_secret_once_and_stores_only_its_hash(target: Target) -> None:
    import hashlib

    argv = [*jobcoord_argv(), *db_args(target), "token"]
    made = subprocess.run([*argv, "create", "laptop", "--role", "worker", "--tenant", "alice",
                           "--worker", "laptop", "--json"], capture_output=True, check=False)
    assert made.returncode == 0, made.stderr
    got = json.loads(made.stdout)
    secret = got["token"]
    assert secret.startswith("jct_") and len(secret) >= 4 + 43  # 32 random bytes, base64
    listed = subprocess.run([*argv, "ls", "--json"], capture_output=True, check=False)
    assert secret not in listed.stdout.decode()
    assert json.loads(listed.stdout)["tokens"][0]["worker_id"] == "laptop"
    with Coordinator.open(target) as c:
        rows = c.db.read(lambda conn: sql(conn, "SELECT * FROM tokens").all())
    assert secret not in repr(rows)
    assert hashlib.sha256(secret.encode()).hexdigest() in repr(rows)
    again = subprocess.run([*argv, "create", "laptop", "--role", "viewer", "--json"],
                           capture_output=True, check=False)
    assert again.returncode == 4
    assert json.loads(again.stdout)["error"]["code"] == "token_exists"
    bad = subprocess.run([*argv, "create", "x", "--role", "worker", "--json"],
                         capture_output=True, check=False)
    assert bad.returncode == 2  # a worker token names its worker
    missing = subprocess.run([*argv, "revoke", "nope", "--json"], capture_output=True,
                             check=False)
    assert missing.returncode == 4


def test_token_create_without_json_prints_only_the_secret_on_stdout(target: Target,
                                                                    tmp_path: Any) -> None:
    """`token create NAME --role R > F` makes a token file `--token-file F` reads and
    `Bearer $(cat F)` sends: the notice that it is shown once goes to stderr."""
    from jobcoord.http.commands import read_token_file

    argv = [*jobcoord_argv(), *db_args(target), "token", "create", "ci", "--role",
            "submitter"]
    made = subprocess.run(argv, capture_output=True, check=False)
    assert made.returncode == 0, made.stderr
    out = made.stdout.decode()
    assert out.count("\n") == 1 and out.startswith("jct_"), out
    assert "shown only once" in made.stderr.decode()
    path = tmp_path / "tok"
    path.write_bytes(made.stdout)
    secret = read_token_file(str(path))
    with served(target, "--reap-every", "0") as s, s.client(secret) as http:
        assert http.get("/v1/jobs").status_code == 200


def test_a_tenant_bound_worker_token_claims_only_its_tenants_jobs(target: Target) -> None:
    alice = token(target, "wa", "worker", tenant="alice", worker="wa")
    unbound = token(target, "wu", "worker", worker="wu")
    with Coordinator.open(target) as c:
        bobs = c.enqueue("k", {}, tenant="bob", priority=0)["job_id"]
        default = c.enqueue("k", {})["job_id"]  # the default tenant is not alice's
        alices = c.enqueue("k", {}, tenant="alice")["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(alice) as wa, \
            s.client(unbound) as wu:
        for http in (wa, wu):
            assert http.post("/v1/heartbeat", json={"readings": {"memory_used_pct": 5}}
                             ).status_code == 200
        got = wa.post("/v1/claims", json={}).json()
        assert got["job"]["job_id"] == alices and got["job"]["tenant"] == "alice"
        nothing = wa.post("/v1/claims", json={}).json()
        assert nothing["job"] is None and nothing["reason"] == "no_waiting_jobs"
        assert "bob" not in nothing["detail"]
        # A long-poll is not woken into another tenant's job: 204 when the wait ends.
        assert wa.post("/v1/claims", json={"wait": 0.3}).status_code == 204
        # An unbound worker token serves every tenant.
        assert wu.post("/v1/claims", json={}).json()["job"]["job_id"] == bobs
        assert wu.post("/v1/claims", json={}).json()["job"]["job_id"] == default


def test_claim_next_takes_only_the_tokens_tenants_next_job(target: Target) -> None:
    alice = token(target, "wa", "worker", tenant="alice", worker="wa")
    with Coordinator.open(target) as c:
        c.heartbeat("wa", readings={"memory_used_pct": 5})
        first = c.enqueue("k", {}, tenant="alice")["job_id"]
        assert c.claim("wa", tenant="alice")["job"]["job_id"] == first
        # Ahead of alice's next job in claim order: another tenant's, and the default's.
        bobs = c.enqueue("k", {}, tenant="bob", priority=0)["job_id"]
        default = c.enqueue("k", {}, priority=0)["job_id"]
        alices = c.enqueue("k", {}, tenant="alice")["job_id"]
    with served(target, "--reap-every", "0") as s, s.client(alice) as wa:
        got = wa.post(f"/v1/jobs/{first}/complete", json={"epoch": 1, "claim_next": True})
        assert got.status_code == 200, got.text
        nxt = got.json()["next"]
        assert nxt["job"]["job_id"] == alices and nxt["job"]["tenant"] == "alice"
        last = wa.post(f"/v1/jobs/{alices}/complete",
                       json={"epoch": 1, "claim_next": True}).json()["next"]
        assert last["job"] is None and last["reason"] == "no_waiting_jobs"
        assert "bob" not in last["detail"]
    with Coordinator.open(target) as c:
        assert c.show(bobs)["job"]["status"] == c.show(default)["job"]["status"] == "waiting"


def test_a_worker_token_learns_nothing_of_a_lease_it_never_held(target: Target) -> None:
    """Every fenced refusal about a (job, epoch) this worker never claimed answers 404 as if
    the job were absent: a wrong epoch on another worker's live lease (was 409 stale_epoch
    with the current epoch), a waiting job (409 lease_expired with its status), a job another
    worker finished (409 job_finished with its status and accepted epoch) or had cancelled.
    A lease the worker did hold is answered as it is (the worker must learn it lost it)."""
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    c = Coordinator.open(target)
    w = World(c)
    live, live_epoch = w.leased("wb", "alice")
    waiting = w.waiting("alice")
    done, done_epoch = w.leased("wb", "alice")
    c.complete(done, "wb", done_epoch, {})
    cancelled, cancelled_epoch = w.leased("wb", "alice")
    c.cancel(cancelled)
    mine, mine_epoch = w.leased("wa", "alice")
    c.fail(mine, "wa", mine_epoch, "stopping", reason="worker_shutdown")  # back to waiting
    cases = [(live, live_epoch + 4), (live, live_epoch - 1), (waiting, 0), (waiting, 1),
             (done, done_epoch), (done, done_epoch + 1), (cancelled, cancelled_epoch)]
    failures = []
    with served(target, "--reap-every", "0") as s, s.client(secret) as client:
        for op, body in FENCED:
            for job, epoch in cases:
                resp = client.post(f"/v1/jobs/{job}/{op}", json={"epoch": epoch, **body})
                if resp.status_code != 404 or resp.json()["error"] != {
                        "code": "job_not_found", "message": f"job {job} not found",
                        "details": {"job_id": job}}:
                    failures.append(f"{op} job {job} epoch {epoch}: {resp.status_code} "
                                    f"{resp.text[:200]}")
            # Its own lease, given back: the refusal it needs to stop.
            resp = client.post(f"/v1/jobs/{mine}/{op}", json={"epoch": mine_epoch, **body})
            if resp.status_code != 409 or resp.json()["error"]["code"] != "lease_expired":
                failures.append(f"{op} own released lease: {resp.status_code} {resp.text}")
        resp = client.post("/v1/completions", json={"items": [
            {"job_id": job, "epoch": epoch} for job, epoch in cases]})
        assert resp.status_code == 200, resp.text
        for (job, epoch), one in zip(cases, resp.json()["results"], strict=True):
            if one.get("error", {}).get("code") != "job_not_found" or set(
                    one["error"].get("details", {})) != {"job_id"}:
                failures.append(f"completions item job {job} epoch {epoch}: {one}")
    with Coordinator.open(target) as c2:
        assert c2.show(live)["lease"]["worker_id"] == "wb"
        assert c2.show(waiting)["job"]["status"] == "waiting"
    assert not failures, "\n".join(failures)


def test_a_worker_told_its_lease_is_stale_is_not_told_the_epoch_another_worker_holds(
        target: Target) -> None:
    """A lease this worker lost keeps its 409 `stale_epoch`, which said `current_epoch`: the
    epoch of the lease another worker now holds, which no answer tells it. The Python API,
    a trusted local caller, keeps it."""
    secret = token(target, "wa", "worker", tenant="alice", worker="wa")
    c = Coordinator.open(target)
    job = c.enqueue("k", {}, tenant="alice", role="both")["job_id"]
    c.heartbeat("wa", roles=["both"], readings={"memory_used_pct": 10})
    c.heartbeat("wb", roles=["both"], readings={"memory_used_pct": 10})
    lost = c.claim("wa", lease_s=300)["lease"]["epoch"]
    c.fail(job, "wa", lost, "stopping", reason="worker_shutdown")
    assert c.claim("wb", lease_s=300)["lease"]["epoch"] == lost + 1
    answers = []
    with served(target, "--reap-every", "0") as s, s.client(secret) as client:
        for op, body in FENCED:
            resp = client.post(f"/v1/jobs/{job}/{op}", json={"epoch": lost, **body})
            answers.append((op, resp.status_code, resp.json()["error"]))
        resp = client.post("/v1/completions", json={"items": [{"job_id": job,
                                                                "epoch": lost}]})
        answers.append(("completions", 409, resp.json()["results"][0]["error"]))
    for op, status, error in answers:
        assert status == 409 and error["code"] == "stale_epoch", (op, status, error)
        assert error["details"] == {"job_id": job}, (op, error)
        assert f"epoch {lost + 1}" not in error["message"], (op, error)
    with pytest.raises(Refused) as local:
        c.complete(job, "wa", lost, {})
    assert local.value.details["current_epoch"] == lost + 1
    c.close()


def test_a_worker_tokens_claim_refused_by_a_limit_names_no_other_workers_holder(
        target: Target) -> None:
    """A full concurrency limit: a worker token's claim (alone, with `n`, chained after a
    completion) is told the limit is full, never which job and worker hold it when that is
    another worker's lease (the fenced calls about that job answer 404: a worker sees its own
    leases only), whether the token is unbound or bound to the holder's own tenant. Its own
    holder is named. The Python API, a trusted local caller, keeps the full detail."""
    import re

    unbound = token(target, "wu", "worker", worker="wu")
    same_tenant = token(target, "wt", "worker", tenant="alice", worker="wt")
    holder = token(target, "wh", "worker", worker="wh")
    with Coordinator.open(target) as c:
        c.set_limit("lim", 1)
        for w in ("wu", "wt", "wh", "w1"):
            c.heartbeat(w, roles=[f"r-{w}"], readings={"memory_used_pct": 5})
        held = c.enqueue("lim", {}, tenant="alice", role="r-w1")["job_id"]
        assert c.claim("w1", lease_s=600)["job"]["job_id"] == held
        chained = {w: c.enqueue("other", {}, tenant="alice", role=f"r-{w}")["job_id"]
                   for w in ("wu", "wt")}
        for w, job in chained.items():
            assert c.claim(w, lease_s=600, tenant="alice" if w == "wt" else None
                           )["job"]["job_id"] == job
        for w in ("wu", "wt", "w1"):
            c.enqueue("lim", {}, tenant="alice", role=f"r-{w}")
        own = c.enqueue("lim", {}, tenant="alice", role="r-wh")["job_id"]
        c.enqueue("lim", {}, tenant="alice", role="r-wh")  # waits behind the limit
        # The holder's own view: the limit is full with its own job.
        c.set_limit("lim", 2)
        assert c.claim("wh", lease_s=600)["job"]["job_id"] == own
        trusted = c.claim("wu", kinds=["lim"])
    assert trusted["reason"] == "concurrency_limit" and "on w1" in trusted["detail"], trusted
    named = re.compile(rf"\bjob ({held}|{own})\b|\bw1\b|\bwh\b")
    failures = []
    with served(target, "--reap-every", "0") as s:
        for secret, w in ((unbound, "wu"), (same_tenant, "wt")):
            with s.client(secret) as http:
                answers = {
                    "claim": http.post("/v1/claims", json={"kinds": ["lim"]}).json(),
                    "claim n": http.post("/v1/claims", json={"kinds": ["lim"], "n": 3}).json(),
                    "claim_next": http.post(f"/v1/jobs/{chained[w]}/complete", json={
                        "epoch": 1, "claim_next": True}).json()["next"]}
                for what, got in answers.items():
                    if got.get("reason") != "concurrency_limit" or named.search(
                            json.dumps(got)):
                        failures.append(f"{w} {what}: {got}")
        with s.client(holder) as http:
            got = http.post("/v1/claims", json={"kinds": ["lim"]}).json()
            assert got["reason"] == "concurrency_limit", got
            # Its own holder is named; the other worker's is not.
            assert f"job {own} on wh" in got["detail"] and "w1" not in got["detail"], got
            assert not re.search(rf"\bjob {held}\b", got["detail"]), got
    assert not failures, "\n".join(failures)


def test_a_tenant_bound_view_of_workers_shows_no_refusal_detail_naming_another_tenant(
        target: Target) -> None:
    """Workers are shared, their last refusal is not: its detail names kinds, jobs and the
    workers holding them, of any tenant ("kind bob-secret held by job 1 on w1"). A view bound
    to a tenant (an operator token through GET /v1/workers, a viewer on the dashboard's
    Workers page) sees the refusal's reason and time, not its detail; an unbound operator
    and the Python API see it whole."""
    import httpx

    bound_op = token(target, "opa", "operator", tenant="alice")
    bound_viewer = token(target, "va", "viewer", tenant="alice")
    unbound_op = token(target, "op", "operator")
    with Coordinator.open(target) as c:
        c.set_limit("bob-secret-kind", 1)
        for i in (1, 2):
            c.enqueue("bob-secret-kind", {"n": i}, tenant="bob")
        for w in ("w1", "w2"):
            c.heartbeat(w, readings={"memory_used_pct": 5})
        held = c.claim("w1")["job"]["job_id"]
        refused = c.claim("w2")
        assert refused["reason"] == "concurrency_limit"
        local = {w["worker_id"]: w for w in c.workers()["workers"]}
    assert "bob-secret-kind" in local["w2"]["last_refusal"]["detail"]
    secret_words = ("bob-secret-kind", f"job {held}", "on w1")
    with served(target, "--reap-every", "0") as s:
        with s.client(bound_op) as http:
            bound = {w["worker_id"]: w for w in http.get("/v1/workers").json()["workers"]}
        with s.client(unbound_op) as http:
            unbound = {w["worker_id"]: w for w in http.get("/v1/workers").json()["workers"]}
        ui = httpx.Client(base_url=s.url, timeout=30)
        ui.cookies.update(ui.post("/ui/login", data={"token": bound_viewer}).cookies)
        page = ui.get("/ui/workers")
        ui.close()
    assert bound["w2"]["last_refusal"]["reason"] == "concurrency_limit", bound["w2"]
    assert bound["w2"]["last_refusal"]["detail"] is None, bound["w2"]
    assert not any(word in json.dumps(bound) for word in secret_words), bound
    assert "bob-secret-kind" in unbound["w2"]["last_refusal"]["detail"], unbound["w2"]
    assert page.status_code == 200 and "concurrency_limit" in page.text, page.text[:500]
    assert not any(word in page.text for word in secret_words), page.text
    assert "None" not in page.text.split("Last refusal:")[1].split("</p>")[0], page.text


def _revoke(target: Target, name: str) -> None:
    done = subprocess.run([*jobcoord_argv(), *db_args(target), "token", "revoke", name,
                           "--json"], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr


def _stored_state(target: Target) -> tuple[Any, ...]:
    """Every job's row, every lease, worker, checkpoint and refused claim, and the number
    of events."""
    with Coordinator.open(target) as c:
        return c.db.read(lambda conn: tuple(sql(conn, statement).all() for statement in (
            "SELECT * FROM jobs ORDER BY job_id",
            "SELECT * FROM leases ORDER BY job_id",
            "SELECT * FROM workers ORDER BY worker_id",
            "SELECT * FROM checkpoints ORDER BY job_id",
            "SELECT count(*) FROM claim_refusals",
            "SELECT count(*) FROM job_events")))


def test_a_worker_token_revoked_after_its_server_knows_it_is_refused_and_changes_nothing(
        target: Target) -> None:
    """The server keeps a live token's identity (it never changes) and checks the token is
    still live on every request, inside the request's own write transaction. A worker that
    has called before (its identity kept) and is then revoked by another process: every
    one of its calls is 401, and none of them changes anything: no completion, renewal,
    failure, effect, checkpoint, heartbeat or claim, not even a refusal's event."""
    secret = token(target, "w1", "worker", worker="w1")
    with Coordinator.open(target) as c:
        first = c.enqueue("k", {})["job_id"]
        c.enqueue("k", {})
    with served(target, "--reap-every", "0") as s, s.client(secret) as w:
        assert w.post("/v1/heartbeat", json={}).status_code == 200
        got = w.post("/v1/claims", json={"wait": 0, "lease_s": 300}).json()
        assert got["job"]["job_id"] == first, got
        epoch = got["lease"]["epoch"]
        assert w.post(f"/v1/jobs/{first}/renew", json={"epoch": epoch}).status_code == 200
        _revoke(target, "w1")
        before = _stored_state(target)
        calls = [
            (f"/v1/jobs/{first}/complete", {"epoch": epoch, "result": {"ok": 1}}),
            (f"/v1/jobs/{first}/complete", {"epoch": epoch, "result": {}, "claim_next": True}),
            ("/v1/completions", {"items": [{"job_id": first, "epoch": epoch, "result": {}}]}),
            (f"/v1/jobs/{first}/renew", {"epoch": epoch}),
            (f"/v1/jobs/{first}/fail", {"epoch": epoch, "error": "e"}),
            (f"/v1/jobs/{first}/effect", {"epoch": epoch}),
            (f"/v1/jobs/{first}/checkpoint", {"epoch": epoch, "name": "step"}),
            (f"/v1/jobs/{first}/complete", {"epoch": epoch + 5, "result": {}}),
            ("/v1/jobs/999999/complete", {"epoch": 1, "result": {}}),
            ("/v1/heartbeat", {}),
            ("/v1/claims", {"wait": 0}),
            ("/v1/claims", {"wait": 0, "n": 4}),
            # Nothing it may take: a claim that writes nothing, the token read after it.
            ("/v1/claims", {"wait": 0, "kinds": ["none-such"]}),
        ]
        for path, body in calls:
            resp = w.post(path, json=body)
            assert resp.status_code == 401, (path, body, resp.status_code, resp.text)
            assert resp.json()["error"]["code"] == "unauthorized"
        assert _stored_state(target) == before


def test_a_submitter_token_revoked_after_its_server_knows_it_submits_nothing(
        target: Target) -> None:
    secret = token(target, "ci", "submitter")
    with served(target, "--reap-every", "0") as s, s.client(secret) as sub:
        assert sub.post("/v1/jobs", json={"kind": "k", "payload": {}}).status_code == 201
        _revoke(target, "ci")
        before = _stored_state(target)
        # A route its role may not call (first, while its identity is still kept):
        # revoked is said first (401), as for any token.
        for path in ("/v1/heartbeat", "/v1/claims", "/v1/jobs/1/complete"):
            resp = sub.post(path, json={"epoch": 1} if "complete" in path else {})
            assert resp.status_code == 401, (path, resp.text)
        for headers in ({}, {"Idempotency-Key": "doc-1"}):
            resp = sub.post("/v1/jobs", json={"kind": "k", "payload": {}}, headers=headers)
            assert resp.status_code == 401, resp.text
        assert _stored_state(target) == before


def test_a_kept_identity_that_no_longer_matches_its_stored_token_is_read_again(
        target: Target) -> None:
    """A kept identity is checked against the stored token, not only its revocation: a
    token row that names another worker (a database put back from elsewhere, bent here by
    hand) is acted on as stored, never as the server remembered it."""
    secret = token(target, "w1", "worker", worker="w1")
    with served(target, "--reap-every", "0") as s, s.client(secret) as w:
        assert w.post("/v1/heartbeat", json={}).status_code == 200
        with Coordinator.open(target) as c:
            c.db.write(lambda conn: sql(conn, "UPDATE tokens SET worker_id = 'w9' "
                                              "WHERE name = 'w1'"))
        assert w.post("/v1/heartbeat", json={}).status_code == 200
        with Coordinator.open(target) as c:
            seen = {x["worker_id"] for x in c.workers()["workers"]}
        assert seen == {"w1", "w9"}, seen


def test_no_completion_is_accepted_after_its_workers_revocation_returned(
        target: Target) -> None:
    """Eight threads share one worker token (its identity kept by the server), each claiming
    and completing jobs as fast as the server answers; another process revokes the token
    in the middle. Once the revocation has returned (and the writes already under way have
    ended), the server accepts nothing more of that token: every later call is 401, no job
    succeeds after it, no lease is granted."""
    import threading
    import time

    secret = token(target, "w1", "worker", worker="w1")
    with Coordinator.open(target) as c:
        c.enqueue_many([{"kind": "k", "payload": {"i": i}} for i in range(3000)])
    codes: list[int] = []
    stop = threading.Event()
    with served(target, "--reap-every", "0") as s:
        with s.client(secret) as w:
            assert w.post("/v1/heartbeat", json={}).status_code == 200

        def work() -> None:
            with s.client(secret) as http:
                while not stop.is_set():
                    got = http.post("/v1/claims", json={"wait": 0, "lease_s": 300})
                    if got.status_code != 200:
                        codes.append(got.status_code)
                        return
                    job = got.json()["job"]
                    if job is None:
                        return
                    done = http.post(f"/v1/jobs/{job['job_id']}/complete", json={
                        "epoch": got.json()["lease"]["epoch"], "result": {}})
                    if done.status_code != 200:
                        codes.append(done.status_code)
                        return

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        _revoke(target, "w1")
        # (A PostgreSQL transaction that judged the token live just before the revocation
        # committed may still commit: it began before it.)
        time.sleep(0.3)
        after = _stored_state(target)
        for t in threads:
            t.join(30)
        stop.set()
        assert not any(t.is_alive() for t in threads)
    assert codes and set(codes) == {401}, codes
    assert _stored_state(target) == after
    succeeded = sum(1 for row in after[0] if row[6] == "succeeded")
    assert 0 < succeeded < 3000, succeeded


def test_a_bad_token_is_refused_before_an_unknown_query_parameter(target: Target) -> None:
    """An unknown query parameter is invalid input (400) for a token that may call the
    route; for none, an unknown token, or a role the route does not allow, who calls is
    said first (401, 403), as for every other invalid request."""
    sub = token(target, "sub", "submitter", tenant="alice")
    wa = token(target, "wa", "worker", tenant="alice", worker="wa")
    with served(target, "--reap-every", "0") as s, s.client(sub) as submitter, \
            s.client(wa) as worker, s.client("jct_not-a-token") as unknown, \
            s.client() as anonymous:
        for method, path, body, allowed, refused in (
                ("POST", "/v1/claims?x=1", {}, worker, submitter),
                ("POST", "/v1/jobs/1/renew?foo=1", {"epoch": 1}, worker, submitter),
                ("GET", "/v1/jobs?tenant=x", None, submitter, worker)):
            codes = {name: http.request(method, path, json=body).status_code
                     for name, http in (("anonymous", anonymous), ("unknown", unknown),
                                        ("refused", refused), ("allowed", allowed))}
            assert codes == {"anonymous": 401, "unknown": 401, "refused": 403,
                             "allowed": 400}, (path, codes)


def test_one_worker_id_is_bound_to_one_tenant_across_its_live_tokens(target: Target) -> None:
    """Two worker tokens naming one worker id for different tenants (or one unbound) were both
    made: bob's token then rewrote alice's worker's row (its kinds, readings and so its
    gates), and the unbound one renewed alice's lease. A worker id's live tokens share one
    tenant binding: another is refused (`worker_id_taken`, exit 4) and nothing is made. A
    second token of the same binding (a new secret for the same machine) is made, and a
    revoked token frees the id."""
    from jobcoord import tokens
    from jobcoord.errors import Refused

    argv = [*jobcoord_argv(), *db_args(target), "token"]

    def create(name: str, *tenant: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*argv, "create", name, "--role", "worker", "--worker", "w9",
                               *tenant, "--json"], capture_output=True, check=False)

    assert create("a", "--tenant", "alice").returncode == 0
    for name, tenant in (("b", ("--tenant", "bob")), ("c", ())):
        refused = create(name, *tenant)
        assert refused.returncode == 4, refused
        error = json.loads(refused.stdout)["error"]
        assert error["code"] == "worker_id_taken", error
        assert "w9" in error["message"] and "alice" in error["message"]
    assert create("a2", "--tenant", "alice").returncode == 0  # a new secret, same binding
    with Coordinator.open(target) as c:
        with pytest.raises(Refused) as got:
            tokens.create(c.db, "d", "worker", tenant="bob", worker="w9")
        assert got.value.code == "worker_id_taken"
        names = [t["name"] for t in tokens.list_tokens(c.db)["tokens"]]
        assert sorted(names) == ["a", "a2"]
    for name in ("a", "a2"):
        assert subprocess.run([*argv, "revoke", name], capture_output=True,
                              check=False).returncode == 0
    assert create("b", "--tenant", "bob").returncode == 0  # the id is free again


def test_tokens_made_at_once_for_one_worker_id_get_one_binding(target: Target) -> None:
    """Four threads each making a token for worker id Z9, each with another binding (none,
    a, b, c), at the same moment: on PostgreSQL all four were made, each having found no
    other binding. Exactly one binding is made; the rest are `worker_id_taken`."""
    import threading

    from jobcoord import tokens
    from jobcoord.errors import Refused
    from jobcoord.store import Database

    bindings = [None, "a", "b", "c"]
    start = threading.Barrier(len(bindings))
    refused: list[str] = []

    def make(i: int) -> None:
        db = Database.open(target)
        try:
            start.wait(10)
            tokens.create(db, f"t{i}", "worker", tenant=bindings[i], worker="Z9")
        except Refused as e:
            refused.append(e.code)
        finally:
            db.close()

    for _ in range(3):
        threads = [threading.Thread(target=make, args=(i,)) for i in range(len(bindings))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        with Coordinator.open(target) as c:
            live = [t for t in tokens.list_tokens(c.db)["tokens"]
                    if t["worker_id"] == "Z9" and not t["revoked"]]
            assert len({t["tenant"] for t in live}) == 1, live
            assert refused == ["worker_id_taken"] * (len(bindings) - 1), refused
            for t in live:
                tokens.revoke(c.db, t["name"])
            with c.db.engine.begin() as conn:  # the names again for the next round
                conn.exec_driver_sql("DELETE FROM tokens")
        refused.clear()

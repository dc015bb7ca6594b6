"""Artifact rows: staging under a live lease, fenced linking in the completion's transaction,
verified reads, validation per kind, through the Python API and the CLI. Both databases."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcoord.artifacts import ObjectStore
from jobcoord.artifacts import rules as artifact_rules
from jobcoord.db import Database, Target
from jobcoord.errors import DatabaseCorrupt, InvalidInput, Refused, StorageUnavailable
from jobcoord.migrate import migrate
from jobcoord.service import Coordinator
from tests.conftest import run_cli
from tests.timeline import IDLE_ON_AC


def install(target: Target) -> None:
    db = Database.open(target)
    try:
        migrate(db, add={"artifacts"})
    finally:
        db.close()


def slow_validator_policy(tmp_path: Path, seconds: float, kind: str = "report") -> Path:
    """A policy file whose `kind` has a validator that sleeps `seconds` and accepts: the
    completion checks of its artifacts take that long (JOBCOORD_POLICY names it)."""
    checker = tmp_path / "slow check.py"  # a space: the validator's argv is a list
    checker.write_text(f"import time\ntime.sleep({seconds})\n")
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[artifacts.kinds.{kind}]\nvalidator = "
                      f"[{json.dumps(sys.executable)}, {json.dumps(str(checker))}]\n")
    return policy


@pytest.fixture
def store_dir(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def ac(target: Target, store_dir: str) -> Iterator[Coordinator]:
    """A coordinator on a database with the artifacts feature and its own store."""
    install(target)
    c = Coordinator.open(target)
    c.artifacts_dir = store_dir
    yield c
    c.close()


def start(c: Coordinator, worker: str = "w1", kind: str = "render", lease_s: float = 45
          ) -> tuple[int, int]:
    job_id = c.enqueue(kind, {"n": 1})["job_id"]
    return job_id, claim(c, worker, lease_s)


def claim(c: Coordinator, worker: str, lease_s: float = 45) -> int:
    c.heartbeat(worker, readings=IDLE_ON_AC)
    got = c.claim(worker, lease_s=lease_s)
    assert got["job"] is not None
    return int(got["lease"]["epoch"])


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rows(c: Coordinator, job_id: int) -> list[tuple[int, str, str, str]]:
    return sorted((a["epoch"], a["name"], a["state"], a["digest"])
                  for a in c.artifacts(job_id, all_states=True)["artifacts"])


def reasons(c: Coordinator, job_id: int) -> list[str]:
    return [e["reason"] for e in c.show(job_id)["events"]]


def temp_files(store: str) -> list[str]:
    tmp = os.path.join(store, "tmp")
    return os.listdir(tmp) if os.path.isdir(tmp) else []


# --- the happy path -------------------------------------------------------------------------


def test_put_complete_ls_get_through_the_python_api(ac: Coordinator, tmp_path: Path) -> None:
    job_id, epoch = start(ac)
    data = b"%PDF-1.7 report\n" * 1000
    staged = ac.put_artifact(job_id, "w1", epoch, "report.pdf", data)
    assert staged["digest"] == sha(data) and staged["state"] == "staged"
    assert staged["media_type"] == "application/pdf"
    assert ac.artifacts(job_id)["artifacts"] == []  # staged is not part of any result yet
    ac.complete(job_id, "w1", epoch, {"pages": 12})
    [a] = ac.artifacts(job_id)["artifacts"]
    assert (a["name"], a["state"], a["digest"], a["size"], a["epoch"]) == (
        "report.pdf", "accepted", sha(data), len(data), epoch)
    h = a["digest"][7:]
    assert a["location"] == f"objects/sha256/{h[:2]}/{h[2:4]}/{h}"
    out = tmp_path / "out.pdf"
    ac.get_artifact(job_id, "report.pdf", out)
    assert out.read_bytes() == data
    ev = reasons(ac, job_id)
    assert ev.index("artifact_staged") < ev.index("artifact_verified") \
        < ev.index("artifact_accepted") < ev.index("completed")
    assert ac.show(job_id)["artifacts"][0]["state"] == "accepted"


def test_identical_content_across_jobs_is_stored_once(ac: Coordinator, store_dir: str
                                                      ) -> None:
    a, ea = start(ac, "w1")
    b, eb = start(ac, "w2")
    first = ac.put_artifact(a, "w1", ea, "x.bin", b"same bytes")
    second = ac.put_artifact(b, "w2", eb, "y.bin", b"same bytes")
    assert first["digest"] == second["digest"]
    assert first["stored"] is True and second["stored"] is False
    assert len(list(ObjectStore(store_dir).iter_objects())) == 1


# --- fencing --------------------------------------------------------------------------------


def test_a_late_attempts_staged_artifact_is_never_linked(ac: Coordinator, clock: Any) -> None:
    job_id, e1 = start(ac, "w1", lease_s=10)
    ac.put_artifact(job_id, "w1", e1, "out.txt", b"from attempt 1")  # staged while live
    clock.tick(11)
    # Expired, not yet reaped: a stage is already refused, and writes no row.
    with pytest.raises(Refused) as caught:
        ac.put_artifact(job_id, "w1", e1, "late.txt", b"too late")
    assert caught.value.code == "lease_expired"
    ac.reap()
    e2 = claim(ac, "w2")
    # Two attempts stage the same name; each has its own row.
    ac.put_artifact(job_id, "w2", e2, "out.txt", b"from attempt 2")
    with pytest.raises(Refused) as caught:
        ac.put_artifact(job_id, "w1", e1, "out.txt", b"fenced out")
    assert caught.value.code == "stale_epoch"
    with pytest.raises(Refused):
        ac.complete(job_id, "w1", e1, {"late": True})
    ac.complete(job_id, "w2", e2, {})
    assert rows(ac, job_id) == [(e1, "out.txt", "staged", sha(b"from attempt 1")),
                                (e2, "out.txt", "accepted", sha(b"from attempt 2"))]
    [accepted] = ac.artifacts(job_id)["artifacts"]
    assert accepted["digest"] == sha(b"from attempt 2")
    # gc ends the over attempt's stage; it is never linked.
    assert ac.gc_artifacts(grace_s=3600)["stages_ended"] == 1
    assert rows(ac, job_id)[0][2] == "rejected"


def test_a_stage_by_another_worker_or_epoch_writes_no_row(ac: Coordinator, store_dir: str
                                                          ) -> None:
    job_id, epoch = start(ac)
    ac.heartbeat("w9", readings=IDLE_ON_AC)
    for worker, ep, code in (("w9", epoch, "not_owner"), ("w1", epoch + 1, "stale_epoch")):
        with pytest.raises(Refused) as caught:
            ac.put_artifact(job_id, worker, ep, "x", b"x")
        assert caught.value.code == code
    assert rows(ac, job_id) == []
    assert temp_files(store_dir) == []


def test_restaging_a_name_in_one_attempt_replaces_its_stage(ac: Coordinator) -> None:
    job_id, epoch = start(ac)
    ac.put_artifact(job_id, "w1", epoch, "out", b"v1")
    ac.put_artifact(job_id, "w1", epoch, "out", b"v2")
    ac.complete(job_id, "w1", epoch, {})
    assert rows(ac, job_id) == [(epoch, "out", "accepted", sha(b"v2"))]


# --- reading always verifies ----------------------------------------------------------------


def _accepted(ac: Coordinator, data: bytes) -> tuple[int, str]:
    job_id, epoch = start(ac)
    out = ac.put_artifact(job_id, "w1", epoch, "r.bin", data)
    ac.complete(job_id, "w1", epoch, {})
    return job_id, ObjectStore(ac.artifacts_dir or "").path_of(out["digest"])


def test_a_corrupted_object_is_exit_7_for_get_and_verify_and_writes_nothing(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:
    job_id, path = _accepted(ac, b"good bytes " * 100)
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(5)
        f.write(b"X")
    dest = tmp_path / "dest.bin"
    with pytest.raises(DatabaseCorrupt) as caught:
        ac.get_artifact(job_id, "r.bin", dest)
    assert caught.value.code == "artifact_corrupt"
    assert not dest.exists() and os.listdir(tmp_path) == [x for x in os.listdir(tmp_path)
                                                         if not x.startswith(".jobcoord-")]
    assert ac.verify_artifacts(job_id)["problems"][0]["problem"] == "corrupt"
    r = run_cli(target, "--artifacts", store_dir, "artifact", "get", str(job_id), "r.bin",
                "-o", str(dest), "--json")
    assert r.code == 7 and r.json["error"]["code"] == "artifact_corrupt"
    assert not dest.exists()
    r = run_cli(target, "--artifacts", store_dir, "artifact", "verify", "--all", "--json")
    assert r.code == 7 and r.json["problems"][0]["problem"] == "corrupt"


@pytest.mark.parametrize("thing", ["directory", "fifo"])
def test_a_put_whose_objects_place_holds_no_file_is_exit_7_naming_it_not_a_busy_store(
        ac: Coordinator, target: Target, store_dir: str, thing: str) -> None:
    """Where an object should be, a directory or a pipe: every put of that content was
    `artifact_store_busy` ("a concurrent gc removed the object"), exit 5, 503 to a remote
    worker, which retried it to its lease's end; no gc was running, and no try could ever
    succeed. It is the damage `get` and `verify` name: artifact_corrupt, exit 7, nothing
    staged (what is in the object's place is left for the operator to move)."""
    _job, path = _accepted(ac, b"the same bytes")
    os.unlink(path)
    if thing == "directory":
        os.mkdir(path)
    else:
        os.mkfifo(path)
    job_id, epoch = start(ac, "w2")
    with pytest.raises(DatabaseCorrupt) as caught:
        ac.put_artifact(job_id, "w2", epoch, "r.bin", b"the same bytes")
    assert caught.value.code == "artifact_corrupt", caught.value
    assert "not a regular file" in caught.value.message
    assert rows(ac, job_id) == [] and temp_files(store_dir) == []


@pytest.mark.parametrize("link_to", ["nowhere", "the same bytes elsewhere"])
def test_a_put_whose_objects_place_holds_a_link_replaces_the_link_with_the_object(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path, link_to: str
        ) -> None:
    """A symbolic link where an object should be (an object is its own file: `get` and
    `verify` call a link corrupt, whatever it points at): a put of that content was refused
    `artifact_corrupt`, and every attempt uploading it failed until an operator came. The
    put's own checked file replaces the link (the link's target is left alone)."""
    _job, path = _accepted(ac, b"the same bytes")
    os.unlink(path)
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(b"the same bytes")
    os.symlink(str(elsewhere) if link_to != "nowhere" else path + ".nowhere", path)
    job_id, epoch = start(ac, "w2")
    ac.put_artifact(job_id, "w2", epoch, "r.bin", b"the same bytes")
    assert not os.path.islink(path) and Path(path).read_bytes() == b"the same bytes"
    assert os.stat(path).st_mode & 0o777 == 0o400
    assert elsewhere.read_bytes() == b"the same bytes"
    assert temp_files(store_dir) == []
    r = run_cli(target, "--artifacts", store_dir, "artifact", "verify", "--all", "--json")
    assert r.code == 0, r


def test_a_missing_object_is_exit_7_for_get_and_verify(ac: Coordinator, target: Target,
                                                        store_dir: str, tmp_path: Path) -> None:
    job_id, path = _accepted(ac, b"soon gone")
    os.unlink(path)
    dest = tmp_path / "d"
    dest.write_bytes(b"old")
    r = run_cli(target, "--artifacts", store_dir, "artifact", "get", str(job_id), "r.bin",
                "-o", str(dest), "--force", "--json")
    assert r.code == 7 and r.json["error"]["code"] == "artifact_missing"
    assert dest.read_bytes() == b"old"
    r = run_cli(target, "--artifacts", store_dir, "artifact", "verify", str(job_id), "--json")
    assert r.code == 7 and r.json["problems"][0]["problem"] == "missing"


# --- the CLI --------------------------------------------------------------------------------


def test_put_complete_ls_get_through_the_cli(ac: Coordinator, target: Target, store_dir: str,
                                             tmp_path: Path) -> None:
    job_id, epoch = start(ac, "gpu-box")
    src = tmp_path / "report.pdf"
    src.write_bytes(b"%PDF " + os.urandom(3000))

    def cli(*args: str, stdin: bytes = b"") -> Any:
        return run_cli(target, "--artifacts", store_dir, *args, stdin=stdin)

    r = cli("artifact", "put", str(job_id), "--worker", "gpu-box", "--epoch", str(epoch),
            "--name", "report.pdf", str(src), "--json")
    assert r.code == 0, r.err
    assert r.json["digest"] == sha(src.read_bytes())
    r = cli("artifact", "put", str(job_id), "--worker", "gpu-box", "--epoch", str(epoch),
            "--name", "notes.txt", "-", "--json", stdin=b"from stdin")
    assert r.code == 0, r.err
    r = cli("complete", str(job_id), "--worker", "gpu-box", "--epoch", str(epoch),
            "--result", '{"pages": 12}', "--json")
    assert r.code == 0, r.err
    r = cli("artifact", "ls", str(job_id), "--json")
    assert [a["name"] for a in r.json["artifacts"]] == ["notes.txt", "report.pdf"]
    assert "report.pdf" in cli("artifact", "ls", str(job_id)).out
    out = tmp_path / "out.pdf"
    r = cli("artifact", "get", str(job_id), "report.pdf", "-o", str(out), "--json")
    assert r.code == 0, r.err
    assert out.read_bytes() == src.read_bytes()
    r = cli("artifact", "verify", "--all", "--json")
    assert r.code == 0 and r.json["ok"] and r.json["checked_objects"] == 2
    r = cli("artifact", "get", str(job_id), "nope", "-o", str(out), "--json")
    assert r.code == 4 and r.json["error"]["code"] == "artifact_not_found"
    # `-o -` is stdout, as `put`'s `-` is stdin: it wrote a file named `-`.
    here = tmp_path / "cwd # ?%"
    here.mkdir()
    where = ["--db", target.sqlite_path] if target.sqlite_path else ["--url", target.url]
    got = subprocess.run([sys.executable, "-m", "jobcoord", *where, "--artifacts",
                          store_dir, "artifact", "get", str(job_id), "report.pdf", "-o", "-"],
                         cwd=here, capture_output=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout == src.read_bytes() and list(here.iterdir()) == []


@pytest.mark.parametrize("name", ["a/b", "..", "nul\x00x", "x" * 256, ""])
def test_bad_names_are_exit_2_with_no_row_and_no_temp_file(ac: Coordinator, target: Target,
                                                           store_dir: str, name: str) -> None:
    job_id, epoch = start(ac)
    with pytest.raises(InvalidInput) as caught:
        ac.put_artifact(job_id, "w1", epoch, name, b"x")
    assert caught.value.code == "invalid_artifact_name"
    if "\x00" not in name:  # argv cannot carry NUL
        r = run_cli(target, "--artifacts", store_dir, "artifact", "put", str(job_id),
                    "--worker", "w1", "--epoch", str(epoch), "--name", name, "-", "--json")
        assert r.code == 2 and r.json["error"]["code"] == "invalid_artifact_name"
    assert rows(ac, job_id) == [] and temp_files(store_dir) == []


def test_a_directory_or_unreadable_source_is_exit_2_with_no_row(ac: Coordinator,
                                                                tmp_path: Path) -> None:
    job_id, epoch = start(ac)
    for source in (str(tmp_path), str(tmp_path / "missing")):
        with pytest.raises(InvalidInput):
            ac.put_artifact(job_id, "w1", epoch, "x", source)
    assert rows(ac, job_id) == []


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800"])
def test_a_source_or_destination_path_that_is_no_path_is_invalid_input_changing_nothing(
        ac: Coordinator, store_dir: str, tmp_path: Path, bad: str) -> None:
    """A path holding a NUL, or a lone surrogate (no file name can hold either), raised
    ValueError and UnicodeEncodeError out of `put_artifact` and `get_artifact`: every API
    method either works or raises a JobcoordError, so it is InvalidInput, with no row, no
    object, no temporary file and nothing written."""
    from tests.conftest import dump

    done, e1 = start(ac)
    ac.put_artifact(done, "w1", e1, "kept.bin", b"kept")
    ac.complete(done, "w1", e1, {})
    job_id, epoch = start(ac, "w2")
    before, objects = dump(ac), _stored(store_dir)
    with pytest.raises(InvalidInput) as caught:
        ac.put_artifact(job_id, "w2", epoch, "x.bin", bad)
    assert caught.value.code == "invalid_input"
    with pytest.raises(InvalidInput) as caught:
        ac.get_artifact(done, "kept.bin", str(tmp_path / bad))
    assert caught.value.code == "invalid_input"
    assert dump(ac) == before and rows(ac, job_id) == []
    assert _stored(store_dir) == objects and temp_files(store_dir) == []
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(
        ("jobcoord.db", "store"))) == []


def test_a_destination_that_is_no_path_is_invalid_input(ac: Coordinator, store_dir: str,
                                                       tmp_path: Path) -> None:
    """`get_artifact(job, name, dest)` with a dest of None, a number, a file object or
    bytes raised a bare TypeError out of the API; `backup` the same. Each is InvalidInput
    naming the destination, nothing written."""
    import io

    from tests.conftest import dump

    done, e1 = start(ac)
    ac.put_artifact(done, "w1", e1, "kept.bin", b"kept")
    ac.complete(done, "w1", e1, {})
    before = dump(ac)
    for dest in (None, 5, io.BytesIO(), str(tmp_path / "out.bin").encode(), ["a"]):
        with pytest.raises(InvalidInput) as caught:
            ac.get_artifact(done, "kept.bin", dest)  # type: ignore[arg-type]
        assert "destination" in caught.value.message, caught.value.message
    assert dump(ac) == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(
        ("jobcoord.db", "store"))) == []


def test_a_store_that_cannot_be_written_is_exit_6_with_no_row(ac: Coordinator,
                                                              tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "objects").write_bytes(b"")  # a damaged store: a file where objects/ goes
    ac.artifacts_dir = str(root)
    job_id, epoch = start(ac)
    from jobcoord.errors import StorageUnavailable

    with pytest.raises(StorageUnavailable) as caught:
        ac.put_artifact(job_id, "w1", epoch, "x", b"x")
    assert caught.value.exit_code == 6
    assert rows(ac, job_id) == []


def test_a_first_stage_into_a_store_path_through_a_regular_file_is_a_mistyped_path(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:
    """A database naming no object yet, its store named under (or as) a regular file
    (`--artifacts q.db`): the first stage said exit 6, unavailable, and a worker retried it
    job after job, where no store can ever be made. It is `artifact_store_missing`
    (exit 2, a worker gives its job back and stops), no row, nothing made."""
    from tests.conftest import dump

    blocker = tmp_path / "q # ?%.db"
    blocker.write_bytes(b"not a store")
    job_id, epoch = start(ac)
    for root in (blocker, blocker / "store"):
        ac.artifacts_dir = str(root)
        before = dump(ac)
        with pytest.raises(InvalidInput) as caught:
            ac.put_artifact(job_id, "w1", epoch, "x", b"x")
        assert (caught.value.code, caught.value.exit_code) == ("artifact_store_missing", 2)
        assert dump(ac) == before
        src = tmp_path / "out.bin"
        src.write_bytes(b"x")
        r = run_cli(target, "--artifacts", str(root), "artifact", "put", str(job_id),
                    str(src), "--worker", "w1", "--epoch", str(epoch), "--name", "x",
                    "--json")
        assert r.code == 2, (r.out, r.err)
        assert '"artifact_store_missing"' in r.out
        assert dump(ac) == before
    assert blocker.read_bytes() == b"not a store"
    assert sorted(p.name for p in tmp_path.iterdir() if "q #" in p.name) == [blocker.name]


def test_postgresql_needs_the_store_named(backend: str, target: Target) -> None:
    install(target)
    with Coordinator.open(target) as c:
        if backend == "sqlite":
            assert artifact_rules.store_of(c).root == target.sqlite_path + ".artifacts"
        else:
            with pytest.raises(InvalidInput) as caught:
                artifact_rules.store_of(c)
            assert caught.value.code == "artifact_store_required"


def test_without_the_feature_artifact_commands_say_how_to_install_it(coord: Coordinator
                                                                     ) -> None:
    with pytest.raises(Exception) as caught:
        coord.artifacts(None)
    assert "migrate --with artifacts" in str(caught.value)


def test_a_feature_found_missing_is_read_again_only_after_the_look_interval(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server asks for a missing feature on each artifact request: one schema read per
    FEATURE_LOOK_S, not one per request; an install is taken at the next look."""
    from jobcoord import coordinator as facade
    from jobcoord import migrate as migrate_module

    reads = []
    real = migrate_module.verify_schema

    def counted(db: Database) -> set[str]:
        reads.append(1)
        return real(db)

    now = [1000.0]
    monkeypatch.setattr(migrate_module, "verify_schema", counted)
    monkeypatch.setattr(facade.time, "monotonic", lambda: now[0])
    c = Coordinator.open(target)
    try:
        assert reads == [1]  # the open's own read
        assert not any(c.has_feature("artifacts") for _ in range(50))
        assert len(reads) == 2  # the first miss looks again; the next 49 do not
        install(target)
        now[0] += facade.FEATURE_LOOK_S - 0.01
        assert not c.has_feature("artifacts") and len(reads) == 2
        now[0] += 0.02
        assert c.has_feature("artifacts") and len(reads) == 3
        assert c.has_feature("artifacts") and len(reads) == 3  # found: never read again
    finally:
        c.close()


# --- validation per kind --------------------------------------------------------------------


def test_an_artifact_over_the_kinds_size_fails_the_completion_and_the_attempt(
        ac: Coordinator) -> None:
    artifact_rules.declare_kind(ac, "render", max_bytes=1000, media_types=["application/pdf"])
    job_id, epoch = start(ac)
    ac.put_artifact(job_id, "w1", epoch, "a.pdf", b"ok")
    ac.put_artifact(job_id, "w1", epoch, "b.txt", b"text")  # media type not allowed
    with pytest.raises(Refused) as caught:
        ac.complete(job_id, "w1", epoch, {})
    assert caught.value.code == "artifact_invalid" and caught.value.exit_code == 4
    shown = ac.show(job_id)
    assert shown["job"]["status"] == "waiting"  # a failed attempt: retried
    assert ac.artifacts(job_id)["artifacts"] == []
    states = {a["name"]: (a["state"], a["reason"])
              for a in ac.artifacts(job_id, all_states=True)["artifacts"]}
    assert states["b.txt"] == ("rejected", "media_type_not_allowed")
    failed = [e for e in shown["events"] if e["reason"] == "artifact_invalid"]
    assert failed and "b.txt" in failed[0]["detail"]["error"]
    rejected = [e for e in shown["events"] if e["reason"] == "artifact_rejected"]
    assert rejected[0]["detail"]["reason"] == "media_type_not_allowed"


def test_a_media_type_is_the_same_type_whatever_its_letters_case(ac: Coordinator) -> None:
    """Media types are case-insensitive (RFC 9110): `TEXT/PLAIN` was stored as given at put,
    then refused by a kind allowing `text/plain`, failing the attempt. Stored lower-case,
    and a kind's list is read so too."""
    artifact_rules.declare_kind(ac, "render", media_types=["Text/Plain", "application/pdf"])
    job_id, epoch = start(ac)
    staged = ac.put_artifact(job_id, "w1", epoch, "a.txt", b"text", media_type="TEXT/PLAIN")
    assert staged["media_type"] == "text/plain"
    ac.complete(job_id, "w1", epoch, {})
    assert [(a["name"], a["media_type"]) for a in ac.artifacts(job_id)["artifacts"]] == [
        ("a.txt", "text/plain")]


def test_a_validator_command_that_refuses_fails_the_completion(ac: Coordinator,
                                                               tmp_path: Path) -> None:
    checker = tmp_path / "check.py"
    checker.write_text("import sys\ndata = open(sys.argv[1], 'rb').read()\n"
                       "sys.exit(0 if data.startswith(b'%PDF') else 3)\n")
    artifact_rules.declare_kind(ac, "render", validator=[sys.executable, str(checker)])
    good, e1 = start(ac)
    ac.put_artifact(good, "w1", e1, "a.pdf", b"%PDF ok")
    ac.complete(good, "w1", e1, {})
    bad, e2 = start(ac)
    ac.put_artifact(bad, "w1", e2, "a.pdf", b"not a pdf")
    with pytest.raises(Refused) as caught:
        ac.complete(bad, "w1", e2, {})
    assert caught.value.code == "artifact_invalid"
    assert caught.value.details["artifacts"][0]["reason"] == "validator_refused"
    assert [a["name"] for a in ac.artifacts(good)["artifacts"]] == ["a.pdf"]


def test_a_group_completions_leases_are_all_kept_while_one_items_artifacts_are_checked(
        ac: Coordinator, tmp_path: Path) -> None:
    """complete_many checks its items' artifacts one after another, before its transaction:
    an item without artifacts waited for another's slow validator with its lease unrenewed,
    and was refused `lease_expired` although it was reported in time."""
    checker = tmp_path / "slow.py"
    checker.write_text("import time\ntime.sleep(3)\n")
    artifact_rules.declare_kind(ac, "render", validator=[sys.executable, str(checker)])
    checked, e1 = start(ac, lease_s=2)
    plain, e2 = start(ac, kind="plain", lease_s=2)
    ac.put_artifact(checked, "w1", e1, "a.pdf", b"%PDF ok")
    got = ac.complete_many([{"job_id": plain, "worker_id": "w1", "epoch": e2, "result": {}},
                            {"job_id": checked, "worker_id": "w1", "epoch": e1,
                             "result": {}}])
    assert got["accepted"] == 2, got
    assert ac.show(plain)["job"]["status"] == "succeeded"


@pytest.mark.parametrize("validator, evidence", [
    (["sh", "-c", "sleep 30"], "did not finish within 1 s"),
    (["/no such/validator"], "could not run"),
])
def test_a_validator_past_its_time_limit_or_that_cannot_start_fails_validator_failed(
        ac: Coordinator, monkeypatch: pytest.MonkeyPatch, validator: list[str],
        evidence: str) -> None:
    monkeypatch.setattr(artifact_rules, "VALIDATOR_TIMEOUT_S", 1.0)
    artifact_rules.declare_kind(ac, "render", validator=validator)
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "a.pdf", b"%PDF ok")
    with pytest.raises(Refused) as caught:
        ac.complete(job, "w1", epoch, {})
    [found] = caught.value.details["artifacts"]
    assert found["reason"] == "validator_failed" and evidence in found["evidence"], found


def test_artifact_rules_from_the_policy_file(target: Target, store_dir: str,
                                             tmp_path: Path) -> None:
    install(target)
    policy = tmp_path / "policy.toml"
    policy.write_text("max_payload_bytes = 4096\n[artifacts]\nmax_bytes = 10\n"
                      "[artifacts.kinds.big]\nmax_bytes = 100\n")
    r = run_cli(target, "--policy", str(policy), "--artifacts", store_dir, "status", "--json")
    assert r.code == 0, r.err
    from jobcoord.policy import Policy

    p = Policy.from_toml(str(policy))
    assert p.max_payload_bytes == 4096
    settings = artifact_rules.settings_of(type("C", (), {"policy": p})())  # type: ignore
    assert settings.for_kind("big").max_bytes == 100
    assert settings.for_kind("other").max_bytes == 10


def _stored(store_dir: str) -> list[str]:
    return [f for d, _, files in os.walk(store_dir) for f in files if f != "gc.lock"]


def test_a_put_with_an_expected_digest_stores_nothing_when_the_bytes_differ(
        ac: Coordinator, store_dir: str) -> None:
    job, epoch = start(ac)
    right = "sha256:" + hashlib.sha256(b"data").hexdigest()
    with pytest.raises(InvalidInput) as e:
        ac.put_artifact(job, "w1", epoch, "a.bin", b"other", expected_digest=right)
    assert e.value.code == "artifact_invalid"
    assert ac.artifacts(job, all_states=True)["artifacts"] == [] and _stored(store_dir) == []
    with pytest.raises(InvalidInput):
        ac.put_artifact(job, "w1", epoch, "a.bin", b"data", expected_digest="sha256:nothex")
    got = ac.put_artifact(job, "w1", epoch, "a.bin", b"data", expected_digest=right)
    assert got["digest"] == right and got["state"] == "staged"


def test_a_put_without_the_live_lease_stores_no_bytes(ac: Coordinator, store_dir: str) -> None:
    job, epoch = start(ac)
    for worker, e, code in (("w2", epoch, "not_owner"), ("w1", epoch + 1, "stale_epoch")):
        with pytest.raises(Refused) as refused:
            ac.put_artifact(job, worker, e, "a.bin", b"bytes nobody may keep")
        assert refused.value.code == code
    with pytest.raises(Refused) as refused:
        ac.put_artifact(job, "w1", epoch, "a.bin", b"bytes nobody may keep", tenant="bob")
    assert refused.value.code == "job_not_found"
    assert _stored(store_dir) == []


def _three_claimed(ac: Coordinator, worker: str = "w1") -> list[tuple[int, int]]:
    jobs = [ac.enqueue("render", {"n": i})["job_id"] for i in range(3)]
    ac.heartbeat(worker, readings=IDLE_ON_AC)
    got = ac.claim_many(worker, 3, lease_s=45)["claimed"]
    assert [g["job"]["job_id"] for g in got] == jobs
    return [(g["job"]["job_id"], g["lease"]["epoch"]) for g in got]


def _only_ok(ac: Coordinator, tmp_path: Path) -> None:
    """The kind's validator accepts an artifact whose bytes start with `ok`."""
    checker = tmp_path / "check.py"
    checker.write_text("import sys\n"
                       "sys.exit(0 if open(sys.argv[1], 'rb').read()[:2] == b'ok' else 3)\n")
    artifact_rules.declare_kind(ac, "render", validator=[sys.executable, str(checker)])


def test_complete_many_refuses_only_the_item_whose_artifact_fails_validation(
        ac: Coordinator, tmp_path: Path) -> None:
    """One refused completion never refuses the others: an item whose staged artifact fails
    its kind's validation is that item's `artifact_invalid` (its attempt failed, as a
    single completion's), and the group's other results are accepted."""
    _only_ok(ac, tmp_path)
    (a, ea), (b, eb), (c, ec) = _three_claimed(ac)
    ac.put_artifact(b, "w1", eb, "bad.bin", b"not ok")
    ac.put_artifact(c, "w1", ec, "ok.bin", b"ok")
    got = ac.complete_many([{"job_id": j, "worker_id": "w1", "epoch": e, "result": {"j": j}}
                            for j, e in ((a, ea), (b, eb), (c, ec))])
    assert (got["accepted"], got["refused"]) == (2, 1), got
    assert got["results"][1]["error"]["code"] == "artifact_invalid", got["results"][1]
    assert [ac.show(j)["job"]["status"] for j in (a, c)] == ["succeeded"] * 2
    assert ac.show(b)["job"]["status"] == "waiting"  # the failed attempt is retried
    assert [x["name"] for x in ac.artifacts(c)["artifacts"]] == ["ok.bin"]


def test_a_completion_by_another_worker_never_validates_the_owners_artifacts(
        ac: Coordinator, tmp_path: Path) -> None:
    """A completion that is not the lease's (another worker, another tenant) is refused by
    the fence as if its artifacts were not there: the owner's staged artifacts are not
    hashed, not judged, not rejected, and the owner's attempt is untouched -- alone and in
    a group, where it is that item's refusal only."""
    _only_ok(ac, tmp_path)
    (a, ea), (b, eb), _ = _three_claimed(ac)
    ac.put_artifact(a, "w1", ea, "bad.bin", b"not ok")
    ac.heartbeat("w2", readings=IDLE_ON_AC)
    with pytest.raises(Refused) as caught:
        ac.complete(a, "w2", ea, {})
    assert caught.value.code == "not_owner", caught.value.to_json()
    got = ac.complete_many([{"job_id": a, "worker_id": "w2", "epoch": ea},
                            {"job_id": b, "worker_id": "w1", "epoch": eb}])
    assert [r.get("error", {}).get("code") for r in got["results"]] == ["not_owner", None]
    shown = ac.show(a)
    assert shown["job"]["status"] == "running", shown["job"]
    assert "artifact_rejected" not in [e["reason"] for e in shown["events"]]
    assert [x["state"] for x in rows_of(ac, a)] == ["staged"]


def rows_of(c: Coordinator, job_id: int) -> list[dict[str, Any]]:
    return [{"state": r[2]} for r in rows(c, job_id)]


def test_artifact_get_never_writes_over_the_database_a_device_or_an_existing_file(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:
    """`artifact get -o` into the live database exited 0 and replaced it with the artifact's
    bytes; into an existing file, a FIFO or a device it replaced them too. Now: the
    database and its files, directories, FIFOs and devices are exit 2 with nothing written,
    whatever --force says; an existing file is replaced only with --force."""
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"hello")
    ac.complete(job, "w1", epoch, {})
    refused = [str(tmp_path)]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused.append(str(fifo))
    if target.sqlite_path:
        refused += [target.sqlite_path, target.sqlite_path + "-wal"]
    for dest in refused:
        for force in ((), ("--force",)):
            r = run_cli(target, "--artifacts", store_dir, "artifact", "get", str(job),
                        "out.txt", "-o", dest, *force, "--json")
            assert r.code == 2, (dest, force, r)
    assert fifo.is_fifo()
    assert ac.show(job)["job"]["status"] == "succeeded"  # the database is whole
    existing = tmp_path / "kept.txt"
    existing.write_bytes(b"mine")
    r = run_cli(target, "--artifacts", store_dir, "artifact", "get", str(job), "out.txt",
                "-o", str(existing), "--json")
    assert r.code == 2 and r.json["error"]["code"] == "destination_exists", r
    assert existing.read_bytes() == b"mine"
    r = run_cli(target, "--artifacts", store_dir, "artifact", "get", str(job), "out.txt",
                "-o", str(existing), "--force", "--json")
    assert r.code == 0 and existing.read_bytes() == b"hello", r
    with pytest.raises(InvalidInput):
        ac.get_artifact(job, "out.txt", existing)
    assert ac.get_artifact(job, "out.txt", existing, force=True)["size"] == 5


def test_an_artifact_row_whose_digest_is_no_digest_is_found_by_check_and_gc_removes_nothing(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """A digest changed by hand so it names no object (its letters upper case): `check`
    said ok, `verify` and `backup` said bad usage (exit 2), and `gc`, which could not match
    the row to its object, deleted the intact object of an accepted artifact, exit 0: once
    the row was mended the content was gone for good. `check` names the row
    (`artifact_unreadable`, exit 7), `gc` and `verify` are exit 7 and remove nothing."""
    from sqlalchemy import text

    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "a.txt", b"good bytes")
    ac.complete(job, "w1", epoch, {})
    assert run_cli(target, "check", "--json").code == 0
    with ac.db.engine.begin() as conn:
        conn.execute(text("UPDATE artifacts SET digest = upper(digest)"))
    r = run_cli(target, "check", "--json")
    assert r.code == 7, r
    [found] = [v for v in r.json["violations"] if v["invariant"] == "artifact_unreadable"]
    assert [a["name"] for a in found["artifacts"]] == ["a.txt"], found
    backup = (("backup", os.path.join(store_dir, "..", "b.db")),) if target.sqlite_path else ()
    for args in (("artifact", "gc", "--grace", "0s"), ("artifact", "verify", "--all"),
                 *backup):
        r = run_cli(target, "--artifacts", store_dir, *args, "--json")
        assert r.code == 7, (args, r)
    with ac.db.engine.begin() as conn:
        conn.execute(text("UPDATE artifacts SET digest = lower(digest)"))
    assert ac.get_artifact(job, "a.txt", os.path.join(store_dir, "..", "got.txt"))["size"] == 10


def test_artifact_gets_racing_to_one_new_file_without_force_write_it_once(
        ac: Coordinator, tmp_path: Path) -> None:
    """Twelve threads (one Coordinator) getting an artifact to one new file without
    `force`: all saw no file there, and up to five said they wrote it, each replacing the
    one before. The file is linked into place, not renamed: one writes it, the others are
    `destination_exists` (exit 2), and no temporary file is left."""
    import threading

    job, epoch = start(ac)
    data = os.urandom(1 << 22)
    ac.put_artifact(job, "w1", epoch, "model.bin", data)
    ac.complete(job, "w1", epoch, {})
    dest = tmp_path / "out dir #1" / "model.bin"
    dest.parent.mkdir()
    gate = threading.Barrier(12)
    answers: list[str] = []

    def get() -> None:
        gate.wait()
        try:
            ac.get_artifact(job, "model.bin", dest)
            answers.append("written")
        except InvalidInput as e:
            answers.append(e.code)

    threads = [threading.Thread(target=get) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == ["destination_exists"] * 11 + ["written"], answers
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["model.bin"]


def test_artifact_get_and_backup_never_write_the_wal_of_a_database_opened_through_a_link(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:
    """Opened as `alias.db` (a link to `real.db`), SQLite keeps `real.db-wal`: the guard
    built `alias.db-wal` and let `--force` write over the live -wal (committed jobs lost).
    Nor may a copy go into the artifact store: an object is never replaced."""
    if not target.sqlite_path:
        pytest.skip("SQLite files")
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"hello")
    ac.complete(job, "w1", epoch, {})
    alias = tmp_path / "alias.db"
    alias.symlink_to(target.sqlite_path)
    wal = target.sqlite_path + "-wal"
    assert os.path.exists(wal)
    objects = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(store_dir, "objects"))
               for f in fs]
    assert objects
    for dest in (wal, objects[0]):
        for args in (("artifact", "get", str(job), "out.txt", "-o", dest, "--force"),
                     ("backup", dest, "--force")):
            r = run_cli(Target(f"sqlite:///{alias}", str(alias)), "--artifacts", store_dir,
                        *args, "--json")
            assert r.code == 2, (dest, args, r)
    assert ac.show(job)["job"]["status"] == "succeeded"
    assert ac.verify_artifacts()["ok"]


@pytest.mark.parametrize("change", ["replaced", "added"])
def test_a_completion_is_refused_when_its_attempt_stages_artifacts_during_its_checks(
        target: Target, store_dir: str, tmp_path: Path, change: str) -> None:
    """An artifact staged again (or a new one) while the completion checks the attempt's
    stages was left staged and the completion accepted without it: the job succeeded with
    an artifact the worker replaced missing. The completion is refused `artifact_changed`
    with nothing accepted, the lease kept; sent again, it checks and accepts what is staged
    now."""
    import threading

    from jobcoord.policy import Policy

    install(target)
    policy = Policy.from_toml(str(slow_validator_policy(tmp_path, 2, kind="render")))
    with Coordinator.open(target, policy=policy) as c:
        c.artifacts_dir = store_dir
        job, epoch = start(c, "w1", lease_s=120)
        c.put_artifact(job, "w1", epoch, "a.bin", b"first bytes")
        answer: dict[str, Any] = {}

        def complete() -> None:
            try:
                answer["ok"] = c.complete(job, "w1", epoch, {"done": 1})
            except Refused as e:
                answer["refused"] = e

        t = threading.Thread(target=complete)
        t.start()
        time.sleep(0.5)  # the validator of a.bin's first bytes is running
        name = "a.bin" if change == "replaced" else "b.bin"
        c.put_artifact(job, "w1", epoch, name, b"second bytes")
        t.join(60)
        assert "refused" in answer, answer
        assert answer["refused"].code == "artifact_changed", answer["refused"].to_json()
        assert c.show(job)["job"]["status"] == "running"
        assert c.artifacts(job)["artifacts"] == []
        c.complete(job, "w1", epoch, {"done": 2})
        accepted = {a["name"]: a["digest"] for a in c.artifacts(job)["artifacts"]}
    assert accepted[name] == sha(b"second bytes"), accepted
    assert set(accepted) == ({"a.bin"} if change == "replaced" else {"a.bin", "b.bin"})


def test_an_upload_limit_that_is_no_whole_number_is_invalid_input_and_stores_nothing(
        ac: Coordinator) -> None:
    """put_artifact(max_bytes="x") raised a bare TypeError, and max_bytes=nan set no limit
    at all (no comparison with NaN is true): a limit is a whole number of bytes."""
    job, epoch = start(ac)
    for limit in (float("nan"), 1.5, "x", [1], -1, True):
        with pytest.raises(InvalidInput, match="max_bytes"):
            ac.put_artifact(job, "w1", epoch, "a.bin", b"x" * 20, max_bytes=limit)
    assert ac.artifacts(job)["artifacts"] == []
    assert ac.put_artifact(job, "w1", epoch, "a.bin", b"x" * 20, max_bytes=20)["size"] == 20


def test_a_memoryview_with_gaps_is_stored_as_the_bytes_it_shows(ac: Coordinator) -> None:
    """A memoryview every other byte of a buffer (`view[::2]`) raised a bare TypeError: it
    is stored as the bytes it shows."""
    job, epoch = start(ac)
    got = ac.put_artifact(job, "w1", epoch, "a.bin", memoryview(b"abcdef")[::2])
    assert got["size"] == 3
    assert got["digest"] == "sha256:" + hashlib.sha256(b"ace").hexdigest()


def test_ctrl_c_stops_an_artifact_put_while_it_reads_and_leaves_nothing(
        sqlite_target: Target, tmp_path: Path) -> None:
    """The lease check before the bytes are read is a write transaction, and a Ctrl-C after
    a commit is held until the next write: `artifact put -` from a pipe still open went on
    reading (a 4 GB source to its end, /dev/zero until the disk was full) and stopped only
    then. It stops at once, exit 130, with no object, no temporary file and no row."""
    import signal

    from tests.test_cli_modes import _reading_stdin

    install(sqlite_target)
    store = tmp_path / "store # 1"
    with Coordinator.open(sqlite_target) as c:
        c.artifacts_dir = str(store)
        job, epoch = start(c)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcoord", "--db", sqlite_target.sqlite_path or "",
         "--artifacts", str(store), "artifact", "put", str(job), "--worker", "w1", "--epoch",
         str(epoch), "--name", "big.bin", "-", "--json"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdin is not None
    try:
        proc.stdin.write(os.urandom(1 << 20))
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not (_reading_stdin(proc.pid) and list((store / "tmp").glob("*"))):
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=15)  # the pipe still open: no end of input to wait for
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    assert code == 130, (code, out, err)
    assert json.loads(out)["error"]["code"] == "interrupted"
    left = [p for p in store.rglob("*") if p.is_file() and p.parent.name != "databases"]
    assert left == [], left
    with Coordinator.open(sqlite_target) as c:
        c.artifacts_dir = str(store)
        assert c.artifacts(job)["artifacts"] == []


def test_a_stage_into_a_store_gone_while_its_objects_are_referenced_makes_no_new_store(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """The store moved away (or `--artifacts` mistyped) after this database's rows came to
    name its objects: the next stage made a new, empty store there and went on, the earlier
    objects missing from it (`artifact verify --all` exit 7, `check` saying nothing). As
    `artifact gc` and the completion do, a stage refuses: exit 2 `artifact_store_missing`,
    no store made, nothing changed. The first stage of a database naming no object makes
    its store; the store back in its place takes stages again."""
    from tests.conftest import dump

    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"first result")
    ac.complete(job, "w1", epoch, {"ok": True})
    later, later_epoch = start(ac)
    os.rename(store_dir, store_dir + ".moved")
    before = dump(ac)
    with pytest.raises(InvalidInput) as caught:
        ac.put_artifact(later, "w1", later_epoch, "out.txt", b"second result")
    assert caught.value.code == "artifact_store_missing", caught.value
    assert store_dir in caught.value.message
    src = Path(store_dir).parent / "second result.txt"
    src.write_bytes(b"second result")
    r = run_cli(target, "--artifacts", store_dir, "artifact", "put", str(later), str(src),
                "--worker", "w1", "--epoch", str(later_epoch), "--name", "out.txt", "--json")
    assert r.code == 2, r
    assert r.json["error"]["code"] == "artifact_store_missing", r.json
    assert dump(ac) == before
    assert not os.path.lexists(store_dir)
    os.rename(store_dir + ".moved", store_dir)
    got = ac.put_artifact(later, "w1", later_epoch, "out.txt", b"second result")
    assert got["state"] == "staged"
    ac.complete(later, "w1", later_epoch, {"ok": True})
    assert [s for _, s in ObjectStore(store_dir).verify_all()] == ["ok", "ok"]


def test_a_store_gone_during_a_stage_is_not_made_again(store_dir: str,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A write into the store there (`create=False`, as a stage makes once rows name its
    objects) finds it gone: none of it is made again (a new, empty store where the old one
    was), whether it was gone at the write's look or went just after it."""
    store = ObjectStore(store_dir)
    store.put(b"first")
    os.rename(store_dir, store_dir + ".moved")
    with pytest.raises(InvalidInput) as caught:
        store.put(b"second", create=False)
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(store_dir)
    real = ObjectStore.present

    def gone_after_the_look() -> None:
        looks = iter([True])  # the write's look saw it; then it went
        monkeypatch.setattr(store, "present", lambda: next(looks, real(store)))

    gone_after_the_look()
    with pytest.raises(InvalidInput) as caught:
        store.put(b"second", create=False)
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(store_dir)
    # Its objects gone from under a root left in place: not made again either.
    os.rename(store_dir + ".moved", store_dir)
    os.rename(os.path.join(store_dir, "objects"), os.path.join(store_dir, "objects.moved"))
    gone_after_the_look()
    with pytest.raises(InvalidInput) as caught:
        store.put(b"second", create=False)
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(os.path.join(store_dir, "objects"))


def _accepted_then_leased(ac: Coordinator) -> tuple[int, int]:
    """One job's artifact accepted (a row names an object), then another job leased."""
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"first result")
    ac.complete(job, "w1", epoch, {"ok": True})
    return start(ac)


def test_a_store_gone_between_a_stages_write_and_its_row_is_not_made_again(
        ac: Coordinator, store_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store moved away after a stage stored its bytes, before its row: the lock the
    row is written under made the store again, empty; the stage said `artifact_store_busy`
    (try again), and the retry staged into the new store. Refused `artifact_store_missing`,
    no store made, no row; so is the retry."""
    later, epoch = _accepted_then_leased(ac)
    put = ObjectStore.put

    def put_then_moved(self: ObjectStore, *args: Any, **kwargs: Any) -> Any:
        stored = put(self, *args, **kwargs)
        os.rename(store_dir, store_dir + ".moved")
        return stored

    monkeypatch.setattr(ObjectStore, "put", put_then_moved)
    with pytest.raises(InvalidInput) as caught:
        ac.put_artifact(later, "w1", epoch, "out.txt", b"second result")
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(store_dir)
    monkeypatch.setattr(ObjectStore, "put", put)
    with pytest.raises(InvalidInput) as caught:
        ac.put_artifact(later, "w1", epoch, "out.txt", b"second result")
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(store_dir)
    assert rows(ac, later) == []


def test_a_store_gone_while_gc_looks_is_not_made_again(
        ac: Coordinator, store_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc found the store, then it moved away before gc's lock: the lock made it again,
    empty, and gc said it collected nothing (stages then went on into the new store).
    Refused `artifact_store_missing`, no store made."""
    from jobcoord.artifacts import retention

    _accepted_then_leased(ac)
    shared = retention.refuse_if_shared

    def looked_then_moved(*args: Any, **kwargs: Any) -> Any:
        got = shared(*args, **kwargs)
        if not os.path.lexists(store_dir + ".moved"):  # the first look only
            os.rename(store_dir, store_dir + ".moved")
        return got

    monkeypatch.setattr(retention, "refuse_if_shared", looked_then_moved)
    with pytest.raises(InvalidInput) as caught:
        ac.gc_artifacts(grace_s=0)
    assert caught.value.code == "artifact_store_missing", caught.value
    assert not os.path.lexists(store_dir)


def test_the_first_stages_of_a_new_database_made_at_once_are_all_staged(
        ac: Coordinator, store_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two first stages of a database at once: one found no store, then, before it looked
    whether rows name objects, the other made the store and committed its row. The first
    was refused `artifact_store_missing` (its worker stopped) with the store right there."""
    one, one_epoch = start(ac)
    two, two_epoch = start(ac)
    refuse = artifact_rules.refuse_missing_store
    raced: list[dict[str, Any]] = []

    def other_stage_first(*args: Any, **kwargs: Any) -> None:
        if not raced:  # the first stage's look: the other stage runs whole first
            raced.append({})
            raced[0] = ac.put_artifact(two, "w1", two_epoch, "b.txt", b"two")
        refuse(*args, **kwargs)

    monkeypatch.setattr(artifact_rules, "refuse_missing_store", other_stage_first)
    got = ac.put_artifact(one, "w1", one_epoch, "a.txt", b"one")
    assert got["state"] == "staged" and raced[0]["state"] == "staged"
    assert [r[2] for r in rows(ac, one) + rows(ac, two)] == ["staged", "staged"]


def test_a_completion_through_another_databases_store_is_refused_and_uses_up_no_attempt(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:
    """`--artifacts` naming the store of another database (one letter off): a store is
    there, so the attempt's objects were judged missing, the attempt failed, and three such
    completions made the job dead. A store that does not name this database among its
    users is not its store: exit 2 `artifact_store_missing`, nothing changed."""
    from jobcoord.artifacts.settings import record_user
    from tests.conftest import dump

    other = str(tmp_path / "other store")
    ObjectStore(other).put(b"another database's object")
    record_user(ObjectStore(other), "sqlite:" + str(tmp_path / "other.db"))
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")
    before = dump(ac)
    r = run_cli(target, "--artifacts", other, "complete", str(job), "--worker", "w1",
                "--epoch", str(epoch), "--json")
    assert r.code == 2, r
    assert r.json["error"]["code"] == "artifact_store_missing", r.json
    assert other in r.json["error"]["message"]
    assert dump(ac) == before
    ac.complete(job, "w1", epoch, {"ok": True})
    assert rows(ac, job)[0][2] == "accepted"


def test_a_completion_through_a_store_that_cannot_be_used_names_its_job(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """A completion whose store's `objects/` leads nowhere (a volume not mounted) is exit 6,
    nothing changed, as every reader; its error named no job (the other refusals of a
    completion's look name it), so a script retrying many could not tell which."""
    from tests.conftest import dump

    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")
    objects = Path(store_dir, "objects")
    objects.rename(Path(store_dir, "objects.away"))
    objects.symlink_to(Path(store_dir, "nowhere"))
    before = dump(ac)
    r = run_cli(target, "--artifacts", store_dir, "complete", str(job), "--worker", "w1",
                "--epoch", str(epoch), "--json")
    assert r.code == 6, r
    assert r.json["error"]["details"]["job_id"] == job, r.json
    with pytest.raises(StorageUnavailable) as e:
        ac.complete(job, "w1", epoch, {"ok": True})
    assert e.value.details["job_id"] == job
    assert dump(ac) == before
    objects.unlink()
    Path(store_dir, "objects.away").rename(objects)
    ac.complete(job, "w1", epoch, {"ok": True})
    assert rows(ac, job)[0][2] == "accepted"


@pytest.mark.parametrize("moved_at", ["verify", "size", "validator"])
def test_a_store_moved_during_a_completions_checks_is_refused_and_uses_up_no_attempt(
        ac: Coordinator, store_dir: str, monkeypatch: pytest.MonkeyPatch,
        moved_at: str) -> None:
    """The store moved away while a completion's checks ran (after its look found it):
    the rows left were judged missing, or refused by a validator given no file, and the
    attempt failed (a try lost); or the object's size was asked of no file and the
    completion said exit 7 `artifact_missing`. Refused `artifact_store_missing`, nothing
    changed; the store back, the completion is accepted."""
    from tests.conftest import dump

    staged = 3
    if moved_at == "validator":
        artifact_rules.declare_kind(ac, "render", validator=[
            sys.executable, "-c", "import os, sys; sys.exit(not os.path.isfile(sys.argv[1]))"])
        moved_at, staged = "size", 1  # after its verify and size, before its validator
    job, epoch = start(ac)
    for n in range(staged):
        ac.put_artifact(job, "w1", epoch, f"out{n}.txt", f"result {n}".encode())
    before = dump(ac)
    real = getattr(ObjectStore, moved_at)
    calls: list[str] = []

    def then_moved(self: ObjectStore, digest: str) -> Any:
        got = real(self, digest)
        if not calls:  # after the first row's
            os.rename(store_dir, store_dir + ".moved")
        calls.append(digest)
        return got

    monkeypatch.setattr(ObjectStore, moved_at, then_moved)
    with pytest.raises(InvalidInput) as caught:
        ac.complete(job, "w1", epoch, {"ok": True})
    assert caught.value.code == "artifact_store_missing", caught.value
    assert dump(ac) == before
    monkeypatch.setattr(ObjectStore, moved_at, real)
    os.rename(store_dir + ".moved", store_dir)
    ac.complete(job, "w1", epoch, {"ok": True})
    assert [r[2] for r in rows(ac, job)] == ["accepted"] * staged


@pytest.mark.parametrize("store", ["mistyped", "another database's"])
def test_reading_accepted_artifacts_through_a_store_not_the_databases_is_exit_2(
        ac: Coordinator, target: Target, tmp_path: Path, store: str) -> None:
    """`artifact get`, `artifact verify` and `backup` through a `--artifacts` that names no
    store, or another database's: every accepted artifact was reported missing, exit 7 (a
    damaged store, its results lost) when only the path was wrong. Refused as gc, a stage
    and a completion refuse it: exit 2 `artifact_store_missing`, nothing made or changed."""
    from jobcoord.artifacts.settings import record_user
    from tests.conftest import dump

    wrong = str(tmp_path / "stor #?%")
    if store != "mistyped":
        ObjectStore(wrong).put(b"another database's object")
        record_user(ObjectStore(wrong), "sqlite:" + str(tmp_path / "other.db"))
    def in_store() -> list[str]:  # (a backup takes the store's gc lock, its file made)
        return sorted(str(p) for p in Path(wrong).rglob("*") if p.name != "gc.lock")

    before_store = in_store()
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")
    ac.complete(job, "w1", epoch, {"ok": True})
    before = dump(ac)
    commands = [("artifact", "get", str(job), "out.txt", "-o", str(tmp_path / "got.txt")),
                ("artifact", "verify", str(job)), ("artifact", "verify", "--all")]
    if target.sqlite_path:
        commands.append(("backup", str(tmp_path / "b.db")))
    for command in commands:
        r = run_cli(target, "--artifacts", wrong, *command, "--json")
        assert r.code == 2, (command, r)
        assert r.json["error"]["code"] == "artifact_store_missing", (command, r.json)
        assert wrong in r.json["error"]["message"], (command, r.json)
    assert dump(ac) == before
    assert in_store() == before_store
    assert not any(p.name.startswith(("got.txt", "b.db")) for p in tmp_path.iterdir())
    ac.artifacts_dir = wrong
    with pytest.raises(InvalidInput) as caught:
        ac.verify_artifacts(job)
    assert caught.value.code == "artifact_store_missing"


def test_an_object_missing_from_a_store_recording_no_database_is_missing(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """A store written before stores recorded their databases names none: it is taken as
    the database's, and an object missing from it is missing (exit 7), not a wrong path."""
    import shutil

    job, epoch = start(ac)
    digest = ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")["digest"]
    ac.complete(job, "w1", epoch, {"ok": True})
    shutil.rmtree(os.path.join(store_dir, "databases"))
    os.unlink(ObjectStore(store_dir).path_of(digest))
    r = run_cli(target, "--artifacts", store_dir, "artifact", "verify", str(job), "--json")
    assert r.code == 7, r
    assert r.json["problems"][0]["problem"] == "missing", r.json


def test_a_stage_into_another_databases_store_while_rows_name_objects_is_refused(
        ac: Coordinator, target: Target, tmp_path: Path) -> None:
    """The database's rows name objects of its store; a stage through `--artifacts` naming
    another database's store (one recording other databases, not this one) was accepted,
    recorded this database there, and from then on the earlier artifacts read as missing
    through it and the new one through the right store. Refused `artifact_store_missing`,
    nothing stored or recorded. A database naming no object yet may join a store another
    uses (a store shared on purpose)."""
    from jobcoord.artifacts.settings import record_user, store_users

    other = str(tmp_path / "other store #?%")
    ObjectStore(other).put(b"another database's object")
    record_user(ObjectStore(other), "sqlite:" + str(tmp_path / "other.db"))
    objects_before = sorted(d for d, _ in ObjectStore(other).verify_all())
    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"first result")
    ac.complete(job, "w1", epoch, {"ok": True})
    later, later_epoch = start(ac)
    src = tmp_path / "second.txt"
    src.write_bytes(b"second result")
    r = run_cli(target, "--artifacts", other, "artifact", "put", str(later), str(src),
                "--worker", "w1", "--epoch", str(later_epoch), "--name", "out.txt", "--json")
    assert r.code == 2, r
    assert r.json["error"]["code"] == "artifact_store_missing", r.json
    assert len(store_users(ObjectStore(other))) == 1
    assert sorted(d for d, _ in ObjectStore(other).verify_all()) == objects_before
    assert rows(ac, later) == []


def test_a_store_holding_the_databases_objects_under_another_record_still_takes_stages(
        ac: Coordinator, store_dir: str, tmp_path: Path) -> None:
    """A database whose store records it under another name (a SQLite file moved with its
    store, a PostgreSQL database restored under another name) and another database too:
    the store holds its objects, so it is its own. Judged by the records alone, its every
    stage was refused and its workers stopped."""
    import shutil

    from jobcoord.artifacts.settings import record_user, store_users

    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"first result")
    ac.complete(job, "w1", epoch, {"ok": True})
    shutil.rmtree(os.path.join(store_dir, "databases"))
    record_user(ObjectStore(store_dir), "sqlite:" + str(tmp_path / "where it was.db"))
    record_user(ObjectStore(store_dir), "sqlite:" + str(tmp_path / "another.db"))
    later, later_epoch = start(ac)
    got = ac.put_artifact(later, "w1", later_epoch, "out.txt", b"second result")
    assert got["state"] == "staged"
    assert len(store_users(ObjectStore(store_dir))) == 3  # this database recorded now


def test_a_store_whose_records_cannot_be_listed_is_unavailable_not_missing_objects(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """A store whose `databases/` is a file: its records were read as none, so objects
    missing through it were `artifact_missing` (exit 7) for get and verify while every
    other command said the store is unusable. Exit 6 `artifact_store_unavailable`."""
    job, epoch = start(ac)
    digest = ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")["digest"]
    ac.complete(job, "w1", epoch, {"ok": True})
    records = os.path.join(store_dir, "databases")
    os.rename(records, records + ".aside")
    Path(records).write_text("not a directory")
    os.unlink(ObjectStore(store_dir).path_of(digest))
    r = run_cli(target, "--artifacts", store_dir, "artifact", "verify", str(job), "--json")
    assert r.code == 6, r
    assert r.json["error"]["code"] == "artifact_store_unavailable", r.json


def test_a_completion_through_a_mistyped_store_is_refused_and_uses_up_no_attempt(
        ac: Coordinator, target: Target, store_dir: str, tmp_path: Path) -> None:
    """With `--artifacts` one letter off, a completion found none of its staged objects:
    the artifacts were rejected (`artifact_missing`) and the attempt failed, so three typos
    made the job dead. No store there at all is the caller's mistake, as `artifact gc`
    says: exit 2 `artifact_store_missing`, nothing changed; the right store completes it."""
    from tests.conftest import dump

    job, epoch = start(ac)
    ac.put_artifact(job, "w1", epoch, "out.txt", b"result bytes")
    before = dump(ac)
    typo = str(tmp_path / "stor")
    r = run_cli(target, "--artifacts", typo, "complete", str(job), "--worker", "w1",
                "--epoch", str(epoch), "--json")
    assert r.code == 2, r
    assert r.json["error"]["code"] == "artifact_store_missing", r.json
    assert typo in r.json["error"]["message"]
    ac.artifacts_dir = typo
    with pytest.raises(InvalidInput) as caught:
        ac.complete(job, "w1", epoch, {"ok": True})
    assert caught.value.code == "artifact_store_missing"
    assert dump(ac) == before
    assert not os.path.exists(typo)
    # In a batch, it is that item's refusal only: the item without artifacts is accepted.
    plain = ac.enqueue("render", {"n": 2})["job_id"]
    plain_epoch = claim(ac, "w1")
    got = ac.complete_many([
        {"job_id": job, "worker_id": "w1", "epoch": epoch, "result": {"ok": True}},
        {"job_id": plain, "worker_id": "w1", "epoch": plain_epoch, "result": {"ok": 2}}])
    assert (got["accepted"], got["refused"]) == (1, 1), got
    assert got["results"][0]["error"]["code"] == "artifact_store_missing", got
    assert ac.show(plain)["job"]["status"] == "succeeded"
    assert ac.show(job)["job"]["status"] == "running"
    assert not os.path.exists(typo)
    ac.artifacts_dir = store_dir
    ac.complete(job, "w1", epoch, {"ok": True})
    assert ac.show(job)["job"]["status"] == "succeeded"


def test_an_empty_artifacts_directory_is_refused_never_the_default_store(
        ac: Coordinator, target: Target, store_dir: str) -> None:
    """`--artifacts ""` (a variable of the caller's left unset) took the default store
    `<db>.artifacts` and ran gc there, as if none had been named. Refused as `--db ""` is:
    exit 2, nothing changed; the Python API alike."""
    job, epoch = start(ac)
    for args in (("artifact", "gc", "--grace", "0"), ("artifact", "verify", "--all")):
        r = run_cli(target, "--artifacts", "", *args, "--json")
        assert r.code == 2, (args, r)
        assert "--artifacts" in r.json["error"]["message"], r.json
    ac.artifacts_dir = ""
    with pytest.raises(InvalidInput):
        ac.put_artifact(job, "w1", epoch, "a.txt", b"bytes")
    ac.artifacts_dir = store_dir
    assert ac.artifacts(job)["artifacts"] == []



@pytest.mark.parametrize("lock", ["directory", "link to a file", "link to nothing",
                                  "immutable file"])
def test_a_stage_refused_for_a_broken_gc_lock_leaves_nothing_in_the_store(
        ac: Coordinator, store_dir: str, tmp_path: Path, lock: str) -> None:
    """`gc.lock` a directory or a link: the stage stored its object (and its fan-out
    directories), then failed to take the lock (exit 6), leaving an object no row names,
    which gc, refused the same lock, never collected. The lock is looked at before the
    bytes are stored: exit 6, the store as it was. A regular file the stage cannot open
    for writing (the immutable flag: root too is refused) is looked at by opening it."""
    import shutil
    import subprocess

    done, e1 = start(ac, "w1")
    ac.put_artifact(done, "w1", e1, "kept.bin", b"accepted bytes")
    path = Path(store_dir, "gc.lock")
    if lock == "immutable file":
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed")
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("this filesystem has no immutable flag")
    elif lock == "directory":
        path.unlink()
        path.mkdir()
    else:
        path.unlink()
        aside = tmp_path / "aside.lock"
        if lock == "link to a file":
            aside.write_bytes(b"")
        path.symlink_to(aside)

    def tree() -> list[str]:
        return sorted(str(p) for p in Path(store_dir).rglob("*"))

    before = tree()
    from jobcoord.errors import StorageUnavailable

    try:
        with pytest.raises(StorageUnavailable) as caught:
            ac.put_artifact(done, "w1", e1, "more.bin", b"bytes never stored")
    finally:
        if lock == "immutable file":
            subprocess.run(["chattr", "-i", str(path)], check=True)
    assert caught.value.exit_code == 6 and "gc lock" in caught.value.message, caught.value
    assert tree() == before
    assert [r[1] for r in rows(ac, done)] == ["kept.bin"]

"""Every input the Python API accepts either works or is refused as InvalidInput.

Hypothesis calls every public method of Coordinator with arguments drawn from good values and
odd ones: empty, huge, negative, float, NaN, bool, None, bytes, wrong types, nested containers,
huge ints, strings with NUL or lone surrogates. Each call must succeed or raise a JobcoordError
subclass -- never any other exception -- and a call refused as invalid input changes nothing
(every core table is compared before and after). A bare string where a sequence is expected is
one element, the same in every method."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcoord.errors import InvalidInput, JobcoordError
from jobcoord.service import Coordinator, JobSpec
from tests.conftest import dump
from tests.sql import sql
from tests.timeline import IDLE_ON_AC

OMIT = object()

ODD_TEXT = ["", " ", "a\x00b", "\ud800", "x" * 5000, "P0", "-1", "1e400", "nan", "🙂", "a b",
            "gpu", "%", "'; DROP TABLE jobs; --"]
odd = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, -1, 2**63, 10**400, 10**5000]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e300, -0.0, 1e-300]),
    st.sampled_from(ODD_TEXT), st.text(max_size=8), st.binary(max_size=8),
    st.lists(st.one_of(st.text(max_size=4), st.integers(), st.none()), max_size=4),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.text(max_size=4)),
                    max_size=3),
    st.tuples(st.text(max_size=3)), st.sampled_from([[], {}, (), set(), [[["x"]]], {"a": {}}]),
    st.sampled_from([object(), b"\xff", bytearray(b"x"), 1j, float("nan")]),
)


def arg(*good: Any, optional: bool = True) -> st.SearchStrategy[Any]:
    """Mostly a good value (so calls reach deep), often an odd one, sometimes left out."""
    choices = [st.sampled_from(good), st.sampled_from(good), odd]
    if optional:
        choices.append(st.just(OMIT))
    return st.one_of(*choices)


JOB = arg(1, 2, 3, optional=False)
WORKER = arg("w1", "w2", optional=False)
EPOCH = arg(1, 2, optional=False)
TENANT = arg(None, "default", "A")
KINDS = arg(None, ["k"], ["k", "j"], "k", ("k",))
LEASE = arg(None, 30, 0.5, "30")

#: Batch items whose every field may be odd.
ITEMS = st.lists(st.fixed_dictionaries(
    {"job_id": JOB, "worker_id": WORKER, "epoch": EPOCH},
    optional={"result": arg({"ok": 1}, None, optional=False), "tenant": TENANT,
              "provenance": arg(None, {"m": 1}, optional=False),
              "error": arg("boom", optional=False), "permanent": arg(False, True),
              "reason": arg("failed", "worker_shutdown")}), max_size=3)

METHODS: dict[str, tuple[list[st.SearchStrategy[Any]], dict[str, st.SearchStrategy[Any]]]] = {
    "enqueue": ([arg("k", "j", optional=False), arg({"a": 1}, None, "{}")],
                {"priority": arg(None, 0, "P3"), "role": arg(None, "gpu"), "tenant": TENANT,
                 "key": arg(None, "key1"), "max_attempts": arg(None, 1, 5),
                 "deadline_s": arg(None, 60), "delay_s": arg(0, 1.5)}),
    "enqueue_many": ([arg([{"kind": "k"}], [JobSpec("k")], [], ({"kind": "j", "key": "b"},),
                          optional=False)], {}),
    "heartbeat": ([WORKER], {"roles": arg(None, ["gpu"], "gpu", []),
                             "readings": arg(None, IDLE_ON_AC, '{"memory_used_pct": 3}'),
                             "kinds": KINDS}),
    "claim": ([WORKER], {"lease_s": LEASE, "kinds": KINDS}),
    "complete": ([JOB, WORKER, EPOCH, arg({"ok": 1}, None)],
                 {"provenance": arg(None, {"model": "m"}), "tenant": TENANT}),
    "complete_and_claim": ([JOB, WORKER, EPOCH, arg({"ok": 1}, None)],
                           {"provenance": arg(None, {"m": 1}), "tenant": TENANT,
                            "lease_s": LEASE, "kinds": KINDS}),
    "fail": ([JOB, WORKER, EPOCH, arg("boom", optional=False)],
             {"permanent": arg(False, True), "reason": arg("failed", "timeout",
                                                            "worker_shutdown"),
              "tenant": TENANT, "effect_not_applied": arg(False, True)}),
    "claimable": ([WORKER], {"kinds": KINDS}),
    "claim_many": ([WORKER, arg(1, 2, 32, optional=False)], {"lease_s": LEASE, "kinds": KINDS}),
    "complete_many": ([st.one_of(arg(
        [{"job_id": 1, "worker_id": "w1", "epoch": 1, "result": {"ok": 1}}],
        [{"job_id": 2, "worker_id": "w1", "epoch": 1},
         {"job_id": 1, "worker_id": "w2", "epoch": 2, "tenant": "A"}],
        [], [{"job_id": 1}], optional=False), ITEMS)], {}),
    "fail_many": ([arg([{"job_id": 1, "worker_id": "w1", "epoch": 1, "error": "boom"}],
                       [{"job_id": 2, "worker_id": "w1", "epoch": 1, "error": "x",
                         "permanent": True, "reason": "worker_shutdown"}],
                       [], [{"job_id": 1, "worker_id": "w1", "epoch": 1}], optional=False)
                   | ITEMS], {}),
    "renew": ([JOB, WORKER, EPOCH], {"lease_s": LEASE, "tenant": TENANT}),
    "mark_effect": ([JOB, WORKER, EPOCH], {"tenant": TENANT}),
    "checkpoint": ([JOB, WORKER, EPOCH, arg("step", optional=False), arg({"n": 1}, None)],
                   {"tenant": TENANT}),
    "reap": ([], {"limit": arg(1000, 1)}),
    "cancel": ([JOB], {"tenant": TENANT}),
    "retry": ([JOB], {"tenant": TENANT}),
    "reconcile": ([JOB, arg("waiting", "dead", "succeeded", optional=False),
                   arg("checked", optional=False)], {"result": arg(None, {"r": 1}),
                                                     "tenant": TENANT}),
    # pause_s only from values that cannot make the run sleep for long
    "prune": ([arg("7d", 0, 3600, optional=False)],
              {"statuses": arg(None, ["dead"], "dead", ("succeeded", "cancelled")),
               "tenant": TENANT, "batch": arg(500, 1), "dry_run": arg(False, True),
               "pause_s": st.one_of(st.just(OMIT), st.sampled_from(
                   [0, None, -1, 1e300, float("nan"), "x", [], True]))}),
    "jobs": ([], {"status": arg(None, "waiting", "dead"), "kind": arg(None, "k"),
                  "tenant": TENANT, "limit": arg(100, 1)}),
    "show": ([JOB], {"tenant": TENANT}),
    "explain": ([JOB], {"tenant": TENANT}),
    "workers": ([], {}),
    "status": ([], {"tenant": TENANT}),
}
# Schedules (tests/test_schedules_arguments.py runs these alone, many more times).
SCHEDULE_METHODS: dict[str, tuple[list[st.SearchStrategy[Any]],
                                  dict[str, st.SearchStrategy[Any]]]] = {
    "add_schedule": ([arg("s1", "s2", optional=False), arg("k", optional=False)],
                     {"cron": arg(None, "0 2 * * *", "*/15 * * * *", "61 * * * *"),
                      "tz": arg(None, "Europe/Berlin", "America/New_York", "Mars/Base"),
                      "every": arg(None, "15m", 60, "0", "-1h", 0.5),
                      "payload": arg(None, {"a": 1}, "{}"), "priority": arg(None, "P2"),
                      "role": arg(None, "gpu"), "tenant": TENANT,
                      "max_attempts": arg(None, 2), "window": arg(None, "4h", 0, "-1m"),
                      "catchup": arg(None, "skip", "latest", "all:3", "all:0", "all"),
                      "overlap": arg(None, "allow", "skip", "queue_one", "never")}),
    "schedules": ([], {}),
    "pause_schedule": ([arg("s1", "s2", optional=False)], {}),
    "resume_schedule": ([arg("s1", "s2", optional=False)], {}),
    "remove_schedule": ([arg("s1", "s2", optional=False)], {}),
    "tick_schedules": ([], {"limit": arg(100, 1)}),
}
METHODS.update(SCHEDULE_METHODS)
METHODS.update({
    "has_feature": ([arg("artifacts", "schedules", optional=False)], {}),
    "limits": ([], {}),
    "set_limit": ([arg("k", "j", optional=False), arg(1, 2, 0, optional=False)],
                  {"key": arg(None, "model")}),
    "remove_limit": ([arg("k", "j", optional=False)], {}),
    "claimed_by": ([JOB, WORKER, EPOCH], {"tenant": TENANT}),
    "completed_by": ([JOB, WORKER, EPOCH], {"tenant": TENANT}),
    "claimed_next": ([JOB, WORKER, EPOCH], {"tenant": TENANT}),
    "failed_by": ([JOB, WORKER, EPOCH], {"reason": arg("failed", "worker_shutdown",
                                                      optional=False),
                                         "error": arg("boom", optional=False),
                                         "permanent": arg(False, True), "tenant": TENANT}),
})
#: The artifact methods that take no file: fuzzed on a database with the feature installed.
ARTIFACT_METHODS: dict[str, tuple[list[st.SearchStrategy[Any]],
                                  dict[str, st.SearchStrategy[Any]]]] = {
    "artifacts": ([arg(None, 1, 2)], {"all_states": arg(False, True), "tenant": TENANT}),
    "verify_artifacts": ([arg(None, 1, 2)], {}),
    "gc_artifacts": ([], {"grace_s": arg(0, 3600), "dry_run": arg(True)}),
}
#: Public methods the drawn calls leave out, and why.
NOT_DRAWN = {
    "close": "no arguments; a closed coordinator's refusals have their own test",
    "stop_checks": "no arguments", "resume_checks": "no arguments",
    "put_artifact": "reads a file or stream: tests/test_artifacts_rules.py",
    "get_artifact": "writes a file: tests/test_artifacts_rules.py",
}


@st.composite
def calls(draw: Any, methods: dict[str, Any] | None = None
          ) -> tuple[str, list[Any], dict[str, Any]]:
    """A call of one of `methods` (name: (positional strategies, keyword strategies);
    METHODS when not given)."""
    methods = METHODS if methods is None else methods
    method = draw(st.sampled_from(sorted(methods)))
    positional, keywords = methods[method]
    args = [draw(s) for s in positional]
    while args and args[-1] is OMIT:
        args.pop()
    if OMIT in args:  # a left-out positional in the middle: use None there instead
        args = [None if a is OMIT else a for a in args]
    kwargs = {k: v for k, v in ((k, draw(s)) for k, s in keywords.items()) if v is not OMIT}
    return method, args, kwargs


def check_calls(subject: Any, coord: Coordinator, methods: dict[str, Any], examples: int,
                *, refusals: tuple[type[JobcoordError], ...] = (JobcoordError,),
                unchanged_on: tuple[type[JobcoordError], ...] = (InvalidInput,)) -> None:
    """Call `subject`'s methods with drawn arguments: each works or raises one of
    `refusals`, and one of `unchanged_on` leaves `coord`'s database as it was."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(call=calls(methods))
    def check_one(call: tuple[str, list[Any], dict[str, Any]]) -> None:
        method, args, kwargs = call
        before = dump(coord)
        try:
            getattr(subject, method)(*args, **kwargs)
        except JobcoordError as e:
            assert isinstance(e, refusals), f"{method}: {type(e).__name__}: {e}"
            if isinstance(e, unchanged_on):
                assert dump(coord) == before, f"refused {method} changed the database"

    check_one()


def _setup(coord: Coordinator) -> None:
    for kind in ("k", "j", "k"):
        coord.enqueue(kind, {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.claim("w1", lease_s=600)


def _run(coord: Coordinator, examples: int) -> None:
    _setup(coord)
    check_calls(coord, coord, METHODS, examples)


def test_every_public_method_either_works_or_refuses_input_sqlite(sqlite_target: Any) -> None:
    with Coordinator.open(sqlite_target) as coord:
        _run(coord, 1500)


def test_every_public_artifact_method_either_works_or_refuses_input(target: Any,
                                                                     tmp_path: Path) -> None:
    from tests.test_artifacts_rules import install

    install(target)
    with Coordinator.open(target) as coord:
        coord.artifacts_dir = str(tmp_path / "store")
        _setup(coord)
        check_calls(coord, coord, ARTIFACT_METHODS, 300)


def test_the_drawn_calls_cover_every_public_method() -> None:
    """A public method added without a place here was never called with odd arguments
    (has_feature([]) raised TypeError)."""
    public = {name for name, value in vars(Coordinator).items()
              if not name.startswith("_") and callable(value)}
    drawn = set(METHODS) | set(ARTIFACT_METHODS)
    assert public - drawn - set(NOT_DRAWN) == set()
    assert (drawn | set(NOT_DRAWN)) - public == set()


def test_every_public_method_either_works_or_refuses_input_postgresql(
        request: pytest.FixtureRequest) -> None:
    from tests.conftest import fresh_pg

    with fresh_pg(request.getfixturevalue("pg_template")) as target, \
            Coordinator.open(target) as coord:
        _run(coord, 300)


# --- the specific reproductions ------------------------------------------------------------


def test_an_empty_kinds_list_is_invalid_input_everywhere(coord: Coordinator) -> None:
    coord.enqueue("k", {})
    before = dump(coord)
    for call in (lambda: coord.claim("w1", kinds=[]),
                 lambda: coord.heartbeat("w1", kinds=[]),
                 lambda: coord.complete_and_claim(1, "w1", 1, kinds=[])):
        with pytest.raises(InvalidInput) as caught:
            call()
        assert "give at least one kind, or leave it out to take any kind" in caught.value.message
    assert dump(coord) == before


def test_a_worker_row_with_no_kinds_claims_nothing_with_a_reason(coord: Coordinator) -> None:
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    coord.db.write(lambda conn: sql(conn, "UPDATE workers SET kinds_json = '[]'"))
    got = coord.claim("w1")
    assert got["job"] is None and "no kinds" in got["detail"]


def test_a_bare_string_is_one_element_in_every_method(coord: Coordinator) -> None:
    coord.enqueue("abc", {}, role="gpu")
    assert coord.heartbeat("w1", roles="gpu", kinds="abc", readings=IDLE_ON_AC
                           )["roles"] == ["gpu"]
    assert coord.workers()["workers"][0]["kinds"] == ["abc"]
    got = coord.claim("w1", kinds="abc")
    assert got["job"] is not None and got["job"]["kind"] == "abc"
    coord.complete(got["job"]["job_id"], "w1", 1, {})
    out = coord.prune(0, statuses="succeeded", dry_run=True)
    assert out["statuses"] == ["succeeded"]


class _Lying(str):
    """Text whose equality lies: equal to `claims` and to nothing else, itself included."""

    claims = ""

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self.claims, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _lying(text: str, claims: str) -> str:
    cls = type("Lying", (_Lying,), {"claims": claims})
    return cls(text)


def test_text_whose_equality_lies_is_judged_by_its_characters(coord: Coordinator) -> None:
    """A str subclass equal to what it is not passed the checks and stored its own
    characters: `reconcile(job, "running")` said ok and left a running job with no lease;
    `fail(reason="completed")` recorded a failed attempt as completed. Text is judged, and
    stored, as the plain string its characters make."""
    coord.heartbeat("w")
    job = coord.enqueue("k", {})["job_id"]
    epoch = coord.claim("w")["lease"]["epoch"]
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.fail(job, "w", epoch, "boom", reason=_lying("completed", "failed"))
    assert dump(coord) == before
    coord.mark_effect(job, "w", epoch)
    coord.fail(job, "w", epoch, "boom")
    assert coord.show(job)["job"]["status"] == "unknown"
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.reconcile(job, _lying("running", "dead"), "checked")
    assert dump(coord) == before
    with pytest.raises(InvalidInput):
        coord.add_schedule("s", "k", every=60, overlap=_lying("sometimes", "skip"))
    with pytest.raises(InvalidInput):
        coord.add_schedule("s", "k", every=60, catchup=_lying("never", "skip"))
    assert dump(coord) == before


def test_a_gpu_reading_with_a_key_that_is_not_text_is_invalid_input(coord: Coordinator
                                                                     ) -> None:
    """`heartbeat(readings={"gpus": [{1: 2}]})` raised a bare TypeError (joining the
    unknown keys into the message)."""
    before = dump(coord)
    for gpu in ({1: 2}, {None: 1}, {"a": 1, 1: 2}, {(1, 2): 3}):
        with pytest.raises(InvalidInput) as caught:
            coord.heartbeat("w", readings={"gpus": [gpu]})
        assert "readings" in caught.value.message, caught.value.message
    assert dump(coord) == before


def test_a_priority_too_large_to_print_is_invalid_input(coord: Coordinator) -> None:
    before = dump(coord)
    for priority in (10**5000, -(10**5000), 4, "P4", -1):
        with pytest.raises(InvalidInput) as caught:
            coord.enqueue("k", priority=priority)
        assert "priority" in caught.value.message
        # The value refused is named when it can be printed (it was left out for all).
        if not isinstance(priority, int) or abs(priority) < 100:
            assert str(priority).lstrip("P") in caught.value.message, caught.value.message
    assert dump(coord) == before


def test_a_priority_of_more_digits_than_python_converts_is_invalid_input(
        coord: Coordinator) -> None:
    """priority="9" * 5000 raised a bare ValueError (Python converts at most 4300 digits)
    from enqueue, enqueue_many and add_schedule."""
    before = dump(coord)
    for text in ("9" * 5000, "P" + "9" * 5000, "0" * 5000 + "1"):
        for call in (lambda p: coord.enqueue("k", {}, priority=p),
                     lambda p: coord.enqueue_many([{"kind": "k", "priority": p}]),
                     lambda p: coord.enqueue_many([JobSpec("k", {}, priority=p)]),
                     lambda p: coord.add_schedule("s", "k", every="1m", priority=p)):
            with pytest.raises(InvalidInput, match="priority"):
                call(text)
    assert dump(coord) == before


class _KeysLie(Mapping[str, Any]):
    """A mapping whose keys are not the ones it holds."""

    def __init__(self, **held: Any) -> None:
        self.held = held

    def __getitem__(self, key: str) -> Any:
        return self.held[key]

    def __iter__(self) -> Iterator[str]:
        return iter(["zzz"])

    def __len__(self) -> int:
        return 1


def test_a_mapping_whose_keys_lie_is_invalid_input(coord: Coordinator) -> None:
    """A mapping whose keys() names a key it does not hold raised a bare KeyError out of
    complete(provenance=...), heartbeat(readings=...) and enqueue_many's mapping specs."""
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    job = coord.enqueue("k")["job_id"]
    epoch = coord.claim("w1")["lease"]["epoch"]
    before = dump(coord)
    for call in (lambda: coord.complete(job, "w1", epoch, {}, provenance=_KeysLie(a=1)),
                 lambda: coord.complete_and_claim(job, "w1", epoch, {},
                                                  provenance=_KeysLie(a=1)),
                 lambda: coord.heartbeat("w1", readings=_KeysLie(memory_used_pct=1)),
                 lambda: coord.enqueue_many([_KeysLie(kind="k")]),
                 lambda: coord.enqueue("k", needs=_KeysLie(ram_mb=1))):
        with pytest.raises(InvalidInput):
            call()
    assert dump(coord) == before


class _AlwaysInRange(int):
    """An int whose comparisons say it is within any bound."""

    def __le__(self, other: object) -> bool:
        return True

    def __ge__(self, other: object) -> bool:
        return True

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


def test_a_number_whose_comparisons_lie_is_judged_by_its_value(coord: Coordinator) -> None:
    """An int subclass answering every bound with "within" passed the range checks, then
    failed as a bare OverflowError where the driver bound it. It is judged, and stored, as
    the plain int its value is."""
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    job = coord.enqueue("k")["job_id"]
    epoch = coord.claim("w1")["lease"]["epoch"]
    huge = _AlwaysInRange(10**30)
    before = dump(coord)
    for call in (lambda: coord.enqueue("k", priority=huge),
                 lambda: coord.enqueue("k", max_attempts=huge),
                 lambda: coord.enqueue_many([{"kind": "k", "max_attempts": huge}]),
                 lambda: coord.show(huge),
                 lambda: coord.complete(huge, "w1", epoch, {}),
                 lambda: coord.complete(job, "w1", huge, {}),
                 lambda: coord.renew(job, "w1", huge),
                 lambda: coord.claim_many("w1", huge),
                 lambda: coord.set_limit("k", huge)):
        with pytest.raises(InvalidInput):
            call()
    assert dump(coord) == before
    made = coord.enqueue("k", priority=_AlwaysInRange(2), max_attempts=_AlwaysInRange(5))
    shown = coord.show(made["job_id"])["job"]
    assert (shown["priority"], shown["max_attempts"]) == (2, 5)


def test_a_number_out_of_range_is_named_in_the_refusal(coord: Coordinator) -> None:
    """`claim_many("w", 1001)` said only "n: is outside 1..1000": the value refused is named
    when it can be printed, and a huge one by its size (Python cannot print it)."""
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    for n, shown in ((0, "0 is outside"), (1001, "1001 is outside"),
                     (-(2**200), "a 51-hex-digit number is outside")):
        with pytest.raises(InvalidInput) as caught:
            coord.claim_many("w1", n)
        assert shown in caught.value.message, caught.value.message
    with pytest.raises(InvalidInput) as caught:
        coord.claim("w1", lease_s=10**5000)
    assert "hex-digit number is outside" in caught.value.message


def test_a_duration_out_of_range_names_the_same_range_whatever_its_type(
        coord: Coordinator) -> None:
    """A lease of -1 said "outside 0..43200 seconds" (0 allowed) while a lease of 0 said
    "outside (0, 43200]": every refusal names the range that is checked."""
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    for lease in (-1, 0, -0.5, "-1", 43201, 10**30):
        for call, args in ((coord.claim, ("w1",)), (coord.claim_many, ("w1", 1))):
            with pytest.raises(InvalidInput) as caught:
                call(*args, lease_s=lease)
            assert "is outside (0, 43200] seconds" in caught.value.message, (
                lease, caught.value.message)
    assert dump(coord) == before


def test_a_duration_just_past_its_bound_is_named_as_given_not_rounded_onto_it(
        coord: Coordinator) -> None:
    """A lease of 43200.00000000001 s (just past the limit) was refused as "43200 is outside
    (0, 43200] seconds": rounded to 15 digits, the value named was the bound itself."""
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    just_past = 43200.00000000001
    with pytest.raises(InvalidInput) as caught:
        coord.claim("w1", lease_s=just_past)
    assert caught.value.message.startswith(f"lease: {just_past!r} is outside"), (
        caught.value.message)
    with pytest.raises(InvalidInput) as caught:  # and a value with few digits, as before
        coord.claim("w1", lease_s=-0.5)
    assert caught.value.message.startswith("lease: -0.5 is outside"), caught.value.message


#: Yes/no arguments given what only looks like an answer: `prune(dry_run="false")` counted
#: (a non-empty string is true) while `dry_run=0` deleted; `open(migrate="no")` migrated.
NOT_A_FLAG = ("false", "no", 0, 1, None, 1.0)


def test_a_yes_no_argument_that_is_not_true_or_false_is_invalid_input(
        coord: Coordinator, clock: Any) -> None:
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    done = coord.enqueue("k")["job_id"]
    got = coord.claim("w1")
    coord.complete(done, "w1", got["lease"]["epoch"], {})
    coord.enqueue("k")
    clock.tick(3600)
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    calls = {
        "prune": lambda b: coord.prune(1, dry_run=b),
        "claim": lambda b: coord.claim("w1", worker_view=b),
        "claim_many": lambda b: coord.claim_many("w1", 1, worker_view=b),
        "complete_and_claim": lambda b: coord.complete_and_claim(
            done, "w1", got["lease"]["epoch"], {}, worker_view=b),
        "open.verify": lambda b: Coordinator.open(coord.db.target, verify=b),
        "open.migrate": lambda b: Coordinator.open(coord.db.target, migrate=b),
        "Coordinator": lambda b: Coordinator(coord.db, verify=b),
    }
    before = dump(coord)
    for name, call in calls.items():
        for value in NOT_A_FLAG:
            with pytest.raises(InvalidInput) as caught:
                call(value)
            assert "must be true or false" in caught.value.message, (name, value)
    assert dump(coord) == before


def test_a_coordinator_opens_a_sqlite_path_given_as_a_path_object(tmp_path: Path) -> None:
    """The README says open takes a SQLite path: a pathlib.Path was refused with "give a
    SQLite path". A path in bytes is refused, saying to give it as text."""
    where = tmp_path / "dir with space#?%" / "q.db"
    where.parent.mkdir()
    with Coordinator.open(where, migrate=True) as c:
        made = c.enqueue("k")["job_id"]
    with Coordinator.open(where) as c:
        assert c.show(made)["job"]["job_id"] == made
    with pytest.raises(InvalidInput, match="as text"):
        Coordinator.open(bytes(where))


def test_a_provenance_that_is_not_an_object_is_invalid_input_in_a_batch_too(
        coord: Coordinator) -> None:
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    got = coord.claim("w1")
    before = dump(coord)
    for provenance in (True, 1, "x", [1]):
        with pytest.raises(InvalidInput):
            coord.complete(got["job"]["job_id"], "w1", 1, {}, provenance=provenance)
        with pytest.raises(InvalidInput):
            coord.complete_many([{"job_id": got["job"]["job_id"], "worker_id": "w1",
                                  "epoch": 1, "provenance": provenance}])
    assert dump(coord) == before


def test_a_provenance_that_is_not_an_object_is_invalid_input(coord: Coordinator) -> None:
    coord.enqueue("k", {})
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    job = coord.claim("w1")["job"]
    before = dump(coord)
    for bad in (True, 5, [1], ("a",)):
        with pytest.raises(InvalidInput) as caught:
            coord.complete(job["job_id"], "w1", 1, {}, provenance=bad)
        assert caught.value.details.get("field") == "provenance"
    assert dump(coord) == before


def test_a_value_that_contains_itself_is_invalid_input_everywhere(coord: Coordinator) -> None:
    """A payload, result or reading that contains itself cannot be written as JSON: it is
    refused as invalid input at once (the check that looks for over-long integers once walked
    such a value forever)."""
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    in_list: list[Any] = [1]
    in_list.append({"back": in_list})
    before = dump(coord)
    for bad in (cyclic, {"outer": in_list}):
        with pytest.raises(InvalidInput) as caught:
            coord.enqueue("k", bad)
        assert "payload" in caught.value.message
        with pytest.raises(InvalidInput):
            coord.enqueue_many([{"kind": "k", "payload": bad}])
    assert dump(coord) == before
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    job = coord.claim("w1")["job"]
    before = dump(coord)
    with pytest.raises(InvalidInput):
        coord.complete(job["job_id"], "w1", 1, cyclic)
    assert dump(coord) == before


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_an_argument_nested_past_pythons_recursion_limit_is_invalid_input(
        coord: Coordinator) -> None:
    """A job id, number or name nested 5,000 lists deep raised RecursionError (writing the
    refusal's text showed the value whole) instead of InvalidInput."""
    deep, cyclic = _nested(5000), [1]
    cyclic.append(cyclic)
    coord.enqueue("k")
    coord.heartbeat("w1", readings=IDLE_ON_AC)
    before = dump(coord)
    calls = {
        "show": lambda x: coord.show(x),
        "complete epoch": lambda x: coord.complete(1, "w1", x, {}),
        "reap limit": lambda x: coord.reap(limit=x),
        "jobs limit": lambda x: coord.jobs(limit=x),
        "enqueue priority": lambda x: coord.enqueue("k", priority=x),
        "enqueue max_attempts": lambda x: coord.enqueue("k", max_attempts=x),
        "enqueue needs": lambda x: coord.enqueue("k", needs={"gpu": x}),
        "enqueue kind": lambda x: coord.enqueue(x),
        "claim_many n": lambda x: coord.claim_many("w1", x),
        "prune batch": lambda x: coord.prune(1, batch=x),
        "set_limit concurrency": lambda x: coord.set_limit("k", x),
        "add_schedule catchup": lambda x: coord.add_schedule("s", "k", every="1h",
                                                              catchup=x),
        "add_schedule overlap": lambda x: coord.add_schedule("s", "k", every="1h",
                                                              overlap=x),
    }
    for name, call in calls.items():
        for bad in (deep, cyclic):
            with pytest.raises(InvalidInput) as caught:
                call(bad)
            assert len(caught.value.message) < 1000, (name, caught.value.message[:200])
    assert dump(coord) == before


@pytest.mark.parametrize("db", ["q.db", None, 3, object()])
def test_a_coordinator_built_from_anything_but_a_database_is_invalid_input(db: Any) -> None:
    """Coordinator(x) takes an open Database; a path, Target or anything else is told to use
    Coordinator.open, not met with an AttributeError from deep inside."""
    with pytest.raises(InvalidInput, match=r"Coordinator\.open"):
        Coordinator(db)


def test_a_coordinator_given_a_policy_that_is_not_a_policy_is_invalid_input(
        coord: Coordinator) -> None:
    with pytest.raises(InvalidInput, match="policy"):
        Coordinator(coord.db, {"retry_base_s": 5}, verify=False)  # type: ignore[arg-type]


def _open_connections(target: Any) -> int:
    """This process's connections to the target: handles on the SQLite file, or TCP
    connections to the PostgreSQL server's port."""
    import psutil

    me = psutil.Process()
    if target.sqlite_path:
        return sum(1 for f in me.open_files() if f.path == target.sqlite_path)
    from sqlalchemy.engine import make_url

    port = make_url(target.url).port or 5432
    return sum(1 for c in me.net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == "ESTABLISHED")


def test_close_while_other_threads_run_calls_leaves_no_connection_open(target: Any) -> None:
    """A connection a thread was using as `close()` ran went back to be kept after it, and
    nothing closed it for the process's life (12 handles on the SQLite file, 5 server
    connections). Closed means closed, whatever the other threads were doing."""
    import threading
    import time

    before = _open_connections(target)
    c = Coordinator.open(target)
    c.enqueue("k", {})
    going = threading.Event()

    def busy() -> None:
        going.set()
        while True:
            try:
                c.status()
                c.jobs(limit=50)
                c.enqueue("k", {})
            except InvalidInput as e:
                assert e.code == "coordinator_closed"
                return

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        going.wait(10)
        time.sleep(0.5)
        assert _open_connections(target) > before
    finally:
        c.close()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert _open_connections(target) == before


def test_a_closed_coordinator_refuses_every_call_instead_of_reopening(target: Any) -> None:
    c = Coordinator.open(target)
    c.enqueue("k", {})
    c.close()
    for call in (lambda: c.enqueue("k", {}), lambda: c.status(), lambda: c.reap()):
        with pytest.raises(InvalidInput) as closed:
            call()
        assert closed.value.code == "coordinator_closed"
    c.close()  # closing again is harmless
    with Coordinator.open(target) as again:
        assert again.status()["jobs"]["waiting"] == 1

"""A submission handed over to a waiting worker: the job's insert and that worker's claim in
one write transaction, one commit where the claim would otherwise need its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from .. import validate as v
from ..clock import now_us
from ..errors import JobcoordError
from ..tokens import live_identity
from .claim import claim_in
from .common import DEFAULT_TENANT, Context, lease_us
from .items import NO_KINDS
from .submit import JobSpec, check_spec, insert


class Claimant(NamedTuple):
    """Whose claim follows the insert: a worker's claim exactly as it would make it itself."""

    worker_id: str
    lease_s: float | None = None
    kinds: Sequence[str] | None = None
    tenant: str | None = None
    #: The hash of the API token the claim is made for: made only if that token is live
    #: (not revoked) in this very transaction, as its own request would be looked up.
    token_hash: str | None = None


def enqueue_and_claim(ctx: Context, kind: str, payload: Any = None, *,
                      claimant: Claimant, priority: int | str | None = None,
                      role: str | None = None, tenant: str = DEFAULT_TENANT,
                      key: str | None = None, max_attempts: int | None = None,
                      deadline_s: float | None = None, delay_s: float = 0.0,
                      needs: Mapping[str, int] | str | None = None) -> dict[str, Any]:
    """Accept a job exactly as `enqueue` does, then, in the same write transaction, make
    `claimant`'s claim (the core's `claim_in`: its heartbeat, gates, roles, kinds, limits,
    tenant and order; the job it takes is the claim's first eligible one, not necessarily
    this one). The claim runs in a savepoint: a claim that takes nothing, or raises, is
    rolled back to it (no refusal is recorded for it) and the submission commits alone.

    Returns enqueue's answer plus `claimed`: the claim's answer ({"job", "lease"}) when it
    took a job, else None. A submission that made no new job (its idempotency key's job
    exists already) claims nothing."""
    spec = JobSpec(kind, payload, priority, role, tenant, key, max_attempts, deadline_s,
                   delay_s, needs)
    checked = check_spec(ctx, spec)
    try:
        worker = v.name(claimant.worker_id, "worker", max_len=v.MAX_WORKER_ID)
        lease = lease_us(ctx, claimant.lease_s)
        kinds = (None if claimant.kinds is None
                 else v.names(claimant.kinds, "kind", empty=NO_KINDS))
        bound = v.optional_name(claimant.tenant, "tenant")
    except JobcoordError:
        worker = None  # a claim its own worker could not make: none is made here

    def _do(conn: Connection) -> dict[str, Any] | JobcoordError:
        now = now_us()
        got = insert(ctx, conn, checked, now)
        if isinstance(got, JobcoordError) or not got["created"] or worker is None \
                or not _token_live(ctx, conn, claimant.token_hash):
            return got if isinstance(got, JobcoordError) else {**got, "claimed": None}
        return {**got, "claimed": _claim_or_nothing(ctx, conn, worker, lease, kinds, now,
                                                    bound)}

    return ctx.db.write(_do, "enqueue_and_claim")


def _token_live(ctx: Context, conn: Connection, token_hash: str | None) -> bool:
    """No token named, or the named one exists and is not revoked."""
    return token_hash is None or live_identity(ctx.db, conn, token_hash) is not None


def _claim_or_nothing(ctx: Context, conn: Connection, worker: str, lease: int,
                      kinds: Sequence[str] | None, now: int, tenant: str | None
                      ) -> dict[str, Any] | None:
    """`claim_in` in a savepoint of the open transaction: its answer when it took a job;
    otherwise None, with everything it wrote rolled back."""
    raw = conn.connection.driver_connection
    assert raw is not None
    raw.execute("SAVEPOINT jobcoord_handover")
    try:
        got = claim_in(ctx, conn, worker, lease, kinds, now, tenant)
    except Exception:
        # The submission must not depend on the claim: undo the claim alone. (If even the
        # rollback fails, the connection is gone and the whole transaction retries.)
        raw.execute("ROLLBACK TO SAVEPOINT jobcoord_handover")
        raw.execute("RELEASE SAVEPOINT jobcoord_handover")
        return None
    if got["job"] is None:
        raw.execute("ROLLBACK TO SAVEPOINT jobcoord_handover")
        raw.execute("RELEASE SAVEPOINT jobcoord_handover")
        return None
    raw.execute("RELEASE SAVEPOINT jobcoord_handover")
    return got

"""The statements of the features beside the queue -- the HTTP server's tokens and the
artifact store -- built from `schema.py`'s tables like the core's (kept apart so a plain
claim or complete never builds them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    column,
    exists,
    func,
    insert,
    null,
    select,
    table,
    update,
)

from ..schema import artifacts, jobs, leases, tokens
from .statements import SQL, const

P = bindparam
T, A, J, L = tokens.c, artifacts.c, jobs.c, leases.c

# --- tokens ---------------------------------------------------------------------------------

TOKEN_NAMED = SQL(select(const(1)).where(T.name == P("name")))
INSERT_TOKEN = SQL(insert(tokens).values(
    name=P("name"), token_hash=P("hash"), role=P("role"), tenant=P("tenant"),
    worker_id=P("worker"), created_at=P("now"), revoked_at=null()))
ALL_TOKENS = SQL(select(T.name, T.role, T.tenant, T.worker_id, T.created_at, T.revoked_at)
                 .order_by(T.name))
#: The live worker tokens acting as worker :worker, with their tenant bindings.
LIVE_TOKENS_OF_WORKER = SQL(select(T.name, T.tenant).where(
    T.worker_id == P("worker"), T.revoked_at.is_(None)).order_by(T.name))
TOKEN_REVOKED_AT = SQL(select(T.revoked_at).where(T.name == P("name")))
REVOKE_TOKEN = SQL(update(tokens).where(T.name == P("name"), T.revoked_at.is_(None))
                   .values(revoked_at=P("now")))
#: A token by its hash, for the API's authentication.
TOKEN_BY_HASH = SQL(select(T.name, T.role, T.tenant, T.worker_id, T.token_hash, T.revoked_at)
                    .where(T.token_hash == P("hash")))
#: A token by its hash, for the dashboard's login.
# --- artifacts ------------------------------------------------------------------------------

#: Every column of an artifact row, in the order `rules._row` reads them.
ARTIFACT_COLUMNS = (A.artifact_id, A.job_id, A.epoch, A.name, A.digest, A.size, A.media_type,
                    A.state, A.reason, A.location, A.created_at, A.verified_at)
LIVE_STAGE = A.state.in_([const("staged"), const("verified")])
#: No lease of the stage's attempt any more: the attempt is over.
ATTEMPT_OVER = ~exists(select(const(1)).select_from(leases).where(
    L.job_id == A.job_id, L.epoch == A.epoch))

JOB_KIND = SQL(select(J.kind).where(J.job_id == P("j")))
#: Who holds the job's lease, at which epoch, and the job's tenant (no row: no lease).
LEASE_HOLDER = SQL(select(L.worker_id, L.epoch, J.tenant, L.expires_at)
                   .select_from(jobs.join(leases, L.job_id == J.job_id))
                   .where(J.job_id == P("j")))
RESTAGE = SQL(update(artifacts).where(A.job_id == P("j"), A.epoch == P("e"), A.name == P("n"))
              .values(digest=P("d"), size=P("s"), media_type=P("m"), location=P("l"),
                      state=const("staged"), reason=null(), created_at=P("now"),
                      verified_at=null()))
STAGE = SQL(insert(artifacts).values(
    job_id=P("j"), epoch=P("e"), name=P("n"), digest=P("d"), size=P("s"), media_type=P("m"),
    state=const("staged"), location=P("l"), created_at=P("now")))
ATTEMPT_STAGES = SQL(
    select(A.artifact_id, A.name, A.digest, A.size, A.media_type)
    .where(A.job_id == P("j"), A.epoch == P("e"), LIVE_STAGE).order_by(A.name))
REJECT = SQL(update(artifacts).where(A.artifact_id == P("a"))
             .values(state=const("rejected"), reason=P("r")))
ACCEPT = SQL(update(artifacts).where(A.artifact_id == P("a"), A.job_id == P("j"),
                                     A.epoch == P("e"), A.digest == P("d"), LIVE_STAGE)
             .values(state=const("accepted"), verified_at=P("v")))
ACCEPTED_NAMED = SQL(select(*ARTIFACT_COLUMNS).where(
    A.job_id == P("j"), A.name == P("n"), A.state == const("accepted")))
#: The objects the live rows name, with their sizes (a backup's manifest).
LIVE_OBJECTS = SQL(select(A.digest, A.size).where(A.state != const("rejected")))
_REFERENCED = select(A.digest).distinct().where(A.state != const("rejected"))
REFERENCED_DIGESTS = SQL(_REFERENCED)
#: How many of a database's objects a look for them in a store takes.
OBJECTS_LOOKED_FOR = 32
#: Some of them (none: the rows name no object), for a look at whether a store is theirs.
SOME_REFERENCED = SQL(_REFERENCED.limit(const(OBJECTS_LOOKED_FOR)))
#: The same once gc has rejected the stages of attempts that are over (its dry run).
REFERENCED_AFTER_END = SQL(select(A.digest).distinct().where(
    A.state != const("rejected"), ~and_(LIVE_STAGE, ATTEMPT_OVER)))
STALE_STAGES = SQL(
    select(A.artifact_id, A.job_id, A.epoch, A.name, A.digest, J.status)
    .select_from(artifacts.join(jobs, J.job_id == A.job_id)).where(LIVE_STAGE, ATTEMPT_OVER))
END_STALE = SQL(update(artifacts).where(LIVE_STAGE, ATTEMPT_OVER)
                .values(state=const("rejected"), reason=const("attempt_ended")))
ARTIFACT_TOTALS = SQL(select(func.count(), func.coalesce(func.sum(A.size), const(0))))
#: The same before the artifacts' a0002 revision, whose column was `size_bytes`.
_A0001 = table("artifacts", column("size_bytes"))
ARTIFACT_TOTALS_A0001 = SQL(
    select(func.count(), func.coalesce(func.sum(_A0001.c.size_bytes), const(0)))
    .select_from(_A0001))

_LISTS: dict[tuple[bool, bool, bool], SQL] = {}


def artifact_list(by_job: bool, by_tenant: bool, all_states: bool) -> SQL:
    """Artifacts in (job, name, epoch) order: of one job (:j), of one tenant (:t), accepted
    only or every stage; one statement per shape."""
    shape = (by_job, by_tenant, all_states)
    stmt = _LISTS.get(shape)
    if stmt is None:
        where: list[Any] = []
        if by_job:
            where.append(A.job_id == P("j"))
        if by_tenant:
            where.append(J.tenant == P("t"))
        if not all_states:
            where.append(A.state == const("accepted"))
        stmt = _LISTS[shape] = SQL(
            select(*ARTIFACT_COLUMNS).select_from(artifacts.join(jobs, J.job_id == A.job_id))
            .where(*where).order_by(A.job_id, A.name, A.epoch))
    return stmt


JOB_EXISTS = SQL(select(const(1)).where(J.job_id == P("j")))
JOB_OF_TENANT_EXISTS = SQL(select(const(1)).where(J.job_id == P("j"), J.tenant == P("t")))

"""The statements of schedules (core revision c0005), built from the Core tables of
`schema.py` like every other statement in `statements.py` (kept apart only so neither
module grows past what one can read)."""

from __future__ import annotations

from sqlalchemy import delete, select, update

from ..schema import jobs, schedule_fires, schedules
from .statements import SQL, J, P, const

S, F = schedules.c, schedule_fires.c

#: A schedule's columns, in this order, wherever a whole schedule is read.
SCHEDULE_COLUMNS = (S.schedule_id, S.name, S.tenant, S.kind, S.required_role, S.priority,
                    S.payload_json, S.max_attempts, S.cron, S.tz, S.every_us, S.window_us,
                    S.catchup, S.catchup_max, S.overlap, S.paused, S.next_slot_at, S.due_at,
                    S.queued_slot_at, S.created_at, S.updated_at)

#: Their names, for reading a row (a tuple) by name.
SCHEDULE_NAMES = tuple(c.name for c in SCHEDULE_COLUMNS)

INSERT_SCHEDULE = SQL(
    lambda insert: insert(schedules).values(
        name=P("name"), tenant=P("tenant"), kind=P("kind"), required_role=P("role"),
        priority=P("priority"), payload_json=P("payload"), max_attempts=P("max_attempts"),
        cron=P("cron"), tz=P("tz"), every_us=P("every_us"), window_us=P("window_us"),
        catchup=P("catchup"), catchup_max=P("catchup_max"), overlap=P("overlap"),
        paused=P("paused"), next_slot_at=P("next_slot_at"), due_at=P("due_at"),
        created_at=P("now"), updated_at=P("now"))
    # Two adds of one name at once: the later one inserts nothing and is told so.
    .on_conflict_do_nothing(index_elements=[S.name])
    .returning(S.schedule_id))
SCHEDULE_BY_NAME = SQL(select(*SCHEDULE_COLUMNS).where(S.name == P("name")))
# Held until commit before a pause, resume or removal decides on it (PostgreSQL; SQLite's
# BEGIN IMMEDIATE already holds the only write lock).
SCHEDULE_BY_NAME_LOCKED = SQL(select(*SCHEDULE_COLUMNS).where(S.name == P("name"))
                              .with_for_update())
ALL_SCHEDULES = SQL(select(*SCHEDULE_COLUMNS).order_by(S.name))
#: The tick's one indexed read: schedules due now, each held by the ticker that reads it
#: (another ticker skips it instead of waiting, and finds it handled next time).
DUE_SCHEDULES = SQL(
    select(*SCHEDULE_COLUMNS).where(S.due_at <= P("now"))
    .order_by(S.due_at).limit(P("limit")).with_for_update(skip_locked=True))
#: The schedule a tick's earlier write left half done, if it is still due: its next write
#: goes on with it before any other schedule.
DUE_SCHEDULE_BY_ID = SQL(
    select(*SCHEDULE_COLUMNS).where(S.schedule_id == P("schedule_id"), S.due_at <= P("now"))
    .with_for_update(skip_locked=True))
ADVANCE_SCHEDULE = SQL(
    update(schedules).where(S.schedule_id == P("schedule_id"))
    .values(next_slot_at=P("next_slot_at"), due_at=P("due_at"),
            queued_slot_at=P("queued_slot_at"), updated_at=P("now")))
SET_PAUSED = SQL(
    update(schedules).where(S.schedule_id == P("schedule_id"))
    .values(paused=P("paused"), next_slot_at=P("next_slot_at"), due_at=P("due_at"),
            queued_slot_at=P("queued_slot_at"), updated_at=P("now")))
DELETE_SCHEDULE = SQL(delete(schedules).where(S.schedule_id == P("schedule_id")))

#: What is due: the tick's first read, without the write lock, whose slots it computes
#: before taking that lock.
DUE_TO_PLAN = SQL(
    select(*SCHEDULE_COLUMNS).where(S.due_at <= P("now"))
    .order_by(S.due_at).limit(P("limit")))

#: Record a handled slot; returns its id, or nothing when that slot was handled already.
INSERT_FIRE = SQL(
    lambda insert: insert(schedule_fires).values(
        schedule_id=P("schedule_id"), slot_at=P("slot_at"), outcome=P("outcome"),
        job_id=P("job_id"), at=P("now"), detail=P("detail"))
    .on_conflict_do_nothing(index_elements=[F.schedule_id, F.slot_at])
    .returning(F.fire_id))
SET_FIRE_JOB = SQL(update(schedule_fires).where(F.fire_id == P("fire_id"))
                   .values(job_id=P("job_id"), outcome=P("outcome"), at=P("now")))
FIRE_ID = SQL(select(F.fire_id).where(F.schedule_id == P("schedule_id"),
                                      F.slot_at == P("slot_at")))
SET_FIRE_OUTCOME = SQL(update(schedule_fires).where(F.fire_id == P("fire_id"))
                       .values(outcome=P("outcome"), at=P("now"), detail=P("detail")))
_FIRE_WITH_JOB = (F.slot_at, F.outcome, F.job_id, F.at, F.detail, J.status)
#: The names of a fire row read with its job's status.
FIRE_NAMES = ("slot_at", "outcome", "job_id", "at", "detail", "status")
#: A schedule's last handled slot, with its job's status now.
LAST_FIRE = SQL(
    select(*_FIRE_WITH_JOB)
    .select_from(schedule_fires.outerjoin(jobs, J.job_id == F.job_id))
    .where(F.schedule_id == P("schedule_id")).order_by(F.slot_at.desc()).limit(const(1)))
#: A schedule's last slot that made a job, with that job's status now (for overlap).
LAST_JOB_FIRE = SQL(
    select(*_FIRE_WITH_JOB)
    .select_from(schedule_fires.outerjoin(jobs, J.job_id == F.job_id))
    .where(F.schedule_id == P("schedule_id"), F.outcome == const("fired"))
    .order_by(F.slot_at.desc()).limit(const(1)))
#: The schedule and slot that made a job (none for a job enqueued by hand).
FIRE_OF_JOB = SQL(
    select(S.name, F.slot_at, S.window_us)
    .select_from(schedule_fires.join(schedules, S.schedule_id == F.schedule_id))
    .where(F.job_id == P("job_id")))

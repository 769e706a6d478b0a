-- Schedules: a row per schedule, and a row per fire (the fires log). The scheduler claims a
-- fire by moving `next_fire_at` from the value it read to the next one in one guarded update,
-- so each fire time is claimed once however many replicas poll. Ids are UUID v7 text and
-- times Unix milliseconds, the same on both backends.
CREATE TABLE schedules (
    id           TEXT PRIMARY KEY NOT NULL,
    tenant       TEXT NOT NULL,
    owner        TEXT NOT NULL,
    agent        TEXT NOT NULL,
    cron         TEXT NOT NULL,
    timezone     TEXT NOT NULL,
    input        TEXT NOT NULL,
    session_id   TEXT,
    misfire      TEXT NOT NULL,
    overlap      TEXT NOT NULL,
    max_cost_usd DOUBLE PRECISION,
    paused       BOOLEAN NOT NULL,
    next_fire_at BIGINT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX schedules_by_tenant ON schedules (tenant, id);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_fires (
    id          TEXT PRIMARY KEY NOT NULL,
    schedule_id TEXT NOT NULL,
    fire_at     BIGINT NOT NULL,
    trigger_kind TEXT NOT NULL,
    session_id  TEXT,
    run_id      TEXT,
    outcome     TEXT NOT NULL,
    error       TEXT,
    missed      BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX schedule_fires_by_schedule ON schedule_fires (schedule_id, id);

-- The job queue (store.Jobs): asynchronous bot executions waiting for, or
-- held by, a runner in some server process. A row lives from the job's
-- enqueueing to its end; its visible state is the AsyncJob resource of the
-- same id. due_at (unix milliseconds) is when a waiting job may be claimed,
-- and when a claimed job's lease ends: one index serves both, since a job
-- whose lease ended is claimable again. claim is the current claim's token
-- ('' while waiting).
CREATE TABLE jobs (
    id         TEXT    PRIMARY KEY,
    project_id TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    payload    BYTEA   NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    claim      TEXT    NOT NULL DEFAULT '',
    due_at     BIGINT  NOT NULL,
    created_at BIGINT  NOT NULL
);
CREATE INDEX jobs_due ON jobs (due_at, id);
CREATE INDEX jobs_project ON jobs (project_id);

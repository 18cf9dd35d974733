-- The change feed (Store.Subscribe): every update or deletion of a resource
-- of store.ChangeTypes adds a row here in the writing transaction, numbered
-- by change_seq. Taking change_seq's one row holds its lock until commit, so
-- numbers are given in commit order and without gaps: a reader that has seen
-- seq n has seen every change up to n.
CREATE TABLE change_seq (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq BIGINT NOT NULL
);
INSERT INTO change_seq (id, seq) VALUES (1, 0);

CREATE TABLE changes (
    seq           BIGINT PRIMARY KEY,
    resource_type TEXT   NOT NULL,
    resource_id   TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    committed_at  BIGINT NOT NULL -- unix microseconds; old rows are pruned
);

-- Shared hit counters (the auth rate limit across replicas). Unlogged: a
-- crash that loses the counts of the current minute costs nothing.
CREATE UNLOGGED TABLE rate_counts (
    key          TEXT   NOT NULL,
    window_start BIGINT NOT NULL, -- unix seconds
    hits         BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL, -- unix seconds
    PRIMARY KEY (key, window_start)
);
CREATE INDEX rate_counts_expires ON rate_counts (expires_at);

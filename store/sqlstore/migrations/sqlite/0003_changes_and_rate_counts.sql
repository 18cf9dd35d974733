-- The change feed (Store.Subscribe): every update or deletion of a resource
-- of store.ChangeTypes adds a row here in the writing transaction, numbered
-- by change_seq (SQLite's single writer gives commit order; the same SQL
-- serves PostgreSQL, where the row lock does).
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

-- Shared hit counters (the auth rate limit across processes).
CREATE TABLE rate_counts (
    key          TEXT   NOT NULL,
    window_start BIGINT NOT NULL, -- unix seconds
    hits         BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL, -- unix seconds
    PRIMARY KEY (key, window_start)
);
CREATE INDEX rate_counts_expires ON rate_counts (expires_at);

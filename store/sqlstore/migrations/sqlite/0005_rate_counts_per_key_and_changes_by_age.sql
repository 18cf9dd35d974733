-- Rate counters one row per key; the changes table indexed by age.
-- A counter's window now begins at the first hit after the previous window
-- of the same key ended (as the in-process limiter did), instead of at a
-- wall-clock minute: a burst is never split across two minutes. One row per
-- key; times in unix milliseconds.
DROP TABLE rate_counts;
CREATE TABLE rate_counts (
    key          TEXT   PRIMARY KEY,
    window_start BIGINT NOT NULL,
    hits         BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
CREATE INDEX rate_counts_expires ON rate_counts (expires_at);

-- The change feed prunes its rows by age.
CREATE INDEX changes_committed_at ON changes (committed_at);

-- The replicas running on this database (store.Replicas): each process
-- records itself every second or so under an id of its own (new at every
-- start), and which deployed modules it holds compiled, so that $deploy can
-- answer once every live replica is ready to run the new module
-- (docs/decisions.md 56).
CREATE TABLE replicas (
    id       TEXT   PRIMARY KEY,
    seen_at  BIGINT NOT NULL
);
CREATE TABLE replica_modules (
    module_hash TEXT   NOT NULL,
    replica_id  TEXT   NOT NULL,
    ready_at    BIGINT NOT NULL,
    PRIMARY KEY (module_hash, replica_id)
);
CREATE INDEX replica_modules_replica ON replica_modules (replica_id);

-- The last change (changes.seq) each replica has delivered to its caches
-- (store.Replicas.ReplicaSawChanges): a write of a Bot or Project waits
-- until every other live replica has seen it, so that none serves the old
-- one from its cache afterwards (docs/decisions.md 58).
ALTER TABLE replicas ADD COLUMN seen_seq BIGINT NOT NULL DEFAULT 0;

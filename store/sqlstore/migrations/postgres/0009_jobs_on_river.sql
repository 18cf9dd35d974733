-- Background jobs run on River (its own tables, created after these
-- migrations by the same Migrate): the hand-written queue of 0007 is gone.
DROP TABLE jobs;

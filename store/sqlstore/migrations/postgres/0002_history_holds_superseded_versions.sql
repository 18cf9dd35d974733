-- The current version of a resource now lives only in resources; history
-- keeps the versions it superseded. Drop the copies of current versions that
-- the first schema also wrote to history.
DELETE FROM resource_history
WHERE EXISTS (
    SELECT 1 FROM resources r
    WHERE r.id = resource_history.id AND r.version_id = resource_history.version_id
);

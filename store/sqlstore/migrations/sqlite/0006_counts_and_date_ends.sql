-- Counts kept by every write in the writing transaction, so that
-- _total=accurate needs no count of rows: the live resources of each type in
-- each project (every list page of the web app asks for its total), and the
-- resources of each value of a counted parameter (fhir.SearchParam.Counted:
-- one value per resource, from a small set, such as status, gender, active
-- or profile-type). A count is spread over 16 rows (shard = a hash of a
-- resource id) so that concurrent writers in one project rarely wait for the
-- same row. The rebuild of the search index that follows the migrations
-- (fhir.SearchIndexVersion changed with them) fills both.
CREATE TABLE resource_counts (
    resource_type TEXT    NOT NULL,
    project_id    TEXT    NOT NULL,
    shard         INTEGER NOT NULL,
    live          BIGINT  NOT NULL,
    PRIMARY KEY (resource_type, project_id, shard)
);

CREATE TABLE value_counts (
    resource_type TEXT    NOT NULL,
    project_id    TEXT    NOT NULL,
    code          TEXT    NOT NULL,
    value         TEXT    NOT NULL,
    shard         INTEGER NOT NULL,
    n             BIGINT  NOT NULL,
    PRIMARY KEY (resource_type, project_id, code, value, shard)
);

-- Dates compared by their end (ge, gt, eb: "since", "after") find their rows
-- by it instead of reading the parameter's whole index.
CREATE INDEX search_date_hi ON search_date (resource_type, code, hi, lo, project_id, last_updated, resource_id);

-- A resource's index rows are found by (resource_id, code) alone: the probes
-- of a search read its few rows of a parameter from the table, and the
-- narrower indexes halve the work of writing them (an AuditEvent of a bot
-- execution writes eight index rows).
DROP INDEX search_token_resource;
CREATE INDEX search_token_resource ON search_token (resource_id, code);
DROP INDEX search_string_resource;
CREATE INDEX search_string_resource ON search_string (resource_id, code);
DROP INDEX search_date_resource;
CREATE INDEX search_date_resource ON search_date (resource_id, code);
DROP INDEX search_number_resource;
CREATE INDEX search_number_resource ON search_number (resource_id, code);

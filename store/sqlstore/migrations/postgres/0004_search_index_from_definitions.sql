-- The search index follows the parameter table generated from the FHIR
-- definitions (fhir/searchparams_gen.go). Every index row carries the
-- resource's last_updated, so that a search on one value walks its index in
-- _lastUpdated order and stops at the page's end; references are stored as
-- (target type, id); numbers and quantities get their own table. The rows
-- are rebuilt from the resources by the reindex that runs after the
-- migrations (sqlstore.reindexAll), in batches.
DROP TABLE search_token;
DROP TABLE search_string;
DROP TABLE search_date;

CREATE TABLE search_token (
    resource_id   TEXT   NOT NULL,
    resource_type TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    code          TEXT   NOT NULL,
    system        TEXT COLLATE "C" NOT NULL,
    value         TEXT COLLATE "C" NOT NULL,
    last_updated  BIGINT NOT NULL
);
CREATE INDEX search_token_value ON search_token (resource_type, code, value, project_id, last_updated, resource_id);
CREATE INDEX search_token_resource ON search_token (resource_id, code, value, system);

CREATE TABLE search_string (
    resource_id   TEXT   NOT NULL,
    resource_type TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    code          TEXT   NOT NULL,
    value_norm    TEXT COLLATE "C" NOT NULL,
    value_exact   TEXT   NOT NULL,
    last_updated  BIGINT NOT NULL
);
CREATE INDEX search_string_value ON search_string (resource_type, code, value_norm, project_id, last_updated, resource_id);
CREATE INDEX search_string_resource ON search_string (resource_id, code, value_norm);

CREATE TABLE search_date (
    resource_id   TEXT   NOT NULL,
    resource_type TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    code          TEXT   NOT NULL,
    lo            BIGINT NOT NULL,
    hi            BIGINT NOT NULL,
    last_updated  BIGINT NOT NULL
);
CREATE INDEX search_date_value ON search_date (resource_type, code, lo, hi, project_id, last_updated, resource_id);
CREATE INDEX search_date_resource ON search_date (resource_id, code, lo, hi);

CREATE TABLE search_number (
    resource_id   TEXT   NOT NULL,
    resource_type TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    code          TEXT   NOT NULL,
    lo            DOUBLE PRECISION NOT NULL,
    hi            DOUBLE PRECISION NOT NULL,
    system        TEXT   NOT NULL,
    unit          TEXT   NOT NULL,
    last_updated  BIGINT NOT NULL
);
CREATE INDEX search_number_value ON search_number (resource_type, code, lo, hi, project_id, last_updated, resource_id);
CREATE INDEX search_number_resource ON search_number (resource_id, code, lo, hi);

-- Live rows of a type in a project, in _lastUpdated order: the walk of a
-- search that no index value drives, and COUNT(*) without reading rows.
DROP INDEX resources_type_project_updated;
CREATE INDEX resources_type_project_live ON resources (resource_type, project_id, deleted, last_updated, id);

-- Current version of every resource. content is the JSON as served.
CREATE TABLE resources (
    id            TEXT PRIMARY KEY,
    resource_type TEXT    NOT NULL,
    project_id    TEXT    NOT NULL,
    version_id    TEXT    NOT NULL,
    last_updated  BIGINT  NOT NULL, -- unix microseconds
    deleted       BOOLEAN NOT NULL DEFAULT FALSE,
    content       TEXT    NOT NULL
);
CREATE INDEX resources_type_project_updated ON resources (resource_type, project_id, last_updated, id);
CREATE INDEX resources_type_updated ON resources (resource_type, last_updated, id);

-- Every version, deletions included.
CREATE TABLE resource_history (
    id            TEXT    NOT NULL,
    version_id    TEXT    NOT NULL,
    resource_type TEXT    NOT NULL,
    project_id    TEXT    NOT NULL,
    last_updated  BIGINT  NOT NULL,
    deleted       BOOLEAN NOT NULL,
    content       TEXT    NOT NULL,
    PRIMARY KEY (id, version_id)
);
CREATE INDEX resource_history_id_updated ON resource_history (id, last_updated);

-- Search index: one row per extracted value (fhir.Extract). Rows of a
-- resource are replaced on every write and removed on deletion.
CREATE TABLE search_token (
    resource_id   TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    project_id    TEXT NOT NULL,
    code          TEXT NOT NULL,
    system        TEXT NOT NULL,
    value         TEXT NOT NULL
);
CREATE INDEX search_token_lookup ON search_token (resource_type, code, value, project_id, resource_id);
CREATE INDEX search_token_resource ON search_token (resource_id);

CREATE TABLE search_string (
    resource_id   TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    project_id    TEXT NOT NULL,
    code          TEXT NOT NULL,
    value_norm    TEXT NOT NULL,
    value_exact   TEXT NOT NULL
);
CREATE INDEX search_string_lookup ON search_string (resource_type, code, value_norm, project_id, resource_id);
CREATE INDEX search_string_resource ON search_string (resource_id);

CREATE TABLE search_date (
    resource_id   TEXT   NOT NULL,
    resource_type TEXT   NOT NULL,
    project_id    TEXT   NOT NULL,
    code          TEXT   NOT NULL,
    lo            BIGINT NOT NULL,
    hi            BIGINT NOT NULL
);
CREATE INDEX search_date_lookup ON search_date (resource_type, code, lo, hi);
CREATE INDEX search_date_resource ON search_date (resource_id);

-- Server secrets shared by replicas (the token signing key).
CREATE TABLE key_values (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

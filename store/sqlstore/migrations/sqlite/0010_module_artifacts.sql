-- Compiled bot modules shared between replicas (store.Artifacts): wazero's
-- compiled machine code of a module, stored once by the replica that
-- compiled it and loaded by the others instead of compiling. platform names
-- the wazero version, architecture and OS the code was built for; name is
-- the file's path in wazero's cache directory (it also encodes the CPU
-- features); prepared is the module as the compiling replica prepared it;
-- mac authenticates all of them (runtime).
CREATE TABLE module_artifacts (
    module_hash TEXT   NOT NULL,
    platform    TEXT   NOT NULL,
    name        TEXT   NOT NULL,
    code        BLOB   NOT NULL,
    prepared    BLOB   NOT NULL,
    mac         TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (module_hash, platform)
);

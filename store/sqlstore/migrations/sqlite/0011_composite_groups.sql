-- Composite search parameters (code-value-quantity, component-code-value-
-- quantity...) match their parts within one element: an Observation's
-- component whose code is 8480-6 and whose value is over 100, not any code
-- and any value of the resource. Each component's values are index rows of
-- their own type (code "code-value-quantity$0" in search_token,
-- "code-value-quantity$1" in search_number), and grp numbers the element
-- they come from (from 1; 0 on every other row), so that a search joins the
-- parts on (resource_id, grp). The rows are written by the rebuild of the
-- search index that follows the migrations (fhir.SearchIndexVersion changed
-- with the composite parameters), and by every write after it.
ALTER TABLE search_token ADD COLUMN grp INTEGER NOT NULL DEFAULT 0;
ALTER TABLE search_string ADD COLUMN grp INTEGER NOT NULL DEFAULT 0;
ALTER TABLE search_date ADD COLUMN grp INTEGER NOT NULL DEFAULT 0;
ALTER TABLE search_number ADD COLUMN grp INTEGER NOT NULL DEFAULT 0;

-- A search sorted by a date (sqlstore.sortWalk) pages by (lo, resource_id)
-- ascending or (hi, resource_id) descending. With the resource id right
-- after the compared end, the date indexes are in that order, so the page
-- is the first rows that pass the other conditions; before, every row of
-- the first date was read and sorted by id (240 Patients a day in the
-- search benchmark: gender=female&_sort=birthdate). Ranges over lo or hi
-- read the same entries as before, and the other columns still let a count
-- or a range be answered from the index alone.
DROP INDEX search_date_value;
CREATE INDEX search_date_value ON search_date (resource_type, code, lo, resource_id, hi, project_id, last_updated);
DROP INDEX search_date_hi;
CREATE INDEX search_date_hi ON search_date (resource_type, code, hi, resource_id, lo, project_id, last_updated);

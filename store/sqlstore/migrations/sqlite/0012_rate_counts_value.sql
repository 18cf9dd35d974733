-- A value kept with a counter's window (store.Store.SetHitValue): the task
-- of an HL7 message kept on an application-mode channel, then the ACK its
-- bot answered, so that a resend within the deduplication window gets that
-- ACK again (docs/decisions.md 54). A new window begins with ''; the row
-- goes with its window when ended windows are swept.
ALTER TABLE rate_counts ADD COLUMN value TEXT NOT NULL DEFAULT '';

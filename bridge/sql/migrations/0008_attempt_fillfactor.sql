-- Attempt records are written twice: inserted open by the claim, then updated once by the
-- statement that ends the attempt (settle, retry, release, sweep, takeover). With every page
-- filled at insert, that update cannot stay on its page and writes a new primary-key entry too;
-- with half of each page left free it is a heap-only update. Measured on a batch of 16
-- settlements: 1.14 ms without, 0.60 ms with, against 0.51 ms with no history at all.
--
-- Applies to the pages written from now on; the table is not rewritten (no lock beyond the
-- brief one ALTER TABLE takes), so a rolling upgrade is unaffected. It doubles the space the
-- newest attempts take, which the history's bound (the newest 20 per row by default) limits.
ALTER TABLE work_attempt SET (fillfactor = 50);

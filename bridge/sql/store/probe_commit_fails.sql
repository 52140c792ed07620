-- fencebridge check --probe, in its scratch schema only: make every inbox transaction fail at
-- COMMIT (a deferred constraint trigger on each table the inbox writes), so the probe can show
-- that an adapter acknowledges nothing whose commit failed. probe_commit_works removes them.
CREATE FUNCTION probe_commit_fails() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'fencebridge probe: this commit fails on purpose';
END
$$;
CREATE CONSTRAINT TRIGGER probe_commit_fails AFTER INSERT OR UPDATE ON work_item
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION probe_commit_fails();
CREATE CONSTRAINT TRIGGER probe_commit_fails AFTER INSERT OR UPDATE ON payload
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION probe_commit_fails();
CREATE CONSTRAINT TRIGGER probe_commit_fails AFTER INSERT OR UPDATE ON rejected_delivery
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION probe_commit_fails()

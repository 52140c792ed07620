-- Inside a mark's transaction: the relay row under this fence, locked FOR SHARE until commit.
-- A takeover (an UPDATE of this row) waits for the mark, or the mark sees the new fence and
-- gets no row: the decision is made inside the write's transaction, never before it.
SELECT fence FROM outbox_relay
 WHERE destination = %(destination)s AND fence = %(fence)s
   FOR SHARE

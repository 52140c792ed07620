-- Class C attempts record their intent before they call the provider (as class D attempts do),
-- and a later claim whose lookup cannot tell performs again only when no attempt recorded one:
-- then nothing was ever sent. Attempts made by an earlier release recorded no intent although
-- they may have called the provider, so every class C row they attempted that is still in
-- flight is marked as possibly sent: its later claims look the key up first and park it
-- `unknown` when the lookup cannot tell, as that release did.
--
-- One statement over the rows in flight only (queued or claimed, attempted, class C); the
-- running release never reads the column for class C, so it keeps working unchanged.
UPDATE work_item
   SET intent_fence = fence
 WHERE target_class = 'C'
   AND intent_fence IS NULL
   AND attempts > 0
   AND state IN ('queued', 'claimed');

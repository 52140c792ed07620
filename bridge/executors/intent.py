"""Whether a call to a class C or D target may have left: one rule, asked wherever it matters.

The executors of classes C and D record an *intent* on the work row, under the claim's fence,
before they call the target (``record_intent.sql``), and they call only once that write is known
to have committed. So the row itself says whether any attempt may have reached the target, and
nothing else does:

* **No intent recorded:** no attempt ever started the call, whatever the earlier attempts ended
  in (a failed ``validate``, a worker that vanished before the intent, a process killed with the
  row written claimed or prefetched). Nothing of it can land later: the row may be claimed and
  called as if it were new.
* **An intent recorded:** some attempt started the call, and nothing it answered afterwards
  proves that no request left. A ``RateLimited`` from ``perform`` is the refusal of *one*
  request, and the same ``perform`` may have sent another before it (a client that retries after
  a timeout); a "not applied" from a lookup right after a timeout says only that the request has
  not landed *yet*. So class C looks the key up before acting on every later claim of such a row
  and never ends it ``failed_terminal`` for want of attempts; class D parks it ``unknown``.

The attempt count is no substitute: a rate limit gives its attempt back, so a row whose call
left can be claimed again at ``attempts = 1``. The statements that decide by the same rule in
SQL (the sweeper's ``sweep.sql``) say so where they do.
"""

from __future__ import annotations


def call_may_have_left(intent_fence: int | None) -> bool:
    """True when an attempt recorded its intent to call the target (``work_item.intent_fence``):
    a request may have reached it, and may still land."""
    return intent_fence is not None

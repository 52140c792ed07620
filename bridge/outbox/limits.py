"""What a destination's broker accepts of one message, checked when a handler publishes.

A message the outbox records has to be one its destination can carry: a broker that refuses
it after commit leaves the relay nothing to do but park it, long after its run succeeded. So
``ctx.outbox.publish`` checks it against the :class:`MessageLimits` of its destination's sink
(:attr:`bridge.adapters.sinks.SinkAdapter.limits`) while the handler can still fail the run, and the
error names the limit. The limits count what the relay will send: the handler's attributes and
the relay's own (``fencebridge-message-id``, ``traceparent``).

:data:`LEAST_COMMON` is what every shipped broker accepts (SQS's and SNS's rules, which are the
narrower ones, with Pub/Sub's reserved prefix too): the limits of a destination whose sink
declares none, and of a registry built without a configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

#: SQS and SNS: the text of a body and of a String attribute's value (XML 1.0's characters):
#: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF, "any characters
#: not included in this list will be rejected" (Amazon SQS API Reference, SendMessage; an
#: attribute's value has "the same restrictions on the content as the message body")
SQS_TEXT: Final = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
#: SQS and SNS: a message group or deduplication id, "up to 128 alphanumeric characters
#: (a-z, A-Z, 0-9) and punctuation (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)" (SQS and SNS API
#: References, MessageGroupId): printable ASCII without the space
SQS_ID: Final = re.compile(r"[!-~]{1,128}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageLimits:
    """One broker's rules for a message, as its documentation states them."""

    #: the broker, as an error names it
    broker: str
    #: largest message, as :meth:`size` counts it
    max_message_bytes: int
    #: bytes the broker counts per attribute besides its name and value (SQS and SNS count
    #: the data type, ``String``)
    attribute_type_bytes: int = 0
    #: whether the ordering key counts towards :attr:`max_message_bytes`
    counts_ordering_key: bool = False
    #: attributes per message, the relay's own included
    max_attributes: int
    #: what a whole attribute name matches
    attribute_name: re.Pattern[str]
    #: :attr:`attribute_name` in words, for the error
    attribute_name_rule: str
    max_attribute_name_bytes: int
    max_attribute_value_bytes: int | None = None
    #: attribute name prefixes the broker keeps for itself, lower case (compared so)
    reserved_prefixes: tuple[str, ...] = ()
    #: the body and attribute values must be text of the XML characters (SQS, SNS)
    text_only: bool = False
    #: what a whole ordering key matches
    ordering_key: re.Pattern[str]
    #: :attr:`ordering_key` in words, for the error
    ordering_key_rule: str
    max_ordering_key_bytes: int

    def size(self, body: bytes, attributes: Mapping[str, str], ordering_key: str | None) -> int:
        """The message's size as the broker counts it against :attr:`max_message_bytes`."""
        total = len(body)
        for name, value in attributes.items():
            total += len(name.encode()) + self.attribute_type_bytes + len(value.encode())
        if self.counts_ordering_key and ordering_key:
            total += len(ordering_key.encode())
        return total

    def problem(
        self,
        body: bytes,
        attributes: Mapping[str, str],
        ordering_key: str | None,
        relay_attributes: Mapping[str, str],
        *,
        relay_may_add: int,
    ) -> str | None:
        """Why the broker would refuse this message, or None. ``attributes`` are the
        handler's; ``relay_attributes`` the ones the relay adds to this message when it sends,
        of the ``relay_may_add`` it adds to some (the count a handler may use stays the same
        whether a run is traced or not)."""
        own = self.max_attributes - relay_may_add
        if len(attributes) > own:
            return f"a message carries at most {own} attributes of its own ({self.broker})"
        for name, value in attributes.items():
            found = self._attribute_problem(name, value)
            if found is not None:
                return found
        return (
            self._ordering_key_problem(ordering_key)
            or self._body_problem(body)
            or self._size_problem(body, {**attributes, **relay_attributes}, ordering_key)
        )

    def _ordering_key_problem(self, ordering_key: str | None) -> str | None:
        if ordering_key is None:
            return None
        if 0 < len(ordering_key.encode()) <= self.max_ordering_key_bytes and (
            self.ordering_key.fullmatch(ordering_key)
        ):
            return None
        return f"an ordering key is {self.ordering_key_rule} ({self.broker})"

    def _body_problem(self, body: bytes) -> str | None:
        if not self.text_only:
            return None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return f"the body is not UTF-8 text ({self.broker} carry text)"
        if SQS_TEXT.fullmatch(text):
            return None
        return (
            f"the body holds a character {self.broker} refuses (only tab, newline, carriage "
            "return and the printable Unicode characters)"
        )

    def _size_problem(
        self, body: bytes, attributes: Mapping[str, str], ordering_key: str | None
    ) -> str | None:
        size = self.size(body, attributes, ordering_key)
        if size <= self.max_message_bytes:
            return None
        return (
            f"the message is {size} bytes with its attributes, over the "
            f"{self.max_message_bytes} {self.broker} takes"
        )

    def _attribute_problem(self, name: str, value: str) -> str | None:
        if len(name.encode()) > self.max_attribute_name_bytes or not self.attribute_name.fullmatch(
            name
        ):
            return f"attribute name {name!r}: {self.attribute_name_rule} ({self.broker})"
        if name.lower().startswith(self.reserved_prefixes):
            return f"attribute {name!r} is reserved ({self.broker})"
        limit = self.max_attribute_value_bytes
        if limit is not None and len(value.encode()) > limit:
            return f"attribute {name!r}: a value is at most {limit} bytes ({self.broker})"
        if self.text_only and not SQS_TEXT.fullmatch(value):
            return f"attribute {name!r}: the value holds a character {self.broker} refuses"
        return None


#: What every shipped broker accepts: SQS's and SNS's rules (the narrower ones in each case)
#: with Pub/Sub's reserved prefix too. Sources, as of this writing:
#: - size: "the maximum allowed individual message size and the maximum total payload size
#:   (the sum of the individual lengths of all of the batched messages) are both 256 KiB
#:   (262,144 bytes)" (SNS API Reference, PublishBatch; a topic may raise it, and SQS queues
#:   now take up to 1 MiB, but a topic's default and a queue set lower do not), and "all parts
#:   of the message attribute, including name, type, and value, are part of the message size
#:   restriction" (Amazon SQS Developer Guide, Amazon SQS message attributes);
#: - attributes: "each message can have up to 10 attributes" (the same guide; SNS: the same
#:   number); a name "can contain alphanumeric characters and the underscore (_), hyphen (-),
#:   and period (.)", "must not start with AWS-reserved prefixes such as AWS. or Amazon. (or
#:   any casing variants)", "must not start or end with a period (.), and it should not have
#:   periods in succession (..)", "can be up to 256 characters long" (SQS API Reference,
#:   MessageAttributeNames); Pub/Sub reserves keys starting with ``goog``;
#: - ordering key: sent as the FIFO ``MessageGroupId`` (:data:`SQS_ID`);
#: - text: :data:`SQS_TEXT`.
LEAST_COMMON: Final = MessageLimits(
    broker="SQS and SNS",
    max_message_bytes=262_144,
    attribute_type_bytes=len("String"),
    max_attributes=10,
    attribute_name=re.compile(r"(?!\.)(?!.*\.\.)[A-Za-z0-9_.-]+(?<!\.)"),
    attribute_name_rule=(
        "1 to 256 of letters, digits, '_', '-' and '.', not starting or ending with '.' and "
        "without '..'"
    ),
    max_attribute_name_bytes=256,
    reserved_prefixes=("aws.", "amazon.", "goog"),
    text_only=True,
    ordering_key=SQS_ID,
    ordering_key_rule="1 to 128 of letters, digits and ASCII punctuation",
    max_ordering_key_bytes=128,
)

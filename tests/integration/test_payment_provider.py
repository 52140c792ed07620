"""The demo payment provider over real HTTP on loopback: idempotency, faults, ledger, process.

Every fault test checks both sides: the exception the client raises *and* what the ledger says
really happened, because the gap between the two is what a class C executor must reconcile.
"""

from __future__ import annotations

import dataclasses
import errno
import http.client
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

import pytest

from bridge.demo.provider import (
    ChargeResult,
    FaultKind,
    PaymentClient,
    PaymentProvider,
    ProviderAmbiguous,
    ProviderConflict,
    ProviderConnectionError,
    ProviderRejected,
    ProviderServerError,
    ProviderTimeout,
    ProviderUnavailable,
    canonical_hash,
)
from tests.support.waiting import eventually

BODY = {"amount": 1200, "currency": "eur", "reference": "order-1"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def provider() -> Iterator[PaymentProvider]:
    with PaymentProvider() as p:
        yield p


@pytest.fixture
def client(provider: PaymentProvider) -> PaymentClient:
    return PaymentClient(provider.url, timeout=2.0)


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP exchange: status, headers and body exactly as the provider sent them."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=2.0)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def post_charge(url: str, key: str | None, body: bytes) -> tuple[int, dict[str, str], bytes]:
    headers = dict(JSON)
    if key is not None:
        headers["Idempotency-Key"] = key
    return request(url, "POST", "/v1/charges", body, headers)


def error_type(body: bytes) -> str:
    return str(json.loads(body)["error"]["type"])


# -- idempotency ------------------------------------------------------------------------------


def test_a_charge_creates_one_ledger_entry(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    result = client.charge("key-1", BODY)
    assert result.id.startswith("ch_")
    assert (result.amount, result.currency, result.status) == (1200, "eur", "succeeded")
    assert (result.idempotency_key, result.reference, result.replayed) == (
        "key-1",
        "order-1",
        False,
    )
    [charge] = provider.ledger()
    assert (charge.order, charge.id, charge.idempotency_key) == (1, result.id, "key-1")
    assert (charge.amount, charge.currency, charge.reference) == (1200, "eur", "order-1")
    assert charge.body_hash == canonical_hash(BODY)
    assert provider.charges_for("key-1") == 1
    assert provider.requests_for("key-1") == 1


def test_same_key_same_body_replays_the_stored_response(provider: PaymentProvider) -> None:
    first = post_charge(provider.url, "key-1", json.dumps(BODY).encode())
    second = post_charge(provider.url, "key-1", json.dumps(BODY).encode())
    assert first[0] == second[0] == 200
    assert second[2] == first[2]
    assert "Idempotent-Replayed" not in first[1]
    assert second[1]["Idempotent-Replayed"] == "true"
    assert len(provider.ledger()) == 1
    assert provider.requests_for("key-1") == 2


def test_the_body_is_compared_in_canonical_form(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    first = client.charge("key-1", BODY)
    reordered = b'{ "reference": "order-1",\n "currency": "eur", "amount": 1200 }'
    status, headers, body = post_charge(provider.url, "key-1", reordered)
    assert (status, headers["Idempotent-Replayed"]) == (200, "true")
    assert json.loads(body)["id"] == first.id
    assert provider.charges_for("key-1") == 1


def test_the_client_reports_a_replay(provider: PaymentProvider, client: PaymentClient) -> None:
    first = client.charge("key-1", BODY)
    second = client.charge("key-1", BODY)
    assert second == dataclasses.replace(first, replayed=True)
    assert provider.charges_for("key-1") == 1


def test_same_key_other_body_is_422_and_charges_nothing(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    first = client.charge("key-1", BODY)
    status, headers, body = post_charge(
        provider.url, "key-1", json.dumps({**BODY, "amount": 999}).encode()
    )
    assert (status, error_type(body)) == (422, "idempotency_error")
    assert "Idempotent-Replayed" not in headers
    with pytest.raises(ProviderRejected) as raised:
        client.charge("key-1", {**BODY, "reference": "order-2"})
    assert (raised.value.status, raised.value.error_type) == (422, "idempotency_error")
    assert [c.id for c in provider.ledger()] == [first.id]
    assert client.charge("key-1", BODY).replayed


def test_keys_are_independent(provider: PaymentProvider, client: PaymentClient) -> None:
    a = client.charge("key-a", BODY)
    b = client.charge("key-b", BODY)
    assert a.id != b.id
    assert [(c.order, c.idempotency_key) for c in provider.ledger()] == [(1, "key-a"), (2, "key-b")]


def test_a_key_is_required_and_at_most_255_characters(provider: PaymentProvider) -> None:
    body = json.dumps(BODY).encode()
    for key in (None, "", "k" * 256):
        status, _, answer = post_charge(provider.url, key, body)
        assert (status, error_type(answer)) == (400, "invalid_request_error")
    assert provider.ledger() == []
    status, _, _ = post_charge(provider.url, "k" * 255, body)
    assert status == 200
    assert provider.charges_for("k" * 255) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1200]",
        b'{"currency": "eur"}',
        b'{"amount": "1200", "currency": "eur"}',
        b'{"amount": 12.5, "currency": "eur"}',
        b'{"amount": 0, "currency": "eur"}',
        b'{"amount": -5, "currency": "eur"}',
        b'{"amount": true, "currency": "eur"}',
        b'{"amount": 1200}',
        b'{"amount": 1200, "currency": "euro"}',
        b'{"amount": 1200, "currency": "eur", "reference": 7}',
    ],
)
def test_an_invalid_body_is_400_and_stores_nothing_for_the_key(
    provider: PaymentProvider, client: PaymentClient, body: bytes
) -> None:
    status, _, answer = post_charge(provider.url, "key-1", body)
    assert (status, error_type(answer)) == (400, "invalid_request_error")
    assert provider.ledger() == []
    assert client.lookup("key-1") is None
    # Nothing was stored: the key still takes a first, different, valid body.
    assert not client.charge("key-1", BODY).replayed
    assert provider.charges_for("key-1") == 1


def test_the_client_maps_400_to_rejected(client: PaymentClient) -> None:
    with pytest.raises(ProviderRejected) as raised:
        client.charge("key-1", {"amount": -1, "currency": "eur"})
    assert (raised.value.status, raised.value.error_type) == (400, "invalid_request_error")


# -- lookup -----------------------------------------------------------------------------------


def test_lookup_finds_the_stored_charge(provider: PaymentProvider, client: PaymentClient) -> None:
    charged = client.charge("key-1", BODY)
    assert client.lookup("key-1") == charged
    status, _, body = request(provider.url, "GET", "/v1/charges?idempotency_key=key-1")
    assert status == 200
    assert json.loads(body)["id"] == charged.id
    assert provider.lookups_for("key-1") == 2
    assert provider.charges_for("key-1") == 1


def test_lookup_of_a_key_never_applied_is_404_and_creates_nothing(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    status, _, body = request(provider.url, "GET", "/v1/charges?idempotency_key=key-1")
    assert (status, error_type(body)) == (404, "not_found")
    assert client.lookup("key-1") is None
    assert provider.ledger() == []
    assert provider.requests_for("key-1") == 0
    assert not client.charge("key-1", BODY).replayed


def test_lookup_needs_a_key(provider: PaymentProvider) -> None:
    status, _, body = request(provider.url, "GET", "/v1/charges")
    assert (status, error_type(body)) == (400, "invalid_request_error")


def test_a_wrong_url_is_never_taken_for_not_applied(provider: PaymentProvider) -> None:
    misdirected = PaymentClient(provider.url + "/not-the-api", timeout=2.0)
    with pytest.raises(ProviderRejected) as raised:
        misdirected.lookup("key-1")
    assert raised.value.status == 404


def test_keys_with_reserved_characters_round_trip(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    key = "tenant/a&b=c?d #e%f+g"
    charged = client.charge(key, BODY)
    assert client.lookup(key) == charged
    assert provider.charges_for(key) == 1


# -- faults: the client's exception and the ledger's truth ------------------------------------


def test_apply_then_timeout(provider: PaymentProvider) -> None:
    provider.set_fault(FaultKind.APPLY_THEN_TIMEOUT, seconds=30)
    impatient = PaymentClient(provider.url, timeout=0.3)
    with pytest.raises(ProviderTimeout):
        impatient.charge("key-1", BODY)
    # The timeout is the client's view; the provider applied the charge before holding.
    eventually(lambda: provider.charges_for("key-1") == 1, "the charge to be applied")
    client = PaymentClient(provider.url, timeout=2.0)
    found = client.lookup("key-1")
    assert found is not None
    assert found.id == provider.ledger()[0].id
    again = client.charge("key-1", BODY)
    assert (again.id, again.replayed) == (found.id, True)
    assert provider.charges_for("key-1") == 1


def test_apply_then_500(provider: PaymentProvider, client: PaymentClient) -> None:
    provider.set_fault(FaultKind.APPLY_THEN_500)
    with pytest.raises(ProviderServerError) as raised:
        client.charge("key-1", BODY)
    assert raised.value.status == 500
    assert provider.charges_for("key-1") == 1
    found = client.lookup("key-1")
    assert found is not None
    # The stored response is the charge's 200, not the injected 500.
    assert client.charge("key-1", BODY) == dataclasses.replace(found, replayed=True)


def test_reset_before_apply(provider: PaymentProvider, client: PaymentClient) -> None:
    provider.set_fault(FaultKind.RESET_BEFORE_APPLY)
    with pytest.raises(ProviderConnectionError) as raised:
        client.charge("key-1", BODY)
    assert getattr(raised.value.__cause__, "errno", None) == errno.ECONNRESET  # a RST, not a FIN
    assert provider.requests_for("key-1") == 1
    assert provider.charges_for("key-1") == 0
    assert client.lookup("key-1") is None
    assert not client.charge("key-1", BODY).replayed
    assert provider.charges_for("key-1") == 1


def test_reset_after_apply(provider: PaymentProvider, client: PaymentClient) -> None:
    provider.set_fault(FaultKind.RESET_AFTER_APPLY)
    with pytest.raises(ProviderConnectionError) as raised:
        client.charge("key-1", BODY)
    assert getattr(raised.value.__cause__, "errno", None) == errno.ECONNRESET  # a RST, not a FIN
    assert provider.charges_for("key-1") == 1
    found = client.lookup("key-1")
    assert found is not None
    assert found.id == provider.ledger()[0].id


def test_slow_then_normal(provider: PaymentProvider, client: PaymentClient) -> None:
    provider.set_fault(FaultKind.SLOW, seconds=0.2)
    result = client.charge("key-1", BODY)
    assert not result.replayed
    assert provider.faults() == []
    assert provider.charges_for("key-1") == 1


def test_slow_beyond_the_client_timeout_still_applies(provider: PaymentProvider) -> None:
    provider.set_fault(FaultKind.SLOW, seconds=0.6)
    with pytest.raises(ProviderTimeout):
        PaymentClient(provider.url, timeout=0.2).charge("key-1", BODY)
    eventually(lambda: provider.charges_for("key-1") == 1, "the slow charge to be applied")


def test_late_apply_lands_after_a_lookup_found_nothing(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    provider.set_fault(FaultKind.LATE_APPLY, seconds=1.0)
    with pytest.raises(ProviderTimeout):
        PaymentClient(provider.url, timeout=0.2).charge("key-1", BODY)
    # Still on its way: the key was never looked at, so a lookup finds nothing, honestly.
    assert provider.late() == 1
    assert client.lookup("key-1") is None
    eventually(lambda: provider.late() == 0, "the late request to arrive")
    (charge,) = provider.ledger()
    found = client.lookup("key-1")
    assert found is not None
    assert found.id == charge.id
    assert client.charge("key-1", BODY).replayed


def test_late_requests_arrive_when_released(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    provider.set_fault(FaultKind.LATE_APPLY, times=2, seconds=600)
    impatient = PaymentClient(provider.url, timeout=0.2)
    for key in ("key-1", "key-2"):
        with pytest.raises(ProviderTimeout):
            impatient.charge(key, BODY)
    assert (provider.late(), provider.ledger()) == (2, [])
    provider.release_late()
    eventually(lambda: provider.late() == 0, "the released requests to arrive")
    assert sorted(c.idempotency_key for c in provider.ledger()) == ["key-1", "key-2"]


def test_a_late_request_behind_a_retry_under_its_key_is_a_replay(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    provider.set_fault(FaultKind.LATE_APPLY, seconds=1.0)
    with pytest.raises(ProviderTimeout):
        PaymentClient(provider.url, timeout=0.2).charge("key-1", BODY)
    retried = client.charge("key-1", BODY)  # the same key: the provider's dedupe decides
    assert not retried.replayed
    eventually(lambda: provider.late() == 0, "the late request to arrive")
    assert [c.id for c in provider.ledger()] == [retried.id]
    assert provider.requests_for("key-1") == 2


def test_lookup_unavailable(provider: PaymentProvider, client: PaymentClient) -> None:
    client.charge("key-1", BODY)
    provider.set_fault(FaultKind.LOOKUP_UNAVAILABLE)
    with pytest.raises(ProviderUnavailable) as raised:
        client.lookup("key-1")
    assert raised.value.status == 503
    # Lookup faults leave charges alone, and a count of 1 means the next lookup answers.
    assert client.charge("key-1", BODY).replayed
    assert client.lookup("key-1") is not None


def test_all_ambiguous_outcomes_share_one_base(provider: PaymentProvider) -> None:
    impatient = PaymentClient(provider.url, timeout=0.3)
    for kind in (
        FaultKind.APPLY_THEN_TIMEOUT,
        FaultKind.APPLY_THEN_500,
        FaultKind.RESET_BEFORE_APPLY,
        FaultKind.RESET_AFTER_APPLY,
    ):
        provider.set_fault(kind, key=kind.value)
        with pytest.raises(ProviderAmbiguous):
            impatient.charge(kind.value, BODY)


def test_a_fault_counts_down_its_times(provider: PaymentProvider, client: PaymentClient) -> None:
    provider.set_fault(FaultKind.APPLY_THEN_500, times=2)
    for key in ("key-1", "key-2"):
        with pytest.raises(ProviderServerError):
            client.charge(key, BODY)
    assert provider.faults() == []
    assert not client.charge("key-3", BODY).replayed
    assert [c.idempotency_key for c in provider.ledger()] == ["key-1", "key-2", "key-3"]


def test_a_fault_for_one_key_spares_the_others(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    provider.set_fault(FaultKind.RESET_BEFORE_APPLY, key="key-2")
    client.charge("key-1", BODY)
    with pytest.raises(ProviderConnectionError):
        client.charge("key-2", BODY)
    assert (provider.charges_for("key-1"), provider.charges_for("key-2")) == (1, 0)


def test_faults_over_http(provider: PaymentProvider, client: PaymentClient) -> None:
    fault = json.dumps({"kind": "lookup_unavailable", "times": 2, "key": "key-1"}).encode()
    status, _, body = request(provider.url, "POST", "/_faults", fault, JSON)
    assert status == 200
    assert json.loads(body) == [
        {"kind": "lookup_unavailable", "times": 2, "key": "key-1", "seconds": None}
    ]
    with pytest.raises(ProviderUnavailable):
        client.lookup("key-1")
    assert [(f.kind, f.times) for f in provider.faults()] == [(FaultKind.LOOKUP_UNAVAILABLE, 1)]
    status, _, body = request(provider.url, "GET", "/_faults")
    assert json.loads(body)[0]["times"] == 1
    status, _, body = request(provider.url, "DELETE", "/_faults")
    assert (status, json.loads(body)) == (200, [])
    assert client.lookup("key-1") is None


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "explode"},
        {"times": 1},
        {"kind": "slow", "times": 0},
        {"kind": "slow", "seconds": -1},
        {"kind": "apply_then_500", "seconds": 1},
        {"kind": "slow", "colour": "red"},
    ],
)
def test_an_invalid_fault_is_400(provider: PaymentProvider, fault: dict[str, object]) -> None:
    status, _, body = request(provider.url, "POST", "/_faults", json.dumps(fault).encode(), JSON)
    assert (status, error_type(body)) == (400, "invalid_request_error")
    assert provider.faults() == []


def test_a_refused_connection_is_a_connection_error() -> None:
    with PaymentProvider() as gone:
        url = gone.url
    client = PaymentClient(url, timeout=0.5)
    with pytest.raises(ProviderConnectionError) as raised:
        client.charge("key-1", BODY)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
    with pytest.raises(ProviderUnavailable):
        client.lookup("key-1")


def test_the_ledger_endpoint(provider: PaymentProvider, client: PaymentClient) -> None:
    a = client.charge("key-a", BODY)
    b = client.charge("key-b", {"amount": 5, "currency": "usd"})
    status, _, body = request(provider.url, "GET", "/_ledger")
    assert status == 200
    assert json.loads(body) == [
        {
            "order": 1,
            "id": a.id,
            "idempotency_key": "key-a",
            "amount": 1200,
            "currency": "eur",
            "reference": "order-1",
            "body_hash": canonical_hash(BODY),
        },
        {
            "order": 2,
            "id": b.id,
            "idempotency_key": "key-b",
            "amount": 5,
            "currency": "usd",
            "reference": None,
            "body_hash": canonical_hash({"amount": 5, "currency": "usd"}),
        },
    ]


# -- concurrency ------------------------------------------------------------------------------


def race(client: PaymentClient, key: str, n: int) -> list[ChargeResult | ProviderConflict]:
    """n charges with the same key and body, released at once; their results in any order."""
    barrier = threading.Barrier(n)
    results: list[ChargeResult | ProviderConflict] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        try:
            outcome: ChargeResult | ProviderConflict = client.charge(key, BODY)
        except ProviderConflict as exc:
            outcome = exc
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            with lock:
                failures.append(exc)
            return
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    return results


def test_concurrent_requests_behind_a_slow_first_one_charge_once(
    provider: PaymentProvider, client: PaymentClient
) -> None:
    provider.set_fault(FaultKind.SLOW, seconds=1.5, key="key-1")
    first: list[ChargeResult] = []
    holder = threading.Thread(target=lambda: first.append(client.charge("key-1", BODY)))
    holder.start()

    def in_flight() -> bool:
        try:
            client.lookup("key-1")
        except ProviderConflict:
            return True
        return False

    eventually(in_flight, "the first request to hold the key while it sleeps")
    others = race(client, "key-1", 19)
    holder.join()

    [winner] = first
    assert not winner.replayed
    assert len(others) == 19
    for outcome in others:
        assert isinstance(outcome, ProviderConflict) or (outcome.id, outcome.replayed) == (
            winner.id,
            True,
        )
    assert provider.charges_for("key-1") == 1
    assert provider.requests_for("key-1") == 20


def test_a_burst_on_one_key_charges_once(provider: PaymentProvider, client: PaymentClient) -> None:
    results = race(client, "key-1", 20)
    charged = [r for r in results if isinstance(r, ChargeResult)]
    [created] = [r for r in charged if not r.replayed]
    assert all(r.id == created.id for r in charged)
    assert provider.charges_for("key-1") == 1
    assert provider.requests_for("key-1") == 20


def test_concurrent_keys_each_charge_once(provider: PaymentProvider) -> None:
    client = PaymentClient(provider.url, timeout=2.0)
    keys = [f"key-{i}" for i in range(20)]
    threads = [threading.Thread(target=client.charge, args=(k, BODY)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger = provider.ledger()
    assert sorted(c.idempotency_key for c in ledger) == sorted(keys)
    assert [c.order for c in ledger] == list(range(1, 21))
    assert len({c.id for c in ledger}) == 20


def test_stop_releases_a_held_request() -> None:
    provider = PaymentProvider().start()
    provider.set_fault(FaultKind.APPLY_THEN_TIMEOUT, seconds=600)
    with pytest.raises(ProviderTimeout):
        PaymentClient(provider.url, timeout=0.3).charge("key-1", BODY)
    provider.stop()  # returns because the hold wakes up; a hang here fails on the suite timeout
    provider.stop()
    assert provider.charges_for("key-1") == 1


def test_stop_drops_a_late_request_that_has_not_arrived() -> None:
    provider = PaymentProvider().start()
    provider.set_fault(FaultKind.LATE_APPLY, seconds=600)
    with pytest.raises(ProviderTimeout):
        PaymentClient(provider.url, timeout=0.3).charge("key-1", BODY)
    provider.stop()  # the hold wakes up; the request is lost with the provider
    assert (provider.charges_for("key-1"), provider.late()) == (0, 0)


# -- as a separate process --------------------------------------------------------------------


def read_line(stream: IO[str], timeout: float = 10.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise AssertionError("the provider printed nothing before the deadline")
    return stream.readline().strip()


@pytest.fixture
def provider_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.demo.provider", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc, read_line(proc.stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_the_process_serves_and_exits_cleanly_on_sigterm(
    provider_process: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = provider_process
    assert url.startswith("http://127.0.0.1:")
    client = PaymentClient(url, timeout=2.0)
    charged = client.charge("key-1", BODY)
    assert client.charge("key-1", BODY).replayed
    # A request held by a fault must not keep the process from stopping.
    fault = json.dumps({"kind": "apply_then_timeout", "seconds": 600}).encode()
    assert request(url, "POST", "/_faults", fault, JSON)[0] == 200
    with pytest.raises(ProviderTimeout):
        PaymentClient(url, timeout=0.3).charge("key-2", BODY)
    eventually(
        lambda: len(json.loads(request(url, "GET", "/_ledger")[2])) == 2,
        "the held charge in the ledger",
    )
    ledger = json.loads(request(url, "GET", "/_ledger")[2])
    assert [(c["order"], c["idempotency_key"]) for c in ledger] == [(1, "key-1"), (2, "key-2")]
    assert ledger[0]["id"] == charged.id

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    with pytest.raises(ProviderConnectionError):
        client.charge("key-3", BODY)


def test_the_process_outlives_a_killed_client(
    provider_process: tuple[subprocess.Popen[str], str],
) -> None:
    _, url = provider_process
    script = (
        "import sys; from bridge.demo.provider import PaymentClient;"
        "PaymentClient(sys.argv[1]).charge('key-1', {'amount': 1200, 'currency': 'eur'});"
        "print('charged', flush=True);"
        "import time; time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", script, url], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert read_line(child.stdout) == "charged"
    finally:
        child.kill()  # SIGKILL: no chance to clean up
        child.communicate(timeout=10)
    again = PaymentClient(url, timeout=2.0).charge("key-1", {"amount": 1200, "currency": "eur"})
    assert again.replayed
    assert len(json.loads(request(url, "GET", "/_ledger")[2])) == 1


def test_the_process_reports_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "bridge.demo.provider", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "cannot listen" in done.stderr

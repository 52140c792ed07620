"""Proxy authentication's configuration and trust rules, without a server: off unless a
header is named, a role for every user it may name, and the header believed only from the
configured proxies (loopback included only when listed: any local process connects from
there)."""

from __future__ import annotations

import ipaddress

import pytest

from bridge.console.auth import (
    PROXY_HEADER_ENV,
    PROXY_ROLES_ENV,
    TRUSTED_PROXIES_ENV,
    Principal,
    ProxyAuth,
    ProxyError,
    Role,
)
from bridge.errors import ConfigError

HEADER = "X-Forwarded-Email"
ROLES = "Ana@Example.com:operator, vic@example.com:viewer"


def configured(host: str = "127.0.0.1", **more: str) -> ProxyAuth:
    env = {PROXY_HEADER_ENV: HEADER, PROXY_ROLES_ENV: ROLES, TRUSTED_PROXIES_ENV: "127.0.0.1"}
    env.update(more)
    proxy = ProxyAuth.from_env(env, host=host)
    assert proxy is not None
    return proxy


def test_it_is_off_unless_a_header_is_named() -> None:
    assert ProxyAuth.from_env({}, host="0.0.0.0") is None
    assert ProxyAuth.from_env({PROXY_ROLES_ENV: ROLES}, host="127.0.0.1") is None


@pytest.mark.parametrize(
    ("env", "host", "problem"),
    [
        ({}, "127.0.0.1", "maps nobody to a role"),
        ({PROXY_ROLES_ENV: "ana@example.com:admin"}, "127.0.0.1", "expected user:role"),
        ({PROXY_ROLES_ENV: ":viewer"}, "127.0.0.1", "the user is empty"),
        ({PROXY_ROLES_ENV: ROLES}, "10.0.0.5", f"set \\${TRUSTED_PROXIES_ENV}"),
        ({PROXY_ROLES_ENV: ROLES}, "127.0.0.1", f"set \\${TRUSTED_PROXIES_ENV}"),
        ({PROXY_ROLES_ENV: ROLES, TRUSTED_PROXIES_ENV: "proxy.internal"}, "10.0.0.5", "not an"),
        ({PROXY_ROLES_ENV: ROLES, PROXY_HEADER_ENV: "X Bad"}, "127.0.0.1", "not an HTTP header"),
    ],
)
def test_a_configuration_it_cannot_trust_is_refused(
    env: dict[str, str], host: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        ProxyAuth.from_env({PROXY_HEADER_ENV: HEADER, **env}, host=host)


def test_loopback_is_believed_only_where_it_is_listed() -> None:
    proxy = configured()
    assert proxy.trusted == (ipaddress.ip_network("127.0.0.1/32"),)
    assert [proxy.trusts(p) for p in ("127.0.0.1", "::ffff:127.0.0.1")] == [True] * 2
    assert not proxy.trusts("::1")
    assert not ProxyAuth(HEADER, {}, ()).trusts("127.0.0.1")
    assert [proxy.trusts(p) for p in ("10.0.0.7", "192.168.1.2", "not an address")] == [False] * 3


def test_with_trusted_proxies_only_their_addresses_are_believed() -> None:
    proxy = configured("0.0.0.0", **{TRUSTED_PROXIES_ENV: "10.0.0.7, 10.1.0.0/16"})
    assert proxy.trusted == (
        ipaddress.ip_network("10.0.0.7/32"),
        ipaddress.ip_network("10.1.0.0/16"),
    )
    assert [proxy.trusts(p) for p in ("10.0.0.7", "10.1.200.3", "::ffff:10.0.0.7")] == [True] * 3
    assert [proxy.trusts(p) for p in ("10.0.0.8", "127.0.0.1")] == [False, False]


def test_the_header_names_a_mapped_user_and_its_role() -> None:
    proxy = configured()
    assert proxy.principal(None, "127.0.0.1") is None
    assert proxy.principal("ana@example.com", "127.0.0.1") == Principal(
        "ana@example.com", Role.OPERATOR
    )
    # Google IAP's form of the same user
    iap = proxy.principal("accounts.google.com:vic@example.com", "127.0.0.1")
    assert iap == Principal("vic@example.com", Role.VIEWER)


def test_a_forged_or_unmapped_header_is_refused_not_ignored() -> None:
    proxy = configured()
    with pytest.raises(ProxyError) as forged:
        proxy.principal("ana@example.com", "10.0.0.7")
    assert forged.value.status == 401
    with pytest.raises(ProxyError) as unmapped:
        proxy.principal("mallory@example.com", "127.0.0.1")
    assert unmapped.value.status == 403
    with pytest.raises(ProxyError):
        proxy.principal("  ", "127.0.0.1")
    with pytest.raises(ProxyError) as repeated:
        proxy.principal(["ana@example.com", "mallory@example.com"], "127.0.0.1")
    assert repeated.value.status == 401

"""The database URL as a message shows it: everything but the password, in each form libpq
takes (bridge.store.reach)."""

from __future__ import annotations

import pytest

from bridge.store.reach import shown_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/pay", "postgresql://app@db:5432/pay"),
        (
            "postgresql://app@db/pay?password=s3cret&sslmode=require",
            "postgresql://app@db/pay?sslmode=require",
        ),
        ("postgres://app:s3cret@h1:5432,h2:5433/pay", "postgres://app@h1:5432,h2:5433/pay"),
        ("postgresql://db/pay", "postgresql://db/pay"),
        ("host=db dbname=pay user=app password=s3cret", "user=app dbname=pay host=db"),
    ],
)
def test_the_password_never_shows(url: str, shown: str) -> None:
    assert shown_url(url) == shown
    assert "s3cret" not in shown_url(url)

"""Databases for tests: one server per run, a migrated template, one database per test."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import conninfo, sql

from bridge.store.migrate import migrate

TEST_DATABASE_URL_ENV = "FENCEBRIDGE_TEST_DATABASE_URL"


def with_dbname(url: str, dbname: str) -> str:
    return conninfo.make_conninfo(url, dbname=dbname)


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if template:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_dbname(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def unique_name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


@contextmanager
def migrated_template(admin_url: str) -> Iterator[str]:
    """A database with every migration applied, usable as a CREATE DATABASE template."""
    name = unique_name("fbt_tpl")
    url = create_database(admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        drop_database(admin_url, name)


@contextmanager
def database_from(admin_url: str, template: str) -> Iterator[str]:
    name = unique_name("fbt")
    url = create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        drop_database(admin_url, name)

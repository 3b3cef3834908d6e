"""Settings are declared once, in ``conf.SETTINGS``: the defaults, the worker's options,
the ``runtaskworker`` flags and the ``manage.py check`` errors come from that table, and
docs/settings.md documents every key of it, with its type, range, default and flag."""

from __future__ import annotations

import ast
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, fields

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_pgqueue.checks import check_settings
from django_pgqueue.core.conf import SETTINGS, SETTINGS_BY_NAME, Setting, get_settings
from django_pgqueue.management.commands.runtaskworker import Command
from django_pgqueue.worker.worker import WorkerOptions
from tests.conftest import REPO

TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "str", list: "list[str]", dict: "dict"}


def documented_rows() -> dict[str, dict[str, str]]:
    """{key: {column: cell}} for each row of the tables of docs/settings.md whose first
    column is "key" (the tables of settings, not those of check ids or flags)."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in (REPO / "docs" / "settings.md").read_text().splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if header is None:
            header = cells
        elif header[0] == "key" and set(cells) != {"---"}:
            rows[cells[0].strip("`")] = dict(zip(header, cells, strict=True))
    return rows


def first_code(cell: str) -> str:
    """The first `code span` of a table cell."""
    match = re.search(r"`([^`]+)`", cell)
    assert match, f"no code span in {cell!r}"
    return match.group(1).replace("\\|", "|")


def documented_range(setting: Setting) -> str | None:
    """How docs/settings.md writes a setting's range after its type: ">= 1", "1..65535"."""
    if setting.minimum is not None and setting.maximum is not None:
        return f"{setting.minimum:g}..{setting.maximum:g}"
    if setting.minimum is not None:
        return f">= {setting.minimum:g}"
    if setting.above is not None:
        return f"> {setting.above:g}"
    return None


# -- the table and its documentation ---------------------------------------------------


def test_every_setting_is_documented_and_every_documented_key_is_a_setting():
    documented = set(documented_rows())
    declared = {s.name for s in SETTINGS}

    assert sorted(declared - documented) == [], "in conf.SETTINGS, not in docs/settings.md"
    assert sorted(documented - declared) == [], "in docs/settings.md, not in conf.SETTINGS"


def test_the_documented_default_type_and_range_of_each_setting_are_its_rows():
    rows = documented_rows()
    wrong = []
    for setting in SETTINGS:
        row = rows[setting.name]
        if ast.literal_eval(first_code(row["default"])) != setting.default:
            wrong.append(f"{setting.name}: default {row['default']} is not {setting.default!r}")
        kind = TYPE_NAMES[setting.kind] + (" | None" if setting.nullable else "")
        if first_code(row["type"]) != kind:
            wrong.append(f"{setting.name}: type {row['type']} is not `{kind}`")
        expected_range = documented_range(setting)
        if expected_range and expected_range not in row["type"]:
            wrong.append(f"{setting.name}: type {row['type']} does not say {expected_range}")
        for choice in setting.choices or ():
            if f'`"{choice}"`' not in row["type"]:
                wrong.append(f"{setting.name}: type {row['type']} does not name {choice!r}")

    assert wrong == []


def test_the_documented_flag_of_each_worker_setting_is_its_rows():
    rows = documented_rows()
    wrong = [
        f"{s.name}: documented flag {rows[s.name]['flag']!r}, declared {s.flag!r}"
        for s in SETTINGS
        if "flag" in rows[s.name]
        and (first_code(rows[s.name]["flag"]).split()[0] if rows[s.name]["flag"] else None)
        != s.flag
    ]

    assert wrong == []


def test_every_default_is_valid_by_its_own_rules():
    assert [s.name for s in SETTINGS if s.problem(s.default, s.name) is not None] == []


# -- manage.py check -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "check_id", "message"),
    [
        (
            {"EXECUTION": "fork"},
            "django_pgqueue.E012",
            "PGQUEUE['EXECUTION'] is 'fork': use one of 'thread', 'process'",
        ),
        ({"KILL_GRACE": -1}, "django_pgqueue.E011", "PGQUEUE['KILL_GRACE'] is -1: use 0 or more"),
        (
            {"DEAD_CONNECTION_TIMEOUT": 0},
            "django_pgqueue.E011",
            "PGQUEUE['DEAD_CONNECTION_TIMEOUT'] is 0: use a value greater than 0",
        ),
        (
            {"HEARTBEAT_SECONDS": math.nan},
            "django_pgqueue.E011",
            "PGQUEUE['HEARTBEAT_SECONDS'] is nan: use a value greater than 0",
        ),
        (
            {"LEASE_SECONDS": "30"},
            "django_pgqueue.E010",
            "PGQUEUE['LEASE_SECONDS'] must be a number, not '30'",
        ),
        (
            {"PRUNE_BATCH": True},
            "django_pgqueue.E010",
            "PGQUEUE['PRUNE_BATCH'] must be an int, not True",
        ),
        (
            {"QUEUES": "default"},
            "django_pgqueue.E010",
            "PGQUEUE['QUEUES'] must be a list of strings, not 'default'",
        ),
        (
            {"DEFAULT_TIMEOUT": -5},
            "django_pgqueue.E011",
            "PGQUEUE['DEFAULT_TIMEOUT'] is -5: use a value greater than 0",
        ),
        ({"CONCURRENCY": 0}, "django_pgqueue.E003", "PGQUEUE['CONCURRENCY'] is 0: use 1 or more"),
    ],
)
def test_a_value_of_the_wrong_kind_or_out_of_range_is_a_check_error_with_its_id(
    configured, check_id, message
):
    # given: one bad value in PGQUEUE
    with override_settings(PGQUEUE=configured):
        # when: the checks run
        errors = check_settings(None)

    # then: it is the only error, with its id, and the hint tells the setting's meaning
    assert [(e.id, e.msg) for e in errors] == [(check_id, message)]
    (name,) = configured
    assert SETTINGS_BY_NAME[name].doc in errors[0].hint


def test_none_is_a_valid_value_only_of_the_nullable_settings():
    with override_settings(PGQUEUE={"VACUUM_INTERVAL": None, "UNROUTABLE_TTL": None}):
        assert check_settings(None) == []
    with override_settings(PGQUEUE={"LEASE_SECONDS": None}):
        assert [e.id for e in check_settings(None)] == ["django_pgqueue.E010"]


def test_a_read_database_that_is_not_an_alias_of_databases_is_a_check_error():
    with override_settings(PGQUEUE={"READ_DATABASE": "replica"}):
        errors = check_settings(None)

    assert [(e.id, e.msg) for e in errors] == [
        ("django_pgqueue.E001", "PGQUEUE['READ_DATABASE'] is 'replica', which is not in DATABASES")
    ]
    assert "default" in errors[0].hint  # the aliases there are


def test_a_read_database_that_is_not_postgresql_is_a_check_error(monkeypatch):
    from django.db import connections

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    monkeypatch.setitem(connections.databases, "replica", sqlite)
    with override_settings(PGQUEUE={"READ_DATABASE": "replica"}):
        errors = check_settings(None)

    assert [e.id for e in errors] == ["django_pgqueue.E002"]
    assert errors[0].msg.startswith("the read database (READ_DATABASE) 'replica' is not PostgreSQL")


def test_manage_py_check_fails_on_a_misconfigured_value():
    with (
        override_settings(PGQUEUE={"EXECUTION": "fork"}),
        pytest.raises(SystemCheckError, match=r"django_pgqueue\.E012"),
    ):
        call_command("check")


# -- runtaskworker's flags -------------------------------------------------------------


def test_each_flag_of_the_table_is_a_runtaskworker_option_showing_the_effective_default():
    # given: settings that differ from the defaults
    configured = {"LEASE_SECONDS": 45, "QUEUES": ["a", "b"], "EXECUTION": "process"}
    with override_settings(PGQUEUE=configured):
        # when: the command's parser is built
        parser = Command().create_parser("manage.py", "runtaskworker")
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}

    # then: each setting with a flag has it, typed as the setting, showing its value
    for setting in (s for s in SETTINGS if s.flag is not None):
        action = actions[setting.flag]
        assert action.dest == setting.dest
        assert action.help.startswith(setting.help)
        if setting.choices:
            assert action.choices == list(setting.choices)
    assert actions["--lease"].type is float
    assert actions["--concurrency"].type is int
    assert actions["--lease"].help.endswith("(default: 45)")
    assert actions["--queues"].help.endswith("(default: a,b)")
    assert actions["--execution"].help.endswith("(default: process)")
    assert actions["--metrics-port"].help.endswith("(default: none)")


@pytest.fixture
def quiet_worker_logger() -> Iterator[None]:
    """runtaskworker sets the django_pgqueue logger up; give it back as it was."""
    logger = logging.getLogger("django_pgqueue")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


@pytest.mark.usefixtures("quiet_worker_logger")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--lease", "0"), "--lease is 0.0: use a value greater than 0"),
        (("--concurrency", "0"), "--concurrency is 0: use 1 or more"),
        (("--processes", "0"), "--processes is 0: use 1 or more"),
        (("--metrics-port", "70000"), "--metrics-port is 70000: use 65535 or less"),
        (("--heartbeat", "40"), "--heartbeat (40s) must be shorter than --lease (30s)"),
    ],
)
def test_runtaskworker_refuses_a_flag_value_out_of_range_naming_the_flag(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("runtaskworker", *args)


@pytest.mark.usefixtures("quiet_worker_logger")
def test_runtaskworker_names_the_setting_when_the_setting_gave_the_bad_value():
    # call_command skips the system checks, as --skip-checks does
    with (
        override_settings(PGQUEUE={"KILL_GRACE": -1}),
        pytest.raises(CommandError, match=re.escape("PGQUEUE['KILL_GRACE'] is -1: use 0 or more")),
    ):
        call_command("runtaskworker")


# -- the worker's options and the effective settings ----------------------------------


def test_worker_options_have_a_field_per_option_setting_and_cross_a_process_boundary():
    # given: a setting and an override
    with override_settings(PGQUEUE={"KILL_GRACE": 5.0}):
        # when: the options are read from the settings, with overrides on top
        options = WorkerOptions.from_settings(concurrency=3, lease_seconds=None)

    # then: the setting, the override, and the default of what was not overridden
    assert (options.kill_grace, options.concurrency, options.lease_seconds) == (5.0, 3, 30.0)
    assert {f.name for f in fields(WorkerOptions)} == {
        *(s.option for s in SETTINGS if s.option),
        "burst",
        "prune",
        "database",
    }
    # ... and they are rebuilt whole from JSON, as the supervisor's children rebuild them
    assert WorkerOptions(**json.loads(json.dumps(asdict(options)))) == options


def test_an_unknown_worker_option_is_refused():
    with pytest.raises(TypeError, match="kill_grase"):
        WorkerOptions.from_settings(kill_grase=1.0)


def test_default_backoff_keys_left_out_keep_their_defaults():
    with override_settings(PGQUEUE={"DEFAULT_BACKOFF": {"cap": 60}}):
        backoff = get_settings().DEFAULT_BACKOFF

    assert backoff == {"base": 5.0, "factor": 2.0, "cap": 60, "jitter": 0.25}

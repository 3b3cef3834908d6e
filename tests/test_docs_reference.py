"""The reference pages name every item the code has, read from the code itself: a new
check id, command flag, metric, permission or public name fails here until its page
says what it is; a page that names one the code no longer has fails too."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re

import pytest
from django.core.management.base import BaseCommand
from django.dispatch import Signal

from tests.conftest import REPO

DOCS = REPO / "docs"
PACKAGE = REPO / "django_pgqueue"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def table_rows(text: str, first_column: str) -> dict[str, list[str]]:
    """{first cell without backticks: cells} of the Markdown tables of ``text`` whose
    header's first cell is ``first_column``."""
    rows: dict[str, list[str]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if header is None:
            header = cells
        elif header[0] == first_column and set(cells) != {"---"}:
            rows[cells[0].strip("`")] = cells
    return rows


# -- system checks (docs/checks.md) ---------------------------------------------------


def check_ids_in_source() -> set[str]:
    """Every check id the package's source gives a message, whatever module it is in."""
    ids: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        ids |= set(re.findall(r"django_pgqueue\.[EW]\d{3}\b", path.read_text()))
    return ids


def test_every_check_id_of_the_source_is_in_the_checks_reference_and_no_other():
    documented = {i for i in table_rows(page("checks.md"), "id") if i.startswith("django_")}
    source = check_ids_in_source()

    assert {"django_pgqueue.W101", "django_pgqueue.E101", "django_pgqueue.W001"} <= source
    assert sorted(source - documented) == [], "in the source, not in docs/checks.md"
    assert sorted(documented - source) == [], "in docs/checks.md, not in the source"


def test_each_check_is_documented_at_its_level():
    for check_id, cells in table_rows(page("checks.md"), "id").items():
        level = {"E": "error", "W": "warning"}[check_id.rsplit(".", 1)[1][0]]
        assert cells[1] == level, check_id


# -- management commands (docs/commands.md) -------------------------------------------


def commands() -> dict[str, BaseCommand]:
    """Every management command of the app, by name."""
    from django_pgqueue.management import commands as package

    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            command = importlib.import_module(f"{package.__name__}.{module.name}").Command()
            found[module.name] = command
    return found


def own_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments, without Django's own options and --help."""
    django = {
        s for a in BaseCommand().create_parser("manage.py", "x")._actions for s in a.option_strings
    }
    return [
        a
        for a in parser._actions
        if not set(a.option_strings) & django and not isinstance(a, argparse._HelpAction)
    ]


def command_sections() -> dict[str, list[str]]:
    """{command: the first cells of its section's tables, without backticks}."""
    sections: dict[str, list[str]] = {}
    for part in re.split(r"^## ", page("commands.md"), flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        rows = {}
        for header in ("flag", "argument or flag", "subcommand, argument or flag"):
            rows |= table_rows(body, header)
        sections[title.strip().strip("`")] = list(rows)
    return sections


def missing_arguments(
    parser: argparse.ArgumentParser, cells: list[str], sub: str = ""
) -> list[str]:
    """The arguments of ``parser`` that no cell names (within subcommand ``sub``'s
    cells, for a subcommand's parser)."""
    missing = []
    for action in own_arguments(parser):
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                mine = [c for c in cells if c.split()[0] == name]
                missing += [name] if not mine else missing_arguments(subparser, mine, name)
            continue
        if action.option_strings:
            wanted = max(action.option_strings, key=len)
            named = any(wanted in re.findall(r"--[a-z-]+", c) for c in cells)
        else:
            wanted = action.metavar or action.dest.upper()
            named = any(wanted in c.split() for c in cells)
        if not named:
            missing.append(f"{sub} {wanted}".strip())
    return missing


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in own_arguments(parser):
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                flags |= flags_of(subparser)
        flags |= set(action.option_strings)
    return flags


def test_every_command_has_a_section_in_the_commands_reference_and_no_other():
    assert sorted(command_sections()) == sorted(commands())


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_argument_of_a_command_is_in_its_section(name):
    parser = commands()[name].create_parser("manage.py", name)

    assert missing_arguments(parser, command_sections()[name]) == []


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_flag_a_section_names_is_one_of_its_command(name):
    parser = commands()[name].create_parser("manage.py", name)
    named = {f for cell in command_sections()[name] for f in re.findall(r"--[a-z-]+", cell)}

    assert sorted(named - flags_of(parser)) == []


def test_each_worker_flag_names_the_setting_it_overrides():
    from django_pgqueue.core.conf import SETTINGS

    cells = table_rows(page("commands.md"), "flag")
    by_flag = {key.split()[0]: row for key, row in cells.items()}
    for setting in SETTINGS:
        if setting.flag is not None:
            assert by_flag[setting.flag][1] == f"`{setting.name}`", setting.flag


# -- the Python API (docs/api.md) -----------------------------------------------------

# The modules docs/api.md documents, each under a heading of its name.
API_MODULES = (
    "django_pgqueue",
    "django_pgqueue.testing",
    "django_pgqueue.workflows",
    "django_pgqueue.periodic",
    "django_pgqueue.operations",
    "django_pgqueue.middleware",
    "django_pgqueue.signals",
    "django_pgqueue.backends",
    "django_pgqueue.embedded",
    "django_pgqueue.admin",
    "django_pgqueue.doctor",
    "django_pgqueue.celery",
    "django_pgqueue.exceptions",
    "django_pgqueue.metrics",
    "django_pgqueue.worker.logging",
)
IDENTIFIER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def public_names(module_name: str) -> set[str]:
    """The module's ``__all__``; without one, the functions, classes and Django signals
    it defines under a name without a leading underscore."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return set(module.__all__)
    source = inspect.getsource(module)
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (
            getattr(value, "__module__", None) == module_name
            or (isinstance(value, Signal) and re.search(rf"^{name} = ", source, re.M))
        )
    }


def api_sections() -> dict[str, str]:
    """{heading without backticks: its text} of docs/api.md's second-level sections."""
    parts = re.split(r"^## ", page("api.md"), flags=re.M)[1:]
    return {p.partition("\n")[0].replace("`", "").strip(): p.partition("\n")[2] for p in parts}


def named_in_tables(text: str, column: int = 0) -> set[str]:
    """The identifiers in code spans of one column of the tables of ``text``."""
    names = set()
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) > column and set(cells) != {"---"}:
            names |= set(IDENTIFIER.findall(cells[column]))
    return names


@pytest.mark.parametrize("module_name", API_MODULES)
def test_every_public_name_of_a_module_is_in_its_section_of_the_api_reference(module_name):
    section = api_sections()[module_name]

    missing = sorted(n for n in public_names(module_name) if f"`{n}`" not in section)

    assert missing == [], f"not in the {module_name} section of docs/api.md"


@pytest.mark.parametrize("module_name", API_MODULES)
def test_every_name_the_api_reference_lists_exists(module_name):
    module = importlib.import_module(module_name)
    column = 1 if module_name == "django_pgqueue.celery" else 0
    listed = named_in_tables(api_sections()[module_name], column)

    if module_name == "django_pgqueue.backends":
        listed -= set(module.OPTION_NAMES)  # the table of OPTIONS keys
    assert sorted(n for n in listed if not hasattr(module, n)) == []


def test_every_module_the_api_reference_documents_is_checked():
    documented = {h for h in api_sections() if h.startswith("django_pgqueue")}

    assert documented == set(API_MODULES)


def test_every_task_option_is_in_the_api_reference_with_its_default():
    from django_pgqueue import task

    rows = table_rows(api_sections()["@task options"], "option")
    parameters = {
        p.name: p
        for p in inspect.signature(task).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }

    assert sorted(rows) == sorted(parameters)
    for name, parameter in parameters.items():
        default = rows[name][2]
        if isinstance(parameter.default, bool | int | float | str | tuple):
            value = parameter.default
            shown = json.dumps(value) if isinstance(value, str) else repr(value)
            assert default.startswith(f"`{shown}`"), name
        elif parameter.default is None and name != "name":
            assert default.startswith(("`None`", '`PGQUEUE["DEFAULT_')), name


def test_every_using_option_is_in_the_api_reference():
    from django_pgqueue.tasking.registry import OPTION_NAMES

    rows = table_rows(api_sections()["using() options"], "option")
    documented = {name.strip("` ") for row in rows for name in row.split(",")}

    assert sorted(documented) == sorted(OPTION_NAMES)


def test_every_method_of_a_task_definition_is_in_the_api_reference():
    from django_pgqueue import TaskDefinition

    methods = {
        name
        for name, value in vars(TaskDefinition).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    rows = table_rows(api_sections()["TaskDefinition"], "method or property")

    assert sorted(row.split("(")[0] for row in rows) == sorted(methods)


def test_every_option_of_the_tasks_framework_backend_is_in_the_api_reference():
    from django_pgqueue.backends import OPTION_NAMES

    rows = table_rows(api_sections()["django_pgqueue.backends"], "key")

    assert sorted(rows) == sorted(OPTION_NAMES)


# -- admin permissions (docs/security.md) ---------------------------------------------


def permission_rows() -> dict[str, str]:
    """{permission codename: what the row says it allows} of docs/security.md's table."""
    rows = {}
    for cells in table_rows(page("security.md"), "permission").values():
        for codename in re.findall(r"`django_pgqueue\.([a-z_]+)`", cells[0]):
            rows[codename] = cells[1]
    return rows


def app_permissions() -> set[str]:
    """Every permission codename of the app's models: Django's defaults and their own."""
    from django.apps import apps

    codenames = set()
    for model in apps.get_app_config("django_pgqueue").get_models():
        opts = model._meta
        codenames |= {f"{action}_{opts.model_name}" for action in opts.default_permissions}
        codenames |= {codename for codename, _ in opts.permissions}
    return codenames


def test_every_permission_of_the_app_is_in_the_security_reference_and_no_other():
    documented = set(permission_rows())

    assert {"enqueue_task", "pause_queue", "decrypt_task"} <= app_permissions()
    assert sorted(app_permissions() - documented) == [], "not in docs/security.md"
    assert sorted(documented - app_permissions()) == [], "not a permission of the app"


def test_every_permission_the_admin_checks_by_name_is_in_the_security_reference():
    checked = set()
    for path in (PACKAGE / "admin").rglob("*.py"):
        checked |= set(re.findall(r"has_perm\(\s*\"django_pgqueue\.([a-z_]+)\"", path.read_text()))

    assert checked and sorted(checked - set(permission_rows())) == []


def test_every_admin_action_is_in_the_row_of_the_permission_it_needs():
    from django.apps import apps
    from django.contrib import admin

    rows = permission_rows()
    for model in apps.get_app_config("django_pgqueue").get_models():
        model_admin = admin.site._registry.get(model)
        for action in getattr(model_admin, "actions", None) or ():
            function = getattr(model_admin, action) if isinstance(action, str) else action
            for permission in function.allowed_permissions:
                codename = f"{permission}_{model._meta.model_name}"
                assert f"*{function.short_description}*" in rows[codename], codename


# -- metrics (docs/metrics.md) --------------------------------------------------------


def exported_metrics() -> dict[str, str]:
    """{name: type} of every metric the package exports, named as Prometheus shows it
    (a counter with its ``_total``)."""
    from prometheus_client import CollectorRegistry

    from django_pgqueue.ops.metrics import DoctorCollector, QueueCollector
    from django_pgqueue.worker.metrics_server import WorkerMetrics

    registry = CollectorRegistry()
    WorkerMetrics(registry)
    families = [*registry.collect(), *DoctorCollector().describe(), *QueueCollector().describe()]
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}


def test_every_metric_is_in_the_metrics_reference_and_no_other():
    documented = set(table_rows(page("metrics.md"), "metric"))
    exported = set(exported_metrics())

    assert "pgqueue_task_outcomes_total" in exported
    assert sorted(exported - documented) == [], "not in docs/metrics.md"
    assert sorted(documented - exported) == [], "not a metric of the package"


def test_each_metric_is_documented_with_its_type():
    rows = table_rows(page("metrics.md"), "metric")

    for name, kind in exported_metrics().items():
        assert rows[name][1] == kind, name


# -- settings (docs/settings.md; tests/test_settings.py checks defaults and flags) ----


def test_each_default_the_tasks_framework_backend_overrides_names_its_options_key():
    from django_pgqueue.backends import OPTION_NAMES
    from django_pgqueue.core.conf import SETTINGS_BY_NAME

    rows = table_rows(page("settings.md"), "key")
    overridden = [k for k in OPTION_NAMES if f"DEFAULT_{k.upper()}" in SETTINGS_BY_NAME]

    assert overridden
    for key in overridden:
        assert f'`OPTIONS["{key}"]`' in rows[f"DEFAULT_{key.upper()}"][-1], key


def test_every_attribute_and_method_of_the_task_context_is_in_the_api_reference():
    from django_pgqueue import TaskContext

    members = {f.name for f in dataclasses.fields(TaskContext)} | set(vars(TaskContext))
    public = {name for name in members if not name.startswith("_")}
    rows = table_rows(api_sections()["TaskContext"], "attribute or method")
    documented = {name for cells in rows.values() for name in re.findall(r"`([a-z_]+)", cells[0])}

    assert sorted(public - documented) == [], "not in docs/api.md"
    assert sorted(documented - public) == [], "not a member of TaskContext"


def tables_of(text: str) -> list[list[list[str]]]:
    """Each Markdown table of ``text``, as its rows of cells, header left out."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if current is None:
            current = []
            tables.append(current)
        elif set(cells) != {"---"}:
            current.append(cells)
    return tables


@pytest.mark.django_db
def test_every_key_of_the_status_json_is_in_the_commands_reference():
    from django_pgqueue.management.commands.pgqueue_status import read_status, read_task
    from django_pgqueue.tasking.periodic import schedules
    from tests import tasks

    text = page("commands.md")
    text = text[text.index("### `pgqueue_status --json`") : text.index("## `pgqueue_doctor`")]
    document, rows, queues, schedule_entries = (
        {name for cells in table for name in IDENTIFIER.findall(cells[0])}
        for table in tables_of(text)
    )
    task_id = tasks.noop.enqueue()
    status = read_status()
    shown = read_task(task_id, None, logs=True)
    # A schedule's keys, from the dict each entry is built from.
    listing = inspect.getsource(schedules).split("listing.append(")[1]

    assert document == set(status)
    assert rows == set(status["tasks"][0])
    assert queues == set(status["queues"][0])
    assert schedule_entries == set(re.findall(r'^\s+"([a-z_]+)":', listing, re.M))
    paragraph = text[text.index("With `--task ID`") :]
    assert [key for key in [*shown, *shown["task"]] if f"`{key}`" not in paragraph] == []


def test_every_alert_rule_is_in_the_metrics_reference_and_no_other():
    rules = set(re.findall(r"^\s*- alert: (\w+)", page("prometheus-alerts.yml"), re.M))
    documented = set(table_rows(page("metrics.md"), "alert"))

    assert rules and sorted(rules ^ documented) == []


def test_every_check_of_the_queue_doctor_is_in_a_table_of_the_docs_and_no_other():
    from django_pgqueue.ops.doctor import CHECK_IDS

    documented = set()
    for path in DOCS.glob("*.md"):
        for cells in table_rows(path.read_text(), "check").values():
            documented |= set(re.findall(r"`([a-z]+\.[a-z_]+)`", cells[0]))

    assert sorted(set(CHECK_IDS) - documented) == [], "in no table of docs/ whose column is check"
    assert sorted(documented - set(CHECK_IDS)) == [], "not a check of the doctor"

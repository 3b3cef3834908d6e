"""The code in README.md, docs/quickstart.md and docs/testing.md runs as written, in the
file its first line names.

The convention of those pages' code blocks is in tests/docs_project.py: a ``python``
or ``ini`` block starts with ``# PATH``, the file it is pasted into (or ``# python
manage.py shell``), unless a ``<!-- docs-example: ... -->`` comment right before it
says it is a ``signature`` or an ``optional`` alternative; an ``sh`` block after
``<!-- docs-example: run -->`` is a step of the newcomer's path.

Here, quickly: every block follows the convention and compiles; the signatures are the
functions'; the settings run as pasted into the settings ``startproject`` writes; the
README's and the quickstart's ``shop`` modules, pasted into a throwaway package (with
the ``Order`` model the quickstart gives, in the test app so that its table lives in
the test's transaction), import and enqueue against the test database. Slow: the whole
path (tests/docs_project.py) in a new directory and database, the testing page's tests
included; .ci/newcomer-check follows it again with the wheel in a fresh virtualenv.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import RequestFactory

from django_pgqueue import testing
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from tests import docs_project
from tests.conftest import REPO, database_url
from tests.docs_project import MARKERS, PAGES, Block, blocks

ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
CODE_BLOCKS = [block for block in ALL_BLOCKS if block.language in ("python", "ini")]
PYTHON_BLOCKS = [b for b in CODE_BLOCKS if b.language == "python" and b.marker != "signature"]


def label(block: Block) -> str:
    return block.label


def test_the_pages_have_python_blocks_to_check():
    assert {block.page for block in PYTHON_BLOCKS} == set(PAGES)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=label)
def test_every_docs_example_comment_is_one_the_convention_knows(block: Block):
    assert block.marker is None or block.marker in MARKERS, (
        f"{block.label}: unknown <!-- docs-example: {block.marker} --> "
        "(see tests/docs_project.py for the convention)"
    )
    if block.marker == "run":
        assert block.language == "sh", f"{block.label}: only sh blocks are run"


@pytest.mark.parametrize("block", CODE_BLOCKS, ids=label)
def test_every_code_block_names_the_file_it_goes_into(block: Block):
    assert block.file or block.is_shell or block.marker == "signature", (
        f"{block.label}: the block's first line must name its file (# shop/tasks.py), or "
        "be # python manage.py shell, or the block be marked a signature"
    )


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=label)
def test_every_python_block_compiles(block: Block):
    compile(block.code, block.label, "exec")


SIGNATURES = [block for block in ALL_BLOCKS if block.marker == "signature"]


@pytest.mark.parametrize("block", SIGNATURES, ids=label)
def test_the_signatures_on_the_testing_page_are_the_functions(block: Block):
    # "name(a, b=None, *, c=None) -> R" per function, possibly over several lines
    documented_functions = re.findall(r"^(\w+)\((.*?)\)\s*->", block.code, re.M | re.S)
    assert documented_functions, f"{block.label}: no signature found"
    for name, params in documented_functions:
        function = getattr(testing, name)
        documented = [p.strip().split("=")[0] for p in params.split(",") if p.strip()]
        actual = []
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind is parameter.KEYWORD_ONLY and "*" not in actual:
                actual.append("*")
            actual.append(parameter.name)
        assert documented == actual, f"{block.label}: {name}"


# -- settings.py, as startproject writes it, with the quickstart's lines added -------


def settings_blocks(optional: bool) -> list[Block]:
    return [
        block
        for block in blocks("docs/quickstart.md")
        if block.file == "mysite/settings.py" and (block.marker == "optional") == optional
    ]


def run_settings(tmp_path: Path, extra: list[Block]) -> dict:
    """The settings module startproject writes, with ``extra`` pasted at its end, run."""
    call_command("startproject", "mysite", str(tmp_path))
    path = tmp_path / "mysite" / "settings.py"
    code = path.read_text() + "".join("\n\n" + block.code for block in extra)
    namespace = {"__file__": str(path), "__name__": "mysite.settings"}
    exec(compile(code, str(path), "exec"), namespace)
    return namespace


def test_the_quickstart_settings_run_as_pasted_at_the_end_of_a_new_projects(tmp_path):
    settings = run_settings(tmp_path, settings_blocks(optional=False))

    assert settings["INSTALLED_APPS"][-2:] == ["django_pgqueue", "shop"]
    assert "django.contrib.admin" in settings["INSTALLED_APPS"]
    assert settings["PGQUEUE"] == {"QUEUES": ["default", "emails"]}
    assert settings["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"


def test_the_embedded_database_settings_run_as_pasted_with_a_database_url(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", "postgres://ann@db.example.com:5433/shop")
    [embedded] = settings_blocks(optional=True)

    settings = run_settings(tmp_path, [*settings_blocks(optional=False), embedded])

    default = settings["DATABASES"]["default"]
    assert (default["ENGINE"], default["HOST"], default["PORT"], default["NAME"]) == (
        "django.db.backends.postgresql", "db.example.com", 5433, "shop"
    )  # fmt: skip


# -- the shop modules, run -------------------------------------------------------------

# shop/models.py for the pages' modules: the quickstart's model, in the test app (so the
# table can be created and dropped inside the test's transaction).
MODELS_META = '''

    class Meta:
        app_label = "testapp"
        db_table = "{table}"
'''


@dataclass
class Shop:
    package: str
    order: type
    tasks: ModuleType
    views: ModuleType


def page_modules(page: str) -> dict[str, str]:
    """The page's blocks for shop/NAME.py, by NAME, each file's blocks in order."""
    modules: dict[str, str] = {}
    for block in blocks(page):
        if block.file and block.file.startswith("shop/") and block.marker != "optional":
            name = block.file.removeprefix("shop/").removesuffix(".py")
            modules[name] = modules.get(name, "") + "\n\n" + block.code
    return modules


@pytest.fixture
def shop(db: None, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Shop]:
    """The page's shop/tasks.py and shop/views.py (``request.param``: README.md or the
    quickstart), pasted into a throwaway package with the quickstart's shop/models.py,
    its Order table created in the test's transaction."""
    package = f"docs_example_{uuid.uuid4().hex[:12]}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    models = page_modules("docs/quickstart.md")["models"]
    (root / "models.py").write_text(models + MODELS_META.format(table=f"{package}_order"))
    modules = page_modules(request.param)
    for name in ("tasks", "views"):
        (root / f"{name}.py").write_text(modules[name])

    sys.path.insert(0, str(tmp_path))
    try:
        models = importlib.import_module(f"{package}.models")
        with connection.schema_editor() as editor:  # rolled back with the test
            editor.create_model(models.Order)
        yield Shop(
            package=package,
            order=models.Order,
            tasks=importlib.import_module(f"{package}.tasks"),
            views=importlib.import_module(f"{package}.views"),
        )
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]
        for definition in registry.all():  # the page's tasks: send_receipt, and others
            if definition.name.startswith(f"{package}."):
                registry.unregister(definition.name)
        apps.all_models["testapp"].pop("order", None)
        apps.clear_cache()


def place_order(shop: Shop, email: str) -> object:
    request = RequestFactory().post("/orders/", {"email": email})
    return shop.views.place_order(request)


QUICKSTART = pytest.mark.parametrize("shop", ["docs/quickstart.md"], indirect=True)


@pytest.mark.parametrize("shop", ["README.md"], indirect=True)
def test_the_readme_view_enqueues_the_readme_task_with_the_order(shop: Shop):
    # when: the README's view places an order
    response = place_order(shop, "ann@example.com")

    # then: the order and its task both exist
    assert response.status_code == 201
    [order] = shop.order.objects.all()
    row = Task.objects.get(task_name=f"{shop.package}.tasks.send_receipt")
    assert (row.args, row.queue, row.max_attempts) == ([order.pk], "emails", 5)


@QUICKSTART
def test_the_quickstart_view_enqueues_the_task_with_the_order(shop: Shop):
    # when: the quickstart's view places an order
    placed = json.loads(place_order(shop, "ann@example.com").content)

    # then: the order and its task both exist, the task as the decorator declared it
    assert shop.order.objects.filter(pk=placed["order"]).exists()
    row = Task.objects.get(pk=placed["task"])
    assert (row.task_name, row.args, row.state) == (
        f"{shop.package}.tasks.send_receipt",
        [placed["order"]],
        "pending",
    )
    assert (row.queue, row.priority, row.max_attempts) == ("emails", 10, 5)
    assert row.timeout == timedelta(seconds=60)


@QUICKSTART
def test_the_quickstart_task_is_gone_when_the_order_rolls_back(shop: Shop):
    # given: the quickstart's view, inside a transaction that then fails
    with pytest.raises(RuntimeError), transaction.atomic():
        placed = json.loads(place_order(shop, "bob@example.com").content)
        raise RuntimeError("the request failed after the view")

    # then: neither the order nor its task was written
    assert not shop.order.objects.filter(pk=placed["order"]).exists()
    assert not Task.objects.filter(pk=placed["task"]).exists()


@QUICKSTART
def test_the_quickstart_task_is_idempotent_as_the_page_says(shop: Shop):
    # given: an order placed through the quickstart's view
    placed = json.loads(place_order(shop, "cy@example.com").content)

    # when: its handler runs twice (delivery is at-least-once)
    first = shop.tasks.send_receipt(placed["order"])
    second = shop.tasks.send_receipt(placed["order"])

    # then: the receipt is sent once
    assert (first, second) == ("sent", "already sent")
    assert shop.order.objects.get(pk=placed["order"]).receipt_sent_at is not None


# -- what the quickstart teaches about the worker --------------------------------------


def test_the_quickstart_says_a_released_task_keeps_its_attempt_and_the_way_out():
    text = (REPO / "docs/quickstart.md").read_text()
    section = text.split("## Run a worker", 1)[1].split("\n## ", 1)[0]
    prose = " ".join(section.split())
    assert "(tasks.md#the-taskcontext)" in prose
    prose = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", prose)  # links read as their text
    assert "is **released**" in prose
    assert "**the attempt it was on counts**: it is not given back" in prose
    assert "ends `failed`" in prose
    assert "Keep handlers shorter than the grace period" in prose
    assert "raise `Continue`" in prose


# -- the whole path, in a new directory and database -----------------------------------


@pytest.mark.slow  # about a minute: two test databases; run by CI's slow step
def test_following_the_quickstart_and_the_testing_page_builds_a_project_whose_tests_pass(
    django_db_modify_db_settings: None, tmp_path: Path, capsys: pytest.CaptureFixture
):
    settings_dict = connections["default"].settings_dict
    url = database_url({**settings_dict, "NAME": f"{settings_dict['NAME']}_docs"})
    try:
        try:
            docs_project.build(tmp_path / "project", url)
        except docs_project.StepFailed as exc:
            pytest.fail(f"{exc}\n{capsys.readouterr().out}")
    finally:
        docs_project.drop_database(url)
    # the quickstart's task ran in the worker it started with --burst
    assert "1 task(s) claimed; success=1" in capsys.readouterr().out


README_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_BLOB = "https://github.com/django-pgqueue/django-pgqueue/blob/main/"


def test_readme_links_work_on_pypi_and_point_at_files_that_exist() -> None:
    """PyPI shows README.md without the repository around it, so a relative link there
    is broken: every link is absolute, and each one into the repository names a file
    this checkout has."""
    links = README_LINK.findall((REPO / "README.md").read_text())
    assert links, "the README links into the docs"
    relative = [link for link in links if "://" not in link]
    assert not relative, f"relative links in README.md break on PyPI: {relative}"
    missing = [
        link for link in links
        if link.startswith(REPO_BLOB) and not (REPO / link[len(REPO_BLOB):]).exists()
    ]
    assert not missing, f"README.md links to files that do not exist: {missing}"

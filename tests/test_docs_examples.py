"""The code in README.md and docs/quickstart.md works as written.

The convention, for the ```python blocks of those two pages:

- Every block must compile (``compile(..., "exec")``). Blocks that use names of the
  reader's own project (an ``Order`` model, a ``task_id`` from an earlier step) are
  only compiled.
- A block right after the HTML comment ``<!-- docs-example: module shop/NAME.py -->``
  is the module NAME of an app called ``shop``. The test writes those blocks, as they
  are, into a throwaway package of that name (with a unique package name, so the task
  names are unique too), supplies ``shop/models.py`` with the ``Order`` model the
  quickstart describes, and imports them: the task is registered, and the view
  enqueues it against the test database.

Any other ``<!-- docs-example: ... -->`` comment is an error, so a typo cannot turn a
check off.
"""

from __future__ import annotations

import importlib
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
from django.db import connection, transaction
from django.test import RequestFactory

from django_pgqueue.models import Task
from django_pgqueue.registry import registry
from tests.conftest import REPO

PAGES = ["README.md", "docs/quickstart.md"]
MARKER = re.compile(r"<!--\s*docs-example:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)

# shop/models.py for the quickstart's modules: the fields it names, in the test app (so
# the table can be created and dropped inside the test's transaction).
MODELS = '''
from django.db import models


class Order(models.Model):
    customer_email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    receipt_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "testapp"
        db_table = "{table}"
'''


@dataclass
class Block:
    page: str
    line: int
    code: str
    marker: str | None

    @property
    def label(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks(page: str) -> list[Block]:
    """The ```python blocks of a page, each with the docs-example comment before it."""
    text = (REPO / page).read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        blocks.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                code=match.group(1),
                marker=marker.group(1) if marker else None,
            )
        )
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in python_blocks(page)]


def test_the_pages_have_python_blocks_to_check():
    assert {block.page for block in ALL_BLOCKS} == set(PAGES)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda block: block.label)
def test_every_python_block_compiles(block: Block):
    compile(block.code, block.label, "exec")


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda block: block.label)
def test_every_docs_example_comment_is_one_the_test_understands(block: Block):
    assert block.marker is None or re.fullmatch(r"module shop/\w+\.py", block.marker), (
        f"{block.label}: unknown <!-- docs-example: {block.marker} --> "
        "(see this test's docstring for the convention)"
    )


# -- the quickstart's shop app, run --------------------------------------------------


@dataclass
class Shop:
    package: str
    order: type
    tasks: ModuleType
    views: ModuleType


@pytest.fixture
def quickstart_shop(db: None, tmp_path: Path) -> Iterator[Shop]:
    """The quickstart's shop/tasks.py and shop/views.py, imported from a throwaway
    package, with its Order table created in the test's transaction."""
    package = f"docs_example_{uuid.uuid4().hex[:12]}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "models.py").write_text(MODELS.format(table=f"{package}_order"))
    modules = {}
    for block in python_blocks("docs/quickstart.md"):
        if block.marker:
            name = block.marker.removeprefix("module shop/").removesuffix(".py")
            assert name not in modules, f"{block.label}: shop/{name}.py is given twice"
            modules[name] = block.code
    assert sorted(modules) == ["tasks", "views"], "the quickstart's shop modules moved"
    for name, code in modules.items():
        (root / f"{name}.py").write_text(code)

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
        registry.unregister(f"{package}.tasks.send_receipt")
        apps.all_models["testapp"].pop("order", None)
        apps.clear_cache()


def place_order(shop: Shop, email: str) -> dict:
    request = RequestFactory().post("/orders/", {"email": email})
    return json.loads(shop.views.place_order(request).content)


def test_the_quickstart_view_enqueues_the_task_with_the_order(quickstart_shop: Shop):
    # given the quickstart's shop app
    # when its view places an order
    placed = place_order(quickstart_shop, "ann@example.com")

    # then the order and its task both exist, the task as the decorator declared it
    assert quickstart_shop.order.objects.filter(pk=placed["order"]).exists()
    row = Task.objects.get(pk=placed["task"])
    assert (row.task_name, row.args, row.state) == (
        f"{quickstart_shop.package}.tasks.send_receipt",
        [placed["order"]],
        "pending",
    )
    assert (row.queue, row.priority, row.max_attempts) == ("emails", 10, 5)
    assert row.timeout == timedelta(seconds=60)


def test_the_quickstart_task_is_gone_when_the_order_rolls_back(quickstart_shop: Shop):
    # given the quickstart's view, inside a transaction that then fails
    with pytest.raises(RuntimeError), transaction.atomic():
        placed = place_order(quickstart_shop, "bob@example.com")
        raise RuntimeError("the request failed after the view")

    # then neither the order nor its task was written
    assert not quickstart_shop.order.objects.filter(pk=placed["order"]).exists()
    assert not Task.objects.filter(pk=placed["task"]).exists()


def test_the_quickstart_task_is_idempotent_as_the_page_says(quickstart_shop: Shop):
    # given an order placed through the quickstart's view
    placed = place_order(quickstart_shop, "cy@example.com")

    # when its handler runs twice (delivery is at-least-once)
    first = quickstart_shop.tasks.send_receipt(placed["order"])
    second = quickstart_shop.tasks.send_receipt(placed["order"])

    # then the receipt is sent once
    assert (first, second) == ("sent", "already sent")
    order = quickstart_shop.order.objects.get(pk=placed["order"])
    assert order.receipt_sent_at is not None


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

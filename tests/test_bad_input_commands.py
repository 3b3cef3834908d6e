"""Bad arguments to the management commands, searched for (Hypothesis).

Property: ``call_command`` with any arguments either works or raises CommandError (a
message for the operator); never another exception, whose traceback would be all the
operator sees. Inputs Hypothesis found that once broke it are pinned with ``@example``,
and each fix has its own test below.
"""

from __future__ import annotations

import math
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from django_pgqueue.models import Task
from tests.factories import TaskFactory
from tests.fuzzing import big_ints, examples, hostile_text

pytestmark = pytest.mark.django_db

values = st.one_of(
    hostile_text,
    big_ints.map(str),
    st.integers(-3, 3).map(str),
    st.floats().map(repr),
    st.sampled_from(
        [
            "nan", "inf", "-inf", "1e300", "-1", "0", "30m", "1.5h", "99999999999999d",
            "2026-13-01T00:00", "2026-05-01T12:00", "2026-05-01T12:00+23:00", "default",
            '{"by": "ops"}', "[" * 2000, "9" * 5000, '"\\u0000"', '"\\ud800"', "null", "-",
            "²", "tests.tasks.noop",
        ]
    ),
)  # fmt: skip
FLAGS = {
    "pgqueue_signal": ["--payload", "--database"],
    "pgqueue_cancel": ["--hard", "--database"],
    "pgqueue_requeue": ["--task", "--queue", "--since", "--id", "--all", "--dry-run",
                        "--database"],
    "pgqueue_prune": ["--dry-run", "--result-ttl", "--dead-ttl", "--batch", "--database"],
    "pgqueue_queue": ["pause", "resume", "list", "--task", "--json"],
    "pgqueue_status": ["--json"],
}  # fmt: skip


def _no_help(argv: list[str]) -> bool:
    """argparse answers -h, --help (and its abbreviations) by exiting: not an input."""
    return not any(a in ("-h", "--help") or a.startswith("--he") for a in argv)


def works_or_says_why(name: str, argv: list[str]) -> None:
    """The property, in a block of the test's transaction with a few tasks (rolled back)."""
    with transaction.atomic():
        TaskFactory(state="failed", attempt=3, max_attempts=3)
        TaskFactory(state="waiting", wait_reason="signal", wait_signal="go")
        TaskFactory(state="succeeded")
        try:
            call_command(name, *argv, stdout=StringIO(), stderr=StringIO())
        except CommandError as exc:
            assert str(exc).strip(), "a CommandError without a message"
        Task.objects.count()  # the block still queries
        transaction.set_rollback(True)


def arguments(name: str) -> st.SearchStrategy[list[str]]:
    return st.lists(st.one_of(st.sampled_from(FLAGS[name]), values), max_size=6)


@settings(max_examples=examples(80))
@given(argv=arguments("pgqueue_signal"))
@example(argv=["1", "a\x00"])  # DataError from the UPDATE
@example(argv=["1", "go", "--payload", "[" * 2000])  # RecursionError from json.loads
@example(argv=["1", "go", "--payload", "9" * 5000])  # ValueError: int from text past 4300
def test_pgqueue_signal_works_or_says_why(argv):
    assume(_no_help(argv))
    works_or_says_why("pgqueue_signal", argv)


@settings(max_examples=examples(60))
@given(argv=arguments("pgqueue_cancel"))
def test_pgqueue_cancel_works_or_says_why(argv):
    assume(_no_help(argv))
    works_or_says_why("pgqueue_cancel", argv)


@settings(max_examples=examples(100))
@given(argv=arguments("pgqueue_requeue"))
@example(argv=["--id", str(2**70)])  # DataError: bigint out of range
@example(argv=["--since", "99999999999999d"])  # OverflowError from timedelta
@example(argv=["--since", "2026-13-01T00:00"])  # ValueError from parse_datetime
@example(argv=["--task", "a\x00"])  # DataError: NUL in text
@example(argv=["--queue", "a\x00"])
def test_pgqueue_requeue_works_or_says_why(argv):
    assume(_no_help(argv))
    works_or_says_why("pgqueue_requeue", argv)


@settings(max_examples=examples(80))
@given(argv=arguments("pgqueue_prune"))
@example(argv=["--result-ttl", "nan"])  # DataError: interval out of range
@example(argv=["--dead-ttl", "inf"])
@example(argv=["--dead-ttl", "1e300"])  # DataError: timestamp out of range
@example(argv=["--batch", str(2**70)])  # DataError: bigint out of range
def test_pgqueue_prune_works_or_says_why(argv):
    assume(_no_help(argv))
    works_or_says_why("pgqueue_prune", argv)


@settings(max_examples=examples(80))
@given(argv=arguments("pgqueue_queue"))
def test_pgqueue_queue_works_or_says_why(argv):
    assume(_no_help(argv))
    works_or_says_why("pgqueue_queue", argv)


def _watches_forever(argv: list[str]) -> bool:
    """``--watch`` with a valid interval redraws until Ctrl-C: not a call to make here."""
    if any(a.startswith("--w") and a != "--watch" for a in argv):
        return True  # an abbreviation, or --watch=N: not worth parsing here
    if "--watch" not in argv:
        return False
    index = len(argv) - 1 - argv[::-1].index("--watch")  # the last one wins
    following = argv[index + 1] if index + 1 < len(argv) else "--json"
    if following.startswith("-") and following not in ("-1", "-inf", "-"):
        return True  # --watch alone: 2 seconds
    try:
        interval = float(following)
    except ValueError:
        return False
    return 0 < interval <= 24 * 3600


@settings(max_examples=examples(60))
@given(argv=st.lists(st.one_of(st.sampled_from(["--json", "--watch"]), values), max_size=4))
@example(argv=["--watch", "nan"])  # ValueError from time.sleep(nan)
@example(argv=["--watch", "inf"])  # OverflowError from time.sleep(inf)
def test_pgqueue_status_works_or_says_why(argv):
    assume(_no_help(argv) and not _watches_forever(argv))
    works_or_says_why("pgqueue_status", argv)


# -- regressions: each input Hypothesis found, as a plain test --------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "2026-13-01T00:00"], r"--since '2026-13-01T00:00': use a duration .*month"),
        (["--since", "99999999999999d"], r"--since '99999999999999d': use a duration"),
        (["--task", "a\x00"], r"--task: strings must not contain NUL characters"),
        (["--queue", "q\udc00"], r"--queue: the string has a lone surrogate"),
    ],
)
def test_pgqueue_requeue_says_which_filter_is_bad(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("pgqueue_requeue", *argv, stdout=StringIO())


def test_pgqueue_requeue_of_an_id_past_bigint_requeues_nothing():
    dead = TaskFactory(state="failed", attempt=3, max_attempts=3)
    out = StringIO()

    call_command("pgqueue_requeue", "--id", str(2**70), "--id", str(dead.pk), stdout=out)

    assert out.getvalue().strip() == f"requeued 1 dead letter(s): {dead.pk}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--result-ttl", "nan"], r"--result-ttl and --dead-ttl must be seconds from 0 to"),
        (["--dead-ttl", "1e300"], r"not 86400 and 1e\+300"),
        (["--batch", str(2**70)], r"--batch must be from 1 to 1,000,000"),
        (["--batch", "0"], r"--batch must be from 1 to 1,000,000, not 0"),
    ],
)
def test_pgqueue_prune_refuses_ttls_and_batches_postgresql_cannot_use(argv, message):
    finished = TaskFactory(state="succeeded")

    with pytest.raises(CommandError, match=message):
        call_command("pgqueue_prune", *argv, stdout=StringIO())

    assert Task.objects.filter(pk=finished.pk).exists()


@pytest.mark.parametrize("interval", [math.nan, math.inf, -1.0, 0.0, 86401.0])
def test_pgqueue_status_refuses_a_watch_interval_it_cannot_sleep(interval):
    with pytest.raises(CommandError, match="--watch needs a positive number of seconds"):
        call_command("pgqueue_status", "--watch", repr(interval), stdout=StringIO())


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[" * 2000, "--payload: nested deeper than 100 levels"),
        ("9" * 5000, "--payload: a number is longer than 1000 digits"),
    ],
)
def test_pgqueue_signal_refuses_a_payload_python_cannot_parse(payload, message):
    task = TaskFactory(state="waiting", wait_reason="signal", wait_signal="go")

    with pytest.raises(CommandError, match=message):
        call_command("pgqueue_signal", str(task.pk), "go", "--payload", payload)

    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})

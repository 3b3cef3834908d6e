"""Fair share by key (docs/tenants.md): keys of a fair task take turns in the claim, in
proportion to their weights, whatever their backlogs.

The SQL tests call the statements as a worker does (tests/sqlhelpers.py, with the fair
routes claimed as fair); the last test runs a real worker process.
"""

from __future__ import annotations

import io
import threading
import uuid
from collections import Counter

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import task
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.fairness import parse_weights
from django_pgqueue.db.sql import QUERIES, execute
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.claimed import claimed_rows
from django_pgqueue.worker.claimer import claim_statement, route_params, stage_params
from django_pgqueue.worker.slots import SlotPool
from django_pgqueue.worker.stats import WorkerStats
from tests import ledger, tasks
from tests.conftest import wait_until
from tests.sqlhelpers import all_routes, claim, settle, success
from tests.tenant_tasks import fair_job, fair_other, fair_run, fair_versioned, fair_versioned_v1

pytestmark = pytest.mark.django_db(transaction=True)

FAIR_JOB = (fair_job.name, fair_job.version)


def keys_of(claimed) -> Counter:
    keys = dict(Task.objects.values_list("id", "fair_key"))
    return Counter(keys[t.id] for t in claimed)


# The statement the fair claims of a test run: a worker claims with the full claim while
# it looks for starving tasks, and with claim_fair otherwise (its routes have no limits).
# The fair-share tests run with both (the fixture below); the others with the full one.
STATEMENT = {"name": "claim"}


@pytest.fixture(params=["claim", "claim_fair"])
def fair_statement(request):
    STATEMENT["name"] = request.param
    yield request.param
    STATEMENT["name"] = "claim"


def fair_claim(pg, limit: int, routes=None):
    statement = STATEMENT["name"]
    return claim(pg, limit, routes=[FAIR_JOB] if routes is None else routes, fair=True,
                 look_for_starving=statement == "claim", statement=statement)


def drain(pg, limit: int, rounds: int, routes=None) -> list[Counter]:
    """Claim ``rounds`` times and settle each claim: the keys each claim took."""
    taken = []
    for _ in range(rounds):
        claimed = fair_claim(pg, limit, routes)
        taken.append(keys_of(claimed))
        settle(pg, [success(t) for t in claimed])
    return taken


# -- the key ---------------------------------------------------------------------------
def test_the_fair_key_is_computed_at_enqueue_and_stored():
    one = fair_job.enqueue("acme", 1)
    many = fair_job.enqueue_many([("acme", 2), ("globex", 3)])
    given = fair_job.using(fair_key="tenant:9").enqueue("acme", 4)
    keyless = fair_job.enqueue(None, 5)

    keys = dict(Task.objects.values_list("id", "fair_key"))
    assert keys[one] == "customer:acme"
    assert [keys[i] for i in many] == ["customer:acme", "customer:globex"]
    assert keys[given] == "tenant:9"
    assert keys[keyless] == ""  # the calls without a key share one flow
    assert Task.objects.filter(task_name=tasks.noop.name).count() == 0


def test_a_task_that_is_not_fair_has_no_key_and_refuses_one():
    plain = tasks.noop.enqueue(1)

    assert Task.objects.get(id=plain).fair_key is None
    with pytest.raises(InvalidTaskError, match="not a fair task"):
        tasks.noop.using(fair_key="customer:1")
    assert Task.objects.count() == 1


def test_a_key_function_that_raises_or_returns_a_non_string_fails_the_enqueue():
    @task(name="tests.fair_broken",
          fair_key=lambda n: f"k{n}" if n > 1 else ({"n": n} if n else 1 / n))
    def broken(n: int) -> None: ...

    try:
        with pytest.raises(InvalidTaskError, match=r"fair_key function .* raised ZeroDivision"):
            broken.enqueue(0)
        with pytest.raises(InvalidTaskError, match="must be a non-empty string, not a dict"):
            broken.enqueue(1)
        with pytest.raises(InvalidTaskError, match=r"item 1: .*not a dict"):
            broken.enqueue_many([(2,), (1,)])
    finally:
        registry.unregister("tests.fair_broken")
    assert Task.objects.count() == 0


def test_a_fair_key_that_is_not_a_function_is_refused_at_declaration():
    with pytest.raises(ImproperlyConfigured, match="fair_key must be a function"):

        @task(name="tests.fair_not_callable", fair_key="customer")  # type: ignore[arg-type]
        def nope() -> None: ...

    assert "tests.fair_not_callable" not in registry


def test_fair_weights_are_checked_and_a_key_takes_its_most_specific_weight():
    weights = parse_weights({"customer:vip-*": 3, "customer:vip-9": 7, "customer:*": 0.5})

    assert weights.of("customer:vip-9") == 7  # the key itself
    assert weights.of("customer:vip-1") == 3  # the longest prefix
    assert weights.of("customer:1") == 0.5
    assert weights.of("other") == 1
    for bad, message in [
        ({"a": 0}, "must be a number > 0"),
        ({"a": float("nan")}, "must be a number > 0"),
        ({"a": True}, "must be a number > 0"),
        ({"": 1}, "is not a key or a prefix"),
        ({"a*b": 1}, "is not a key or a prefix"),
        (["a"], "must be a dict"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_weights(bad)


# -- the claim -------------------------------------------------------------------------
@pytest.mark.usefixtures("fair_statement")
def test_one_key_with_due_work_gets_every_slot(pg):
    fair_job.enqueue_many([("acme", n) for n in range(50)])

    claimed = fair_claim(pg, 20)

    assert keys_of(claimed) == {"customer:acme": 20}


@pytest.mark.usefixtures("fair_statement")
def test_keys_take_turns_whatever_their_backlogs(pg):
    # Given a customer with 1,000 tasks enqueued first, then two with 10 each
    fair_job.enqueue_many([("big", n) for n in range(1000)])
    fair_job.enqueue_many([("small", n) for n in range(10)])
    for n in range(10):
        fair_job.enqueue("tiny", n)

    # When claims take 6 at a time
    taken = drain(pg, 6, 6)

    # Then each customer gets a third of each claim while all three have work, and the
    # big one every slot once the others are done
    assert taken[:3] == [{"customer:big": 2, "customer:small": 2, "customer:tiny": 2}] * 3
    assert sum(taken, Counter())["customer:small"] == 10
    assert taken[-1] == {"customer:big": 6}


@pytest.mark.usefixtures("fair_statement")
def test_weights_share_the_slots_in_proportion(pg):
    with override_settings(PGQUEUE={"FAIR_WEIGHTS": {"customer:gold-*": 3}}):
        fair_job.enqueue_many([("basic", n) for n in range(200)])
        fair_job.enqueue_many([("gold-1", n) for n in range(200)])

        taken = sum(drain(pg, 20, 4), Counter())

    assert taken == {"customer:gold-1": 60, "customer:basic": 20}


@pytest.mark.usefixtures("fair_statement")
def test_a_weight_set_at_runtime_wins_over_the_settings_for_tasks_due_after_it(pg):
    with override_settings(PGQUEUE={"FAIR_WEIGHTS": {"customer:a": 4}}):
        operations.set_fair_weight("customer:*", 2)
        operations.set_fair_weight("customer:a", 1)
        fair_job.enqueue_many([("a", n) for n in range(100)])
        fair_job.enqueue_many([("b", n) for n in range(100)])
        fair_job.enqueue_many([("c", n) for n in range(100)])
        assert operations.runtime_fair_weights() == {"customer:*": 2.0, "customer:a": 1.0}

        taken = sum(drain(pg, 25, 2), Counter())

    # a: 1 (its own row wins over the settings' 4), b and c: 2 (the prefix)
    assert taken == {"customer:a": 10, "customer:b": 20, "customer:c": 20}
    assert operations.clear_fair_weight("customer:a") is True
    assert operations.clear_fair_weight("customer:a") is False
    with pytest.raises(InvalidTaskError, match="must be a number > 0"):
        operations.set_fair_weight("customer:a", -1)


@pytest.mark.usefixtures("fair_statement")
def test_priorities_order_the_work_of_a_key_and_keys_share_within_a_priority(pg):
    first = fair_job.enqueue_many([("a", n) for n in range(5)])
    urgent = fair_job.using(priority=5).enqueue("a", 99)
    fair_job.enqueue_many([("b", n) for n in range(5)])

    claimed = fair_claim(pg, 5)

    ids = {t.id for t in claimed}
    assert urgent in ids  # a higher priority goes first (across keys too)
    assert keys_of(claimed) == {"customer:a": 3, "customer:b": 2}
    assert ids & set(first) == set(first[:2])  # then the key's tasks in order


@pytest.mark.usefixtures("fair_statement")
def test_a_key_back_from_an_idle_spell_gets_its_turns_not_a_burst(pg):
    # Given a customer served long ago, and two busy ones served for a while since
    fair_job.enqueue("back", 0)
    drain(pg, 1, 1)
    fair_job.enqueue_many([("a", n) for n in range(100)])
    fair_job.enqueue_many([("b", n) for n in range(100)])
    drain(pg, 10, 4)

    # When it comes back with 30 tasks
    fair_job.enqueue_many([("back", n) for n in range(30)])

    # Then it takes its third of the next claims, not the turns it did not use
    taken = drain(pg, 9, 2)
    assert taken == [{"customer:a": 3, "customer:b": 3, "customer:back": 3}] * 2


@pytest.mark.usefixtures("fair_statement")
def test_scheduled_tasks_of_a_key_take_turns_when_they_become_due(pg):
    # Given 50 tasks of a customer scheduled for one moment, and another's backlog
    fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(50)])
    fair_job.enqueue_many([("now", n) for n in range(50)])
    assert Task.objects.filter(state="scheduled", fair_tag__isnull=True).count() == 50

    # When they come due (the stager makes them pending, in the claim's helper)
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
    taken = drain(pg, 10, 2)

    # Then they share with the backlog instead of all going first
    assert taken == [{"customer:later": 5, "customer:now": 5}] * 2


@pytest.mark.usefixtures("fair_statement")
def test_tasks_coming_due_join_the_flows_at_their_head_not_behind_finished_places(pg):
    # Given a customer's backlog, part of it served already (those rows finished, with
    # the places they had)
    fair_job.enqueue_many([("now", n) for n in range(50)])
    drain(pg, 10, 2)

    # When 10 tasks of another customer, scheduled, come due
    fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(10)])
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
    taken = drain(pg, 10, 1)

    # Then they share the next claim with the backlog, from where it stands now
    assert taken == [{"customer:later": 5, "customer:now": 5}]


@pytest.mark.usefixtures("fair_statement")
@pytest.mark.parametrize("elsewhere", ["queue", "task", "version", "priority", "untagged"])
def test_tasks_coming_due_join_their_own_flows_head_not_another_flows(pg, elsewhere):
    # Given rows that stand further back but are not the flow's head: another flow's
    # (the same task's in another queue, another fair task's in this one, another
    # version's, another priority's), or one of the flow's own rows without a place
    if elsewhere == "queue":
        fair_job.using(queue="other").enqueue_many([("x", n) for n in range(50)])
    elif elsewhere == "task":
        fair_other.enqueue_many([("x", n) for n in range(50)])
    elif elsewhere == "version":
        old = fair_job.enqueue_many([("x", n) for n in range(50)])
        Task.objects.filter(id__in=old).update(handler_version=2)
    elif elsewhere == "priority":
        fair_job.using(priority=-5).enqueue_many([("x", n) for n in range(50)])
    # and a customer's backlog, part of it served
    fair_job.enqueue_many([("now", n) for n in range(50)])
    drain(pg, 10, 2)
    if elsewhere == "untagged":
        untagged = fair_job.enqueue("x", 0)
        Task.objects.filter(id=untagged).update(fair_tag=None)

    # When 10 tasks of another customer, scheduled, come due
    fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(10)])
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
    (taken,) = drain(pg, 10, 1)

    # Then they share the next claim with the backlog of their own flow (half each; the
    # row without a place goes first, so one of them has 4)
    assert 4 <= taken["customer:later"] <= 5 and 4 <= taken["customer:now"] <= 5, taken


@pytest.mark.parametrize("other", ["key", "queue", "task", "version", "priority"])
def test_two_tasks_coming_due_together_each_join_their_own_flow(pg, other):
    # Given a flow with 10 waiting tasks (places 0 to 9), a task of that flow coming due,
    # and, coming due just after it, a task of a flow that has none (another key's, or
    # the same key's in another queue, task, version or priority)
    fair_job.enqueue_many([("a", n) for n in range(10)])
    mine = fair_job.using(delay=3600).enqueue("a", 10)
    if other == "task":
        theirs = fair_other.using(delay=3600).enqueue("a", 0)
    else:
        theirs = fair_job.using(
            delay=3600, queue="other" if other == "queue" else "default",
            priority=-5 if other == "priority" else 0,
        ).enqueue("b" if other == "key" else "a", 0)
    if other == "version":
        Task.objects.filter(id=theirs).update(handler_version=2)
    pg.execute("UPDATE pgqueue_task SET run_at = now() - interval '2 seconds' WHERE id = %s",
               [mine])
    pg.execute("UPDATE pgqueue_task SET run_at = now() - interval '1 second' WHERE id = %s",
               [theirs])

    # When the stager makes them pending, in one statement
    pg.execute(QUERIES["stage"], stage_params(["default", "other"], 1000))

    # Then each has its own flow's place: behind its flow's 10, or at the head of its own
    tags = dict(Task.objects.filter(id__in=[mine, theirs]).values_list("id", "fair_tag"))
    assert (tags[mine], tags[theirs]) == (10, 0)


@pytest.mark.usefixtures("fair_statement")
@pytest.mark.parametrize("state", ["running", "succeeded"])
def test_a_keys_claimed_or_finished_places_do_not_push_its_tasks_coming_due_back(pg, state):
    # Given a customer's backlog, and another customer's task that is running or done
    # and held a place far behind it (a place given while it waited)
    fair_job.enqueue_many([("now", n) for n in range(50)])
    ahead = fair_job.enqueue("later", 0)
    Task.objects.filter(id=ahead).update(state=state, fair_tag=1000)

    # When 10 more of the second customer's tasks, scheduled, come due
    fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(10)])
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
    (taken,) = drain(pg, 10, 1)

    # Then they take their turns from the head, as if the customer had nothing waiting
    assert taken == {"customer:later": 5, "customer:now": 5}, taken


@pytest.mark.usefixtures("fair_statement")
@pytest.mark.parametrize(
    "waiting", ["own", "own untagged", "queue", "task", "version", "priority"]
)
def test_tasks_coming_due_go_behind_their_keys_own_waiting_tasks_only(pg, waiting):
    # Given a customer's backlog, and a task of a second customer waiting far behind it:
    # in the same flow (also beside one of theirs without a place), or in another flow
    # (the same task's in another queue, another fair task's, another version's,
    # another priority's)
    fair_job.enqueue_many([("now", n) for n in range(50)])
    if waiting == "queue":
        behind = fair_job.using(queue="other").enqueue("later", 0)
    elif waiting == "task":
        behind = fair_other.enqueue("later", 0)
    elif waiting == "priority":
        behind = fair_job.using(priority=-5).enqueue("later", 0)
    else:
        behind = fair_job.enqueue("later", 0)
    Task.objects.filter(id=behind).update(
        fair_tag=1000, handler_version=2 if waiting == "version" else 1
    )
    if waiting == "own untagged":
        untagged = fair_job.enqueue("later", 1)
        Task.objects.filter(id=untagged).update(fair_tag=None)

    # When 10 more of the second customer's tasks, scheduled, come due
    fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(10)])
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
    due = set(Task.objects.filter(fair_key="customer:later", state="scheduled")
              .values_list("id", flat=True))  # fmt: skip
    (taken,) = drain(pg, 10, 1)
    claimed_due = due & set(Task.objects.filter(state="succeeded").values_list("id", flat=True))

    # Then they go behind the customer's own waiting task (none is claimed next), and
    # only behind its own: another flow's task does not hold them back (half the claim)
    if waiting.startswith("own"):
        assert claimed_due == set(), taken
    else:
        assert len(claimed_due) == 5, taken


@pytest.mark.usefixtures("fair_statement")
@pytest.mark.parametrize("where", ["settings", "runtime"])
@pytest.mark.parametrize("pattern", ["customer:later", "customer:lat*"])
def test_tasks_coming_due_take_their_turns_by_their_keys_weight(pg, where, pattern):
    # Given a weight of 3 for a key, by its name or a prefix, in FAIR_WEIGHTS or set at
    # runtime, and another key's backlog
    weights = {pattern: 3} if where == "settings" else {}
    with override_settings(PGQUEUE={"FAIR_WEIGHTS": weights}):
        if where == "runtime":
            operations.set_fair_weight(pattern, 3)
        fair_job.enqueue_many([("now", n) for n in range(50)])

        # When 50 tasks of the weighted key, scheduled, come due
        fair_job.using(delay=3600).enqueue_many([("later", n) for n in range(50)])
        pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE state = 'scheduled'")
        (taken,) = drain(pg, 20, 1)

    # Then they take three turns to the other key's one
    assert taken == {"customer:later": 15, "customer:now": 5}, taken


@pytest.mark.usefixtures("fair_statement")
def test_two_fair_tasks_are_flows_of_their_own_beside_plain_tasks(pg):
    fair_job.enqueue_many([("a", n) for n in range(20)])
    fair_other.enqueue_many([("a", n) for n in range(20)])
    tasks.noop.enqueue_many(range(20))

    claimed = fair_claim(pg, 9, routes=[FAIR_JOB, (fair_other.name, 1), (tasks.noop.name, 1)])

    assert Counter(t.task_name for t in claimed) == {
        fair_job.name: 3, fair_other.name: 3, tasks.noop.name: 3,
    }  # fmt: skip


@pytest.mark.usefixtures("fair_statement")
def test_tasks_of_a_fair_task_enqueued_without_a_key_run_when_the_keyed_leave_room(pg):
    # Given tasks of a fair task enqueued by a release that did not know it as fair
    fair_job.enqueue_many([("a", n) for n in range(4)])
    old = [fair_job.enqueue("a", 10 + n) for n in range(3)]
    Task.objects.filter(id__in=old).update(fair_key=None, fair_tag=None)

    # When claims take 3, then 10
    first = fair_claim(pg, 3)
    second = fair_claim(pg, 10)

    # Then the keyed ones fill the first, and the rest takes the ones without a key
    assert keys_of(first) == {"customer:a": 3}
    assert sorted(t.id for t in second if t.id in old) == old
    assert len(second) == 4


@pytest.mark.usefixtures("fair_statement")
def test_tasks_of_a_queue_the_fair_claim_does_not_serve_are_left_alone(pg):
    # fair tasks (claimed by key) and plain ones beside them (claimed in order)
    elsewhere = [*fair_job.using(queue="other").enqueue_many([("acme", n) for n in range(3)]),
                 *tasks.noop.using(queue="other").enqueue_many(range(3))]
    ids = [*fair_job.enqueue_many([("acme", n) for n in range(3)]),
           *tasks.noop.enqueue_many(range(3))]

    claimed = fair_claim(pg, 20, routes=[FAIR_JOB, (tasks.noop.name, tasks.noop.version)])

    assert sorted(t.id for t in claimed) == sorted(ids)
    assert Task.objects.filter(id__in=elsewhere, state="pending").count() == 6


@pytest.mark.usefixtures("fair_statement")
def test_rows_of_a_version_the_worker_does_not_run_are_left_alone(pg):
    # Given fair and plain rows, half of each written by a release with version 2 of
    # their task, which this worker does not run
    ids = [*fair_job.enqueue_many([("acme", n) for n in range(6)]),
           *tasks.noop.enqueue_many(range(6))]
    newer = ids[3:6] + ids[9:]
    Task.objects.filter(id__in=newer).update(handler_version=2)

    claimed = fair_claim(pg, 20, routes=[FAIR_JOB, (tasks.noop.name, tasks.noop.version)])

    assert sorted(t.id for t in claimed) == sorted(set(ids) - set(newer))


@pytest.mark.usefixtures("fair_statement")
def test_a_task_no_longer_fair_is_claimed_in_order_though_its_rows_hold_keys(pg):
    # Given rows of a task that an earlier release declared fair (they hold keys and
    # places: the last enqueued first), which this worker's release does not
    ids = tasks.noop.enqueue_many(range(6))
    Task.objects.filter(id__in=ids).update(fair_key="customer:old")
    pg.execute("UPDATE pgqueue_task SET fair_tag = 100 - id WHERE id = ANY(%s)", [ids])

    # When a worker that also runs a fair task claims 3
    claimed = fair_claim(pg, 3, routes=[FAIR_JOB, (tasks.noop.name, tasks.noop.version)])

    # Then it takes them in order, as any task that is not fair
    assert sorted(t.id for t in claimed) == ids[:3]


@pytest.mark.usefixtures("fair_statement")
def test_a_claimed_or_finished_row_is_not_claimed_again_fair_or_not(pg):
    routes = [FAIR_JOB, (tasks.noop.name, tasks.noop.version)]
    ids = [*fair_job.enqueue_many([("acme", n) for n in range(3)]),
           *tasks.noop.enqueue_many(range(3))]

    first = fair_claim(pg, 20, routes)
    assert sorted(t.id for t in first) == ids
    assert fair_claim(pg, 20, routes) == []  # running

    settle(pg, [success(t) for t in first])
    assert fair_claim(pg, 20, routes) == []  # succeeded


@pytest.mark.usefixtures("fair_statement")
def test_a_fair_tasks_rows_without_a_key_are_not_crowded_out_by_its_keyed_rows_elsewhere(
    pg,
):
    # Given rows of a fair task without a key (enqueued before it was fair), and keyed
    # rows of the same task in another queue of the worker, or of another version it runs
    def claimed_beside(keyed: list[int], unkeyed: list[int], routes) -> None:
        Task.objects.filter(id__in=unkeyed).update(fair_key=None, fair_tag=None)
        claimed = claim(pg, 6, queue=["default", "other"], routes=routes, fair=True,
                        look_for_starving=STATEMENT["name"] == "claim",
                        statement=STATEMENT["name"])
        # Then the unkeyed rows share the claim with the keyed ones: the keyed rows
        # count against their own route's limit, not against another's
        taken = {t.id for t in claimed}
        assert taken & set(unkeyed) and taken & set(keyed), (taken, keyed, unkeyed)
        pg.execute("DELETE FROM pgqueue_task")

    claimed_beside(fair_job.enqueue_many([("acme", n) for n in range(6)]),
                   fair_job.using(queue="other").enqueue_many([("acme", n) for n in range(3)]),
                   [FAIR_JOB])
    claimed_beside(fair_versioned.enqueue_many([("acme",)] * 6),
                   fair_versioned_v1.enqueue_many([("acme",)] * 3),
                   [(fair_versioned.name, 1), (fair_versioned.name, 2)])


@pytest.mark.usefixtures("fair_statement")
def test_a_paused_queue_holds_back_its_fair_tasks_until_resumed(pg):
    ids = fair_job.enqueue_many([("acme", n) for n in range(3)])
    operations.pause("default")

    assert fair_claim(pg, 10) == []

    operations.resume("default")
    assert sorted(t.id for t in fair_claim(pg, 10)) == ids


@pytest.mark.usefixtures("fair_statement")
def test_a_pause_of_another_queue_holds_back_no_fair_task_here(pg):
    ids = fair_job.enqueue_many([("acme", n) for n in range(3)])
    operations.pause("other")
    operations.pause("other", fair_job.name)

    assert sorted(t.id for t in fair_claim(pg, 10)) == ids


@pytest.mark.usefixtures("fair_statement")
def test_a_paused_fair_task_name_is_held_back_and_the_rest_of_its_queue_claimed(pg):
    held = fair_job.enqueue_many([("acme", n) for n in range(2)])
    other = fair_other.enqueue("acme", 1)
    routes = [FAIR_JOB, (fair_other.name, 1)]
    operations.pause("default", fair_job.name)

    assert [t.id for t in fair_claim(pg, 10, routes)] == [other]

    operations.resume("default", fair_job.name)
    assert sorted(t.id for t in fair_claim(pg, 10, routes)) == held


def test_the_fair_claim_takes_what_the_full_claim_takes(pg):
    """claim_fair is claim reduced for a lane with fair routes and no limits or
    starvation escape: on the same table both take the same rows in the same order."""
    fair_job.enqueue_many([("a", n) for n in range(40)])
    fair_job.using(priority=3).enqueue_many([("b", n) for n in range(7)])
    fair_job.enqueue_many([("c", n) for n in range(9)])
    fair_other.enqueue_many([("a", n) for n in range(5)])
    tasks.noop.enqueue_many(range(12))
    keyless = fair_job.enqueue_many([("d", n) for n in range(4)])
    Task.objects.filter(id__in=keyless).update(fair_key=None, fair_tag=None)
    routes = [FAIR_JOB, (fair_other.name, 1), (tasks.noop.name, 1)]

    def take(statement: str, limit: int, batch_bytes: int | None) -> list[int]:
        params = {
            **route_params(["default"], routes, 3600, claim_batch_bytes=batch_bytes,
                           fair_routes={FAIR_JOB, (fair_other.name, 1)}),
            "look_for_starving": False, "limit": limit, "token": str(uuid.uuid4()),
            "lease_seconds": 30, "worker_id": "w1",
        }  # fmt: skip
        assert claim_statement(params) == "claim_fair"
        with pg.transaction(force_rollback=True):
            claimed = execute(pg, statement, params, row_factory=claimed_rows).fetchall()
        return sorted(t.id for t in claimed)

    for limit in (1, 4, 13, 100):
        for batch_bytes in (None, 200):
            assert take("claim_fair", limit, batch_bytes) == take("claim", limit, batch_bytes)


def test_the_fair_claims_update_and_columns_are_the_plain_claims():
    plain = QUERIES["claim_plain"][QUERIES["claim_plain"].index("UPDATE pgqueue_task AS t"):]
    fair = QUERIES["claim_fair"][QUERIES["claim_fair"].index("UPDATE pgqueue_task AS t"):]

    assert fair == plain


def test_a_lane_without_fair_tasks_claims_with_the_plain_statement():
    params = {**route_params(["default"], all_routes(), 60.0), "look_for_starving": False}

    assert claim_statement(params) == "claim_plain"


def test_a_worker_starts_another_customers_tasks_before_a_big_backlog_drains(
    start_worker, tmp_path
):
    # Given one customer's 300 tasks enqueued before 10 tasks of another
    fair_run.enqueue_many([("big", n, 0.002) for n in range(300)])
    small = fair_run.enqueue_many([("small", n, 0.002) for n in range(10)])

    # When one worker drains them
    path = tmp_path / "ledger.jsonl"
    env = {"PGQUEUE_TEST_TENANTS": "1", ledger.LEDGER_ENV: str(path)}
    start_worker("--concurrency", "4", "--burst", env=env).wait(120)

    # Then the small customer's tasks started among the first, not after the backlog
    assert Task.objects.filter(state="succeeded").count() == 310
    starts = [e["task"] for e in ledger.read(path) if e["event"] == "start"]
    assert len(starts) == 310
    assert max(starts.index(task_id) for task_id in small) < 40, starts.index(small[-1])


# -- who is getting what ---------------------------------------------------------------
def test_the_shares_say_per_key_what_is_due_running_and_started(pg):
    fair_job.enqueue_many([("a", n) for n in range(10)])
    fair_job.enqueue_many([("b", n) for n in range(4)])
    tasks.noop.enqueue(1)  # not a fair task: not a key
    claimed = fair_claim(pg, 4)

    running = {r["key"]: r for r in operations.fair_shares(using="default")}
    settle(pg, [success(t) for t in claimed])
    settled = {r["key"]: r for r in operations.fair_shares(using="default")}
    searched = operations.fair_shares(search="r:b", using="default")

    assert {k: (r["pending"], r["running"], r["started"]) for k, r in running.items()} == {
        "customer:a": (8, 2, 2), "customer:b": (2, 2, 2),
    }  # fmt: skip
    assert {k: (r["pending"], r["running"], r["started"]) for k, r in settled.items()} == {
        "customer:a": (8, 0, 2), "customer:b": (2, 0, 2),
    }  # fmt: skip
    assert [r["key"] for r in searched] == ["customer:b"]


def test_the_fair_command_sets_lists_and_clears_weights_and_shows_shares(pg):
    out = io.StringIO()
    with override_settings(PGQUEUE={"FAIR_WEIGHTS": {"customer:gold-*": 3}}):
        call_command("pgqueue_fair", "weight", "customer:42", "5", stdout=out)
        call_command("pgqueue_fair", "weights", stdout=out)
        fair_job.enqueue_many([("42", n) for n in range(3)])
        call_command("pgqueue_fair", "shares", stdout=out)
        call_command("pgqueue_fair", "clear", "customer:42", stdout=out)
        with pytest.raises(CommandError, match="must be a number > 0"):
            call_command("pgqueue_fair", "weight", "customer:42", "0")

    text = out.getvalue()
    assert "customer:gold-*  3  (settings)" in text
    assert "customer:42  5  (runtime)" in text
    assert "customer:42  3" in text  # three due
    assert "customer:42: runtime weight removed" in text
    assert operations.runtime_fair_weights() == {}


def test_the_overview_shows_the_top_keys_and_finds_a_key(admin_client):
    overview = reverse("admin:django_pgqueue_queueoverview_changelist")
    fair_job.enqueue_many([("a", n) for n in range(7)])
    fair_job.enqueue_many([("b", n) for n in range(3)])

    html = admin_client.get(overview).content.decode()
    found = admin_client.get(overview, {"key": "r:b"}).content.decode()
    missing = admin_client.get(overview, {"key": "nobody"}).content.decode()

    section = html.split('id="pgqueue-fair-shares"', 1)[1]
    assert '<tr data-fair-key="customer:a">' in section and '<td class="num">7</td>' in section
    assert '<tr data-fair-key="customer:b">' in section
    assert 'data-fair-key="customer:a"' not in found and 'data-fair-key="customer:b"' in found
    assert 'No fair key matches "nobody"' in missing


def test_the_overview_has_no_tenants_section_without_fair_tasks(admin_client):
    tasks.noop.enqueue(1)

    html = admin_client.get(reverse("admin:django_pgqueue_queueoverview_changelist")).content
    assert b"pgqueue-tenants" not in html


def test_a_key_with_nothing_waiting_for_a_slot_goes_ahead_of_a_busy_keys_prefetch(pg):
    # Given a worker's one slot busy with a task of a key whose 4 more tasks wait for it
    fair_job.enqueue_many([("busy", n) for n in range(5)])
    busy = fair_claim(pg, 5)
    fair_job.enqueue("other", 0)
    other = fair_claim(pg, 1)
    plain = fair_claim(pg, 0)  # nothing: every task is claimed
    started: list[str | None] = []
    release = threading.Event()

    def execute(task):
        started.append(task.fair_key)
        release.wait(10)
        return None

    pool = SlotPool(1, execute, prefetch=10, on_outcome=lambda outcome: None,
                    stats=WorkerStats(), timeout_grace=10, write_off_limit=3,
                    on_recycle=lambda reason: None)  # fmt: skip
    pool.start()
    try:
        pool.submit(sorted(busy, key=lambda t: t.id))
        wait_until(lambda: started, message="the first task to start")

        # When a task of another key is claimed
        pool.submit(other)
        release.set()
        wait_until(lambda: len(started) == 6, message="every task to start")
    finally:
        pool.stop()

    # Then it starts next, not after the busy key's prefetched tasks
    assert started == ["customer:busy", "customer:other"] + ["customer:busy"] * 4
    assert plain == [] and pool._waiting_keys == {}

"""``manage.py pgqueue_doctor``: what the queue depends on, checked (doctor.py).

Exit status: 0 healthy (nothing past info), 1 warnings, 2 problems.
"""

from __future__ import annotations

import json
import math
import sys

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.conf import get_settings
from django_pgqueue.management.commands._database import database_option
from django_pgqueue.ops import doctor

LABELS = {doctor.INFO: "info", doctor.WARNING: "WARNING", doctor.PROBLEM: "PROBLEM"}


class Command(BaseCommand):
    help = (
        "Check what the queue depends on: what holds back vacuum of the task table, dead "
        "tuples and bloat, the claim index, each queue's waits against its latency "
        "objective and its backlog, the workers, connections, and settings that "
        "contradict each other. Each finding has a severity, its evidence and a fix. Exit "
        "status: 0 healthy, 1 warnings, 2 problems."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--json", action="store_true", help="print the findings as one JSON document"
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="check only this alias's task table (default: every one)",
        )
        parser.add_argument(
            "--only",
            action="append",
            default=[],
            metavar="CHECK",
            help="run only these checks (repeatable): a group (horizon, vacuum, bloat, "
            "claim, queues, workers, connections, settings) or a check id",
        )
        parser.add_argument(
            "--ignore",
            action="append",
            default=[],
            metavar="CHECK",
            help="leave out the findings of these checks (repeatable), e.g. "
            "vacuum.autovacuum when it is off on purpose",
        )
        parser.add_argument(
            "--transaction-age",
            type=float,
            metavar="SECONDS",
            help="a transaction holding back vacuum longer than this is a warning, ten "
            "times longer a problem (default: DOCTOR_TRANSACTION_AGE, "
            f"{get_settings().DOCTOR_TRANSACTION_AGE:g})",
        )

    def handle(self, *args, **opts):
        self.verbosity = opts["verbosity"]
        only = database_option(opts["database"])
        age = opts["transaction_age"]
        if age is not None and not (0 < age < math.inf):
            raise CommandError(f"--transaction-age must be seconds greater than 0, not {age:g}")
        known = set(doctor.GROUPS) | {"doctor"}
        for pattern in opts["only"] + opts["ignore"]:
            if pattern.split(".", 1)[0] not in known:
                raise CommandError(
                    f"no check {pattern!r}: name a group ({', '.join(doctor.GROUPS)}) or a "
                    "check id such as horizon.transaction"
                )
        thresholds = doctor.Thresholds.from_settings(
            **({} if age is None else {"transaction_seconds": age})
        )
        findings = doctor.diagnose(
            [only] if only else None, thresholds, only=opts["only"], ignore=opts["ignore"]
        )
        status = doctor.exit_status(findings)
        if opts["json"]:
            document = {
                "status": ("healthy", "warnings", "problems")[status],
                "findings": [finding.as_json() for finding in findings],
            }
            self.stdout.write(json.dumps(document, indent=2))
        else:
            self._print(findings, status)
        if status:
            sys.exit(status)

    def _print(self, findings: list[doctor.Finding], status: int) -> None:
        counts = {s: sum(1 for f in findings if f.severity == s) for s in doctor.SEVERITIES}
        verdict = ("healthy", "warnings", "problems")[status]
        self.stdout.write(
            f"pgqueue_doctor: {verdict} ({counts[doctor.PROBLEM]} problem(s), "
            f"{counts[doctor.WARNING]} warning(s), {counts[doctor.INFO]} note(s))"
        )
        for finding in findings:
            self.stdout.write("")
            self.stdout.write(
                f"{LABELS[finding.severity]} {finding.check} [{finding.database}]: "
                f"{finding.summary}"
            )
            if finding.severity != doctor.INFO or self.verbosity > 1:
                evidence = " ".join(f"{k}={_shown(v)}" for k, v in finding.evidence.items())
                if evidence:
                    self.stdout.write(f"  evidence: {evidence}")
            if finding.fix:
                self.stdout.write(f"  fix: {finding.fix}")


def _shown(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return json.dumps(text) if " " in text else text

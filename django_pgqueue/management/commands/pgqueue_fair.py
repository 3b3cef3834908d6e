"""``manage.py pgqueue_fair``: fair-share weights at runtime, and who is getting what."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.fairness import fair_weights
from django_pgqueue.ops import operations


class Command(BaseCommand):
    help = (
        "Set or clear the fair-share weight of a key or key prefix at runtime, list the "
        "weights, or show per key what its tasks get (docs/tenants.md)."
    )

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", metavar="{weight,clear,weights,shares}")
        actions.required = True
        weight = actions.add_parser(
            "weight", help="give a key (or every key starting with PREFIX*) a weight"
        )
        weight.add_argument("key", metavar="KEY", help="a key, or a prefix ending with *")
        weight.add_argument("weight", metavar="WEIGHT", type=float, help="a number > 0")
        clear = actions.add_parser("clear", help="remove the runtime weight of a key or prefix")
        clear.add_argument("key", metavar="KEY")
        weights = actions.add_parser("weights", help="the weights: settings and runtime")
        weights.add_argument("--json", action="store_true", help="print JSON")
        shares = actions.add_parser(
            "shares", help="per key: tasks due, running, and started recently"
        )
        shares.add_argument("--queue", help="only this queue")
        shares.add_argument("--search", help="only keys that contain this text")
        shares.add_argument("--limit", type=int, default=20, help="keys shown (default 20)")
        shares.add_argument(
            "--seconds", type=float, default=60.0, help="the window of 'started' (default 60)"
        )
        shares.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args, **opts):
        action = opts["action"]
        try:
            if action == "weight":
                operations.set_fair_weight(opts["key"], opts["weight"])
                self.stdout.write(
                    f"{opts['key']}: weight {opts['weight']:g} for its tasks due from now on"
                )
            elif action == "clear":
                if operations.clear_fair_weight(opts["key"]):
                    self.stdout.write(f"{opts['key']}: runtime weight removed")
                else:
                    self.stdout.write(f"{opts['key']} had no runtime weight")
            elif action == "weights":
                self._weights(opts["json"])
            else:
                self._shares(opts)
        except InvalidTaskError as exc:
            raise CommandError(str(exc)) from None

    def _weights(self, as_json: bool) -> None:
        settings = fair_weights()
        rows = [{"key": k, "weight": w, "from": "settings"}
                for k, w in zip(settings.patterns, settings.values, strict=True)]  # fmt: skip
        rows += [{"key": k, "weight": w, "from": "runtime"}
                 for k, w in operations.runtime_fair_weights().items()]  # fmt: skip
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no weights: every key weighs 1")
        for row in rows:
            self.stdout.write(f"{row['key']}  {row['weight']:g}  ({row['from']})")

    def _shares(self, opts: dict) -> None:
        rows = operations.fair_shares(
            queue=opts["queue"], search=opts["search"], limit=opts["limit"],
            seconds=opts["seconds"],
        )  # fmt: skip
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no fair task is due, running, or started recently")
            return
        header = ["queue", "key", "due", "running", f"started in {opts['seconds']:g}s"]
        lines = [header] + [
            [r["queue"], r["key"] or "(no key)", str(r["pending"]), str(r["running"]),
             str(r["started"])]
            for r in rows
        ]  # fmt: skip
        widths = [max(len(cell) for cell in column) for column in zip(*lines, strict=True)]
        lines.insert(1, ["-" * w for w in widths])
        for line in lines:
            cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())

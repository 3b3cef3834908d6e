"""``python -m benchmarks``: the django_pgqueue benchmark suite (docs/performance.md)."""

from benchmarks.runner import main

if __name__ == "__main__":
    raise SystemExit(main())

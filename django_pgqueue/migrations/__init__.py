# Migrations are expand/contract: a released one is never edited, and a new one only
# adds (CONTRIBUTING.md, "Schema changes"; docs/upgrading.md).

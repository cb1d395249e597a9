"""E2B's protocol on codepool serve, under /e2b (ops/e2b/routes.py; docs/e2b.md)."""

"""Audited changes and reads every caller shares (admin API, fleet file, CLI)."""

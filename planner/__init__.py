"""Planner: hardware catalog, cost model, speculative-decoding performance model (pure)."""

"""How one replica's processes serve: worker processes, the replica's shared state,
requests in flight and budgets over its workers, HTTP limits."""

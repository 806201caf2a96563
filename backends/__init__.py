"""Everything about vLLM servers: method catalog, metrics, probing, bench, simulator."""

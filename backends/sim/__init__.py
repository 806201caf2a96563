"""A vLLM-compatible simulator: vLLM's API and metrics over a modelled engine, no GPU."""

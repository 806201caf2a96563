"""The data plane: `/v1/*` relayed to backends (no database on this path)."""

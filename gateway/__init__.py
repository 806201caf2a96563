"""The gateway: OpenAI-compatible data plane and the admin control plane."""

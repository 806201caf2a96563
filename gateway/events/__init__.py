"""What operators are told: webhooks, budget alerts, tracing."""

"""What several pages draw: live panels, period pickers, change confirmations, curves."""

"""The shapes of the admin API: resources, reports, methods."""

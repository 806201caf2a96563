"""Background loops that watch and steer the fleet."""

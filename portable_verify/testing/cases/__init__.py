"""Case builders: seeded random verification calls, exact-grid calls and bad inputs."""

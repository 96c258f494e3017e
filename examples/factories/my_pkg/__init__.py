"""A user's own package: models and data that a job file names by import path."""

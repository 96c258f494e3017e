"""Launchers: where the ranks of a job run (`local`: this machine through horovodrun)."""

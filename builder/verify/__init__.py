"""Verification: a built image run as users run it and compared with the pipeline."""
